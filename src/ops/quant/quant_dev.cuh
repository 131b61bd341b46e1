// The vector quantizers of quant_format.h on the device, one thread per
// record: quantize, dequantize, and score q·dequant(record) from the codes.
// Header-only; the functions are __host__ __device__ (the host build serves
// quant_dev_host_test.cpp), nvcc C++17, any sm.
// The pieces: quant_dev_format.cuh (DevFormat), quant_dev_higgs.cuh,
// quant_dev_decode.cuh (the other formats), over quant_dev_scalar.cuh;
// this file holds the entry points.
//
// Bit-exact with the FAST CPU path (quant_cpu.cpp, higgs_cpu.cpp), which is
// what production runs: dev_quantize writes the bytes quantize() writes and
// dev_dequantize the values dequantize() gives. Where the readable
// references differ from the fast path, this follows the fast path:
//   * HIGGS nearest point: the largest u·c − ‖c‖²/2 in f32, built as
//     −‖c‖²/2 then one FMA per coordinate in order (higgs_cpu's search),
//     lowest index on ties; higgs_ref takes the smallest f64 squared distance,
//     which can pick the other point of a near-tie;
//   * HIGGS rotation: hadamard_transform's f32 butterflies (spans 1, 2, 4, …)
//     then × f32(1/√G), then × f32(1/σ) (higgs_ref: f64 matrix product, ÷σ);
//   * the CPU's scalar search (grids whose n is not a multiple of 8) now
//     spells its FMAs out too (higgs_cpu.cpp): left to gcc, it fused some of
//     those sums and not others, and quant_dev_check.h's near-tie rows of
//     EDEN4-12 / EDEN8-20 picked other points.
// uniform/1bit dequantize min + code·step: code·step is exact in f32 (8-bit
// code × bf16 step), so fused (here) or not (the CPU, per build) agree.
// Scores accumulate in f32 in another order than score(): they agree to
// ~1e-7·‖q‖·‖x̂‖, not bit for bit. The CPU refuses non-finite inputs (and
// uniform groups beyond bf16); here such a record is unspecified but the
// call returns. A corrupt HIGGS code ≥ n (possible only for n not a power of
// two) reads grid point n − 1 instead of failing.
//
// Cost per record (one thread): a pass or two over x for the scalar formats;
// HIGGS adds the G·log2 G butterflies per group and, to quantize, n·d FMAs
// per sub-vector of d values (EDEN4-256 over 128 values: 32 Ki FMAs).
// Stage the grid in shared memory (dev_stage_grid) when a block quantizes
// many records. Records are read and written through aligned 32-bit words
// where the address allows (quant_dev_scalar.cuh), so mapped pinned host
// memory (zero-copy) works and costs few PCIe transactions.
#pragma once
#include <cstdint>

#include "ops/quant/quant_dev_decode.cuh"
#include "ops/quant/quant_dev_format.cuh"
#include "ops/quant/quant_dev_higgs.cuh"
#include "ops/quant/quant_dev_scalar.cuh"

