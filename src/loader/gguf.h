// GGUF v2/v3 reader: header, metadata key/values, tensor directory. The file is
// memory-mapped; tensor data pointers point into the mapping. Every offset and
// size is validated against the file size at open time, so a corrupt or
// truncated file throws kvtier::Error naming the file, key or tensor.
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

// Metadata value types (on-disk ids).
enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType t);

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr size_t kGgufDefaultAlignment = 32;

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the fastest-varying dimension
  uint64_t offset = 0;      // relative to the start of the data section
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  int64_t n_elements() const;
};

class GgufFile {
 public:
  // Parses the whole header eagerly. Throws kvtier::Error on any inconsistency.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses from memory (used by the fuzzer); `name` is used in messages. The
  // buffer must outlive the object.
  static std::unique_ptr<GgufFile> parse(const uint8_t* data, size_t size, std::string name);
  ~GgufFile();

  const std::string& path() const;
  uint32_t version() const;
  size_t alignment() const;

  bool has(std::string_view key) const;
  std::vector<std::string> keys() const;
  // Scalars; nullopt when the key is missing. Throw kvtier::Error when the key
  // exists with an incompatible type (message names key, found and expected type).
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;  // any integer type
  std::optional<double> get_float(std::string_view key) const; // float or integer types
  std::optional<bool> get_bool(std::string_view key) const;
  // Arrays; empty when missing, throw when the key holds another type.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;
  // Type of a key (nullopt when missing); for arrays, the element type too.
  std::optional<GgufValueType> type_of(std::string_view key) const;
  std::optional<GgufValueType> array_type_of(std::string_view key) const;
  // Number of elements of an array key (0 when missing or not an array).
  size_t array_size(std::string_view key) const;
  // Start of the tensor data section (absolute offset in the file).
  size_t data_offset() const;

  const std::vector<GgufTensorInfo>& tensors() const;
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  struct Impl;

 private:
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
