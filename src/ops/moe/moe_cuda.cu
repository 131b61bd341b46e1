// The MoE block on CUDA (moe_cuda.h). Routing, planning and combining are
// small kernels; the experts' products (moe_experts_cuda.cu) are either a
// grouped tensor-core GEMM or, for a handful of tokens, a GEMV over the active
// experts' weight rows only; for long prefill chunks, one cuBLASLt GEMM per
// active expert after a host-side plan.
#include <cuda_bf16.h>

#include <climits>
#include <vector>

#include "backend/cuda_backend.h"
#include "ops/moe/moe_cuda.h"
#include "ops/moe/moe_cuda_detail.cuh"
#include "ops/swiglu/swiglu_cuda.h"

namespace kvtier::cuda {

using namespace moe_detail;

namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxExperts = 1024;              // the plan kernel's one block holds one expert per thread
constexpr int kMaxPerLane = kMaxExperts / 32;  // routing: a warp's lanes hold every expert's logit
constexpr int kMaxUsed = 32;                   // routing: lane j writes selection j

// ---- routing ------------------------------------------------------------------

// One warp per token: max and softmax denominator over all experts, then k
// rounds of a warp argmax (larger logit, then lower id).
__global__ void route_kernel(const float* __restrict__ logits, int n_tok, int n_expert, int k, bool norm, float scale,
                             int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int t = int((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= n_tok) return;
  const float* l = logits + int64_t(t) * n_expert;  // [n_expert]
  float v[kMaxPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n_expert ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
  float denom = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (lane + 32 * i < n_expert) denom += expf(v[i] - mx);
  for (int o = 16; o > 0; o >>= 1) denom += __shfl_xor_sync(kFull, denom, o);

  uint32_t taken = 0;  // bit i: expert lane + 32 i already selected
  float top = 0.f;
  int my_id = 0;
  float my_p = 0.f;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int best_e = INT_MAX;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < n_expert && !((taken >> i) & 1u) && (best_e == INT_MAX || v[i] > best)) {
        best = v[i];
        best_e = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFull, best, o);
      const int oe = __shfl_xor_sync(kFull, best_e, o);
      if (oe != INT_MAX && (best_e == INT_MAX || ob > best || (ob == best && oe < best_e))) {
        best = ob;
        best_e = oe;
      }
    }
    if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
    const float p = expf(best - mx) / denom;
    top += p;
    if (lane == j) {
      my_id = best_e;
      my_p = p;
    }
  }
  if (lane < k) {
    const float w = (norm ? my_p / top : my_p) * scale;
    ids[int64_t(t) * k + lane] = my_id;
    weights[int64_t(t) * k + lane] = w;
  }
}

// ---- plan ---------------------------------------------------------------------

constexpr int kPlanThreads = 1024;

// Exclusive prefix sum of one value per thread of a 1024-thread block.
__device__ int block_exclusive_scan(int x, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = x;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int s = warp_sums[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFull, s, o);
      if (lane >= o) s += y;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  const int base = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[31];
  __syncthreads();  // warp_sums is reused by the next scan
  return base + inc - x;
}

