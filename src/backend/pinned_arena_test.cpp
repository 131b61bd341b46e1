// PinnedArena over plain memory: blocks carved from slabs, reused without
// pinning again, merged when freed, trimmed, pinned ahead; a pin that fails.
#include "backend/pinned_arena.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/status.h"

namespace kvtier {
namespace {

constexpr size_t MiB = size_t(1) << 20;

// Plain memory standing in for page-locked memory, with a cap like the
// machine's lockable memory, counting every pin. The "device address" is the
// host address moved by a constant, as under a mapping, never dereferenced.
struct CountingPinner {
  size_t limit = size_t(1) << 40;
  size_t pinned = 0;
  int n_pins = 0, n_unpins = 0;
  std::map<void*, size_t> live;
  std::mutex mu;  // the arena pins outside its lock: two threads may pin at once
  static constexpr uintptr_t kDevShift = uintptr_t(1) << 44;

  PinnedArena::Pinner make() {
    return PinnedArena::Pinner{[this](size_t n) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 if (pinned + n > limit) return PinnedBlock{};
                                 void* p = std::aligned_alloc(4096, n);
                                 ++n_pins;
                                 pinned += n;
                                 live[p] = n;
                                 return PinnedBlock{p, reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + kDevShift)};
                               },
                               [this](void* p) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 ++n_unpins;
                                 pinned -= live.at(p);
                                 live.erase(p);
                                 std::free(p);
                               }};
  }
};

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(PinnedArena, FreedBlocksAreReusedWithoutPinningAgain) {
  CountingPinner pin;
  PinnedArena arena(pin.make(), 4 * MiB, 16 * MiB);
  PinnedBlock a = arena.alloc(1 * MiB), b = arena.alloc(1000);
  ASSERT_TRUE(a.host && b.host);
  EXPECT_EQ(pin.n_pins, 1);  // one 4 MiB slab holds both
  EXPECT_EQ(addr(a.host) % PinnedArena::kAlign, 0u);
  EXPECT_EQ(addr(b.host) % PinnedArena::kAlign, 0u);
  EXPECT_EQ(addr(a.dev) - addr(a.host), CountingPinner::kDevShift);  // the slab's mapping, offset kept
  EXPECT_EQ(addr(b.dev) - addr(b.host), CountingPinner::kDevShift);
  EXPECT_TRUE(addr(b.host) >= addr(a.host) + MiB || addr(a.host) >= addr(b.host) + 1024);  // disjoint
  EXPECT_EQ(arena.stats().in_use_bytes, int64_t(MiB + 1024));
  arena.free(a.host);
  arena.free(b.host);
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
  for (int r = 0; r < 10; ++r) {  // a sequence's buffers, again and again: no pin
    PinnedBlock c = arena.alloc(3 * MiB);
    ASSERT_TRUE(c.host);
    arena.free(c.host);
  }
  EXPECT_EQ(pin.n_pins, 1);
  EXPECT_EQ(arena.stats().pinned_bytes, int64_t(4 * MiB));
}

TEST(PinnedArena, FreeNeighboursMergeWithinASlabOnly) {
  CountingPinner pin;
  PinnedArena arena(pin.make(), 4 * MiB, 4 * MiB);
  PinnedBlock a = arena.alloc(MiB), b = arena.alloc(MiB), c = arena.alloc(MiB), d = arena.alloc(MiB);
  ASSERT_EQ(pin.n_pins, 1);
  arena.free(a.host);
  arena.free(c.host);
  PinnedBlock e = arena.alloc(2 * MiB);  // a and c are 1 MiB holes apart: a new slab
  EXPECT_EQ(pin.n_pins, 2);
  arena.free(b.host);  // a|b|c merge into 3 MiB
  PinnedBlock f = arena.alloc(3 * MiB);
  EXPECT_EQ(pin.n_pins, 2);
  EXPECT_EQ(f.host, a.host);
  // Two slabs may happen to be adjacent in memory; a block never spans them.
  arena.free(d.host);
  arena.free(e.host);
  arena.free(f.host);
  PinnedBlock g = arena.alloc(5 * MiB);  // more than a slab: a slab of its own
  EXPECT_EQ(pin.n_pins, 3);
  arena.free(g.host);
  EXPECT_EQ(arena.trim(), int64_t(4 * MiB + 4 * MiB + 6 * MiB));  // 5 MiB rounds up to whole 2 MiB pages
  EXPECT_EQ(pin.n_unpins, 3);
  EXPECT_EQ(arena.stats().pinned_bytes, 0);
  EXPECT_EQ(arena.stats().n_slabs, 0);
}

