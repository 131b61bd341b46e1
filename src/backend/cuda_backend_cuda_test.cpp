#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "backend/device.h"
#include "backend/pinned_arena.h"

namespace kvtier::cuda {
namespace {

TEST(CudaBackend, DeviceSummaryNamesTheDeviceOrWhyNone) {
  const std::string s = cuda_device_summary();
  EXPECT_FALSE(s.empty());
  if (cuda_device_count() == 0) {
    EXPECT_NE(s.find("no CUDA device"), std::string::npos) << s;
  }
}

TEST(CudaBackend, PinnedRoundTripThroughDeviceAndMappedPointer) {
  KVT_REQUIRE_GPU();
  const size_t n = (1 << 20) + 13;
  PinnedBuffer host(n), back(n);
  for (size_t i = 0; i < n; ++i) host.host<uint8_t>()[i] = uint8_t(i * 131 + 7);
  DeviceBuffer dev(n);
  Stream s;
  CopyStats stats;
  copy_h2d_async(dev.data(), host.host(), n, s.get(), &stats);
  copy_d2h_async(back.host(), dev.data(), n, s.get(), &stats);
  s.synchronize();
  EXPECT_EQ(std::memcmp(host.host(), back.host(), n), 0);
  EXPECT_EQ(stats.h2d_bytes, n);
  EXPECT_EQ(stats.d2h_bytes, n);
  EXPECT_EQ(stats.n_copies, 2u);
  EXPECT_NE(host.device_ptr(), nullptr);
}

TEST(CudaBackend, EventsTimeForward) {
  KVT_REQUIRE_GPU();
  Stream s;
  Event a, b;
  DeviceBuffer d(64 << 20);
  a.record(s.get());
  fill_random_bytes(d.data(), int64_t(d.bytes()), 1, s.get());
  b.record(s.get());
  b.synchronize();
  EXPECT_GT(b.elapsed_ms_since(a), 0.0f);
}

TEST(CudaBackend, FillIsReproducibleAndInRange) {
  KVT_REQUIRE_GPU();
  const int64_t n = 100003;
  DeviceBuffer a(n * 2), b(n * 2);
  fill_uniform_bf16(a.data(), n, 42, -0.5f, 0.5f, nullptr);
  fill_uniform_bf16(b.data(), n, 42, -0.5f, 0.5f, nullptr);
  auto ha = testing::to_host<uint16_t>(a, size_t(n)), hb = testing::to_host<uint16_t>(b, size_t(n));
  EXPECT_EQ(ha, hb);
  double sum = 0;
  for (auto x : ha) {
    float f = bf16_to_f32(x);
    ASSERT_GE(f, -0.5f);
    ASSERT_LE(f, 0.5f);
    sum += f;
  }
  EXPECT_LT(std::abs(sum / n), 0.01);
}

TEST(CudaBackend, HugeAllocationIsALimitErrorNotACrash) {
  KVT_REQUIRE_GPU();
  EXPECT_THROW(DeviceBuffer(size_t(1) << 50), LimitError);
}

// The host tier's Buffers come from the pinned pool: a freed block is reused
// without pinning again, blocks carved from one slab are mapped at their own
// offsets (a copy through the device address reads the right bytes), an
// impossible request is a LimitError that names the pool.
TEST(CudaBackend, HostTierBuffersReuseThePinnedPool) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const size_t n = size_t(24) << 20;
  { Buffer warm = dev.alloc_host(n); }
  const PinnedStats before = pinned_host_stats();
  ASSERT_GE(before.pinned_bytes, int64_t(n));
  std::vector<Buffer> bufs;
  for (int i = 0; i < 3; ++i) bufs.push_back(dev.alloc_host(n / 3));  // fit in the freed block: no pin
  EXPECT_EQ(pinned_host_stats().pinned_bytes, before.pinned_bytes);
  EXPECT_EQ(pinned_host_stats().pin_seconds, before.pin_seconds);
  for (int i = 0; i < 3; ++i) {
    auto* h = bufs[size_t(i)].host_ptr<uint8_t>();
    for (size_t k = 0; k < n / 3; ++k) h[k] = uint8_t(k * 7 + i);
  }
  Buffer d = dev.alloc(n / 3);
  for (int i = 0; i < 3; ++i) {
    copy(dev.exec(), d.data(), bufs[size_t(i)].data(), n / 3);  // device address of the middle of a slab
    std::vector<uint8_t> back(n / 3);
    sync(dev.exec());
    KVT_CUDA_CHECK(cudaMemcpy(back.data(), d.data(), back.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t k = 0; k < back.size(); ++k) bad += back[k] != uint8_t(k * 7 + i);
    EXPECT_EQ(bad, 0u) << "block " << i;
  }
  EXPECT_THROW(dev.alloc_host(size_t(1) << 50), LimitError);
}

// pin_host pins ahead (later buffers take the pool's memory without pinning),
// and refuses more than the machine has before pinning any of it.
TEST(CudaBackend, PinHostPinsAheadOrRefusesAtOnce) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const int64_t before = pinned_host_stats().pinned_bytes;
  pin_host(size_t(before) + (size_t(96) << 20));
  const PinnedStats ahead = pinned_host_stats();
  EXPECT_GE(ahead.pinned_bytes, before + (int64_t(96) << 20));
  { Buffer b = dev.alloc_host(size_t(80) << 20); }
  EXPECT_EQ(pinned_host_stats().pin_seconds, ahead.pin_seconds);
  try {
    pin_host(size_t(1) << 50);
    ADD_FAILURE() << "pinning a PiB succeeded";
  } catch (const LimitError& e) {
    EXPECT_NE(std::string(e.what()).find("available"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pinned_host_stats().pin_seconds, ahead.pin_seconds);  // refused before pinning
}

}  // namespace
}  // namespace kvtier::cuda