// Rows per expert → offsets, tile offsets, the active experts; then every
// (token, slot) pair gets its row (order within an expert is whatever the
// atomics give: each row's result depends only on its own token).
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const int32_t* __restrict__ ids, int n_pairs, int k,
                                                            int n_expert, int32_t* __restrict__ offsets,
                                                            int32_t* __restrict__ tile_off, int32_t* __restrict__ active,
                                                            int32_t* __restrict__ row_token,
                                                            int32_t* __restrict__ row_of) {
  __shared__ int s_count[kMaxExperts];
  __shared__ int s_cursor[kMaxExperts];
  __shared__ int s_warp[32];
  const int tid = threadIdx.x;
  s_count[tid] = 0;
  __syncthreads();
  for (int i = tid; i < n_pairs; i += kPlanThreads) atomicAdd(&s_count[ids[i]], 1);
  __syncthreads();
  const int cnt = tid < n_expert ? s_count[tid] : 0;
  int n_rows = 0, n_tiles = 0, n_active = 0;
  const int off = block_exclusive_scan(cnt, s_warp, &n_rows);
  const int toff = block_exclusive_scan((cnt + kBM - 1) / kBM, s_warp, &n_tiles);
  const int aoff = block_exclusive_scan(cnt > 0 ? 1 : 0, s_warp, &n_active);
  if (tid < n_expert) {
    offsets[tid] = off;
    tile_off[tid] = toff;
    s_cursor[tid] = off;
    if (cnt > 0) active[aoff] = tid;
  }
  if (tid == 0) {
    offsets[n_expert] = n_rows;
    tile_off[n_expert] = n_tiles;
    active[n_expert] = n_active;
  }
  __syncthreads();
  for (int i = tid; i < n_pairs; i += kPlanThreads) {
    const int row = atomicAdd(&s_cursor[ids[i]], 1);
    row_token[row] = i / k;
    row_of[i] = row;
  }
}

// ---- combine ------------------------------------------------------------------

// xs[row] = x[row_token[row]]: the cuBLASLt path's rows in expert order.
__global__ void gather_rows_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ row_token, int n_embd,
                                   bf16* __restrict__ xs) {
  const int64_t row = blockIdx.x;
  const auto* src = reinterpret_cast<const uint4*>(x + int64_t(row_token[row]) * n_embd);
  auto* dst = reinterpret_cast<uint4*>(xs + row * n_embd);
  for (int i = threadIdx.x; i < n_embd / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void combine_kernel(const bf16* __restrict__ out, const int32_t* __restrict__ row_of,
                               const float* __restrict__ weights, int k, int n_embd, bf16* __restrict__ y) {
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x * 2; i < n_embd; i += blockDim.x * 2) {
    float s0 = 0.f, s1 = 0.f;
    for (int j = 0; j < k; ++j) {
      const float wt = weights[t * k + j];
      const float2 v =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + int64_t(row_of[t * k + j]) * n_embd + i));
      s0 = fmaf(wt, v.x, s0);
      s1 = fmaf(wt, v.y, s1);
    }
    *reinterpret_cast<__nv_bfloat162*>(y + t * n_embd + i) = __floats2bfloat162_rn(s0, s1);
  }
}

void check_config(const MoeConfig& c) {
  KVT_CHECK(c.n_expert >= 1 && c.n_expert <= kMaxExperts && c.n_expert_used >= 1 && c.n_expert_used <= kMaxUsed &&
                c.n_expert_used <= c.n_expert,
            "moe (CUDA): {} experts, {} used: supported are up to {} experts and up to {} used", c.n_expert,
            c.n_expert_used, kMaxExperts, kMaxUsed);
  KVT_CHECK(c.n_embd > 0 && c.n_ff > 0 && c.n_embd % 8 == 0 && c.n_ff % 8 == 0,
            "moe (CUDA): n_embd {} and expert width {} must be positive multiples of 8", c.n_embd, c.n_ff);
}

}  // namespace

