// GGUF v2/v3 reader. Layout (little-endian):
//   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
//   n_kv × { string key, u32 value_type, value },
//   n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
//   padding to `general.alignment` (default 32), tensor data.
// A string is u64 length + bytes (no terminator); an array is u32 element type,
// u64 count, elements. Every count is checked against the bytes left before
// anything is allocated, so a hostile header cannot make us reserve memory the
// file could not possibly describe.
#include "loader/gguf.h"

#include <cstring>
#include <limits>
#include <map>

#include "core/status.h"

namespace kvtier {

std::string_view gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: return "uint8";
    case GgufValueType::INT8: return "int8";
    case GgufValueType::UINT16: return "uint16";
    case GgufValueType::INT16: return "int16";
    case GgufValueType::UINT32: return "uint32";
    case GgufValueType::INT32: return "int32";
    case GgufValueType::FLOAT32: return "float32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::UINT64: return "uint64";
    case GgufValueType::INT64: return "int64";
    case GgufValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

namespace {

constexpr int kMaxArrayNesting = 8;
constexpr int kMaxDims = 4;

// Bytes of one scalar of type t; 0 for string/array (variable size).
size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool is_known_value_type(uint32_t t) { return t <= uint32_t(GgufValueType::FLOAT64); }

bool is_int_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::UINT64:
    case GgufValueType::INT64: return true;
    default: return false;
  }
}

bool is_float_type(GgufValueType t) {
  return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes an integer scalar stored at p. Returns false when a uint64 does not fit int64.
bool decode_int(GgufValueType t, const uint8_t* p, int64_t* out) {
  switch (t) {
    case GgufValueType::UINT8: *out = load<uint8_t>(p); return true;
    case GgufValueType::INT8: *out = load<int8_t>(p); return true;
    case GgufValueType::UINT16: *out = load<uint16_t>(p); return true;
    case GgufValueType::INT16: *out = load<int16_t>(p); return true;
    case GgufValueType::UINT32: *out = load<uint32_t>(p); return true;
    case GgufValueType::INT32: *out = load<int32_t>(p); return true;
    case GgufValueType::INT64: *out = load<int64_t>(p); return true;
    case GgufValueType::UINT64: {
      uint64_t u = load<uint64_t>(p);
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
      *out = int64_t(u);
      return true;
    }
    default: return false;
  }
}

double decode_float(GgufValueType t, const uint8_t* p) {
  return t == GgufValueType::FLOAT32 ? double(load<float>(p)) : load<double>(p);
}

// One metadata value. Scalars and scalar arrays point into the file bytes
// (which outlive the GgufFile); only string and nested arrays are expanded.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  const uint8_t* raw = nullptr;  // scalar: its bytes; scalar array: packed elements
  std::string_view str;          // STRING
  GgufValueType elem = GgufValueType::UINT8;  // ARRAY element type
  uint64_t count = 0;                         // ARRAY element count
  std::vector<std::string_view> strs;         // ARRAY of STRING
  std::vector<GgufValue> items;               // ARRAY of ARRAY
};

}  // namespace

struct GgufFile::Impl {
  std::string name;
  std::shared_ptr<MappedFile> file;  // set when opened from a path
  const uint8_t* data = nullptr;
  size_t size = 0;
  uint32_t version = 0;
  size_t alignment = kGgufDefaultAlignment;
  size_t data_offset = 0;
  std::vector<std::string> key_order;
  std::map<std::string, GgufValue, std::less<>> kv;
  std::vector<GgufTensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;

  const GgufValue* find(std::string_view key) const {
    auto it = kv.find(key);
    return it == kv.end() ? nullptr : &it->second;
  }
};

namespace {

// Bounds-checked little-endian reader over the file bytes. `ctx` names what is
// being read (a key or tensor) for error messages.
struct Cursor {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  const std::string& file;
  std::string ctx = "header";

  size_t left() const { return size - pos; }

