#include <cuda_bf16.h>

#include "backend/cuda_backend.h"
#include "ops/quant/hadamard_cuda.cuh"
#include "ops/record_dequant/record_dequant_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(32 * kWarps) record_dequant_kernel(HiggsRecordLayout L, RecordDequantParams p,
                                                                      const uint8_t* __restrict__ src,
                                                                      const int32_t* __restrict__ idx,
                                                                      const float* __restrict__ grid,
                                                                      const float* __restrict__ signs, uint8_t* dst) {
  __shared__ float2 pts[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) pts[i] = reinterpret_cast<const float2*>(grid)[i];
  __syncthreads();
  const int64_t w = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= int64_t(p.n_rows) * p.k) return;
  const int lane = threadIdx.x & 31;
  const int r = int(w / p.k);
  const int32_t slot = idx[w];
  if (slot < 0) return;
  const int h = r % p.n_kv_head;
  // The head's Hadamard group and its 128-block inside it; a per-head entry
  // holds the head's group alone (group 0 of the entry).
  const int g = L.per_head ? 0 : h * 128 / L.group;
  const int a = L.per_head ? 0 : (h * 128 - g * L.group) / 128;
  const int n_blk = L.group / 128;
  const uint8_t* e = src + r * p.src_row_stride + int64_t(slot) * L.entry_bytes;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(dst + r * p.dst_row_stride + int64_t(slot) * 4 * 128);
  const float inv = rsqrtf(float(L.group));
  for (int kv = 0; kv < 2; ++kv) {
    const uint8_t* codes = e + L.code_offset(g, kv);
    float z[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b = 0; b < n_blk; ++b) {
      const float sg = (__popc(a & b) & 1) ? -1.f : 1.f;
      const uint16_t c2 = *reinterpret_cast<const uint16_t*>(codes + b * 64 + 2 * lane);
      const float2 p0 = pts[c2 & 255], p1 = pts[c2 >> 8];
      z[0] += sg * p0.x;
      z[1] += sg * p0.y;
      z[2] += sg * p1.x;
      z[3] += sg * p1.y;
    }
    const float sigma = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(e + L.scale_offset(g, kv)));
    warp_hadamard128(z, lane);
    for (int i = 0; i < 4; ++i) {
      float val = z[i] * sigma * inv;
      if (signs) val *= signs[a * 128 + 4 * lane + i];
      out[kv * 128 + 4 * lane + i] = __float2bfloat16_rn(val);
    }
  }
}

}  // namespace

void record_dequant(const HiggsRecordLayout& L, const RecordDequantParams& p, const uint8_t* src, const int32_t* idx,
                    const float* grid, const float* signs, uint8_t* dst, cudaStream_t s) {
  KVT_CHECK(L.width == p.n_kv_head * 128 && L.group >= 128 && L.group % 128 == 0 && L.width % L.group == 0,
            "record_dequant: width {} group {} for {} heads of 128", L.width, L.group, p.n_kv_head);
  KVT_CHECK(p.n_rows >= 0 && p.k >= 0 && p.dst_row_stride >= int64_t(p.k) * 4 * 128 && p.src_row_stride >= 0,
            "record_dequant: rows {} k {} invalid", p.n_rows, p.k);
  const int64_t n = int64_t(p.n_rows) * p.k;
  if (n == 0) return;
  record_dequant_kernel<<<unsigned((n + kWarps - 1) / kWarps), 32 * kWarps, 0, s>>>(L, p, src, idx, grid, signs, dst);
  KVT_CUDA_LAUNCH_CHECK("record_dequant_kernel");
}

}  // namespace kvtier::cuda
