#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "gpu/llama_gpu.h"
#include "ops/decode_attn/decode_attn_cuda.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"
#include "ops/gather/gather_cuda.h"
#include "ops/index_score/index_score_cuda.h"
#include "ops/lowrank_k/lowrank_k_cuda.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "ops/rope/rope_cuda.h"
#include "ops/swiglu/swiglu_cuda.h"
#include "ops/topk/topk_cuda.h"

namespace kvtier::gpu {
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

namespace {

DeviceBuffer random_bf16(size_t n, uint64_t seed, float a, size_t& total) {
  DeviceBuffer b(n * 2);
  cuda::fill_uniform_bf16(b.data(), int64_t(n), seed, -a, a, nullptr);
  total += n * 2;
  return b;
}

// Copies this step's K and V (rows of qkv after RoPE) into slot `slot` of
// each (seq, kv head) row: dst + r*row_stride + slot*tok_stride (+ v_off).
__global__ void append_kv_kernel(const __nv_bfloat16* qkv, int64_t qkv_stride, int n_head, int n_kv_head,
                                 __nv_bfloat16* dst, int64_t row_stride, int64_t tok_stride, int64_t v_off,
                                 int64_t slot) {
  const int seq = blockIdx.x / n_kv_head, g = blockIdx.x % n_kv_head, d = threadIdx.x;
  const __nv_bfloat16* kq = qkv + seq * qkv_stride + int64_t(n_head + g) * 128;
  const __nv_bfloat16* vq = kq + int64_t(n_kv_head) * 128;
  __nv_bfloat16* o = dst + (int64_t(blockIdx.x) * row_stride + slot * tok_stride);
  o[d] = kq[d];
  o[v_off + d] = vq[d];
}

// Host KV with no NaN/Inf codes: random bits with the top exponent bit of
// every element cleared (|x| < 2), 8 bytes per store over PCIe.
constexpr uint64_t kFp8Finite = 0xBFBFBFBFBFBFBFBFull;   // E4M3: bit 6 of each byte
constexpr uint64_t kBf16Finite = 0xBFFFBFFFBFFFBFFFull;  // bf16: bit 14 of each half-word
__global__ void fill_finite_kernel(uint64_t* dst, int64_t n_words, uint64_t seed, uint64_t mask) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + uint64_t(i);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    dst[i] = (z ^ (z >> 31)) & mask;
  }
}

// Token ids of the selected chunks. Landmark i of row r stands for chunk
// lm_chunk[r][i] (outlier chunks have no landmark) = tokens tok0 + c·chunk ..
// + c - 1; ascending landmarks give ascending tokens.
__global__ void chunk_tokens_kernel(const int32_t* sel, int k_chunk, const int32_t* lm_chunk, int64_t n_lm, int c,
                                    int64_t tok0, int32_t* tok) {
  const int64_t r = blockIdx.x;
  for (int i = threadIdx.x; i < k_chunk * c; i += blockDim.x) {
    const int32_t lm = sel[r * k_chunk + i / c];
    tok[r * k_chunk * c + i] = int32_t(tok0 + int64_t(lm_chunk[r * n_lm + lm]) * c + i % c);
  }
}

}  // namespace

Policy parse_policy(const std::string& name) {
  if (name == "full") return Policy::full;
  if (name == "yakv" || name == "yakv-noreuse") return Policy::yakv;
  if (name == "shadowkv") return Policy::shadowkv;
  fail("gpu-bench: policy '{}' not supported on the GPU path (expected full, yakv, yakv-noreuse or shadowkv)", name);
}

DecodeConfig decode_preset(const std::string& name) {
  DecodeConfig c;
  c.policy = parse_policy(name);
  c.reuse = name != "yakv-noreuse";
  if (c.policy == Policy::shadowkv) {
    // SPEC "Why" (ShadowKV on Llama-3.1-8B): no sinks, a 32-token window,
    // 2048 selected tokens at 128K, no reuse across steps.
    c.n_sink = 0;
    c.n_window = 32;
    c.budget = 2048.0 / 131072.0;
    c.reuse = false;
  }
  return c;
}

