// CPU decode attention (every ISA path's row kernel) against decode_attn_ref,
// on a grid of head dims, GQA groups, lengths around the kernel's 32-token
// tiles and its 8-token score blocks, with and without index lists, split
// several ways and merged by attn_merge_cpu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/status.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/decode_attn/decode_attn_kernels.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {

void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse);
void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse, float* out,
                    float* lse);

namespace {
using attn_kernels::RowKernel;

// The kernels this binary tests: the native ones, or (the emulation build)
// the AVX-512 kernel over SIMDe.
struct NamedKernel {
  std::string name;
  RowKernel fn;
  bool available;
  int width;  // head_dim must be a multiple (row_kernel_for picks a narrower kernel otherwise)
};
std::vector<NamedKernel> kernels() {
#if defined(KVT_TEST_EMULATED_AVX512)
  return {{"avx512_emulated", attn_kernels::row_avx512_emulated, true, 16}};
#else
  return {{"scalar", attn_kernels::row_scalar, true, 1},
          {"avx2", attn_kernels::row_avx2, cpu_supports(CpuPath::avx2), 8},
          {"avx512", attn_kernels::row_avx512, cpu_supports(CpuPath::avx512), 16}};
#endif
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Case {
  KvElt elt;
  int head_dim, n_head, n_kv_head;
  int64_t n_tok;
  bool use_idx;
  int n_split;
  int n_seq = 1;
};

std::string case_name(const Case& c) {
  return std::string(c.elt == KvElt::bf16 ? "bf16" : c.elt == KvElt::f32 ? "f32" : "fp8") + "_d" + std::to_string(c.head_dim) + "_h" +
         std::to_string(c.n_head) + "x" + std::to_string(c.n_kv_head) + "_n" + std::to_string(c.n_tok) +
         (c.use_idx ? "_idx" : "") + "_s" + std::to_string(c.n_split) + "_q" + std::to_string(c.n_seq);
}

// The grid: head_dim 64/128 (and 56, 80, 36 for the narrower and scalar
// fallbacks), GQA groups 1..8 (and 12: two passes of the value loop), lengths
// on both sides of the 8-token blocks and 32-token tiles.
std::vector<Case> grid() {
  std::vector<Case> cs;
  const int64_t lengths[] = {1, 7, 9, 31, 32, 33, 95, 300};
  for (KvElt elt : {KvElt::bf16, KvElt::fp8, KvElt::f32})
    for (int hd : {64, 128})
      for (int group = 1; group <= 8; ++group)
        for (int64_t n : lengths) {
          const int n_kv = group == 1 ? 2 : 3;
          const int split = n >= 300 ? 3 : (n >= 32 ? 2 : 1);
          const bool idx = (n + group) % 3 == 0;
          cs.push_back({elt, hd, n_kv * group, n_kv, n, idx, split});
        }
  cs.push_back({KvElt::bf16, 56, 4, 2, 100, false, 2});  // avx2 kernel only (56 % 16 != 0)
  cs.push_back({KvElt::fp8, 80, 6, 2, 70, true, 1});     // avx512 with 5 vectors per row
  cs.push_back({KvElt::bf16, 36, 4, 1, 50, true, 2});    // scalar fallback only (36 % 8 != 0)
  cs.push_back({KvElt::bf16, 64, 24, 2, 300, false, 4}); // group 12
  cs.push_back({KvElt::fp8, 128, 8, 2, 129, true, 3, 3});  // several sequences
  cs.push_back({KvElt::bf16, 64, 4, 4, 0, false, 2});    // no tokens: empty parts
  cs.push_back({KvElt::f32, 36, 6, 2, 40, false, 2});     // f32, scalar fallback
  return cs;
}

// Random K/V rows in the element format, laid out [rows, slots] with padding
// between rows; idx: random slots with some -1 entries.
// K of row r at rows[r], its V v_offset bytes further (both in one buffer).
struct Inputs {
  DecodeAttnParams p;
  std::vector<uint8_t> kv;
  std::vector<const uint8_t*> rows;
  std::vector<int32_t> idx;
  std::vector<float> q;
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  Inputs in;
  DecodeAttnParams& p = in.p;
  p.n_seq = c.n_seq;
  p.n_head = c.n_head;
  p.n_kv_head = c.n_kv_head;
  p.head_dim = c.head_dim;
  p.scale = 1.f / std::sqrt(float(c.head_dim));
  p.elt = c.elt;
  const int64_t eb = c.elt == KvElt::bf16 ? 2 : c.elt == KvElt::f32 ? 4 : 1;
  const int64_t n_slots = c.n_tok + 5;
  p.tok_stride = c.head_dim * eb + 16;
  const int64_t row_stride = n_slots * p.tok_stride + 32;
  p.n_tok_fixed = p.n_tok_max = c.n_tok;
  const int64_t n_rows = int64_t(c.n_seq) * c.n_kv_head;
  p.v_offset = n_rows * row_stride;
  in.kv.assign(size_t(2 * n_rows * row_stride), 0);
  for (int64_t r = 0; r < n_rows; ++r) in.rows.push_back(in.kv.data() + r * row_stride);
  for (int kv = 0; kv < 2; ++kv) {
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t s = 0; s < n_slots; ++s)
        for (int d = 0; d < c.head_dim; ++d) {
          uint8_t* at = in.kv.data() + kv * p.v_offset + r * row_stride + s * p.tok_stride + d * eb;
          const float x = 2.f * g(rng);
          if (eb == 4) {
            std::memcpy(at, &x, 4);
          } else if (eb == 2) {
            const uint16_t b = f32_to_bf16(x);
            std::memcpy(at, &b, 2);
          } else {
            *at = f32_to_e4m3(x);
          }
        }
  }
  if (c.use_idx) {
    p.idx_stride = c.n_tok + 3;
    in.idx.assign(size_t(n_rows * p.idx_stride), 0);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t j = 0; j < c.n_tok; ++j)
        in.idx[size_t(r * p.idx_stride + j)] = (j % 5 == 2) ? -1 : int32_t(rng() % uint32_t(n_slots));
  }
  in.q.resize(size_t(c.n_seq) * c.n_head * c.head_dim);
  for (float& x : in.q) x = 1.5f * g(rng);
  return in;
}

