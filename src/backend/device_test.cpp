// Buffer's views (Buffer::view): one allocation carved into buffers that do
// not own their bytes, on the CPU device (plain memory).
#include <gtest/gtest.h>

#include <cstring>
#include <utility>

#include "backend/device.h"
#include "core/status.h"

namespace kvtier {
namespace {

TEST(BufferView, AViewIsItsBytesOfTheParentAndFreesNothing) {
  Device cpu(DeviceKind::cpu);
  Buffer slab = cpu.alloc(1024);
  {
    Buffer a = Buffer::view(slab, 256, 512);
    EXPECT_EQ(a.data<char>(), slab.data<char>() + 256);
    EXPECT_EQ(a.bytes(), 512u);
    EXPECT_EQ(a.device(), DeviceKind::cpu);
    EXPECT_EQ(a.mem(), MemKind::device);
    std::memset(a.data(), 7, a.bytes());
    Buffer b = std::move(a);  // moves keep it a view
    EXPECT_FALSE(a);
    b = Buffer::view(slab, 0, 16);  // dropping a view frees nothing
    EXPECT_EQ(b.data<char>(), slab.data<char>());
    Buffer c = cpu.alloc(64);
    c = std::move(b);  // the owned buffer is freed, the view taken over
    EXPECT_EQ(c.data<char>(), slab.data<char>());
  }
  EXPECT_EQ(slab.data<char>()[255], 0);  // the parent outlives its views, bytes intact
  EXPECT_EQ(slab.data<char>()[256], 7);
  EXPECT_EQ(slab.data<char>()[767], 7);
  EXPECT_EQ(slab.data<char>()[768], 0);
}

TEST(BufferView, AHostBufferViewHasTheHostAddressToo) {
  Device cpu(DeviceKind::cpu);
  Buffer h = cpu.alloc_host(128);
  const Buffer v = Buffer::view(h, 64, 64);
  EXPECT_EQ(v.host_ptr<char>(), h.host_ptr<char>() + 64);
  EXPECT_EQ(v.mem(), MemKind::host);
}

TEST(BufferView, OutsideTheParentIsRefused) {
  Device cpu(DeviceKind::cpu);
  const Buffer slab = cpu.alloc(100);
  EXPECT_THROW(Buffer::view(slab, 90, 11), Error);
  EXPECT_THROW(Buffer::view(slab, 0, 0), Error);
  EXPECT_NO_THROW(Buffer::view(slab, 90, 10));
}

}  // namespace
}  // namespace kvtier
