#include <cuda_bf16.h>

#include "backend/cuda_backend.h"
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
  const int g = h * 128 / L.group;                // the head's Hadamard group
  const int a = (h * 128 - g * L.group) / 128;    // and its 128-block inside it
  const int n_blk = L.group / 128;
  const uint8_t* e = src + r * p.src_row_stride + int64_t(slot) * L.entry_bytes;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(dst + r * p.dst_row_stride + int64_t(slot) * 4 * 128);
  const float inv = rsqrtf(float(L.group));
  for (int kv = 0; kv < 2; ++kv) {
    const uint8_t* rec = e + kv * L.record_bytes;
    const uint8_t* codes = rec + int64_t(g) * L.code_bytes;
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
    const float sigma = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(rec + L.meta_offset + 2 * g));
    // H_128 over the warp: index bits 0-1 in the lane, bits 2-6 across lanes.
    float x[4];
    {
      const float p = z[0] + z[1], q = z[0] - z[1], r2 = z[2] + z[3], s2 = z[2] - z[3];
      x[0] = p + r2;
      x[1] = q + s2;
      x[2] = p - r2;
      x[3] = q - s2;
    }
    for (int m = 1; m < 32; m <<= 1)
      for (int i = 0; i < 4; ++i) {
        const float o = __shfl_xor_sync(0xffffffffu, x[i], m);
        x[i] = (lane & m) ? o - x[i] : x[i] + o;
      }
    for (int i = 0; i < 4; ++i) {
      float val = x[i] * sigma * inv;
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
