// quant_dev_test_kernels.h: thin kernels around quant_dev.cuh's functions.
#include "backend/cuda_backend.h"
#include "ops/quant/quant_dev_test_kernels.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 64;

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

__global__ void quantize_kernel(DevFormat f, const float* x, int64_t n_vec, uint8_t* rec, float* scratch,
                                bool stage_grid) {
  extern __shared__ float4 smem[];
  if (stage_grid) dev_stage_grid(f, reinterpret_cast<float*>(smem));  // whole block, before any exit
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= n_vec) return;
  dev_quantize(f, x + v * f.dim, rec + v * f.bytes, scratch ? scratch + v * f.dim : nullptr);
}

__global__ void quantize_warp_kernel(DevFormat f, const float* x, int64_t n_vec, uint8_t* rec, float* scratch,
                                     bool stage_grid) {
  extern __shared__ float4 smem[];
  if (stage_grid) dev_stage_grid(f, reinterpret_cast<float*>(smem));
  const int64_t v = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (v >= n_vec) return;  // the whole warp
  dev_quantize_warp(f, x + v * f.dim, rec + v * f.bytes, scratch ? scratch + v * f.dim : nullptr);
}

__global__ void dequantize_kernel(DevFormat f, const uint8_t* rec, int64_t n_vec, float* out) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= n_vec) return;
  dev_dequantize(f, rec + v * f.bytes, out + v * f.dim);
}

__global__ void score_kernel(DevFormat f, const float* q, int n_q, const uint8_t* rec, int64_t n_vec, bool rotated,
                             float* scratch, float* scores) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_q * n_vec) return;
  const int64_t j = t / n_vec, v = t % n_vec;
  const float* qj = q + j * f.dim;
  const uint8_t* r = rec + v * f.bytes;
  scores[t] = rotated ? dev_score_rotated(f, qj, r) : dev_score(f, qj, r, scratch ? scratch + t * f.dim : nullptr);
}

__global__ void rotate_kernel(DevFormat f, const float* q, int n_q, float* q_rot) {
  const int j = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n_q) return;
  dev_rotate_query(f, q + int64_t(j) * f.dim, q_rot + int64_t(j) * f.dim);
}

}  // namespace

void quant_dev_quantize(const DevFormat& f, const float* x, int64_t n_vec, uint8_t* rec, float* scratch,
                        bool stage_grid, bool warp) {
  KVT_CHECK(!dev_needs_scratch(f) || scratch, "quant_dev_quantize: HIGGS group {} needs scratch", f.group);
  const size_t smem = stage_grid ? dev_grid_smem_bytes(f) : 0;
  if (n_vec == 0) return;
  auto kernel = warp ? quantize_warp_kernel : quantize_kernel;
  if (smem > 48 * 1024)  // beyond the default: opt in (fails with a CUDA error past the device's limit)
    KVT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const unsigned blocks = warp ? unsigned((n_vec + kThreads / 32 - 1) / (kThreads / 32)) : blocks_for(n_vec);
  kernel<<<blocks, kThreads, smem>>>(f, x, n_vec, rec, scratch, stage_grid);
  KVT_CUDA_LAUNCH_CHECK("quantize_kernel / quantize_warp_kernel");
}

void quant_dev_dequantize(const DevFormat& f, const uint8_t* rec, int64_t n_vec, float* out) {
  if (n_vec == 0) return;
  dequantize_kernel<<<blocks_for(n_vec), kThreads>>>(f, rec, n_vec, out);
  KVT_CUDA_LAUNCH_CHECK("dequantize_kernel");
}

void quant_dev_score(const DevFormat& f, const float* q, int n_q, const uint8_t* rec, int64_t n_vec, bool rotated,
                     float* scratch, float* scores) {
  KVT_CHECK(rotated || !dev_needs_scratch(f) || scratch, "quant_dev_score: HIGGS group {} needs scratch", f.group);
  const int64_t n = int64_t(n_q) * n_vec;
  if (n == 0) return;
  score_kernel<<<blocks_for(n), kThreads>>>(f, q, n_q, rec, n_vec, rotated, scratch, scores);
  KVT_CUDA_LAUNCH_CHECK("score_kernel");
}

void quant_dev_rotate(const DevFormat& f, const float* q, int n_q, float* q_rot) {
  if (n_q == 0) return;
  rotate_kernel<<<blocks_for(n_q), kThreads>>>(f, q, n_q, q_rot);
  KVT_CUDA_LAUNCH_CHECK("rotate_kernel");
}

}  // namespace kvtier::cuda