  void need(uint64_t n, std::string_view what) const {
    if (n > left())
      fail("{}: truncated or corrupt GGUF: {} at offset {} needs {} bytes, only {} left ({})",
           file, what, pos, n, left(), ctx);
  }
  const uint8_t* take(uint64_t n, std::string_view what) {
    need(n, what);
    const uint8_t* p = data + pos;
    pos += size_t(n);
    return p;
  }
  template <class T>
  T read(std::string_view what) {
    return load<T>(take(sizeof(T), what));
  }
  std::string_view read_string(std::string_view what) {
    uint64_t n = read<uint64_t>(what);
    if (n > left())
      fail("{}: corrupt GGUF: {} at offset {} claims {} bytes but only {} are left ({})", file,
           what, pos - 8, n, left(), ctx);
    const uint8_t* p = take(n, what);
    return {reinterpret_cast<const char*>(p), size_t(n)};
  }
  GgufValueType read_value_type(std::string_view what) {
    uint32_t t = read<uint32_t>(what);
    if (!is_known_value_type(t))
      fail("{}: corrupt GGUF: unknown metadata value type {} at offset {} ({}); expected 0..12",
           file, t, pos - 4, ctx);
    return GgufValueType(t);
  }

  void read_value(GgufValueType type, GgufValue* v, int depth) {
    v->type = type;
    if (type == GgufValueType::STRING) {
      v->str = read_string("string value");
      return;
    }
    if (type != GgufValueType::ARRAY) {
      v->raw = take(scalar_size(type), "scalar value");
      return;
    }
    if (depth >= kMaxArrayNesting)
      fail("{}: corrupt GGUF: arrays nested deeper than {} ({})", file, kMaxArrayNesting, ctx);
    v->elem = read_value_type("array element type");
    v->count = read<uint64_t>("array length");
    // Smallest possible encoding of one element: guards every allocation below.
    size_t min_elem = scalar_size(v->elem);
    if (v->elem == GgufValueType::STRING) min_elem = 8;
    if (v->elem == GgufValueType::ARRAY) min_elem = 12;
    if (v->count > left() / min_elem)
      fail("{}: corrupt GGUF: array of {} {} elements at offset {} cannot fit in the {} bytes "
           "left ({})",
           file, v->count, gguf_value_type_name(v->elem), pos - 12, left(), ctx);
    if (v->elem == GgufValueType::STRING) {
      v->strs.reserve(size_t(v->count));
      for (uint64_t i = 0; i < v->count; ++i) v->strs.push_back(read_string("array string"));
    } else if (v->elem == GgufValueType::ARRAY) {
      v->items.resize(size_t(v->count));
      for (auto& item : v->items) read_value(GgufValueType::ARRAY, &item, depth + 1);
    } else {
      v->raw = take(v->count * min_elem, "array data");
    }
  }
};

}  // namespace

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::~GgufFile() = default;

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto file = MappedFile::open(path);
  auto g = parse(file->data(), file->size(), path);
  g->impl_->file = std::move(file);
  return g;
}

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* data, size_t size, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(name);
  impl->data = data;
  impl->size = size;
  const std::string& file = impl->name;
  Cursor c{data, size, 0, file};

  if (size < 4) fail("{}: not a GGUF file: only {} bytes (expected at least a 24-byte header)", file, size);
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kGgufMagic)
    fail("{}: not a GGUF file: magic is 0x{:08x}, expected 0x{:08x} (\"GGUF\")", file, magic,
         kGgufMagic);
  uint32_t version = c.read<uint32_t>("version");
  if (version == 1)
    fail("{}: GGUF version 1 is not supported (it used 32-bit counts); expected version 2 or 3 — "
         "re-convert the model with a current llama.cpp",
         file);
  if (version != 2 && version != 3) {
    if (version == 0x02000000u || version == 0x03000000u)
      fail("{}: big-endian GGUF files are not supported; expected a little-endian file", file);
    fail("{}: unsupported GGUF version {} (expected 2 or 3)", file, version);
  }
  impl->version = version;
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor
  // at least 8 (name length) + 4 (n_dims) + 8 (ne[0]) + 4 (type) + 8 (offset).
  if (n_kv > c.left() / 13)
    fail("{}: corrupt GGUF: header claims {} metadata entries but only {} bytes follow", file, n_kv,
         c.left());
  if (n_tensors > c.left() / 32)
    fail("{}: corrupt GGUF: header claims {} tensors but only {} bytes follow", file, n_tensors,
         c.left());

  for (uint64_t i = 0; i < n_kv; ++i) {
    c.ctx = fmt::format("metadata entry {} of {}", i, n_kv);
    std::string key(c.read_string("metadata key"));
    c.ctx = fmt::format("metadata key '{}'", key);
    GgufValueType type = c.read_value_type("metadata value type");
    GgufValue v;
    c.read_value(type, &v, 0);
    if (impl->kv.count(key)) fail("{}: corrupt GGUF: duplicate metadata key '{}'", file, key);
    impl->key_order.push_back(key);
    impl->kv.emplace(std::move(key), std::move(v));
  }

  if (const GgufValue* a = impl->find("general.alignment")) {
    int64_t align = 0;
    if (!is_int_type(a->type) || !decode_int(a->type, a->raw, &align))
      fail("{}: metadata key 'general.alignment' has type {}, expected uint32", file,
           gguf_value_type_name(a->type));
    if (align <= 0 || align > (int64_t(1) << 30) || (align & (align - 1)) != 0)
      fail("{}: metadata key 'general.alignment' is {}, expected a power of two", file, align);
    impl->alignment = size_t(align);
  }

  impl->tensors.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    c.ctx = fmt::format("tensor info {} of {}", i, n_tensors);
    GgufTensorInfo t;
    t.name = std::string(c.read_string("tensor name"));
    c.ctx = fmt::format("tensor '{}'", t.name);
    uint32_t n_dims = c.read<uint32_t>("tensor n_dims");
    if (n_dims < 1 || n_dims > kMaxDims)
      fail("{}: tensor '{}': n_dims is {}, expected 1 to {}", file, t.name, n_dims, kMaxDims);
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = c.read<uint64_t>("tensor dimension");
      if (ne > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("{}: tensor '{}': dimension {} is {}, expected a value below 2^63", file, t.name, d,
             ne);
      if (__builtin_mul_overflow(n_el, int64_t(ne), &n_el))
        fail("{}: tensor '{}': element count overflows 64 bits", file, t.name);
      t.ne.push_back(int64_t(ne));
    }
    uint32_t type_id = c.read<uint32_t>("tensor type");
    GgmlTypeTraits tr;
    if (!ggml_type_traits(type_id, &tr))
      fail("{}: tensor '{}': unsupported or unknown ggml type id {}", file, t.name, type_id);
    t.type = GgmlType(type_id);
    if (t.ne[0] % tr.block_size != 0)
      fail("{}: tensor '{}': row length {} is not a multiple of the {} block size {}", file, t.name,
           t.ne[0], tr.name, tr.block_size);
    uint64_t n_bytes = 0;
    if (__builtin_mul_overflow(uint64_t(n_el / tr.block_size), uint64_t(tr.block_bytes), &n_bytes))
      fail("{}: tensor '{}': byte size overflows 64 bits", file, t.name);
    t.n_bytes = size_t(n_bytes);
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % impl->alignment != 0)
      fail("{}: tensor '{}': data offset {} is not a multiple of the alignment {}", file, t.name,
           t.offset, impl->alignment);
    if (impl->tensor_index.count(t.name)) fail("{}: corrupt GGUF: duplicate tensor '{}'", file, t.name);
    impl->tensor_index.emplace(t.name, impl->tensors.size());
    impl->tensors.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  size_t a = impl->alignment;
  impl->data_offset = (c.pos + a - 1) / a * a;
  for (auto& t : impl->tensors) {
    uint64_t begin = 0;
    uint64_t end = 0;
    if (__builtin_add_overflow(uint64_t(impl->data_offset), t.offset, &begin) ||
        __builtin_add_overflow(begin, uint64_t(t.n_bytes), &end) || end > size)
      fail("{}: tensor '{}' ({} {} bytes at data offset {}) extends past the end of the file ({} "
           "bytes; data section starts at {}) — the file is truncated or corrupt",
           file, t.name, ggml_type_name(t.type), t.n_bytes, t.offset, size, impl->data_offset);
    t.data = data + begin;
  }
  return std::unique_ptr<GgufFile>(new GgufFile(std::move(impl)));
}

