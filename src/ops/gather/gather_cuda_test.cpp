#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "backend/cuda_test_util.h"
#include "ops/gather/gather.h"
#include "ops/gather/gather_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// Sorted random selection of k of n tokens per row, some -1 holes.
std::vector<int32_t> select(int64_t n_rows, int64_t n, int k, std::mt19937& rng, bool holes) {
  std::vector<int32_t> idx(size_t(n_rows * k));
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t r = 0; r < n_rows; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> pick(all.begin(), all.begin() + k);
    std::sort(pick.begin(), pick.end());
    if (holes) pick[size_t(rng() % unsigned(k))] = -1;
    std::sort(pick.begin(), pick.end());
    std::copy(pick.begin(), pick.end(), idx.begin() + r * k);
  }
  return idx;
}

struct Case {
  int64_t n_rows, n_tok;
  int k;
  int64_t entry_bytes;
  bool reuse;
};

class GatherCuda : public ::testing::TestWithParam<Case> {};

TEST_P(GatherCuda, ZeroCopyMatchesReferenceExactly) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937 rng(99 + c.k);
  GatherParams p;
  p.n_rows = c.n_rows;
  p.k = c.k;
  p.entry_bytes = c.entry_bytes;
  p.src_tok_stride = c.entry_bytes + 16;  // a gap between entries
  p.src_row_stride = c.n_tok * p.src_tok_stride;
  p.dst_row_stride = c.k * c.entry_bytes + 32;
  // arange-filled source (STYLE rule 3): each 4-byte word holds its own offset.
  PinnedBuffer src(size_t(c.n_rows * p.src_row_stride));
  uint32_t* w = src.host<uint32_t>();
  for (size_t i = 0; i < src.bytes() / 4; ++i) w[i] = uint32_t(i);
  auto idx = select(c.n_rows, c.n_tok, c.k, rng, true);
  std::vector<int32_t> prev;
  std::vector<uint8_t> prev_dst;
  if (c.reuse) {
    p.k_prev = c.k;
    prev = select(c.n_rows, c.n_tok, c.k, rng, false);
    // Make about half of the new selection hit the previous one.
    for (int64_t r = 0; r < c.n_rows; ++r)
      for (int i = 0; i < c.k; i += 2) prev[size_t(r * c.k + i)] = std::max(0, idx[size_t(r * c.k + i)]);
    for (int64_t r = 0; r < c.n_rows; ++r) {
      auto b = prev.begin() + r * c.k;
      std::sort(b, b + c.k);
      // keep entries unique: duplicates become -1 at the front
      for (int i = c.k - 1; i > 0; --i)
        if (b[i] == b[i - 1]) b[i] = -1;
      std::sort(b, b + c.k);
    }
    prev_dst.assign(size_t(c.n_rows * p.dst_row_stride), 0);
    GatherParams pp = p;
    pp.k_prev = 0;
    gather_ref(pp, src.host<uint8_t>(), prev.data(), nullptr, nullptr, prev_dst.data());
  }
  std::vector<uint8_t> ref(size_t(c.n_rows * p.dst_row_stride), 0xAB);
  const int64_t ref_misses = gather_ref(p, src.host<uint8_t>(), idx.data(), prev.empty() ? nullptr : prev.data(),
                                        prev_dst.empty() ? nullptr : prev_dst.data(), ref.data());
  auto d_idx = to_device(idx);
  auto d_prev = to_device(prev);
  auto d_prev_dst = to_device(prev_dst);
  DeviceBuffer d_dst(ref.size());
  KVT_CUDA_CHECK(cudaMemset(d_dst.data(), 0xAB, ref.size()));
  DeviceBuffer d_miss(8);
  KVT_CUDA_CHECK(cudaMemset(d_miss.data(), 0, 8));
  gather(p, src.device_ptr<uint8_t>(), d_idx.data<int32_t>(), c.reuse ? d_prev.data<int32_t>() : nullptr,
         c.reuse ? d_prev_dst.data<uint8_t>() : nullptr, d_dst.data<uint8_t>(),
         d_miss.data<unsigned long long>(), nullptr);
  auto got = to_host<uint8_t>(d_dst, ref.size());
  EXPECT_TRUE(got == ref);
  EXPECT_EQ(int64_t(to_host<unsigned long long>(d_miss, 1)[0]), ref_misses);
  if (c.reuse) EXPECT_LT(ref_misses, c.n_rows * c.k);

  if (!c.reuse) {  // the copy-engine path gives the same bytes
    DeviceBuffer d_dst2(ref.size());
    KVT_CUDA_CHECK(cudaMemset(d_dst2.data(), 0xAB, ref.size()));
    CopyStats stats;
    Stream stream;  // cudaMemcpyBatchAsync refuses the legacy default stream
    gather_memcpy(p, src.host<uint8_t>(), idx.data(), d_dst2.data<uint8_t>(), stream.get(), &stats);
    stream.synchronize();
    auto got2 = to_host<uint8_t>(d_dst2, ref.size());
    EXPECT_TRUE(got2 == ref);
    EXPECT_EQ(int64_t(stats.h2d_bytes), ref_misses * c.entry_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GatherCuda,
                         ::testing::Values(Case{8, 4096, 128, 512, false}, Case{8, 4096, 128, 256, true},
                                           Case{3, 1000, 17, 16, false}, Case{2, 50, 50, 2048, true},
                                           Case{16, 20000, 1024, 512, true}));

// Next step's selection: about `keep` of the previous one stays, the rest is
// new; sorted, unique, a few -1 holes.
std::vector<int32_t> drift(const std::vector<int32_t>& prev, int64_t n_rows, int64_t n, int k, double keep,
                           std::mt19937& rng) {
  std::vector<int32_t> out(prev.size());
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t r = 0; r < n_rows; ++r) {
    std::set<int32_t> pick;
    for (int j = 0; j < k; ++j) {
      const int32_t t = prev[size_t(r * k + j)];
      if (t >= 0 && u(rng) < keep) pick.insert(t);
    }
    while (int(pick.size()) < k - 2) pick.insert(int32_t(rng() % uint32_t(n)));
    std::vector<int32_t> v(size_t(k - int(pick.size())), -1);
    v.insert(v.end(), pick.begin(), pick.end());
    std::copy(v.begin(), v.end(), out.begin() + r * k);
  }
  return out;
}

