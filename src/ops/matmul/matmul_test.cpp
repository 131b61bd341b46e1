#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/ggml_type.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/matmul/matmul.h"
#include "ops/matmul/matmul_kernels.h"

namespace kvtier {
namespace {

struct Case {
  GgmlType type;
  int64_t n_out, n_in, n_tok;
};

std::vector<uint8_t> make_weight(GgmlType type, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.5f);
  const size_t row_bytes = ggml_row_bytes(type, n_in);
  std::vector<uint8_t> w(row_bytes * size_t(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& x : row) x = nd(rng);
    quantize_row(type, row.data(), w.data() + size_t(r) * row_bytes, n_in);
  }
  return w;
}

#if !defined(KVT_TEST_EMULATED_AVX512)
class MatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTest, FastMatchesReference) {
  const Case c = GetParam();
  std::mt19937 rng(1234 + int(c.type) * 7 + int(c.n_tok));
  auto w_bytes = make_weight(c.type, c.n_out, c.n_in, rng);
  WeightView w{c.type, w_bytes.data(), c.n_out, c.n_in, ggml_row_bytes(c.type, c.n_in)};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(c.n_tok * c.n_in));  // [n_tok, n_in]
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(size_t(c.n_tok * c.n_out), NAN), y_ref(y.size()), y_q8(y.size());
  ThreadPool pool(2);
  matmul(w, x.data(), c.n_tok, y.data(), pool);
  matmul_ref(w, x.data(), c.n_tok, y_ref.data());
  const bool quantized_path = c.n_tok < 16 && c.type != GgmlType::F32;
  if (quantized_path) matmul_q8_ref(w, x.data(), c.n_tok, y_q8.data());
  double err = 0, norm = 0, err_q8 = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << i;
    err += (y[i] - y_ref[i]) * double(y[i] - y_ref[i]);
    norm += double(y_ref[i]) * y_ref[i];
    if (quantized_path) err_q8 = std::max(err_q8, double(std::fabs(y[i] - y_q8[i])));
  }
  const double rel = std::sqrt(err / norm);
  // Exact-weights paths (sgemm, f32) agree to float rounding; the quantized
  // path loses ~1/254 of each activation block's range.
  EXPECT_LT(rel, quantized_path ? 2e-2 : 1e-5) << "relative error vs f64 reference";
  if (quantized_path) EXPECT_LT(err_q8, 1e-3) << "fast path must equal the int8 reference";
}

INSTANTIATE_TEST_SUITE_P(
    Grid, MatmulTest,
    ::testing::Values(Case{GgmlType::F32, 37, 64, 1}, Case{GgmlType::F32, 37, 64, 20},
                      Case{GgmlType::Q4_0, 64, 128, 1}, Case{GgmlType::Q4_0, 65, 256, 3},
                      Case{GgmlType::Q4_1, 64, 576, 1}, Case{GgmlType::Q4_1, 33, 96, 2},
                      Case{GgmlType::Q8_0, 40, 576, 1}, Case{GgmlType::Q8_0, 40, 64, 5},
                      Case{GgmlType::Q4_1, 70, 576, 17}, Case{GgmlType::Q8_0, 19, 128, 40},
                      Case{GgmlType::Q4_0, 8, 32, 16}));

// q/k/v-like matrices of different types and heights in one group: the same
// numbers as one matmul() each.
TEST(Matmul, GroupEqualsSeparateCalls) {
  std::mt19937 rng(99);
  const int64_t n_in = 576;
  const GgmlType types[3] = {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0};
  const int64_t n_out[3] = {576, 192, 67};
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<WeightView> w;
  for (int i = 0; i < 3; ++i) bytes.push_back(make_weight(types[i], n_out[i], n_in, rng));
  for (int i = 0; i < 3; ++i) w.push_back({types[i], bytes[i].data(), n_out[i], n_in, ggml_row_bytes(types[i], n_in)});
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  for (int64_t n_tok : {1, 2, 20}) {
    std::vector<float> x(size_t(n_tok * n_in));
    for (auto& v : x) v = nd(rng);
    std::vector<std::vector<float>> y(3), y1(3);
    for (int i = 0; i < 3; ++i) {
      y[i].assign(size_t(n_tok * n_out[i]), NAN);
      y1[i].assign(y[i].size(), NAN);
      matmul(w[i], x.data(), n_tok, y1[i].data(), pool);
    }
    const WeightView* ws[3] = {&w[0], &w[1], &w[2]};
    float* ys[3] = {y[0].data(), y[1].data(), y[2].data()};
    matmul_group(ws, ys, 3, x.data(), n_tok, pool);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], y1[i]) << "matrix " << i << ", " << n_tok << " tokens";
  }
}

