#include "loader/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/status.h"
#include "loader/test_model_writer.h"

namespace kvtier {
namespace {

std::vector<WriterTensor> sample_tensors() {
  std::vector<float> a(6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) - 2.5f;
  return {make_tensor("a.f32", GgmlType::F32, {2, 3}, a), make_tensor("b.bf16", GgmlType::BF16, {6}, a),
          make_tensor("c.f16", GgmlType::F16, {3, 1, 2}, a), make_tensor("scalar", GgmlType::F32, {}, {7.0f})};
}

std::unique_ptr<SafetensorsFile> parse_bytes(const std::vector<uint8_t>& b) {
  return SafetensorsFile::parse(b.data(), b.size(), "test.safetensors");
}

// A file from a raw JSON header and `n_data` zero bytes of data.
std::vector<uint8_t> raw(const std::string& header, size_t n_data) {
  std::vector<uint8_t> b(8);
  uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + n_data, 0);
  return b;
}

void expect_error(const std::vector<uint8_t>& b, std::initializer_list<const char*> parts) {
  try {
    parse_bytes(b);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("test.safetensors"), std::string::npos) << m;
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "want '" << p << "' in: " << m;
  }
}

TEST(Safetensors, RoundTrip) {
  auto tensors = sample_tensors();
  auto bytes = encode_safetensors(tensors, {{"format", "pt"}});
  auto st = parse_bytes(bytes);
  ASSERT_EQ(st->tensors().size(), tensors.size());  // __metadata__ is not a tensor
  for (const auto& w : tensors) {
    const SafetensorsTensor* t = st->find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->shape, w.shape);
    ASSERT_TRUE(t->type.has_value());
    EXPECT_EQ(*t->type, w.type);
    ASSERT_EQ(t->n_bytes, w.data.size());
    EXPECT_EQ(std::memcmp(t->data, w.data.data(), t->n_bytes), 0);
  }
  EXPECT_EQ(st->find("scalar")->n_elements(), 1);
  EXPECT_EQ(st->find("missing"), nullptr);
}

TEST(Safetensors, OtherDtypesParsedButNotComputable) {
  auto st = parse_bytes(raw(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16));
  ASSERT_EQ(st->tensors().size(), 1u);
  EXPECT_EQ(st->tensors()[0].dtype, "I64");
  EXPECT_FALSE(st->tensors()[0].type.has_value());
}

TEST(Safetensors, EmptyAndTinyFiles) {
  expect_error({1, 2, 3}, {"8-byte"});
  EXPECT_TRUE(parse_bytes(raw("{}", 0))->tensors().empty());
  EXPECT_TRUE(parse_bytes(raw(R"({"__metadata__":{"a":"b"}})", 0))->tensors().empty());
}

TEST(Safetensors, ErrorsNameTensorAndExpectation) {
  expect_error(raw("{not json", 0), {"not valid JSON"});
  expect_error(raw("[1,2]", 0), {"expected an object"});
  expect_error(raw(R"({"t":5})", 0), {"'t'", "expected an object"});
  expect_error(raw(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'t'", "dtype"});
  expect_error(raw(R"({"t":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", 4), {"'t'", "F99"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"'t'", "shape"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), {"'t'", "shape"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), {"'t'", "data_offsets"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), {"'t'", "outside"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), {"'t'", "outside"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), {"'t'", "expected 12"});
  expect_error(raw(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
               {"'t'", "overflows"});
  expect_error(raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   12),
               {"overlap"});
  // header length beyond the file and beyond the sanity limit
  std::vector<uint8_t> b = raw("{}", 0);
  uint64_t n = 1000;
  std::memcpy(b.data(), &n, 8);
  expect_error(b, {"truncated"});
  n = ~0ull;
  std::memcpy(b.data(), &n, 8);
  expect_error(b, {"limit"});
}

TEST(Safetensors, TruncationAlwaysThrows) {
  auto bytes = encode_safetensors(sample_tensors());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    EXPECT_THROW(parse_bytes(cut), Error) << "prefix of " << n << " bytes";
  }
}

TEST(Safetensors, RandomByteFlipsNeverCrash) {
  auto bytes = encode_safetensors(sample_tensors());
  std::mt19937 rng(9);
  int n_ok = 0, n_err = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    auto b = bytes;
    for (int f = 0, n_flips = 1 + int(rng() % 3); f < n_flips; ++f)
      b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8));
    try {
      auto st = parse_bytes(b);
      uint64_t sum = 0;
      for (const auto& t : st->tensors())
        for (size_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
      ++n_ok;
    } catch (const Error&) {
      ++n_err;
    }
  }
  EXPECT_GT(n_err, 100);
  EXPECT_GT(n_ok, 10);
}

}  // namespace
}  // namespace kvtier
