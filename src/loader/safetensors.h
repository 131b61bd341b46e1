// safetensors reader: u64 little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
// then the data buffer the offsets point into. The file is memory-mapped; every
// offset and size is validated at open time, so a corrupt or truncated file throws
// kvtier::Error naming the file and tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ggml_type.h"
#include "loader/mapped_file.h"

namespace kvtier {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // as written in the file: "F32", "BF16", "I64"...
  std::optional<GgmlType> type;  // F32 / F16 / BF16; nullopt for dtypes we do not compute with
  std::vector<int64_t> shape;    // outermost first
  // Points into the file; not necessarily aligned to the element size (the format
  // only aligns the data buffer when writers pad the header), so read with memcpy
  // or copy first when alignment matters.
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  int64_t n_elements() const;
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses from memory (used by the fuzzer); `name` is used in messages. The
  // buffer must outlive the object.
  static std::unique_ptr<SafetensorsFile> parse(const uint8_t* data, size_t size, std::string name);

  const std::string& path() const { return name_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // The mapping (null when parsed from memory); keep it alive while using tensor data.
  const std::shared_ptr<MappedFile>& mapping() const { return file_; }

 private:
  SafetensorsFile() = default;
  std::string name_;
  std::shared_ptr<MappedFile> file_;
  std::vector<SafetensorsTensor> tensors_;  // sorted by name
};

// Bytes per element of a safetensors dtype string; 0 when unknown.
size_t safetensors_dtype_size(std::string_view dtype);

}  // namespace kvtier
