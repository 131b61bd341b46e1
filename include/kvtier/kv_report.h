// Public: what a sequence's KV cache reports about itself. Memory is exact
// accounting (SPEC "Policies"); stats count the work of the decode steps so
// far (STYLE rule 7: bytes moved and hit rates, printed by benchmarks).
#pragma once
#include <cstdint>

namespace kvtier {

struct KvMemory {
  double gpu_bytes_per_token = 0;   // GPU tier (key index, resident K/V), all layers
  double host_bytes_per_token = 0;  // host tier (full K and V), all layers
  int64_t gpu_bytes = 0;            // now, for the tokens held (fixed buffers included)
  int64_t host_bytes = 0;
  // The prompt's attention read each layer's K/V from the host tier (policy
  // prefill=stream, or auto that chose it) rather than a dense copy.
  bool prefill_streamed = false;
};

struct KvStats {
  int64_t n_steps = 0;           // decode queries, summed over layers
  int64_t n_selected = 0;        // (KV head, token) rows chosen by the index, summed over steps
  int64_t n_fetched = 0;         // of those, rows read from the host tier (slot-cache misses)
  int64_t bytes_fetched = 0;     // host-tier bytes those reads moved (over PCIe on a GPU)
  // Share of selected rows that were already on the device (slot-cache hits).
  double hit_rate() const { return n_selected ? 1.0 - double(n_fetched) / double(n_selected) : 0.0; }
  // Several sequences' counts together.
  KvStats& operator+=(const KvStats& o) {
    n_steps += o.n_steps;
    n_selected += o.n_selected;
    n_fetched += o.n_fetched;
    bytes_fetched += o.bytes_fetched;
    return *this;
  }
};

}  // namespace kvtier