const std::string& GgufFile::path() const { return impl_->name; }
uint32_t GgufFile::version() const { return impl_->version; }
size_t GgufFile::alignment() const { return impl_->alignment; }
size_t GgufFile::data_offset() const { return impl_->data_offset; }
bool GgufFile::has(std::string_view key) const { return impl_->find(key) != nullptr; }
std::vector<std::string> GgufFile::keys() const { return impl_->key_order; }

std::optional<GgufValueType> GgufFile::type_of(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return std::nullopt;
  return v->type;
}

std::optional<GgufValueType> GgufFile::array_type_of(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v || v->type != GgufValueType::ARRAY) return std::nullopt;
  return v->elem;
}

size_t GgufFile::array_size(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  return v && v->type == GgufValueType::ARRAY ? size_t(v->count) : 0;
}

namespace {
[[noreturn]] void type_error(const std::string& file, std::string_view key, const GgufValue& v,
                             std::string_view expected) {
  if (v.type == GgufValueType::ARRAY)
    fail("{}: metadata key '{}' is an array of {}, expected {}", file, key,
         gguf_value_type_name(v.elem), expected);
  fail("{}: metadata key '{}' has type {}, expected {}", file, key, gguf_value_type_name(v.type),
       expected);
}
}  // namespace

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::STRING) type_error(impl_->name, key, *v, "string");
  return std::string(v->str);
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (!is_int_type(v->type)) type_error(impl_->name, key, *v, "an integer");
  int64_t out = 0;
  if (!decode_int(v->type, v->raw, &out))
    fail("{}: metadata key '{}' = {} does not fit a signed 64-bit integer", impl_->name, key,
         load<uint64_t>(v->raw));
  return out;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (is_float_type(v->type)) return decode_float(v->type, v->raw);
  if (is_int_type(v->type)) return double(*get_int(key));
  type_error(impl_->name, key, *v, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::BOOL) type_error(impl_->name, key, *v, "bool");
  return *v->raw != 0;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return {};
  if (v->type != GgufValueType::ARRAY || v->elem != GgufValueType::STRING)
    type_error(impl_->name, key, *v, "an array of strings");
  return std::vector<std::string>(v->strs.begin(), v->strs.end());
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return {};
  if (v->type != GgufValueType::ARRAY || !is_int_type(v->elem))
    type_error(impl_->name, key, *v, "an array of integers");
  size_t sz = scalar_size(v->elem);
  std::vector<int64_t> out(size_t(v->count));
  for (size_t i = 0; i < out.size(); ++i)
    if (!decode_int(v->elem, v->raw + i * sz, &out[i]))
      fail("{}: metadata key '{}': element {} does not fit a signed 64-bit integer", impl_->name,
           key, i);
  return out;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = impl_->find(key);
  if (!v) return {};
  if (v->type != GgufValueType::ARRAY || !(is_int_type(v->elem) || is_float_type(v->elem)))
    type_error(impl_->name, key, *v, "an array of numbers");
  if (is_int_type(v->elem)) {
    auto ints = get_int_array(key);
    return std::vector<double>(ints.begin(), ints.end());
  }
  size_t sz = scalar_size(v->elem);
  std::vector<double> out(size_t(v->count));
  for (size_t i = 0; i < out.size(); ++i) out[i] = decode_float(v->elem, v->raw + i * sz);
  return out;
}

const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

}  // namespace kvtier