class DecodeAttnCpu : public ::testing::TestWithParam<NamedKernel> {};

TEST_P(DecodeAttnCpu, SplitsMergeToTheReference) {
  const NamedKernel& kern = GetParam();
  if (!kern.available) GTEST_SKIP() << "this CPU has no " << kern.name;
  uint32_t seed = 1;
  for (const Case& c : grid()) {
    if (c.head_dim % kern.width != 0) continue;
    SCOPED_TRACE(case_name(c));
    const Inputs in = make_inputs(c, seed++);
    const int64_t n_qh = int64_t(c.n_seq) * c.n_head;
    const int32_t* idx = c.use_idx ? in.idx.data() : nullptr;
    std::vector<float> ref_out(static_cast<size_t>(n_qh * c.head_dim)), ref_lse(static_cast<size_t>(n_qh));
    decode_attn_ref(in.p, in.q.data(), in.rows.data(), idx, ref_out.data(), ref_lse.data());
    // Parts [1, 1 + n_split) from the kernel, part 0 an empty call (as the
    // resident half of a tiered step would be when it holds nothing).
    DecodeAttnParams p = in.p;
    p.n_split = c.n_split;
    p.part0 = 1;
    const int n_part = c.n_split + 1;
    std::vector<float> po(size_t(n_part * n_qh * c.head_dim), NAN), pl(size_t(n_part * n_qh), NAN);
    attn_kernels::decode_attn_with(kern.fn, p, in.q.data(), in.rows.data(), idx, po.data(), pl.data());
    DecodeAttnParams p0 = in.p;
    p0.n_tok_fixed = 0;
    attn_kernels::decode_attn_with(kern.fn, p0, in.q.data(), in.rows.data(), nullptr, po.data(), pl.data());
    for (float x : po) ASSERT_FALSE(std::isnan(x));
    for (int64_t i = 0; i < n_qh; ++i) ASSERT_EQ(pl[size_t(i)], -INFINITY);
    std::vector<float> out(ref_out.size(), NAN), lse(ref_lse.size(), NAN);
    attn_merge_cpu(n_part, n_qh, c.head_dim, po.data(), pl.data(), out.data(), lse.data());
    if (c.n_tok == 0) {
      for (float x : out) ASSERT_EQ(x, 0.f);
      for (float x : lse) ASSERT_EQ(x, -INFINITY);
      continue;
    }
    EXPECT_LT(rel_l2(out, ref_out), 1e-5);
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref_lse[i], 2e-5 * (1 + std::abs(ref_lse[i])));
    // The CPU merge agrees with the reference merge of the same parts.
    std::vector<float> mref(out.size()), lref(lse.size());
    attn_merge_ref(n_part, n_qh, c.head_dim, po.data(), pl.data(), mref.data(), lref.data());
    EXPECT_LT(rel_l2(out, mref), 1e-6);
  }
}

// The kernel runs a task's heads tile by tile in turn; each head's parts must
// be bit for bit what the kernel computes for that head alone.
attn_kernels::RowKernel g_alone_inner = nullptr;
void one_job_at_a_time(const attn_kernels::RowJob* jobs, int n_jobs) {
  for (int i = 0; i < n_jobs; ++i) g_alone_inner(jobs + i, 1);
}