void moe_route(const float* logits, int n_tok, const MoeConfig& c, int32_t* ids, float* weights, cudaStream_t s) {
  check_config(c);
  if (n_tok <= 0) return;
  constexpr int kWarpsPerBlock = 8;
  route_kernel<<<unsigned((n_tok + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(
      logits, n_tok, c.n_expert, c.n_expert_used, c.norm_topk, c.scale, ids, weights);
  KVT_CUDA_LAUNCH_CHECK("route_kernel");
}

MoeRunner::MoeRunner(const MoeConfig& c, int capacity) : c_(c), cap_(capacity) {
  check_config(c);
  KVT_CHECK(capacity > 0 && int64_t(capacity) * c.n_expert_used < (int64_t(1) << 30),
            "moe (CUDA): capacity {} tokens x {} experts out of range", capacity, c.n_expert_used);
  const size_t n = size_t(capacity), k = size_t(c.n_expert_used), rows = n * k;
  logits_ = DeviceBuffer(n * size_t(c.n_expert) * 4);
  ids_ = DeviceBuffer(rows * 4);
  weights_ = DeviceBuffer(rows * 4);
  offsets_ = DeviceBuffer((size_t(c.n_expert) + 1) * 4);
  tile_off_ = DeviceBuffer((size_t(c.n_expert) + 1) * 4);
  active_ = DeviceBuffer((size_t(c.n_expert) + 1) * 4);
  row_token_ = DeviceBuffer(rows * 4);
  row_of_ = DeviceBuffer(rows * 4);
  gu_ = DeviceBuffer(rows * 2 * size_t(c.n_ff) * 2);
  h_ = DeviceBuffer(rows * size_t(c.n_ff) * 2);
  out_ = DeviceBuffer(rows * size_t(c.n_embd) * 2);
  h_ids_ = PinnedBuffer(rows * 3 * 4);
}

size_t MoeRunner::scratch_bytes() const {
  return logits_.bytes() + ids_.bytes() + weights_.bytes() + offsets_.bytes() + tile_off_.bytes() + active_.bytes() +
         row_token_.bytes() + row_of_.bytes() + gu_.bytes() + h_.bytes() + out_.bytes();
}

void MoeRunner::run_cublas(const MoeDeviceWeights& w, const void* x, int n_tok, Gemm& gemm, cudaStream_t s) {
  const MoeConfig& c = c_;
  const int k = c.n_expert_used, n_pairs = n_tok * k;
  auto* ids = h_ids_.host<int32_t>();  // [n_pairs]
  KVT_CUDA_CHECK(cudaMemcpyAsync(ids, ids_.data(), size_t(n_pairs) * 4, cudaMemcpyDeviceToHost, s));
  KVT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<int32_t> offsets(size_t(c.n_expert) + 1, 0);  // expert e's rows: [offsets[e], offsets[e + 1])
  for (int i = 0; i < n_pairs; ++i) ++offsets[size_t(ids[i]) + 1];
  for (int e = 0; e < c.n_expert; ++e) offsets[size_t(e) + 1] += offsets[size_t(e)];
  std::vector<int32_t> cursor(offsets.begin(), offsets.end() - 1);
  int32_t* row_token = ids + n_pairs;    // [n_pairs]: the token of each row
  int32_t* row_of = row_token + n_pairs;  // [n_pairs]: the row of each (token, slot)
  for (int i = 0; i < n_pairs; ++i) {
    const int row = cursor[size_t(ids[i])]++;
    row_token[row] = i / k;
    row_of[i] = row;
  }
  KVT_CUDA_CHECK(cudaMemcpyAsync(row_token_.data(), row_token, size_t(n_pairs) * 4, cudaMemcpyHostToDevice, s));
  KVT_CUDA_CHECK(cudaMemcpyAsync(row_of_.data(), row_of, size_t(n_pairs) * 4, cudaMemcpyHostToDevice, s));
  gather_rows_kernel<<<unsigned(n_pairs), 128, 0, s>>>(static_cast<const bf16*>(x), row_token_.data<int32_t>(),
                                                       c.n_embd, out_.data<bf16>());
  KVT_CUDA_LAUNCH_CHECK("gather_rows_kernel");
  const int64_t E = c.n_embd, F = c.n_ff;
  const auto* gate_up = static_cast<const uint16_t*>(w.gate_up);  // [n_expert, 2 F, E]
  const auto* down = static_cast<const uint16_t*>(w.down);        // [n_expert, E, F]
  for (int e = 0; e < c.n_expert; ++e) {
    const int64_t r0 = offsets[size_t(e)], n = offsets[size_t(e) + 1] - r0;
    if (n > 0)
      gemm.run(n, 2 * F, E, out_.data<uint16_t>() + r0 * E, gate_up + e * 2 * F * E,
               gu_.data<uint16_t>() + r0 * 2 * F, s);
  }
  swiglu(gu_.data(), n_pairs, c.n_ff, h_.data(), s);  // [rows, n_ff]
  for (int e = 0; e < c.n_expert; ++e) {  // overwrites the gathered rows, consumed above
    const int64_t r0 = offsets[size_t(e)], n = offsets[size_t(e) + 1] - r0;
    if (n > 0) gemm.run(n, E, F, h_.data<uint16_t>() + r0 * F, down + e * E * F, out_.data<uint16_t>() + r0 * E, s);
  }
}

void MoeRunner::run(const MoeDeviceWeights& w, const void* x, int n_tok, void* y, Gemm& gemm, cudaStream_t s,
                    MoeExperts experts) {
  KVT_CHECK(n_tok > 0 && n_tok <= cap_, "moe (CUDA): {} tokens, the runner holds {}", n_tok, cap_);
  const MoeConfig& c = c_;
  const int k = c.n_expert_used, n_pairs = n_tok * k;
  const bool host_plan = experts == MoeExperts::cublas ||
                         (experts == MoeExperts::automatic && n_tok >= kMoeCublasMinTokens);
  if (host_plan) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KVT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
    KVT_CHECK(capture == cudaStreamCaptureStatusNone,
              "moe (CUDA): the cuBLASLt experts synchronize with the host and cannot run in a CUDA graph capture");
  }
  gemm.run_f32(n_tok, c.n_expert, c.n_embd, x, w.router, logits_.data<float>(), s);  // [n_tok, n_expert]
  moe_route(logits_.data<float>(), n_tok, c, ids_.data<int32_t>(), weights_.data<float>(), s);
  if (host_plan) {
    run_cublas(w, x, n_tok, gemm, s);
    combine_kernel<<<unsigned(n_tok), 256, 0, s>>>(static_cast<const bf16*>(out_.data()), row_of_.data<int32_t>(),
                                                   weights_.data<float>(), k, c.n_embd, static_cast<bf16*>(y));
    KVT_CUDA_LAUNCH_CHECK("combine_kernel");
    return;
  }
  plan_kernel<<<1, kPlanThreads, 0, s>>>(ids_.data<int32_t>(), n_pairs, k, c.n_expert, offsets_.data<int32_t>(),
                                         tile_off_.data<int32_t>(), active_.data<int32_t>(),
                                         row_token_.data<int32_t>(), row_of_.data<int32_t>());
  KVT_CUDA_LAUNCH_CHECK("plan_kernel");
  ExpertGemmParams gu;  // gate|up: [rows, 2 n_ff] from the tokens' x
  gu.n = 2 * c.n_ff;
  gu.k = c.n_embd;
  gu.lda = c.n_embd;
  gu.ldy = 2 * c.n_ff;
  gu.n_expert = c.n_expert;
  expert_products(gu, n_tok, n_pairs, x, row_token_.data<int32_t>(), w.gate_up, offsets_.data<int32_t>(),
                  tile_off_.data<int32_t>(), active_.data<int32_t>(), gu_.data(), s);
  swiglu(gu_.data(), n_pairs, c.n_ff, h_.data(), s);  // [rows, n_ff]
  ExpertGemmParams dn;  // down: [rows, n_embd] from the rows' h
  dn.n = c.n_embd;
  dn.k = c.n_ff;
  dn.lda = c.n_ff;
  dn.ldy = c.n_embd;
  dn.n_expert = c.n_expert;
  expert_products(dn, n_tok, n_pairs, h_.data(), nullptr, w.down, offsets_.data<int32_t>(), tile_off_.data<int32_t>(),
                  active_.data<int32_t>(), out_.data(), s);
  combine_kernel<<<unsigned(n_tok), 256, 0, s>>>(static_cast<const bf16*>(out_.data()), row_of_.data<int32_t>(),
                                                 weights_.data<float>(), k, c.n_embd, static_cast<bf16*>(y));
  KVT_CUDA_LAUNCH_CHECK("combine_kernel");
}

}  // namespace kvtier::cuda