namespace kvtier {

namespace qdev {

KVT_QD_INLINE float abs_f(float v) { return bits_f32(f32_bits(v) & 0x7fffffffu); }

}  // namespace qdev

// x: [dim] f32, read only, except that scratch may be x itself (then x is
// overwritten). scratch: null, or [dim] f32 the HIGGS path works in (required
// when dev_needs_scratch(f)). rec: f.bytes bytes, any alignment, device or
// mapped pinned host memory; no byte outside it is touched.
KVT_QD void dev_quantize(const DevFormat& f, const float* x, uint8_t* rec, float* scratch = nullptr) {
  using namespace qdev;
  BitWriter w(rec);
  switch (f.kind) {
    case kF32:
      for (int i = 0; i < f.dim; ++i) w.put(f32_bits(x[i]), 32);
      break;
    case kBf16:
      for (int i = 0; i < f.dim; ++i) w.put(f32_bf16(x[i]), 16);
      break;
    case kFp8:
      for (int i = 0; i < f.dim; ++i) w.put(f32_e4m3(x[i]), 8);
      break;
    case kFp8s: {
      float amax = 0;
      for (int i = 0; i < f.dim; ++i) amax = amax < abs_f(x[i]) ? abs_f(x[i]) : amax;
      const float scale = f_div(amax, 448.0f);
      for (int i = 0; i < f.dim; ++i) w.put(scale > 0 ? f32_e4m3(f_div(x[i], scale)) : 0u, 8);
      w.put(f32_bits(scale), 32);
      break;
    }
    case kNvfp4: {
      BitWriter ws(rec + f.meta_offset);
      for (int b = 0; b < f.dim / 16; ++b) {
        const float* xb = x + 16 * b;
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = amax < abs_f(xb[i]) ? abs_f(xb[i]) : amax;
        const uint32_t sc = f32_e4m3(f_div(f_div(amax, 6.0f), f.tensor_scale));
        const float scale = f_mul(e4m3_f32(sc), f.tensor_scale);
        ws.put(sc, 8);
        for (int i = 0; i < 16; ++i) w.put(scale > 0 ? f32_e2m1(f_div(xb[i], scale)) : 0u, 4);
      }
      ws.finish();
      break;
    }
    case kUniform: {
      BitWriter wm(rec + f.meta_offset);
      const uint32_t levels = (1u << f.code_bits) - 1;
      const float top = float(levels);
      for (int g = 0; g < f.n_group; ++g) {
        const float* xg = x + int64_t(g) * f.group;
        float lo = xg[0], hi = xg[0];
        for (int i = 1; i < f.group; ++i) lo = xg[i] < lo ? xg[i] : lo, hi = hi < xg[i] ? xg[i] : hi;
        const uint32_t min_h = bf16_round_down(lo);
        const float minv = bf16_f32(min_h);
        const uint32_t step_h = bf16_round_up(f_div(f_sub(hi, minv), top));
        const float step = bf16_f32(step_h);
        for (int i = 0; i < f.group; ++i) {
          float q = step > 0 ? f_rint(f_div(f_sub(xg[i], minv), step)) : 0.0f;
          q = q < 0.0f ? 0.0f : top < q ? top : q;  // std::clamp
          w.put(uint32_t(q), f.code_bits);
        }
        w.next_byte();
        wm.put(min_h, 16);
        wm.put(step_h, 16);
      }
      wm.finish();
      break;
    }
    case kBinary: {  // quant_layout.h's binary_levels / binary_code
      BitWriter wm(rec + f.meta_offset);
      const int n = f.group;
      for (int g = 0; g < f.n_group; ++g) {
        const float* xg = x + int64_t(g) * n;
        double mean = 0;
        for (int i = 0; i < n; ++i) mean = d_add(mean, double(xg[i]));
        mean = d_div(mean, double(n));
        double lo = 0, hi = 0;
        int n_lo = 0;
        for (int i = 0; i < n; ++i) {
          if (double(xg[i]) < mean) lo = d_add(lo, double(xg[i])), ++n_lo;
          else hi = d_add(hi, double(xg[i]));
        }
        lo = n_lo ? d_div(lo, double(n_lo)) : mean;
        hi = n_lo < n ? d_div(hi, double(n - n_lo)) : mean;
        const uint32_t min_h = f32_bf16(d_to_f(lo));
        const float gap = f_sub(d_to_f(hi), bf16_f32(min_h));
        const uint32_t step_h = f32_bf16(0.0f < gap ? gap : 0.0f);
        const float minv = bf16_f32(min_h), half_step = f_mul(0.5f, bf16_f32(step_h));
        for (int i = 0; i < n; ++i) w.put(f_sub(xg[i], minv) > half_step ? 1u : 0u, 1);
        w.next_byte();
        wm.put(min_h, 16);
        wm.put(step_h, 16);
      }
      wm.finish();
      break;
    }
    case kHiggs:
      higgs_quantize(f, x, rec, scratch);
      return;
    default:
      return;
  }
  w.finish();
}

// out: [dim] f32 (the HIGGS path rotates in place there, no scratch).
KVT_QD void dev_dequantize(const DevFormat& f, const uint8_t* rec, float* out) {
  if (f.kind == qdev::kHiggs) return qdev::higgs_dequantize(f, rec, out);
  qdev::StoreSink sink{out};
  qdev::decode_each(f, rec, sink);
}

// q_rot = the query in the record's coding domain: per HIGGS group
// H_G(s ⊙ q_g)·(1/√G), bit-identical to the CPU's rotation of q in score();
// for the other formats q itself. q_rot: [dim] f32, may be q.
KVT_QD void dev_rotate_query(const DevFormat& f, const float* q, float* q_rot) {
  if (f.kind == qdev::kHiggs) {
    for (int g = 0; g < f.n_group; ++g) qdev::rotate_group(f, q + int64_t(g) * f.group, q_rot + int64_t(g) * f.group);
    return;
  }
  if (q_rot != q)
    for (int i = 0; i < f.dim; ++i) q_rot[i] = q[i];
}

// q · dequant(rec) from the codes, f32 accumulation; q_rot from
// dev_rotate_query (rotate once, score many records).
KVT_QD float dev_score_rotated(const DevFormat& f, const float* q_rot, const uint8_t* rec) {
  if (f.kind == qdev::kHiggs) return qdev::higgs_score_rotated(f, q_rot, rec);
  qdev::DotSink sink{q_rot};
  qdev::decode_each(f, rec, sink);
  return sink.acc;
}

// The same from the raw query q [dim]: HIGGS rotates q group by group inside
// (in a local array, or in scratch [dim] f32 when given; required when
// dev_needs_scratch(f); scratch may be q, which is then overwritten).
KVT_QD float dev_score(const DevFormat& f, const float* q, const uint8_t* rec, float* scratch = nullptr) {
  if (f.kind == qdev::kHiggs) return qdev::higgs_score_raw(f, q, rec, scratch);
  return dev_score_rotated(f, q, rec);
}

#ifdef __CUDACC__
// Block-cooperative (every thread of the block calls it, then it syncs):
// copies the HIGGS grid and its half norms into smem (dev_grid_smem_bytes,
// 16-byte aligned, e.g. extern __shared__ float4[]) and points f at them.
// No-op for the other formats.
__device__ inline void dev_stage_grid(DevFormat& f, float* smem) {
  if (f.kind != qdev::kHiggs) return;
  const int nd = f.grid_size * f.grid_dim;
  const int tid = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int n_thread = int(blockDim.x * blockDim.y * blockDim.z);
  float* hn = smem + ((nd + 3) & ~3);
  for (int i = tid; i < nd; i += n_thread) smem[i] = f.grid[i];
  for (int c = tid; c < f.grid_size; c += n_thread) hn[c] = qdev::half_norm2_of(f.grid + c * f.grid_dim, f.grid_dim);
  __syncthreads();
  f.grid = smem;
  f.half_norm2 = hn;
}

// dev_quantize by a whole warp: all 32 lanes call it with the same arguments
// and it returns in each once rec is written (by lane 0). HIGGS spreads the
// rotation and the nearest-point searches over the lanes: ~32× less latency
// than one thread, for where few records are quantized at once (a decode
// step's appends); σ stays lane 0's sequential f64 sum, the CPU's order, so
// the bytes are dev_quantize's. scratch: [dim] f32 the warp shares (shared or
// global memory; may be x, then overwritten). The other formats, and HIGGS
// without scratch, run dev_quantize on lane 0.
__device__ inline void dev_quantize_warp(const DevFormat& f, const float* x, uint8_t* rec, float* scratch) {
  using namespace qdev;
  constexpr unsigned kAll = 0xffffffffu;
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  if (f.kind != kHiggs || !scratch) {
    if (f.kind == kHiggs && f.group > kDevLocalGroup) fail();
    if (lane == 0) dev_quantize(f, x, rec);
    __syncwarp();
    return;
  }
  const int G = f.group, d = f.grid_dim;
  BitWriter codes(rec), meta(rec + f.meta_offset);  // lane 0's
  for (int g = 0; g < f.n_group; ++g) {
    const float* xg = x + int64_t(g) * G;
    float* u = scratch + int64_t(g) * G;
    double n2 = 0;
    if (lane == 0)
      for (int i = 0; i < G; ++i) n2 = d_add(n2, d_mul(double(xg[i]), double(xg[i])));
    n2 = __shfl_sync(kAll, n2, 0);
    const uint32_t sigma_h = f32_bf16(d_to_f(d_sqrt(d_div(n2, double(G)))));
    const float sigma = bf16_f32(sigma_h);
    const float inv = sigma > 0 ? f_div(1.0f, sigma) : 0.0f;
    for (int i = int(lane); i < G; i += 32) u[i] = f.signs ? f_mul(f.signs[i], xg[i]) : xg[i];
    __syncwarp();
    for (int h = 1; h < G; h *= 2) {  // fwht's butterflies, spread over the lanes
      for (int k = int(lane); k < G / 2; k += 32) {
        const int i = (k / h) * 2 * h + k % h;
        const float a = u[i], b = u[i + h];
        u[i] = f_add(a, b);
        u[i + h] = f_sub(a, b);
      }
      __syncwarp();
    }
    for (int i = int(lane); i < G; i += 32) u[i] = f_mul(f_mul(u[i], f.hadamard_scale), inv);
    __syncwarp();
    for (int p0 = 0; p0 < f.n_code; p0 += 32) {  // lane l searches sub-vector p0 + l; lane 0 packs in order
      const int p = p0 + int(lane);
      const uint32_t c = p < f.n_code ? uint32_t(nearest(f, u + p * d)) : 0u;
      if (f.code_bits == 8) {  // a code per byte: each lane stores its own
        if (p < f.n_code) rec[int64_t(g) * f.code_bytes + p] = uint8_t(c);
        continue;
      }
      for (int k = 0; k < 32 && p0 + k < f.n_code; ++k) {
        const uint32_t ck = __shfl_sync(kAll, c, k);
        if (lane == 0) codes.put(ck, f.code_bits);
      }
    }
    if (lane == 0) {
      codes.next_byte();
      meta.put(sigma_h, 16);
    }
    __syncwarp();  // u is the next group's only after every lane's search
  }
  if (lane == 0) {
    codes.finish();
    meta.finish();
  }
  __syncwarp();
}
#endif

}  // namespace kvtier
