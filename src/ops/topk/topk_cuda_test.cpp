#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/topk/topk.h"
#include "ops/topk/topk_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

enum class Fill { arange_shuffled, random, ties, negative, constant, special };

void check(int64_t n_rows, int64_t n, int k, Fill fill, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t stride = n + 3;
  std::vector<float> s(size_t(n_rows * stride), NAN);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = s.data() + r * stride;
    if (fill == Fill::arange_shuffled) {
      std::vector<int64_t> perm(static_cast<size_t>(n));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t i = 0; i < n; ++i) row[i] = float(perm[size_t(i)]);
    } else if (fill == Fill::special) {
      // Signed zeros, infinities and NaNs of both signs; 0xffffffff has order key 0.
      const uint32_t bits[] = {0xffffffffu, 0xffc00000u, 0xff800000u, 0xbf800000u, 0x80000000u,
                               0x00000000u, 0x3f800000u, 0x7f800000u, 0x7fc00000u, 0x7f800001u};
      std::uniform_int_distribution<int> pick(0, 9);
      for (int64_t i = 0; i < n; ++i) row[i] = std::bit_cast<float>(bits[pick(rng)]);
    } else if (fill == Fill::constant) {
      std::fill_n(row, n, 0.5f);
    } else {
      std::normal_distribution<float> g(0.f, 3.f);
      std::uniform_int_distribution<int> few(0, 7);
      for (int64_t i = 0; i < n; ++i)
        row[i] = fill == Fill::ties ? float(few(rng)) : fill == Fill::negative ? -std::abs(g(rng)) : g(rng);
    }
  }
  // The reference reads packed rows.
  std::vector<float> packed(size_t(n_rows * n));
  for (int64_t r = 0; r < n_rows; ++r) std::copy_n(s.data() + r * stride, n, packed.data() + r * n);
  const int64_t kk = std::min<int64_t>(k, n);
  std::vector<int32_t> ref(size_t(n_rows * kk));
  topk_ref(packed.data(), n_rows, n, k, 5, ref.data());
  auto d_s = to_device(s);
  DeviceBuffer d_out(ref.size() * 4 + 64);
  poison(d_out);
  topk(d_s.data<float>(), n_rows, n, stride, k, 5, d_out.data<int32_t>(), nullptr);
  auto got = to_host<int32_t>(d_out, ref.size() + 16);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i], ref[i]) << "entry " << i << " n " << n << " k " << k;
  for (size_t i = ref.size(); i < got.size(); ++i) ASSERT_EQ(got[i], -1) << "guard band written at " << i;
}

TEST(TopkCuda, ExactOnArangeGrid) {
  KVT_REQUIRE_GPU();
  for (int64_t n : {1, 100, 1024, 4097, 65536, 131072})
    for (int k : {1, 7, 64, 2048, 4096}) check(3, n, k, Fill::arange_shuffled, uint32_t(n * 31 + k));
}

TEST(TopkCuda, ExactOnRandomTiesAndNegatives) {
  KVT_REQUIRE_GPU();
  for (int64_t n : {333, 50000})
    for (int k : {5, 300, 4096}) {
      check(8, n, k, Fill::random, 11);
      check(2, n, k, Fill::ties, 12);
      check(2, n, k, Fill::negative, 13);
    }
}

// A row is split over a cluster of blocks: rows shorter than the cluster,
// lengths that are not multiples of 4, chunks longer than one register tile
// (n > 131072), more rows than clusters fit on the GPU at once.
TEST(TopkCuda, ExactAcrossClusterChunks) {
  KVT_REQUIRE_GPU();
  for (int64_t n : {2, 3, 5, 9, 31, 257, 1001})
    for (int k : {1, int(n / 2), int(n - 1)}) check(3, n, k, Fill::arange_shuffled, uint32_t(n + k));
  for (int64_t n : {131073, 300001})
    for (int k : {1, 4096, 150000, int(n - 1)}) check(2, n, k, Fill::arange_shuffled, uint32_t(n ^ k));
  check(40, 20000, 1000, Fill::random, 21);
  check(40, 20000, 1000, Fill::ties, 22);
}

// Ties that span every block of the cluster: the lowest indices of the row win.
TEST(TopkCuda, ExactOnConstantAndSpecialValues) {
  KVT_REQUIRE_GPU();
  for (int64_t n : {100, 4097, 131072, 131075})
    for (int k : {1, 63, 4096}) {
      check(2, n, k, Fill::constant, 31);
      check(2, n, k, Fill::special, 32);
      check(2, n, k, Fill::ties, 33);
    }
}

}  // namespace
}  // namespace kvtier::cuda