TEST_P(DecodeAttnCpu, HeadsRunTogetherAsEachAlone) {
  const NamedKernel& kern = GetParam();
  if (!kern.available) GTEST_SKIP() << "this CPU has no " << kern.name;
  g_alone_inner = kern.fn;
  uint32_t seed = 100;
  int n_grouped = 0;
  for (const Case& c : grid()) {
    if (c.head_dim % kern.width != 0 || c.n_kv_head < 2) continue;
    SCOPED_TRACE(case_name(c));
    ++n_grouped;
    const Inputs in = make_inputs(c, seed++);
    const int64_t n_qh = int64_t(c.n_seq) * c.n_head;
    const int32_t* idx = c.use_idx ? in.idx.data() : nullptr;
    DecodeAttnParams p = in.p;
    p.n_split = c.n_split;
    std::vector<float> po(size_t(c.n_split * n_qh * c.head_dim), NAN), pl(size_t(c.n_split * n_qh), NAN);
    std::vector<float> ao(po), al(pl);
    attn_kernels::decode_attn_with(kern.fn, p, in.q.data(), in.rows.data(), idx, po.data(), pl.data());
    attn_kernels::decode_attn_with(one_job_at_a_time, p, in.q.data(), in.rows.data(), idx, ao.data(), al.data());
    for (size_t i = 0; i < po.size(); ++i) ASSERT_EQ(std::memcmp(&po[i], &ao[i], 4), 0) << i;
    for (size_t i = 0; i < pl.size(); ++i) ASSERT_EQ(std::memcmp(&pl[i], &al[i], 4), 0) << i;
  }
  EXPECT_GT(n_grouped, 10);
}

INSTANTIATE_TEST_SUITE_P(Kernels, DecodeAttnCpu, ::testing::ValuesIn(kernels()),
                         [](const ::testing::TestParamInfo<NamedKernel>& i) { return i.param.name; });

using ExpFn = void (*)(const float*, int64_t, float*);
ExpFn exp_for(const std::string& name) {
#if defined(KVT_TEST_EMULATED_AVX512)
  return name == "avx512_emulated" ? attn_kernels::exp_avx512_emulated : nullptr;
#else
  if (name == "avx2") return attn_kernels::exp_avx2;
  if (name == "avx512") return attn_kernels::exp_avx512;
  return nullptr;
#endif
}

class ExpKernel : public ::testing::TestWithParam<NamedKernel> {};

// The vector e^x against std::exp over the range softmax uses (x <= 0), its
// underflow edge and -inf.
TEST_P(ExpKernel, MatchesStdExp) {
  const NamedKernel& kern = GetParam();
  const ExpFn fn = exp_for(kern.name);
  if (!kern.available || !fn) GTEST_SKIP() << "no vector exp for " << kern.name << " here";
  std::vector<float> x;
  for (float v = -90.f; v <= 2.f; v += 0.0137f) x.push_back(v);
  x.push_back(0.f);
  x.push_back(-INFINITY);
  x.push_back(-87.3f);
  std::vector<float> y(x.size());
  fn(x.data(), int64_t(x.size()), y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = x[i] < -87.33654f ? 0.0 : std::exp(double(x[i]));
    ASSERT_NEAR(y[i], want, 4e-7 * want + 1e-38) << "x = " << x[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ExpKernel, ::testing::ValuesIn(kernels()),
                         [](const ::testing::TestParamInfo<NamedKernel>& i) { return i.param.name; });

#if !defined(KVT_TEST_EMULATED_AVX512)
TEST(DecodeAttnCpu, KernelChoiceFollowsHeadDim) {
  using namespace attn_kernels;
  EXPECT_EQ(row_kernel_for(CpuPath::avx2, 128), row_avx2);
  EXPECT_EQ(row_kernel_for(CpuPath::avx2, 56), row_avx2);
  EXPECT_EQ(row_kernel_for(CpuPath::avx2, 36), row_scalar);
  EXPECT_EQ(row_kernel_for(CpuPath::avx512, 56), row_avx2);
  EXPECT_EQ(row_kernel_for(CpuPath::avx512, 64), cpu_supports(CpuPath::avx512) ? row_avx512 : row_avx2);
}

TEST(DecodeAttnCpu, RejectsBadShapes) {
  DecodeAttnParams p;
  p.n_head = 10;
  p.n_kv_head = 4;
  float o = 0, l = 0;
  EXPECT_THROW(decode_attn_cpu(p, nullptr, nullptr, nullptr, &o, &l), Error);
  p.n_head = 8;
  p.n_split = 0;
  EXPECT_THROW(decode_attn_cpu(p, nullptr, nullptr, nullptr, &o, &l), Error);
  EXPECT_THROW(attn_merge_cpu(0, 1, 64, &o, &l, &o, &l), Error);
}
#endif

}  // namespace
}  // namespace kvtier
