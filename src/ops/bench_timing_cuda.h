// CUDA-event timing of the op benchmarks (kvt_flash_prefill_bench,
// kvt_score_bench): one launch set timed `reps` times, the L2 flushed before
// each by writing a buffer larger than it, as a decode step's layers each
// read their own data.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda_backend.h"

namespace kvtier::cuda {

// Milliseconds of each of `reps` runs of launch() on stream s, sorted (the
// caller warms up first: module load, attributes).
template <class Launch>
std::vector<double> time_launches_ms(cudaStream_t s, int reps, void* flush, size_t flush_bytes, Launch&& launch) {
  std::vector<double> t;
  Event e0, e1;
  for (int r = 0; r < reps; ++r) {
    KVT_CUDA_CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, s));
    e0.record(s);
    launch();
    e1.record(s);
    e1.synchronize();
    t.push_back(e1.elapsed_ms_since(e0));
  }
  std::sort(t.begin(), t.end());
  return t;
}

}  // namespace kvtier::cuda