TEST(GatherSlotsCuda, StepsMatchTheReferenceAndReadOnlyMisses) {
  KVT_REQUIRE_GPU();
  for (const auto& [n_rows, n_tok, k, entry] : {std::tuple<int64_t, int64_t, int, int64_t>{8, 4096, 128, 256},
                                                 {3, 5000, 1500, 512}, {2, 70000, 4096, 256}, {5, 40, 33, 16}}) {
    std::mt19937 rng(uint32_t(7 + k));
    GatherParams p;
    p.n_rows = n_rows;
    p.k = k;
    p.entry_bytes = entry;
    p.src_tok_stride = entry;
    p.src_row_stride = n_tok * entry;
    p.dst_row_stride = k * entry + 48;
    PinnedBuffer src(size_t(n_rows * p.src_row_stride));
    uint32_t* w = src.host<uint32_t>();
    for (size_t i = 0; i < src.bytes() / 4; ++i) w[i] = uint32_t(i);
    const size_t n_idx = size_t(n_rows * k);
    std::vector<int32_t> prev(n_idx, -1), prev_slot(n_idx, -1), idx = select(n_rows, n_tok, k, rng, true);
    std::vector<uint8_t> ref(size_t(n_rows * p.dst_row_stride), 0);
    DeviceBuffer d_idx[2] = {DeviceBuffer(n_idx * 4), DeviceBuffer(n_idx * 4)};
    DeviceBuffer d_slot[2] = {DeviceBuffer(n_idx * 4), DeviceBuffer(n_idx * 4)};
    DeviceBuffer d_scratch(size_t(gather_slots_scratch_bytes(p))), d_dst(ref.size()), d_miss(8);
    KVT_CUDA_CHECK(cudaMemset(d_idx[1].data(), 0xff, n_idx * 4));   // empty: -1
    KVT_CUDA_CHECK(cudaMemset(d_slot[1].data(), 0xff, n_idx * 4));
    KVT_CUDA_CHECK(cudaMemset(d_dst.data(), 0, ref.size()));
    for (int step = 0; step < 5; ++step) {
      const int cur = step & 1, old = 1 - cur;
      std::vector<int32_t> slot(n_idx);
      const int64_t ref_misses =
          gather_slots_ref(p, src.host<uint8_t>(), idx.data(), prev.data(), prev_slot.data(), slot.data(), ref.data());
      KVT_CUDA_CHECK(cudaMemcpy(d_idx[cur].data(), idx.data(), n_idx * 4, cudaMemcpyHostToDevice));
      KVT_CUDA_CHECK(cudaMemset(d_miss.data(), 0, 8));
      gather_slots(p, src.device_ptr<uint8_t>(), d_idx[cur].data<int32_t>(), d_idx[old].data<int32_t>(),
                   d_slot[old].data<int32_t>(), d_slot[cur].data<int32_t>(), d_scratch.data(),
                   d_dst.data<uint8_t>(), d_miss.data<unsigned long long>(), nullptr);
      auto got_slot = to_host<int32_t>(d_slot[cur], n_idx);
      ASSERT_EQ(got_slot, slot) << "step " << step << " k " << k;
      EXPECT_EQ(int64_t(to_host<unsigned long long>(d_miss, 1)[0]), ref_misses) << "step " << step;
      auto got = to_host<uint8_t>(d_dst, ref.size());
      // Every selected token's entry sits in its slot (the slots' bytes equal the reference's).
      for (int64_t r = 0; r < n_rows; ++r)
        for (int j = 0; j < k; ++j) {
          const int32_t t = idx[size_t(r * k + j)], sl = slot[size_t(r * k + j)];
          if (t < 0) continue;
          const size_t at = size_t(r * p.dst_row_stride + int64_t(sl) * entry);
          ASSERT_EQ(std::memcmp(got.data() + at, ref.data() + at, size_t(entry)), 0);
          ASSERT_EQ(std::memcmp(ref.data() + at, src.host<uint8_t>() + r * p.src_row_stride + int64_t(t) * entry,
                                size_t(entry)), 0);
        }
      if (step > 0) EXPECT_LT(ref_misses, int64_t(n_idx) / 2) << "most of a drifting selection is reused";
      prev = idx;
      prev_slot = slot;
      idx = drift(idx, n_rows, n_tok, k, 0.8, rng);
    }
  }
}

}  // namespace
}  // namespace kvtier::cuda