// -t reaches the prefill GEMMs: the engine passes its thread count here.
TEST(Matmul, BlasThreadsFollowTheSetting) {
  const int before = blas_threads();
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(0);  // no setting: unchanged
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(before);
  EXPECT_EQ(blas_threads(), before);
}

TEST(Matmul, RejectsUnsupportedType) {
  std::vector<uint8_t> w(210);
  WeightView v{GgmlType::Q6_K, w.data(), 1, 256, 210};
  std::vector<float> x(256), y(1);
  ThreadPool pool(1);
  EXPECT_THROW(matmul(v, x.data(), 1, y.data(), pool), std::exception);
}

#endif

// Each ISA path's row kernel against the int8 reference (matmul_q8_ref): row
// counts around the kernels' 4-row groups, odd and even block counts (the
// AVX-512 kernel takes blocks in pairs), several tokens.
struct NamedKernel {
  std::string name;
  matmul_kernels::RowsKernel fn;
  bool available;
};
std::vector<NamedKernel> kernels() {
#if defined(KVT_TEST_EMULATED_AVX512)
  return {{"avx512_emulated", matmul_kernels::rows_avx512_emulated, true}};
#else
  return {{"avx2", matmul_kernels::rows_avx2, cpu_supports(CpuPath::avx2)},
          {"avx512", matmul_kernels::rows_avx512, cpu_supports(CpuPath::avx512)}};
#endif
}

class MatmulKernel : public ::testing::TestWithParam<NamedKernel> {};

TEST_P(MatmulKernel, MatchesInt8Reference) {
  const NamedKernel& k = GetParam();
  if (!k.available) GTEST_SKIP() << "this CPU has no " << k.name;
  ThreadPool pool(2);
  int seed = 7;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0})
    for (int64_t n_out : {1, 3, 4, 5, 9, 67})
      for (int64_t n_in : {32, 64, 96, 576})
        for (int64_t n_tok : {1, 3}) {
          SCOPED_TRACE(std::string(ggml_type_name(type)) + " " + std::to_string(n_out) + "x" +
                       std::to_string(n_in) + " tokens " + std::to_string(n_tok));
          std::mt19937 rng(seed++);
          auto w_bytes = make_weight(type, n_out, n_in, rng);
          WeightView w{type, w_bytes.data(), n_out, n_in, ggml_row_bytes(type, n_in)};
          std::normal_distribution<float> nd(0.0f, 1.0f);
          std::vector<float> x(size_t(n_tok * n_in));
          for (auto& v : x) v = nd(rng);
          std::vector<float> y(size_t(n_tok * n_out), NAN), y_q8(y.size());
          const WeightView* ws[1] = {&w};
          float* ys[1] = {y.data()};
          matmul_kernels::matmul_quantized_with(k.fn, ws, ys, 1, x.data(), n_tok, pool);
          matmul_q8_ref(w, x.data(), n_tok, y_q8.data());
          for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], y_q8[i], 1e-4 * (1 + std::fabs(y_q8[i]))) << i;
        }
}

// A batch of decode tokens (the engine's batched step) gives each token the
// bits it gets alone, across several of the kernel's row blocks.
TEST_P(MatmulKernel, EachTokenOfABatchEqualsItsSoloProduct) {
  const NamedKernel& k = GetParam();
  if (!k.available) GTEST_SKIP() << "this CPU has no " << k.name;
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0}) {
    const int64_t n_in = 1024, n_tok = 7;
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    const int64_t n_out = 3 * matmul_kernels::kRowBlockBytes / int64_t(row_bytes) + 5;
    auto w_bytes = make_weight(type, n_out, n_in, rng);
    WeightView w{type, w_bytes.data(), n_out, n_in, row_bytes};
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(n_tok * n_in));
    for (auto& v : x) v = nd(rng);
    const WeightView* ws[1] = {&w};
    std::vector<float> y(size_t(n_tok * n_out), NAN), y1(size_t(n_out), NAN);
    float* ys[1] = {y.data()};
    matmul_kernels::matmul_quantized_with(k.fn, ws, ys, 1, x.data(), n_tok, pool);
    for (int64_t t = 0; t < n_tok; ++t) {
      float* y1s[1] = {y1.data()};
      matmul_kernels::matmul_quantized_with(k.fn, ws, y1s, 1, x.data() + t * n_in, 1, pool);
      for (int64_t r = 0; r < n_out; ++r)
        ASSERT_EQ(y[size_t(t * n_out + r)], y1[size_t(r)]) << ggml_type_name(type) << " token " << t << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, MatmulKernel, ::testing::ValuesIn(kernels()),
                         [](const ::testing::TestParamInfo<NamedKernel>& i) { return i.param.name; });

}  // namespace
}  // namespace kvtier
