#include "loader/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/status.h"

namespace kvtier {

namespace {
// The reference implementation refuses headers above 100 MB; so do we, which
// also bounds the JSON parser's memory on hostile input.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
}  // namespace

size_t safetensors_dtype_size(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto file = MappedFile::open(path);
  auto st = parse(file->data(), file->size(), path);
  st->file_ = std::move(file);
  return st;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                        std::string name) {
  std::unique_ptr<SafetensorsFile> st(new SafetensorsFile());
  st->name_ = std::move(name);
  const std::string& file = st->name_;
  if (size < 8)
    fail("{}: not a safetensors file: {} bytes, expected at least the 8-byte header length", file,
         size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > kMaxHeaderBytes)
    fail("{}: corrupt safetensors: header length {} exceeds the {}-byte limit", file, header_len,
         kMaxHeaderBytes);
  if (header_len > size - 8)
    fail("{}: truncated safetensors: header length {} but only {} bytes follow", file, header_len,
         size - 8);
  const char* hp = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header = nlohmann::json::parse(hp, hp + header_len, nullptr, false);
  if (header.is_discarded())
    fail("{}: corrupt safetensors: the {}-byte header is not valid JSON", file, header_len);
  if (!header.is_object())
    fail("{}: corrupt safetensors: the header is JSON {}, expected an object", file,
         header.type_name());

  const uint8_t* buffer = data + 8 + header_len;
  const uint64_t buffer_size = size - 8 - header_len;
  for (auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;  // free-form string map; nothing we need
    if (!entry.is_object())
      fail("{}: tensor '{}': header entry is JSON {}, expected an object", file, key,
           entry.type_name());
    SafetensorsTensor t;
    t.name = key;
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string())
      fail("{}: tensor '{}': missing or non-string \"dtype\"", file, key);
    t.dtype = dt->get<std::string>();
    size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0) fail("{}: tensor '{}': unknown dtype \"{}\"", file, key, t.dtype);
    if (t.dtype == "F32") t.type = GgmlType::F32;
    if (t.dtype == "F16") t.type = GgmlType::F16;
    if (t.dtype == "BF16") t.type = GgmlType::BF16;

    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array())
      fail("{}: tensor '{}': missing or non-array \"shape\"", file, key);
    int64_t n_el = 1;
    for (auto& d : *sh) {
      if (!d.is_number_unsigned())
        fail("{}: tensor '{}': shape entry {} is not a non-negative integer", file, key, d.dump());
      uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(n_el, int64_t(v), &n_el))
        fail("{}: tensor '{}': shape {} overflows 64 bits (expected a byte size below 2^64)", file, key, sh->dump());
      t.shape.push_back(int64_t(v));
    }
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      fail("{}: tensor '{}': \"data_offsets\" must be [begin, end] non-negative integers", file,
           key);
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > buffer_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] outside the {}-byte data buffer (truncated or "
           "corrupt file)",
           file, key, begin, end, buffer_size);
    uint64_t expect = 0;
    if (__builtin_mul_overflow(uint64_t(n_el), uint64_t(elem), &expect) || end - begin != expect)
      fail("{}: tensor '{}': data_offsets span {} bytes, expected {} for {} shape {}", file, key,
           end - begin, expect, t.dtype, sh->dump());
    t.data = buffer + begin;
    t.n_bytes = size_t(expect);
    st->tensors_.push_back(std::move(t));
  }

  // Tensors must not share bytes: overlapping ranges mean a corrupt header.
  std::vector<const SafetensorsTensor*> by_offset;
  for (auto& t : st->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsTensor* a = by_offset[i - 1];
    const SafetensorsTensor* b = by_offset[i];
    if (a->data + a->n_bytes > b->data)
      fail("{}: corrupt safetensors: tensors '{}' and '{}' overlap", file, a->name, b->name);
  }
  std::sort(st->tensors_.begin(), st->tensors_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return st;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

}  // namespace kvtier