TEST(PinnedArena, SlabsGrowWithWhatIsPinned) {
  CountingPinner pin;
  PinnedArena arena(pin.make(), 2 * MiB, 8 * MiB);
  std::vector<PinnedBlock> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(arena.alloc(2 * MiB));  // slabs of 2, 2, 4 and 8 MiB, the last two holding two blocks each
  EXPECT_EQ(pin.n_pins, 4);
  EXPECT_EQ(arena.stats().pinned_bytes, int64_t(16 * MiB));
  for (const PinnedBlock& b : blocks) arena.free(b.host);
}

TEST(PinnedArena, AFailedPinTrimsFreeSlabsAndRetries) {
  CountingPinner pin;
  pin.limit = 8 * MiB;
  PinnedArena arena(pin.make(), 4 * MiB, 4 * MiB);
  PinnedBlock a = arena.alloc(4 * MiB), b = arena.alloc(4 * MiB);
  ASSERT_TRUE(a.host && b.host);
  arena.free(a.host);
  arena.free(b.host);
  // 6 MiB fits no free slab and the cap allows no third: both free slabs go, then it fits.
  PinnedBlock c = arena.alloc(6 * MiB);
  ASSERT_TRUE(c.host);
  EXPECT_EQ(pin.n_unpins, 2);
  PinnedBlock d = arena.alloc(4 * MiB);  // 2 MiB left under the cap: refused, not a crash
  EXPECT_EQ(d.host, nullptr);
  EXPECT_EQ(d.dev, nullptr);
  EXPECT_EQ(arena.stats().in_use_bytes, int64_t(6 * MiB));
  arena.free(c.host);
}

TEST(PinnedArena, ReservePinsAheadAndAllocTakesFromIt) {
  CountingPinner pin;
  PinnedArena arena(pin.make(), 4 * MiB, 8 * MiB);
  EXPECT_EQ(arena.reserve(20 * MiB), int64_t(20 * MiB));  // 8 + 8 + 4
  const int pins = pin.n_pins;
  EXPECT_EQ(pins, 3);
  std::vector<PinnedBlock> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(arena.alloc(4 * MiB));
  EXPECT_EQ(pin.n_pins, pins);
  for (const PinnedBlock& b : blocks) arena.free(b.host);
  EXPECT_EQ(arena.reserve(8 * MiB), int64_t(20 * MiB));  // already there: nothing pinned
  EXPECT_EQ(pin.n_pins, pins);
  pin.limit = 30 * MiB;
  EXPECT_EQ(arena.reserve(40 * MiB), int64_t(28 * MiB));  // the cap stops it: what was pinned is reported
}

TEST(PinnedArena, ForeignPointersAreRefused) {
  CountingPinner pin;
  PinnedArena arena(pin.make());
  int x = 0;
  EXPECT_THROW(arena.free(&x), Error);
  arena.free(nullptr);
}

TEST(PinnedArena, ThreadsAllocatingAndFreeingNeverShareBytes) {
  CountingPinner pin;
  PinnedArena arena(pin.make(), 2 * MiB, 8 * MiB);
  auto work = [&arena](uint8_t tag, bool* ok) {
    std::mt19937 rng(tag);
    std::vector<std::pair<PinnedBlock, size_t>> held;
    for (int i = 0; i < 400; ++i) {
      if (held.size() < 8 && rng() % 3 != 0) {
        const size_t n = 1 + rng() % (600 * 1024);
        PinnedBlock b = arena.alloc(n);
        if (!b.host) return;
        std::memset(b.host, tag, n);
        held.emplace_back(b, n);
      } else if (!held.empty()) {
        auto [b, n] = held.back();
        held.pop_back();
        const auto* p = static_cast<const uint8_t*>(b.host);
        for (size_t k = 0; k < n; k += 997)
          if (p[k] != tag) return;  // another thread wrote into this block
        arena.free(b.host);
      }
    }
    for (auto& [b, n] : held) arena.free(b.host);
    *ok = true;
  };
  bool ok1 = false, ok2 = false;
  std::thread t1(work, uint8_t(1), &ok1), t2(work, uint8_t(2), &ok2);
  t1.join();
  t2.join();
  EXPECT_TRUE(ok1);
  EXPECT_TRUE(ok2);
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
}

}  // namespace
}  // namespace kvtier