LlamaGpu::LlamaGpu(const LlamaShape& s, uint64_t seed) : s_(s) {
  const size_t E = size_t(s.n_embd), QKV = size_t(s.n_head + 2 * s.n_kv_head) * s.head_dim,
               HD = size_t(s.n_head) * s.head_dim, F = size_t(s.n_ff);
  // uniform(±√(3/fan_in)): unit-variance outputs, so activations stay finite.
  auto a = [](size_t fan_in) { return float(std::sqrt(3.0 / double(fan_in))); };
  for (int l = 0; l < s.n_layer; ++l) {
    LayerWeights w;
    const uint64_t ls = seed + 1000 * uint64_t(l);
    w.attn_norm = random_bf16(E, ls + 1, 0.f, weight_bytes_);
    cuda::fill_uniform_bf16(w.attn_norm.data(), int64_t(E), ls + 1, 0.9f, 1.1f, nullptr);
    w.wqkv = random_bf16(QKV * E, ls + 2, a(E), weight_bytes_);
    w.wo = random_bf16(E * HD, ls + 3, a(HD), weight_bytes_);
    w.ffn_norm = random_bf16(E, ls + 4, 0.f, weight_bytes_);
    cuda::fill_uniform_bf16(w.ffn_norm.data(), int64_t(E), ls + 4, 0.9f, 1.1f, nullptr);
    w.w_gate_up = random_bf16(2 * F * E, ls + 5, a(E), weight_bytes_);
    w.w_down = random_bf16(E * F, ls + 6, a(F), weight_bytes_);
    layers_.push_back(std::move(w));
  }
  tok_embd_ = random_bf16(size_t(s.n_vocab) * E, seed + 7, 1.f, weight_bytes_);
  out_norm_ = random_bf16(E, seed + 8, 0.f, weight_bytes_);
  cuda::fill_uniform_bf16(out_norm_.data(), int64_t(E), seed + 8, 0.9f, 1.1f, nullptr);
  lm_head_ = random_bf16(size_t(s.n_vocab) * E, seed + 9, a(E), weight_bytes_);
  std::vector<float> inv(size_t(s.head_dim / 2));
  for (int i = 0; i < s.head_dim / 2; ++i) inv[size_t(i)] = float(std::pow(double(s.rope_theta), -2.0 * i / s.head_dim));
  inv_freq_ = DeviceBuffer(inv.size() * 4);
  KVT_CUDA_CHECK(cudaMemcpy(inv_freq_.data(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  KVT_CUDA_CHECK(cudaDeviceSynchronize());
}

double time_prefill(LlamaGpu& m, int64_t T, cudaStream_t s) {
  const LlamaShape& S = m.shape();
  const int64_t E = S.n_embd, QKV = int64_t(S.n_head + 2 * S.n_kv_head) * S.head_dim, HD = int64_t(S.n_head) * S.head_dim,
                F = S.n_ff;
  DeviceBuffer x(size_t(T * E * 2)), xn(size_t(T * E * 2)), qkv(size_t(T * QKV * 2)), attn(size_t(T * HD * 2)),
      delta(size_t(T * E * 2)), gu(size_t(T * 2 * F * 2)), h(size_t(T * F * 2)), logits(size_t(S.n_vocab) * 2),
      pos(size_t(T * 8));
  std::vector<int64_t> hp(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) hp[size_t(i)] = i;
  KVT_CUDA_CHECK(cudaMemcpy(pos.data(), hp.data(), hp.size() * 8, cudaMemcpyHostToDevice));
  cuda::fill_uniform_bf16(x.data(), T * E, 99, -1.f, 1.f, s);
  cuda::FlashPrefillParams fp;
  fp.n_head = S.n_head;
  fp.n_kv_head = S.n_kv_head;
  fp.head_dim = S.head_dim;
  fp.scale = 1.f / std::sqrt(float(S.head_dim));
  fp.n_q = fp.n_kv = T;
  fp.q_tok_stride = fp.kv_tok_stride = QKV;
  fp.out_tok_stride = HD;
  auto* qkvp = qkv.data<__nv_bfloat16>();
  auto run = [&] {
    for (int l = 0; l < S.n_layer; ++l) {
      const LayerWeights& w = m.layer(l);
      cuda::add_rmsnorm(x.data(), l ? delta.data() : nullptr, w.attn_norm.data(), T, int(E), 1e-5f, xn.data(), s);
      m.gemm().run(T, QKV, E, xn.data(), w.wqkv.data(), qkv.data(), s);
      cuda::rope(qkv.data(), T, QKV, S.n_head + S.n_kv_head, S.head_dim, pos.data<int64_t>(), m.inv_freq(), false, s);
      cuda::flash_prefill(fp, qkvp, qkvp + HD, qkvp + HD + int64_t(S.n_kv_head) * S.head_dim, attn.data(), s);
      m.gemm().run(T, E, HD, attn.data(), w.wo.data(), delta.data(), s);
      cuda::add_rmsnorm(x.data(), delta.data(), w.ffn_norm.data(), T, int(E), 1e-5f, xn.data(), s);
      m.gemm().run(T, 2 * F, E, xn.data(), w.w_gate_up.data(), gu.data(), s);
      cuda::swiglu(gu.data(), T, int(F), h.data(), s);
      m.gemm().run(T, E, F, h.data(), w.w_down.data(), delta.data(), s);
    }
    cuda::add_rmsnorm(x.data(), delta.data(), m.output_norm(), T, int(E), 1e-5f, xn.data(), s);
    m.gemm().run(1, S.n_vocab, E, xn.data<__nv_bfloat16>() + (T - 1) * E, m.lm_head(), logits.data(), s);
  };
  run();  // warm-up: cuBLASLt plans, module load
  cuda::Event a, b;
  a.record(s);
  run();
  b.record(s);
  b.synchronize();
  return double(b.elapsed_ms_since(a));
}

struct DecodeState::Impl {
  LlamaGpu& m;
  DecodeConfig cfg;
  int64_t E, QKV, HD, F, rows, n_mid = 0;
  int64_t cap = 0;  // full: slots per row
  // yakv, shadowkv: resident slots per row = sinks, the window ring of n_local
  // slots, then (shadowkv) the outlier chunks' tokens.
  int64_t n_local = 0, n_res = 0;
  int64_t n_lm = 0;  // shadowkv: landmarks per row (non-outlier chunks)
  int k = 0, k_chunk = 0, splits_main = 1, splits_g = 1, n_part = 1;
  DeviceBuffer x, xn, qkv, q, attn, delta, gu, h, logits, pos, part_out, part_lse;
  std::vector<DeviceBuffer> kv;        // full: per layer [2][rows, cap, hd] bf16;
                                       // yakv, shadowkv: per layer resident [rows, n_res, 2, hd] bf16
  std::vector<DeviceBuffer> index;     // yakv: per layer [rows, n_ctx records] higgs2 (codes plane, scales plane)
  PinnedBuffer host;                   // yakv: [layer][rows, n_ctx, 2, hd] fp8 K|V;
                                       // shadowkv: [layer][rows, n_ctx, hd] bf16 V
  std::vector<DeviceBuffer> gathered;  // yakv: per layer [rows, k, 2, hd] fp8 (with reuse: the slot cache)
  std::vector<DeviceBuffer> sel;       // yakv: per layer 2 x [rows, k] int32 (this step's, last step's)
  std::vector<DeviceBuffer> slots;     // yakv with reuse: per layer 2 x [rows, k] int32 slot of each selected token
  DeviceBuffer miss_flags;             // yakv with reuse: gather_slots scratch (miss lists)
  std::vector<DeviceBuffer> svd_a;     // shadowkv: per layer [n_seq, n_ctx, rank] bf16 (U·S of the pre-RoPE keys)
  std::vector<DeviceBuffer> svd_b;     // shadowkv: per layer [n_seq, rank, n_kv_head*hd] bf16 (Vᵀ)
  std::vector<DeviceBuffer> landmarks; // shadowkv: per layer [rows, n_lm, hd] bf16 chunk means of post-RoPE keys
  std::vector<DeviceBuffer> lm_chunk;  // shadowkv: per layer [rows, n_lm] int32 chunk of each landmark
  DeviceBuffer chunk_sel, tok_sel;     // shadowkv: [rows, k_chunk], [rows, k] int32
  DeviceBuffer k_sel, v_sel;           // shadowkv: [rows, k, hd] bf16 rebuilt keys, gathered values
  DeviceBuffer scores, qidx, grid, signs, misses;
  cuda::Stream side;
  std::vector<std::unique_ptr<cuda::Event>> fork, join, marks;  // marks: [layer][7] + 2
  int parity = 0;
  int64_t host_layer_bytes = 0, miss_bytes = 0;

  Impl(LlamaGpu& model, const DecodeConfig& c) : m(model), cfg(c) {}
};

DecodeState::DecodeState(LlamaGpu& model, const DecodeConfig& cfg, uint64_t seed)
    : impl_(std::make_unique<Impl>(model, cfg)) {
  Impl& I = *impl_;
  const LlamaShape& S = model.shape();
  KVT_CHECK(S.head_dim == 128, "gpu-bench: head_dim {} unsupported", S.head_dim);
  I.E = S.n_embd;
  I.QKV = int64_t(S.n_head + 2 * S.n_kv_head) * S.head_dim;
  I.HD = int64_t(S.n_head) * S.head_dim;
  I.F = S.n_ff;
  I.rows = int64_t(cfg.n_seq) * S.n_kv_head;
  const int64_t B = cfg.n_seq, hd = S.head_dim;
  auto dev = [&](size_t bytes) {
    gpu_bytes_ += bytes;
    return DeviceBuffer(bytes);
  };
  I.x = dev(size_t(B * I.E * 2));
  I.xn = dev(size_t(B * I.E * 2));
  I.qkv = dev(size_t(B * I.QKV * 2));
  I.q = dev(size_t(B * I.HD * 2));
  I.attn = dev(size_t(B * I.HD * 2));
  I.delta = dev(size_t(B * I.E * 2));
  I.gu = dev(size_t(B * 2 * I.F * 2));
  I.h = dev(size_t(B * I.F * 2));
  I.logits = dev(size_t(B * S.n_vocab * 2));
  I.pos = dev(size_t(B * 8));
  std::vector<int64_t> hp(size_t(B), cfg.n_ctx);
  KVT_CUDA_CHECK(cudaMemcpy(I.pos.data(), hp.data(), hp.size() * 8, cudaMemcpyHostToDevice));
  cuda::fill_uniform_bf16(I.x.data(), B * I.E, seed, -1.f, 1.f, nullptr);
  if (cfg.policy == Policy::full) {
    I.cap = (cfg.n_ctx + 1 + 7) / 8 * 8;
    I.splits_main = cuda::decode_attn_splits(I.rows, cfg.n_ctx + 1);
    I.n_part = I.splits_main;
    for (int l = 0; l < S.n_layer; ++l) {
      I.kv.push_back(dev(size_t(2 * I.rows * I.cap * hd * 2)));
      cuda::fill_uniform_bf16(I.kv.back().data(), 2 * I.rows * I.cap * hd, seed + 10 + l, -1.f, 1.f, nullptr);
    }
  } else if (cfg.policy == Policy::yakv) {
    I.n_local = cfg.n_window;
    I.n_res = cfg.n_sink + cfg.n_window;
    const int64_t n_res = I.n_res;
    I.n_mid = cfg.n_ctx - n_res;
    KVT_CHECK(I.n_mid > 0, "gpu-bench: context {} shorter than sinks + window", cfg.n_ctx);
    I.k = int(std::min<int64_t>(I.n_mid, int64_t(std::llround(cfg.budget * double(cfg.n_ctx)))));
    k_ = I.k;
    I.splits_g = cuda::decode_attn_splits(I.rows, I.k, 128);
    I.n_part = 1 + I.splits_g;
    const int64_t entry = 2 * hd;  // fp8 K|V
    I.miss_bytes = entry;
    I.host_layer_bytes = I.rows * cfg.n_ctx * entry;
    I.host = PinnedBuffer(size_t(I.host_layer_bytes * S.n_layer));
    host_bytes_ = I.host.bytes();
    fill_finite_kernel<<<4096, 256>>>(I.host.device_ptr<uint64_t>(), int64_t(I.host.bytes() / 8), seed + 3, kFp8Finite);
    KVT_CUDA_LAUNCH_CHECK("fill_finite_kernel");
    const int64_t idx_stride = (cfg.n_ctx * kHiggs2RecordBytes + 15) / 16 * 16;
    for (int l = 0; l < S.n_layer; ++l) {
      I.kv.push_back(dev(size_t(I.rows * n_res * 2 * hd * 2)));
      cuda::fill_uniform_bf16(I.kv.back().data(), I.rows * n_res * 2 * hd, seed + 10 + l, -1.f, 1.f, nullptr);
      I.index.push_back(dev(size_t(I.rows * idx_stride)));
      cuda::fill_random_bytes(I.index.back().data(), int64_t(I.index.back().bytes()), seed + 200 + l, nullptr);
      I.gathered.push_back(dev(size_t(I.rows * I.k * entry)));
      for (int pp = 0; pp < 2; ++pp) {
        I.sel.push_back(dev(size_t(I.rows * I.k * 4)));
        KVT_CUDA_CHECK(cudaMemset(I.sel.back().data(), 0xff, I.sel.back().bytes()));  // empty: -1
        if (!cfg.reuse) continue;
        I.slots.push_back(dev(size_t(I.rows * I.k * 4)));
        KVT_CUDA_CHECK(cudaMemset(I.slots.back().data(), 0xff, I.slots.back().bytes()));
      }
    }
    if (cfg.reuse) {
      GatherParams gp;
      gp.n_rows = I.rows;
      gp.k = I.k;
      gp.entry_bytes = entry;
      I.miss_flags = dev(size_t(cuda::gather_slots_scratch_bytes(gp)));
    }
    I.scores = dev(size_t(I.rows * I.n_mid * 4));
    I.qidx = dev(size_t(I.rows * hd * 4));
    I.grid = dev(256 * 4 * 4);
    cuda::fill_uniform_f32(I.grid.data<float>(), 1024, seed + 5, -2.f, 2.f, nullptr);
    I.signs = dev(size_t(hd * 4));
    std::vector<float> sg(static_cast<size_t>(hd));
    for (int i = 0; i < hd; ++i) sg[size_t(i)] = ((i * 2654435761u) >> 7) & 1 ? 1.f : -1.f;
    KVT_CUDA_CHECK(cudaMemcpy(I.signs.data(), sg.data(), sg.size() * 4, cudaMemcpyHostToDevice));
    I.misses = dev(8);
    KVT_CUDA_CHECK(cudaMemset(I.misses.data(), 0, 8));
  } else {  // shadowkv
    const int64_t c = cfg.chunk, rank = cfg.rank, W = int64_t(S.n_kv_head) * hd;
    const int group = S.n_head / S.n_kv_head;
    KVT_CHECK(group == 1 || group == 2 || group == 4,
              "gpu-bench: shadowkv scores landmarks with each query head of a GQA group of 1, 2 or 4, not {}", group);
    KVT_CHECK(c >= 1 && rank >= 1 && cfg.n_outlier >= 0, "gpu-bench: shadowkv chunk {} rank {} outliers {} invalid", c,
              rank, cfg.n_outlier);
    // A row's tokens: [sinks | n_chunk chunks | window]; the window also takes
    // the (< chunk) tokens the chunking leaves over. n_outlier chunks are kept
    // exact on the GPU and have no landmark.
    const int64_t n_chunk = (cfg.n_ctx - cfg.n_sink - cfg.n_window) / c;
    I.n_lm = n_chunk - cfg.n_outlier;
    KVT_CHECK(I.n_lm > 0,
              "gpu-bench: context {} too short for shadowkv ({} sinks, {}-token window, {} outlier chunks of {})",
              cfg.n_ctx, cfg.n_sink, cfg.n_window, cfg.n_outlier, c);
    I.n_local = cfg.n_ctx - cfg.n_sink - n_chunk * c;
    I.n_res = cfg.n_sink + I.n_local + cfg.n_outlier * c;
    const int64_t budget = std::max<int64_t>(c, std::llround(cfg.budget * double(cfg.n_ctx)));
    I.k_chunk = int(std::min<int64_t>(I.n_lm, budget / c));
    I.k = int(I.k_chunk * c);
    k_ = I.k;
    I.splits_g = cuda::decode_attn_splits(I.rows, I.k, 128);
    I.n_part = 1 + I.splits_g;
    // Values only on the host: the keys come from the SVD.
    I.miss_bytes = hd * 2;
    I.host_layer_bytes = I.rows * cfg.n_ctx * hd * 2;
    I.host = PinnedBuffer(size_t(I.host_layer_bytes * S.n_layer));
    host_bytes_ = I.host.bytes();
    fill_finite_kernel<<<4096, 256>>>(I.host.device_ptr<uint64_t>(), int64_t(I.host.bytes() / 8), seed + 3,
                                      kBf16Finite);
    KVT_CUDA_LAUNCH_CHECK("fill_finite_kernel");
    // Which chunks are outliers does not matter for speed: spread evenly.
    std::vector<char> outlier(static_cast<size_t>(n_chunk), 0);
    for (int64_t j = 0; j < cfg.n_outlier; ++j) outlier[size_t((2 * j + 1) * n_chunk / (2 * cfg.n_outlier))] = 1;
    std::vector<int32_t> lm_chunk;  // [rows, n_lm]
    for (int64_t r = 0; r < I.rows; ++r)
      for (int64_t ch = 0; ch < n_chunk; ++ch)
        if (!outlier[size_t(ch)]) lm_chunk.push_back(int32_t(ch));
    KVT_CHECK(int64_t(lm_chunk.size()) == I.rows * I.n_lm, "gpu-bench: shadowkv outlier chunks not distinct");
    for (int l = 0; l < S.n_layer; ++l) {
      I.kv.push_back(dev(size_t(I.rows * I.n_res * 2 * hd * 2)));
      cuda::fill_uniform_bf16(I.kv.back().data(), I.rows * I.n_res * 2 * hd, seed + 10 + l, -1.f, 1.f, nullptr);
      I.svd_a.push_back(dev(size_t(B * cfg.n_ctx * rank * 2)));
      cuda::fill_uniform_bf16(I.svd_a.back().data(), B * cfg.n_ctx * rank, seed + 300 + l, -1.f, 1.f, nullptr);
      // ±√(3/rank): rebuilt keys of unit variance.
      const float bs = float(std::sqrt(3.0 / double(rank)));
      I.svd_b.push_back(dev(size_t(B * rank * W * 2)));
      cuda::fill_uniform_bf16(I.svd_b.back().data(), B * rank * W, seed + 400 + l, -bs, bs, nullptr);
      I.landmarks.push_back(dev(size_t(I.rows * I.n_lm * hd * 2)));
      cuda::fill_uniform_bf16(I.landmarks.back().data(), I.rows * I.n_lm * hd, seed + 500 + l, -1.f, 1.f, nullptr);
      I.lm_chunk.push_back(dev(lm_chunk.size() * 4));
      KVT_CUDA_CHECK(
          cudaMemcpy(I.lm_chunk.back().data(), lm_chunk.data(), lm_chunk.size() * 4, cudaMemcpyHostToDevice));
    }
    // Step buffers, shared by the layers (no reuse across steps).
    I.scores = dev(size_t(I.rows * I.n_lm * 4));
    I.qidx = dev(size_t(B * S.n_head * hd * 4));
    I.chunk_sel = dev(size_t(I.rows * I.k_chunk * 4));
    I.tok_sel = dev(size_t(I.rows * I.k * 4));
    I.k_sel = dev(size_t(I.rows * I.k * hd * 2));
    I.v_sel = dev(size_t(I.rows * I.k * hd * 2));
    I.misses = dev(8);
    KVT_CUDA_CHECK(cudaMemset(I.misses.data(), 0, 8));
  }
  I.part_out = dev(size_t(I.n_part) * B * S.n_head * hd * 4);
  I.part_lse = dev(size_t(I.n_part) * B * S.n_head * 4);
  for (int l = 0; l < S.n_layer; ++l) {
    I.fork.push_back(std::make_unique<cuda::Event>(false));
    I.join.push_back(std::make_unique<cuda::Event>(false));
  }
  for (int i = 0; i < S.n_layer * 7 + 2; ++i) I.marks.push_back(std::make_unique<cuda::Event>(true));
  KVT_CUDA_CHECK(cudaDeviceSynchronize());
}

DecodeState::~DecodeState() = default;

void DecodeState::step(cudaStream_t s, bool timing) {
  Impl& I = *impl_;
  const LlamaShape& S = I.m.shape();
  const int64_t B = I.cfg.n_seq, hd = S.head_dim, n_qh = B * S.n_head;
  auto mark = [&](int i) {
    if (timing) I.marks[size_t(i)]->record(s);
  };
  if (I.cfg.policy != Policy::full) KVT_CUDA_CHECK(cudaMemsetAsync(I.misses.data(), 0, 8, s));
  DecodeAttnParams ap;
  ap.n_seq = int(B);
  ap.n_head = S.n_head;
  ap.n_kv_head = S.n_kv_head;
  ap.head_dim = int(hd);
  ap.scale = 1.f / std::sqrt(float(hd));
  // This step's K/V into the window ring of the resident slots.
  auto append_resident = [&](int l) {
    const int64_t slot = I.cfg.n_sink + I.cfg.n_ctx % I.n_local;
    append_kv_kernel<<<unsigned(I.rows), unsigned(hd), 0, s>>>(
        I.qkv.data<__nv_bfloat16>(), I.QKV, S.n_head, S.n_kv_head, I.kv[size_t(l)].data<__nv_bfloat16>(),
        I.n_res * 2 * hd, 2 * hd, hd, slot);
    KVT_CUDA_LAUNCH_CHECK("append_kv_kernel");
  };
  // Resident tokens (sinks, window, shadowkv's outlier chunks) into part 0 on
  // the side stream, overlapped with score → select → gather on the main stream.
  auto attend_resident = [&](int l) {
    const uint8_t* res = I.kv[size_t(l)].data<uint8_t>();
    I.fork[size_t(l)]->record(s);
    KVT_CUDA_CHECK(cudaStreamWaitEvent(I.side.get(), I.fork[size_t(l)]->get()));
    DecodeAttnParams rp = ap;
    rp.elt = KvElt::bf16;
    rp.row_stride = I.n_res * 2 * hd * 2;
    rp.tok_stride = 2 * hd * 2;
    rp.n_tok = I.n_res;
    rp.n_split = 1;
    rp.part0 = 0;
    cuda::decode_attn(rp, I.q.data(), res, res + hd * 2, nullptr, I.part_out.data<float>(), I.part_lse.data<float>(),
                      I.side.get());
    I.join[size_t(l)]->record(I.side.get());
  };
  // The k selected tokens of every row, slot i of row r at r·k·tok_stride +
  // i·tok_stride (bytes), into parts 1 .. splits_g.
  // With `slot`, entry i of row r is read from slot slot[r·k + i].
  auto attend_selected = [&](KvElt elt, const uint8_t* k, const uint8_t* v, int64_t tok_stride,
                             const int32_t* slot = nullptr) {
    DecodeAttnParams gp = ap;
    gp.elt = elt;
    gp.row_stride = int64_t(I.k) * tok_stride;
    gp.tok_stride = tok_stride;
    gp.n_tok = I.k;
    gp.idx_stride = I.k;
    gp.n_split = I.splits_g;
    gp.part0 = 1;
    cuda::decode_attn(gp, I.q.data(), k, v, slot, I.part_out.data<float>(), I.part_lse.data<float>(), s);
  };
  for (int l = 0; l < S.n_layer; ++l) {
    const LayerWeights& w = I.m.layer(l);
    mark(l * 7 + 0);
    cuda::add_rmsnorm(I.x.data(), l ? I.delta.data() : nullptr, w.attn_norm.data(), B, int(I.E), 1e-5f, I.xn.data(), s);
    I.m.gemm().run(B, I.QKV, I.E, I.xn.data(), w.wqkv.data(), I.qkv.data(), s);
    cuda::rope(I.qkv.data(), B, I.QKV, S.n_head + S.n_kv_head, int(hd), I.pos.data<int64_t>(), I.m.inv_freq(), false, s);
    KVT_CUDA_CHECK(cudaMemcpy2DAsync(I.q.data(), size_t(I.HD * 2), I.qkv.data(), size_t(I.QKV * 2), size_t(I.HD * 2),
                                     size_t(B), cudaMemcpyDeviceToDevice, s));
    if (I.cfg.policy == Policy::full) {
      uint8_t* kc = I.kv[size_t(l)].data<uint8_t>();
      const int64_t half = I.rows * I.cap * hd * 2;
      append_kv_kernel<<<unsigned(I.rows), unsigned(hd), 0, s>>>(I.qkv.data<__nv_bfloat16>(), I.QKV, S.n_head,
                                                                  S.n_kv_head, reinterpret_cast<__nv_bfloat16*>(kc),
                                                                  I.cap * hd, hd, half / 2, I.cfg.n_ctx);
      KVT_CUDA_LAUNCH_CHECK("append_kv_kernel");
      mark(l * 7 + 1);
      mark(l * 7 + 2);
      mark(l * 7 + 3);
      mark(l * 7 + 4);
      ap.elt = KvElt::bf16;
      ap.row_stride = I.cap * hd * 2;
      ap.tok_stride = hd * 2;
      ap.n_tok = I.cfg.n_ctx + 1;
      ap.n_split = I.splits_main;
      ap.part0 = 0;
      cuda::decode_attn(ap, I.q.data(), kc, kc + half, nullptr, I.part_out.data<float>(), I.part_lse.data<float>(), s);
    } else if (I.cfg.policy == Policy::yakv) {
      append_resident(l);
      mark(l * 7 + 1);
      attend_resident(l);
      // score
      cuda::index_query(I.q.data(), int(B), S.n_head, S.n_kv_head, int(hd), true, true, I.signs.data<float>(),
                        I.qidx.data<float>(), s);
      IndexScoreParams sp;
      sp.n_seq = int(B);
      sp.n_kv_head = S.n_kv_head;
      sp.n_q = 1;
      sp.n_tok = I.n_mid;
      sp.tok_offset = I.cfg.n_sink;
      sp.row_stride = int64_t(I.index[size_t(l)].bytes()) / I.rows;
      sp.scale_offset = 32 * I.cfg.n_ctx;  // codes plane [n_ctx, 32], then scales plane [n_ctx] bf16
      cuda::index_score(IndexElt::higgs2, sp, I.qidx.data<float>(), I.index[size_t(l)].data<uint8_t>(),
                        I.grid.data<float>(), I.scores.data<float>(), s);
      mark(l * 7 + 2);
      // select
      const int cur = I.parity, prev = 1 - I.parity;
      int32_t* idx_cur = I.sel[size_t(2 * l + cur)].data<int32_t>();
      cuda::topk(I.scores.data<float>(), I.rows, I.n_mid, I.n_mid, I.k, I.cfg.n_sink, idx_cur, s);
      mark(l * 7 + 3);
      // gather, zero-copy from pinned host. With reuse the buffer is a slot
      // cache: tokens selected again stay where they are, only misses are read.
      GatherParams gp;
      gp.n_rows = I.rows;
      gp.k = I.k;
      gp.entry_bytes = 2 * hd;
      gp.src_tok_stride = 2 * hd;
      gp.src_row_stride = I.cfg.n_ctx * 2 * hd;
      gp.dst_row_stride = int64_t(I.k) * 2 * hd;
      uint8_t* gbuf = I.gathered[size_t(l)].data<uint8_t>();
      const uint8_t* host_l = I.host.device_ptr<uint8_t>() + l * I.host_layer_bytes;
      int32_t* slot = nullptr;
      if (I.cfg.reuse) {
        slot = I.slots[size_t(2 * l + cur)].data<int32_t>();
        cuda::gather_slots(gp, host_l, idx_cur, I.sel[size_t(2 * l + prev)].data<int32_t>(),
                           I.slots[size_t(2 * l + prev)].data<int32_t>(), slot, I.miss_flags.data(), gbuf,
                           I.misses.data<unsigned long long>(), s);
      } else {
        cuda::gather(gp, host_l, idx_cur, nullptr, nullptr, gbuf, I.misses.data<unsigned long long>(), s);
      }
      mark(l * 7 + 4);
      attend_selected(KvElt::fp8, gbuf, gbuf + hd, 2 * hd, slot);  // [rows, k, K|V] fp8
      KVT_CUDA_CHECK(cudaStreamWaitEvent(s, I.join[size_t(l)]->get()));
    } else {  // shadowkv
      append_resident(l);
      mark(l * 7 + 1);
      attend_resident(l);
      // score: each chunk landmark against every query head of the group, max over the group
      cuda::index_query(I.q.data(), int(B), S.n_head, S.n_kv_head, int(hd), false, false, nullptr,
                        I.qidx.data<float>(), s);
      IndexScoreParams sp;
      sp.n_seq = int(B);
      sp.n_kv_head = S.n_kv_head;
      sp.n_q = S.n_head / S.n_kv_head;
      sp.n_tok = I.n_lm;
      sp.row_stride = I.n_lm * hd * 2;
      cuda::index_score(IndexElt::bf16, sp, I.qidx.data<float>(), I.landmarks[size_t(l)].data<uint8_t>(), nullptr,
                        I.scores.data<float>(), s);
      mark(l * 7 + 2);
      // select: the top chunks, then their tokens (ascending)
      int32_t* chunks = I.chunk_sel.data<int32_t>();
      int32_t* toks = I.tok_sel.data<int32_t>();
      cuda::topk(I.scores.data<float>(), I.rows, I.n_lm, I.n_lm, I.k_chunk, 0, chunks, s);
      chunk_tokens_kernel<<<unsigned(I.rows), 256, 0, s>>>(chunks, I.k_chunk, I.lm_chunk[size_t(l)].data<int32_t>(),
                                                             I.n_lm, I.cfg.chunk, I.cfg.n_sink, toks);
      KVT_CUDA_LAUNCH_CHECK("chunk_tokens_kernel");
      mark(l * 7 + 3);
      // gather: keys rebuilt from the SVD on the GPU, values zero-copy from
      // pinned host memory (no reuse: every selected value is a miss)
      LowrankKParams kp;
      kp.n_seq = int(B);
      kp.n_kv_head = S.n_kv_head;
      kp.head_dim = int(hd);
      kp.rank = I.cfg.rank;
      kp.k = I.k;
      kp.n_ctx = I.cfg.n_ctx;
      kp.a_seq_stride = I.cfg.n_ctx * I.cfg.rank;
      kp.b_seq_stride = int64_t(I.cfg.rank) * S.n_kv_head * hd;
      kp.out_row_stride = int64_t(I.k) * hd;
      cuda::lowrank_k(kp, I.svd_a[size_t(l)].data(), I.svd_b[size_t(l)].data(), toks, I.m.inv_freq(), I.k_sel.data(),
                      s);
      GatherParams gp;
      gp.n_rows = I.rows;
      gp.k = I.k;
      gp.entry_bytes = hd * 2;
      gp.src_tok_stride = hd * 2;
      gp.src_row_stride = I.cfg.n_ctx * hd * 2;
      gp.dst_row_stride = int64_t(I.k) * hd * 2;
      cuda::gather(gp, I.host.device_ptr<uint8_t>() + l * I.host_layer_bytes, toks, nullptr, nullptr,
                   I.v_sel.data<uint8_t>(), I.misses.data<unsigned long long>(), s);
      mark(l * 7 + 4);
      attend_selected(KvElt::bf16, I.k_sel.data<uint8_t>(), I.v_sel.data<uint8_t>(), hd * 2);  // [rows, k, hd] each
      KVT_CUDA_CHECK(cudaStreamWaitEvent(s, I.join[size_t(l)]->get()));
    }
    cuda::attn_merge(I.n_part, n_qh, int(hd), I.part_out.data<float>(), I.part_lse.data<float>(), I.attn.data(), nullptr,
                     nullptr, s);
    mark(l * 7 + 5);
    I.m.gemm().run(B, I.E, I.HD, I.attn.data(), w.wo.data(), I.delta.data(), s);
    cuda::add_rmsnorm(I.x.data(), I.delta.data(), w.ffn_norm.data(), B, int(I.E), 1e-5f, I.xn.data(), s);
    I.m.gemm().run(B, 2 * I.F, I.E, I.xn.data(), w.w_gate_up.data(), I.gu.data(), s);
    cuda::swiglu(I.gu.data(), B, int(I.F), I.h.data(), s);
    I.m.gemm().run(B, I.E, I.F, I.h.data(), w.w_down.data(), I.delta.data(), s);
    mark(l * 7 + 6);
  }
  mark(S.n_layer * 7);
  cuda::add_rmsnorm(I.x.data(), I.delta.data(), I.m.output_norm(), B, int(I.E), 1e-5f, I.xn.data(), s);
  I.m.gemm().run(B, S.n_vocab, I.E, I.xn.data(), I.m.lm_head(), I.logits.data(), s);
  mark(S.n_layer * 7 + 1);
  I.parity ^= 1;
}

StageTimes DecodeState::stage_times() const {
  const Impl& I = *impl_;
  const int L = I.m.shape().n_layer;
  I.marks.back()->synchronize();
  auto dt = [&](int a, int b) { return double(I.marks[size_t(b)]->elapsed_ms_since(*I.marks[size_t(a)])); };
  StageTimes t;
  for (int l = 0; l < L; ++l) {
    const int b = l * 7;
    t.rest += dt(b, b + 1) + dt(b + 5, b + 6);
    t.score += dt(b + 1, b + 2);
    t.select += dt(b + 2, b + 3);
    t.gather += dt(b + 3, b + 4);
    t.attention += dt(b + 4, b + 5);
    if (l + 1 < L) t.rest += dt(b + 6, b + 7);
  }
  t.rest += dt(L * 7 - 1, L * 7) + dt(L * 7, L * 7 + 1);
  return t;
}

uint64_t DecodeState::last_step_pcie_bytes() {
  Impl& I = *impl_;
  if (I.cfg.policy == Policy::full) return 0;
  unsigned long long n = 0;
  KVT_CUDA_CHECK(cudaMemcpy(&n, I.misses.data(), 8, cudaMemcpyDeviceToHost));
  return uint64_t(n) * uint64_t(I.miss_bytes);
}

}  // namespace kvtier::gpu
