// CUDA gathers (contract in gather.h).
//  * gather(): the GPU reads the selected entries itself — from pinned host
//    memory through its mapped device pointer (zero-copy) or from device
//    memory — with 16-byte loads, several in flight per thread; with reuse,
//    hits are copied from prev_dst in HBM. No host synchronization: CUDA-graph safe.
//  * gather_slots(): reuse without copies — a slot cache (gather.h).
//    `misses` (device, may be null) accumulates the entries read from src.
//  * gather_memcpy(): the copy-engine alternative: one cudaMemcpyBatchAsync of
//    runs of consecutive tokens; needs the indices on the host (so a host
//    synchronization per layer when they come from the GPU). Kept to measure.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cuda_backend.h"
#include "ops/gather/gather.h"

namespace kvtier::cuda {

void gather(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
            const uint8_t* prev_dst, uint8_t* dst, unsigned long long* misses, cudaStream_t s);

// The slot cache of gather.h (gather_slots_ref): a slot-assignment pass (one
// block per row, which also lists each row's misses) and a copy pass over the
// misses only, zero-copy. scratch: gather_slots_scratch_bytes(p) of device
// memory, 8-byte aligned; misses (device, may be null) accumulates the
// entries read from src. No host synchronization: CUDA-graph safe.
int64_t gather_slots_scratch_bytes(const GatherParams& p);
void gather_slots(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
                  const int32_t* prev_slot, int32_t* slot_of, void* scratch, uint8_t* dst,
                  unsigned long long* misses, cudaStream_t s);

// idx_host: [n_rows, k] ascending; src_host: pinned host pointer. Returns the
// number of copies issued (runs of consecutive tokens become one copy).
int64_t gather_memcpy(const GatherParams& p, const uint8_t* src_host, const int32_t* idx_host, uint8_t* dst,
                      cudaStream_t s, CopyStats* stats);

}  // namespace kvtier::cuda
