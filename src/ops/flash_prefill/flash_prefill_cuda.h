// Causal GQA prefill attention on the GPU, flash style: bf16 Q/K/V in, f32
// accumulation on tensor cores, online softmax, bf16 out. The specification is
// attention_causal_ref (ops/attention/attention.h): query i sits at position
// n_kv - n_q + i and sees keys [0, n_kv - n_q + i].
// Two kernels: mma.sync (FA2 layout, any sm_80+ GPU, head_dim 64 or 128) and,
// on Hopper, wgmma + TMA with producer/consumer warpgroups (FA3 style,
// head_dim 128; flash_prefill_sm90.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// Which kernel flash_prefill runs. automatic: the Hopper kernel when
// flash_prefill_kernel_available(wgmma, head_dim), else mma_sync. wgmma_serial
// is the Hopper kernel without the softmax / P·V overlap (a fallback and a
// reference point for timing).
enum class FlashPrefillKernel { automatic, mma_sync, wgmma, wgmma_serial };

struct FlashPrefillParams {
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 128;  // 64 or 128 (flash_prefill_supports)
  float scale = 0.f;
  int64_t n_q = 0;
  int64_t n_kv = 0;
  int64_t q_tok_stride = 0;   // elements between tokens of q (and out when out_tok_stride is 0)
  int64_t kv_tok_stride = 0;  // elements between tokens of k and v
  int64_t out_tok_stride = 0;
  FlashPrefillKernel kernel = FlashPrefillKernel::automatic;
};

bool flash_prefill_supports(int head_dim);
// Whether `kernel` can run on the current device for this head_dim: the
// Hopper kernels need an sm_90 device, a build with the sm_90a target and
// head_dim 128.
bool flash_prefill_kernel_available(FlashPrefillKernel kernel, int head_dim);
// The kernel `automatic` resolves to on the current device.
FlashPrefillKernel flash_prefill_resolve(FlashPrefillKernel kernel, int head_dim);
const char* flash_prefill_kernel_name(FlashPrefillKernel kernel);

// q:   [n_q, q_tok_stride] bf16, head h at + h*head_dim
// k,v: [n_kv, kv_tok_stride] bf16, kv head g at + g*head_dim
// out: [n_q, out_tok_stride] bf16
void flash_prefill(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out,
                   cudaStream_t s);

}  // namespace kvtier::cuda
