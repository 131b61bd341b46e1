#include "loader/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/status.h"
#include "loader/test_model_writer.h"

namespace kvtier {
namespace {

std::vector<WriterTensor> sample_tensors() {
  std::vector<float> a(64 * 2), b(3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.25f - 3.0f;
  b = {1.0f, -2.0f, 0.5f};
  return {make_tensor("w.q8", GgmlType::Q8_0, {2, 64}, a), make_tensor("v.f32", GgmlType::F32, {3}, b),
          make_tensor("m.f16", GgmlType::F16, {1, 2, 64}, a)};
}

GgufMetadata sample_metadata() {
  return {
      {"general.architecture", GgufMetaValue::str("llama")},
      {"k.u8", GgufMetaValue::u8(200)},
      {"k.i32", GgufMetaValue::i32(-7)},
      {"k.u64", GgufMetaValue::u64(1ull << 40)},
      {"k.f32", GgufMetaValue::f32(0.5f)},
      {"k.f64", GgufMetaValue::f64(-1.25)},
      {"k.bool", GgufMetaValue::boolean(true)},
      {"k.strs", GgufMetaValue::str_array({"a", "", "héllo"})},
      {"k.ints", GgufMetaValue::i32_array({1, -2, 3})},
      {"k.floats", GgufMetaValue::f32_array({0.25f, 4.0f})},
      {"k.nested", GgufMetaValue::array(GgufValueType::ARRAY, {GgufMetaValue::i32_array({1, 2}),
                                                              GgufMetaValue::i32_array({})})},
  };
}

std::unique_ptr<GgufFile> parse_bytes(const std::vector<uint8_t>& b) {
  return GgufFile::parse(b.data(), b.size(), "test.gguf");
}

std::string error_of(const std::vector<uint8_t>& b) {
  try {
    parse_bytes(b);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Gguf, RoundTripsMetadataAndTensors) {
  for (uint32_t version : {2u, 3u})
    for (size_t alignment : {size_t(32), size_t(64), size_t(1)}) {
      auto tensors = sample_tensors();
      auto bytes = encode_gguf(sample_metadata(), tensors, {version, alignment});
      auto g = parse_bytes(bytes);
      EXPECT_EQ(g->version(), version);
      EXPECT_EQ(g->alignment(), alignment);
      EXPECT_EQ(g->data_offset() % alignment, 0u);
      EXPECT_EQ(*g->get_string("general.architecture"), "llama");
      EXPECT_EQ(*g->get_int("k.u8"), 200);
      EXPECT_EQ(*g->get_int("k.i32"), -7);
      EXPECT_EQ(*g->get_int("k.u64"), int64_t(1) << 40);
      EXPECT_EQ(*g->get_float("k.f32"), 0.5);
      EXPECT_EQ(*g->get_float("k.f64"), -1.25);
      EXPECT_EQ(*g->get_float("k.i32"), -7.0);  // integers read as floats too
      EXPECT_EQ(*g->get_bool("k.bool"), true);
      EXPECT_EQ(g->get_string_array("k.strs"), (std::vector<std::string>{"a", "", "héllo"}));
      EXPECT_EQ(g->get_int_array("k.ints"), (std::vector<int64_t>{1, -2, 3}));
      EXPECT_EQ(g->get_float_array("k.floats"), (std::vector<double>{0.25, 4.0}));
      EXPECT_EQ(g->get_float_array("k.ints"), (std::vector<double>{1, -2, 3}));
      EXPECT_EQ(g->array_size("k.nested"), 2u);
      EXPECT_EQ(*g->array_type_of("k.nested"), GgufValueType::ARRAY);
      EXPECT_FALSE(g->get_int("missing").has_value());
      EXPECT_TRUE(g->get_string_array("missing").empty());
      auto keys = g->keys();
      ASSERT_GE(keys.size(), 11u);
      EXPECT_EQ(keys[0], "general.architecture");  // file order
      ASSERT_EQ(g->tensors().size(), 3u);
      for (size_t i = 0; i < tensors.size(); ++i) {
        const GgufTensorInfo* t = g->find_tensor(tensors[i].name);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->type, tensors[i].type);
        std::vector<int64_t> ne(tensors[i].shape.rbegin(), tensors[i].shape.rend());
        EXPECT_EQ(t->ne, ne);
        ASSERT_EQ(t->n_bytes, tensors[i].data.size());
        EXPECT_EQ(std::memcmp(t->data, tensors[i].data.data(), t->n_bytes), 0);
        EXPECT_EQ((t->data - bytes.data()) % alignment, 0);
      }
      EXPECT_EQ(g->find_tensor("nope"), nullptr);
    }
}

TEST(Gguf, TypeMismatchNamesKeyAndTypes) {
  auto g = parse_bytes(encode_gguf(sample_metadata(), {}));
  try {
    g->get_int("general.architecture");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("general.architecture"), std::string::npos) << m;
    EXPECT_NE(m.find("string"), std::string::npos) << m;
  }
  EXPECT_THROW(g->get_string("k.i32"), Error);
  EXPECT_THROW(g->get_bool("k.i32"), Error);
  EXPECT_THROW(g->get_float("k.strs"), Error);
  EXPECT_THROW(g->get_int_array("k.strs"), Error);
  EXPECT_THROW(g->get_string_array("k.nested"), Error);
  EXPECT_THROW(g->get_float_array("k.f32"), Error);
}

// Hand-built headers for the error cases the writer cannot produce.
struct Raw {
  std::vector<uint8_t> b;
  template <class T>
  Raw& put(T v) {
    uint8_t x[sizeof(T)];
    std::memcpy(x, &v, sizeof(T));
    b.insert(b.end(), x, x + sizeof(T));
    return *this;
  }
  Raw& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return put<uint32_t>(kGgufMagic).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Raw& pad(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

void expect_error(const std::vector<uint8_t>& b, std::initializer_list<const char*> parts) {
  std::string m = error_of(b);
  EXPECT_NE(m.find("test.gguf"), std::string::npos) << m;
  for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "want '" << p << "' in: " << m;
}

TEST(Gguf, RejectsBadHeaders) {
  expect_error({}, {"not a GGUF file"});
  expect_error(Raw().put<uint32_t>(0x12345678).pad(20).b, {"magic"});
  expect_error(Raw().header(0, 0, 1).b, {"version 1"});
  expect_error(Raw().header(0, 0, 4).b, {"version 4"});
  expect_error(Raw().header(0, 0, 0x03000000).b, {"big-endian"});
  expect_error(Raw().put<uint32_t>(kGgufMagic).put<uint32_t>(3).put<uint32_t>(0).b, {"truncated"});
  // counts that could not fit in the file
  expect_error(Raw().header(0, uint64_t(1) << 60).b, {"metadata entries"});
  expect_error(Raw().header(uint64_t(1) << 62, 0).b, {"tensors"});
}

TEST(Gguf, RejectsBadMetadata) {
  // huge string length
  expect_error(Raw().header(0, 1).put<uint64_t>(~0ull).b, {"claims"});
  // unknown value type
  expect_error(Raw().header(0, 1).str("k").put<uint32_t>(13).pad(8).b, {"unknown metadata value type 13", "'k'"});
  // array count larger than the file
  expect_error(Raw().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 61).b,
               {"arr", "cannot fit"});
  // string array count larger than the file
  expect_error(Raw().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1000).pad(16).b,
               {"cannot fit"});
  // arrays nested too deep
  Raw deep;
  deep.header(0, 1).str("deep").put<uint32_t>(9);
  for (int i = 0; i < 20; ++i) deep.put<uint32_t>(9).put<uint64_t>(1);
  deep.put<uint32_t>(0).put<uint64_t>(0);
  expect_error(deep.b, {"nested"});
  // duplicate key
  expect_error(Raw().header(0, 2).str("a").put<uint32_t>(0).put<uint8_t>(1).str("a").put<uint32_t>(0).put<uint8_t>(2).b,
               {"duplicate metadata key 'a'"});
  // bad alignment values
  expect_error(encode_gguf({{"general.alignment", GgufMetaValue::u32(48)}}, {}), {"power of two"});
  expect_error(encode_gguf({{"general.alignment", GgufMetaValue::u32(0)}}, {}), {"power of two"});
  expect_error(encode_gguf({{"general.alignment", GgufMetaValue::str("x")}}, {}), {"general.alignment"});
}

// One tensor info with the given fields, data section after it.
std::vector<uint8_t> one_tensor(uint32_t n_dims, std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                                size_t data_bytes, std::string name = "t") {
  Raw r;
  r.header(1, 0).str(name).put<uint32_t>(n_dims);
  for (uint64_t d : ne) r.put<uint64_t>(d);
  r.put<uint32_t>(type).put<uint64_t>(offset);
  r.b.resize((r.b.size() + 31) / 32 * 32, 0);
  r.pad(data_bytes);
  return r.b;
}

TEST(Gguf, RejectsBadTensorInfos) {
  EXPECT_NO_THROW(parse_bytes(one_tensor(1, {8}, 0, 0, 32)));
  expect_error(one_tensor(5, {1, 1, 1, 1, 1}, 0, 0, 4), {"'t'", "n_dims is 5"});
  expect_error(one_tensor(0, {}, 0, 0, 4), {"n_dims is 0"});
  expect_error(one_tensor(1, {8}, 99, 0, 32), {"'t'", "type id 99"});
  expect_error(one_tensor(1, {8}, 4, 0, 32), {"type id 4"});  // removed Q4_2
  expect_error(one_tensor(1, {~0ull}, 0, 0, 32), {"below 2^63"});
  expect_error(one_tensor(2, {1ull << 40, 1ull << 40}, 0, 0, 32), {"overflows"});
  expect_error(one_tensor(1, {33}, 2, 0, 32), {"not a multiple of the Q4_0 block size 32"});
  expect_error(one_tensor(1, {8}, 0, 3, 64), {"not a multiple of the alignment"});
  expect_error(one_tensor(1, {8}, 0, 0, 31), {"'t'", "past the end"});
  expect_error(one_tensor(1, {8}, 0, ~0ull / 32 * 32, 32), {"past the end"});
  Raw dup;
  dup.header(2, 0);
  for (int i = 0; i < 2; ++i) dup.str("x").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(0);
  dup.b.resize(96 + 16, 0);
  expect_error(dup.b, {"duplicate tensor 'x'"});
}

// Reads every byte a successfully parsed file exposes (ASan checks the bounds).
uint64_t touch_all(const GgufFile& g) {
  uint64_t sum = 0;
  for (const auto& k : g.keys()) {
    auto t = g.type_of(k);
    if (t == GgufValueType::STRING) sum += g.get_string(k)->size();
    if (t == GgufValueType::ARRAY) {
      auto et = g.array_type_of(k);
      if (et == GgufValueType::STRING) sum += g.get_string_array(k).size();
      else if (et == GgufValueType::FLOAT32 || et == GgufValueType::FLOAT64) sum += g.get_float_array(k).size();
      else if (et != GgufValueType::ARRAY && et != GgufValueType::BOOL) {
        try {
          sum += g.get_int_array(k).size();
        } catch (const Error&) {  // uint64 elements above int64 max
        }
      }
    }
  }
  for (const auto& t : g.tensors())
    for (size_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  return sum;
}

TEST(Gguf, TruncationAlwaysThrows) {
  auto bytes = encode_gguf(sample_metadata(), sample_tensors());
  auto full = parse_bytes(bytes);
  size_t needed = 0;
  for (const auto& t : full->tensors()) needed = std::max(needed, size_t(t.data - bytes.data()) + t.n_bytes);
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    if (n < needed) {
      EXPECT_THROW(parse_bytes(cut), Error) << "prefix of " << n << " bytes";
    } else {
      EXPECT_NO_THROW(parse_bytes(cut));  // only trailing padding is missing
    }
  }
}

TEST(Gguf, RandomByteFlipsNeverCrash) {
  auto bytes = encode_gguf(sample_metadata(), sample_tensors());
  std::mt19937 rng(42);
  int n_ok = 0, n_err = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    auto b = bytes;
    int n_flips = 1 + int(rng() % 4);
    // most flips land in the header, where the parser's decisions are
    size_t span = iter % 2 ? b.size() : std::min<size_t>(b.size(), 400);
    for (int f = 0; f < n_flips; ++f) b[rng() % span] ^= uint8_t(1u << (rng() % 8));
    try {
      auto g = parse_bytes(b);
      touch_all(*g);
      ++n_ok;
    } catch (const Error&) {
      ++n_err;
    }
  }
  EXPECT_GT(n_err, 100);  // the corruption is detected, not ignored
  EXPECT_GT(n_ok, 100);   // flips in values and tensor data are not structural
}

}  // namespace
}  // namespace kvtier
