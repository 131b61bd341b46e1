// Test kernels of quant_dev.cuh (quant_dev_test_kernels.cu): one thread per
// record, blocks of 64, on the legacy default stream. Pointers are device
// pointers (records may also be mapped pinned host memory). Used by
// quant_dev_cuda_test.cpp.
#pragma once
#include <cstdint>

#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda {

// x: [n_vec, dim] f32; rec: n_vec records of f.bytes from rec (any alignment);
// scratch: null or [n_vec, dim] f32 (may be x); stage_grid: the HIGGS grid in
// shared memory (dev_stage_grid; dev_grid_smem_bytes(f) within the device's
// limit); warp: one warp per record (dev_quantize_warp).
void quant_dev_quantize(const DevFormat& f, const float* x, int64_t n_vec, uint8_t* rec, float* scratch,
                        bool stage_grid, bool warp);
// out: [n_vec, dim] f32
void quant_dev_dequantize(const DevFormat& f, const uint8_t* rec, int64_t n_vec, float* out);
// scores: [n_q, n_vec] f32, q: [n_q, dim] f32 (rotated: from quant_dev_rotate);
// scratch: null or [n_q·n_vec, dim] f32 (raw HIGGS scores of groups > kDevLocalGroup).
void quant_dev_score(const DevFormat& f, const float* q, int n_q, const uint8_t* rec, int64_t n_vec, bool rotated,
                     float* scratch, float* scores);
// q, q_rot: [n_q, dim] f32
void quant_dev_rotate(const DevFormat& f, const float* q, int n_q, float* q_rot);

}  // namespace kvtier::cuda
