// The pool of page-locked host memory behind the host tier (MemKind::host on
// CUDA). Pinning is slow: cudaHostAlloc runs at 2–3 GB/s on the H200's host
// (bench/results/gpu/server/README.md), so a 32K-token yakv sequence's 1.2 GB
// of host K/V cost half a second of the scheduler's thread each time one was
// admitted. The arena pins slabs once and carves them into blocks: a freed
// block goes back to the pool (merged with its free neighbours) and its slab
// stays pinned for the next sequence, until trim() or a pin that fails.
// reserve() pins ahead of use.
//
// The pin and unpin functions are the caller's (CUDA: cudaHostAlloc mapped,
// cudaFreeHost; tests: plain memory), so the carving is tested without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace kvtier {

struct PinnedBlock {
  void* host = nullptr;  // the CPU's address (null: pinning failed)
  void* dev = nullptr;   // the device's address of the same bytes
};

struct PinnedStats {
  int64_t pinned_bytes = 0;  // held by the slabs
  int64_t in_use_bytes = 0;  // handed out as blocks (rounded up to kAlign)
  int64_t n_slabs = 0;
  double pin_seconds = 0;  // spent in pin() so far
};

class PinnedArena {
 public:
  struct Pinner {
    std::function<PinnedBlock(size_t)> pin;  // {null, null} when the memory cannot be pinned
    std::function<void(void* host)> unpin;
  };
  static constexpr size_t kAlign = 256;
  // Slabs grow with what is pinned, from min_slab to max_slab; a larger
  // request gets a slab of its own size.
  explicit PinnedArena(Pinner pinner, size_t min_slab = size_t(64) << 20, size_t max_slab = size_t(1) << 30);
  ~PinnedArena();  // unpins every slab
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // kAlign-aligned, uninitialized; {null, null} when even after trim() the
  // memory cannot be pinned. Thread-safe.
  PinnedBlock alloc(size_t bytes);
  void free(void* host);  // a block's host address
  // Pins slabs until `bytes` are pinned in all, or a pin fails. Returns the
  // bytes pinned in all.
  int64_t reserve(size_t bytes);
  int64_t trim();  // unpins the slabs no block uses; returns their bytes
  PinnedStats stats() const;

 private:
  struct Slab {
    char* host;
    char* dev;
    size_t bytes;
  };
  struct Range {
    size_t bytes;
    size_t slab;
  };
  size_t next_slab_bytes(size_t need) const;  // under mu_
  bool pin_slab(size_t bytes);                // pins outside mu_, adds under it
  bool take(size_t bytes, PinnedBlock* out);  // best fit from the free ranges, under mu_
  int64_t trim_locked();

  Pinner pinner_;
  size_t min_slab_, max_slab_;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;                 // a trimmed slab keeps its entry with bytes 0
  std::map<char*, Range> free_;             // by host address; never spans two slabs
  std::unordered_map<char*, Range> used_;   // by host address
  int64_t pinned_ = 0, in_use_ = 0;
  double pin_seconds_ = 0;
};

// The process's pool behind the host tier on CUDA (MemKind::host buffers,
// backend/device.h), implemented in device.cpp.
// Its statistics: zeros before anything was pinned, and without CUDA.
PinnedStats pinned_host_stats();
// Pins `bytes` into that pool now (a server pins its host KV budget before
// it answers, as vLLM pins its CPU swap space), so that sequences take their
// host K/V from it instead of pinning it when they start. Throws LimitError
// at once when more is asked than the machine has available (MemAvailable),
// and after giving back what it pinned when the machine will not lock that
// much. Without CUDA: throws.
void pin_host(size_t bytes);

}  // namespace kvtier
