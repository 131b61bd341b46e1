// PinnedArena: slabs pinned once, carved best-fit, freed blocks merged back.
#include "backend/pinned_arena.h"

#include <algorithm>
#include <chrono>

#include "core/status.h"

namespace kvtier {
namespace {
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
constexpr size_t kSlabRound = size_t(2) << 20;  // slabs are whole 2 MiB pages
}  // namespace

PinnedArena::PinnedArena(Pinner pinner, size_t min_slab, size_t max_slab)
    : pinner_(std::move(pinner)),
      min_slab_(round_up(std::max<size_t>(min_slab, 1), kSlabRound)),
      max_slab_(std::max(min_slab_, round_up(max_slab, kSlabRound))) {}

PinnedArena::~PinnedArena() {
  for (const Slab& s : slabs_)
    if (s.bytes) pinner_.unpin(s.host);
}

// Doubling with what is pinned: a short run pins 64 MiB, a server gigabytes
// in 1 GiB slabs.
size_t PinnedArena::next_slab_bytes(size_t need) const {
  const size_t grow = std::clamp(size_t(pinned_), min_slab_, max_slab_);
  return std::max(round_up(need, kSlabRound), grow);
}

bool PinnedArena::pin_slab(size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const PinnedBlock b = pinner_.pin(bytes);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  pin_seconds_ += dt;
  if (!b.host) return false;
  slabs_.push_back(Slab{static_cast<char*>(b.host), static_cast<char*>(b.dev), bytes});
  free_.emplace(static_cast<char*>(b.host), Range{bytes, slabs_.size() - 1});
  pinned_ += int64_t(bytes);
  return true;
}

bool PinnedArena::take(size_t bytes, PinnedBlock* out) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->second.bytes >= bytes && (best == free_.end() || it->second.bytes < best->second.bytes)) best = it;
  if (best == free_.end()) return false;
  char* host = best->first;
  const Range r = best->second;
  free_.erase(best);
  if (r.bytes > bytes) free_.emplace(host + bytes, Range{r.bytes - bytes, r.slab});
  used_.emplace(host, Range{bytes, r.slab});
  in_use_ += int64_t(bytes);
  const Slab& s = slabs_[r.slab];
  *out = PinnedBlock{host, s.dev + (host - s.host)};
  return true;
}

PinnedBlock PinnedArena::alloc(size_t bytes) {
  const size_t n = round_up(std::max<size_t>(bytes, 1), kAlign);
  PinnedBlock out;
  for (int attempt = 0; attempt < 3; ++attempt) {
    size_t slab = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (take(n, &out)) return out;
      if (attempt == 1) trim_locked();  // the pin failed: give back what no block uses, try once more
      slab = attempt == 0 ? next_slab_bytes(n) : round_up(n, kSlabRound);
    }
    if (attempt == 2) break;
    pin_slab(slab);
  }
  return PinnedBlock{};
}

void PinnedArena::free(void* host) {
  if (!host) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(static_cast<char*>(host));
  KVT_CHECK(u != used_.end(), "pinned host memory: {} is not a block of this pool", host);
  char* p = u->first;
  Range r = u->second;
  used_.erase(u);
  in_use_ -= int64_t(r.bytes);
  auto next = free_.find(p + r.bytes);  // merge with the free neighbours of the same slab
  if (next != free_.end() && next->second.slab == r.slab) {
    r.bytes += next->second.bytes;
    free_.erase(next);
  }
  auto it = free_.lower_bound(p);
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.slab == r.slab && prev->first + prev->second.bytes == p) {
      prev->second.bytes += r.bytes;
      return;
    }
  }
  free_.emplace(p, r);
}

int64_t PinnedArena::reserve(size_t bytes) {
  for (;;) {
    size_t slab = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pinned_ >= int64_t(bytes)) return pinned_;
      slab = std::min(max_slab_, round_up(bytes - size_t(pinned_), kSlabRound));
    }
    if (!pin_slab(slab)) {
      std::lock_guard<std::mutex> lock(mu_);
      return pinned_;
    }
  }
}

int64_t PinnedArena::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  return trim_locked();
}

int64_t PinnedArena::trim_locked() {
  int64_t freed = 0;
  for (size_t i = 0; i < slabs_.size(); ++i) {
    Slab& s = slabs_[i];
    if (!s.bytes) continue;
    auto it = free_.find(s.host);
    if (it == free_.end() || it->second.bytes != s.bytes) continue;  // a block still uses it
    free_.erase(it);
    pinner_.unpin(s.host);
    freed += int64_t(s.bytes);
    pinned_ -= int64_t(s.bytes);
    s.bytes = 0;
  }
  return freed;
}

PinnedStats PinnedArena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PinnedStats s;
  s.pinned_bytes = pinned_;
  s.in_use_bytes = in_use_;
  s.n_slabs = int64_t(std::count_if(slabs_.begin(), slabs_.end(), [](const Slab& x) { return x.bytes > 0; }));
  s.pin_seconds = pin_seconds_;
  return s;
}

}  // namespace kvtier
