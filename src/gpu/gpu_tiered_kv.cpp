#include "gpu/gpu_tiered_kv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda_backend.h"
#include "gpu/gpu_model_kernels.h"
#include "ops/decode_attn/decode_attn_cuda.h"
#include "ops/gather/gather_cuda.h"
#include "ops/index_score/index_score_cuda.h"
#include "ops/kv_append/kv_append_cuda.h"
#include "ops/record_dequant/record_dequant_cuda.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"
#include "ops/topk/topk_cuda.h"

namespace kvtier {
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

std::string gpu_tiered_unsupported(const PolicyConfig& p, const KvGeometry& g) {
  const int group = g.n_kv_head > 0 ? g.n_head / g.n_kv_head : 0;
  if (p.index != IndexKind::landmarks || p.residual || p.chunk != 1)
    return "the GPU decodes per-token landmarks only (index=landmarks, chunk=1)";
  if (!index_append_supports(resolved_lm_spec(p.lm, g.head_dim), g.head_dim))
    return fmt::format("lm={} at head_dim {} (the GPU index is higgs2 with group 128, head_dim 128)", p.lm,
                       g.head_dim);
  if (p.kv != "fp8" && p.kv != "bf16") {
    const std::string why = higgs_record_unsupported(p.kv, g.n_kv_head, g.head_dim);
    if (!why.empty()) return fmt::format("kv={}: {}", p.kv, why);
  }
  if (p.keys_prerope) return "keys_prerope=1 (the GPU host tier holds post-RoPE keys)";
  if (p.gqa == GqaMode::shadowkv && group != 1 && group != 2 && group != 4)
    return fmt::format("gqa=shadowkv with a GQA group of {} (the GPU scores each query of groups of 1, 2 or 4)", group);
  if (p.local < 1) return "local=0 (the GPU path keeps the current token in the local window)";
  if (p.budget <= 0) return "budget=0";
  if (!cuda::decode_attn_supports(g.head_dim, group)) return fmt::format("a GQA group of {}", group);
  return "";
}

struct GpuTieredKv::Impl {
  struct Layer {
    int64_t n = 0;             // tokens held
    int64_t cap = 0;           // tokens the host tier and the index have room for
    PinnedBuffer host;         // [cap, tok_bytes]: [n_kv_head, entry] (fp8/bf16, higgs group 128) or one entry (higgs)
    DeviceBuffer index;        // [n_kv_head rows, row_stride]: codes plane [cap, 32], scales plane [cap] bf16
    int64_t row_stride = 0;
    DeviceBuffer resident;     // [n_kv_head, n_res, 2, head_dim] bf16
    DeviceBuffer slots;        // [n_kv_head, k, entry]: the slot cache
    DeviceBuffer sel[2], slot_of[2];  // [n_kv_head, k] int32: a step's selection and its slots, and the last step's
    int parity = 0;
    int k_prev = -1;           // k of the last step (-1: none); a new k starts the cache afresh
    std::unique_ptr<cuda::Event> fork, join;
  };
  PolicyConfig p;
  KvGeometry g;
  int H, D, QH;
  // Host K/V: fp8 / bf16 entries per (token, KV head), or HIGGS records
  // (kv_append.h: per token over the layer width — one entry serves every
  // head — or, with group 128, per head); the slot cache then holds the
  // records and record_dequant rebuilds the head's K|V in deq.
  bool higgs;
  KvElt elt;
  HiggsRecordLayout rec;
  int64_t entry;      // bytes a slot holds (fp8/bf16: one head's K|V; higgs: the token's records, or the head's group)
  int64_t tok_bytes;  // host bytes per token and layer
  int64_t n_res;
  bool decoding = false;
  int64_t budget = 0;
  std::vector<Layer> layers;
  DeviceBuffer grid, signs, qidx, scores, part_out, part_lse, scratch, misses;
  DeviceBuffer raw, gqa_scratch;    // gqa=shadowkv: [n_kv_head, group, n] per-query scores, the lse partials
  DeviceBuffer grid2, signs2, deq;  // higgs host K/V: EDEN2-256, its signs, [n_kv_head, k, K|V] bf16 (shared by the layers)
  int64_t scores_cap = 0, raw_cap = 0, n_part_cap = 0;
  cuda::Stream side;

  Impl(const PolicyConfig& pc, const KvGeometry& gc)
      : p(pc), g(gc), H(gc.n_kv_head), D(gc.head_dim), QH(gc.n_head),
        higgs(pc.kv != "fp8" && pc.kv != "bf16"), elt(pc.kv == "fp8" ? KvElt::fp8 : KvElt::bf16),
        rec(higgs ? higgs_record_layout(pc.kv, gc.n_kv_head * gc.head_dim) : HiggsRecordLayout()),
        entry(higgs ? rec.entry_bytes : kv_entry_bytes(elt, gc.head_dim)),
        tok_bytes(higgs ? rec.tok_bytes : gc.n_kv_head * entry), n_res(int64_t(pc.sink) + pc.local) {}

  void grow(Layer& L, int64_t need, cudaStream_t s, bool exact = false);
  void ensure_parts(int n_part, cudaStream_t s);
};

GpuTieredKv::GpuTieredKv(const PolicyConfig& p, const KvGeometry& g) {
  const std::string why = gpu_tiered_unsupported(p, g);
  KVT_CHECK(why.empty(), "GPU tiered KV: policy '{}' has no native GPU path: {}", to_string(p), why);
  impl_ = std::make_unique<Impl>(p, g);
  Impl& I = *impl_;
  I.layers.resize(size_t(g.n_layer));
  for (auto& L : I.layers) {
    L.resident = DeviceBuffer(size_t(I.H * I.n_res * 2 * I.D * 2));
    L.fork = std::make_unique<cuda::Event>(false);
    L.join = std::make_unique<cuda::Event>(false);
  }
  const QuantSpec lm = parse_quant_spec(resolved_lm_spec(p.lm, g.head_dim));
  const HiggsGrid& grid = higgs_grid(4, 256);
  I.grid = DeviceBuffer(grid.points.size() * 4);
  KVT_CUDA_CHECK(cudaMemcpy(I.grid.data(), grid.points.data(), I.grid.bytes(), cudaMemcpyHostToDevice));
  if (lm.random_signs) {
    std::vector<float> sg(static_cast<size_t>(I.D));
    hadamard_signs(lm.sign_seed, I.D, sg.data());
    I.signs = DeviceBuffer(sg.size() * 4);
    KVT_CUDA_CHECK(cudaMemcpy(I.signs.data(), sg.data(), I.signs.bytes(), cudaMemcpyHostToDevice));
  }
  if (I.higgs) {
    const HiggsGrid& g2 = higgs_grid(2, 256);
    I.grid2 = DeviceBuffer(g2.points.size() * 4);
    KVT_CUDA_CHECK(cudaMemcpy(I.grid2.data(), g2.points.data(), I.grid2.bytes(), cudaMemcpyHostToDevice));
    if (I.rec.random_signs) {
      std::vector<float> sg(static_cast<size_t>(I.rec.group));
      hadamard_signs(I.rec.sign_seed, I.rec.group, sg.data());
      I.signs2 = DeviceBuffer(sg.size() * 4);
      KVT_CUDA_CHECK(cudaMemcpy(I.signs2.data(), sg.data(), I.signs2.bytes(), cudaMemcpyHostToDevice));
    }
  }
  I.qidx = DeviceBuffer(size_t(I.QH * I.D * 4));  // [n_kv_head, n_q ≤ group, head_dim]
  if (p.gqa == GqaMode::shadowkv)
    I.gqa_scratch = DeviceBuffer(size_t(cuda::index_gqa_scratch_bytes(I.H, I.QH / I.H)));
  I.misses = DeviceBuffer(8);
  KVT_CUDA_CHECK(cudaMemset(I.misses.data(), 0, 8));
}

GpuTieredKv::~GpuTieredKv() = default;

// Room for `need` tokens: a larger host tier and index, the held tokens copied over.
void GpuTieredKv::Impl::grow(Layer& L, int64_t need, cudaStream_t s, bool exact) {
  if (need <= L.cap) return;
  const int64_t cap = exact ? need : std::max<int64_t>({need, 2 * L.cap, 1024});
  const int64_t row_stride = (cap * 34 + 15) / 16 * 16;
  KVT_CUDA_CHECK(cudaStreamSynchronize(s));  // in-flight kernels may still write the old tiers
  PinnedBuffer host(size_t(cap * tok_bytes));
  if (L.n > 0) std::memcpy(host.host(), L.host.host(), size_t(L.n * tok_bytes));
  DeviceBuffer index(size_t(H * row_stride));
  if (L.n > 0) {
    KVT_CUDA_CHECK(cudaMemcpy2DAsync(index.data(), size_t(row_stride), L.index.data(), size_t(L.row_stride),
                                     size_t(32 * L.n), size_t(H), cudaMemcpyDeviceToDevice, s));
    KVT_CUDA_CHECK(cudaMemcpy2DAsync(index.data<uint8_t>() + 32 * cap, size_t(row_stride),
                                     L.index.data<uint8_t>() + 32 * L.cap, size_t(L.row_stride), size_t(2 * L.n),
                                     size_t(H), cudaMemcpyDeviceToDevice, s));
    KVT_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  L.host = std::move(host);
  L.index = std::move(index);
  L.row_stride = row_stride;
  L.cap = cap;
}

void GpuTieredKv::Impl::ensure_parts(int n_part, cudaStream_t s) {
  if (n_part <= n_part_cap) return;
  KVT_CUDA_CHECK(cudaStreamSynchronize(s));
  KVT_CUDA_CHECK(cudaStreamSynchronize(side.get()));
  part_out = DeviceBuffer(size_t(n_part) * QH * D * 4);
  part_lse = DeviceBuffer(size_t(n_part) * QH * 4);
  n_part_cap = n_part;
}

void GpuTieredKv::append(int layer, const void* k, const void* v, int64_t kv_tok_stride, int64_t pos0, int n_tok,
                         cudaStream_t s) {
  Impl& I = *impl_;
  KVT_CHECK(layer >= 0 && layer < int(I.layers.size()), "GPU tiered KV: layer {} out of range", layer);
  Impl::Layer& L = I.layers[size_t(layer)];
  KVT_CHECK(pos0 == L.n && n_tok >= 1, "GPU tiered KV: append at {} ({} tokens) but {} are held", pos0, n_tok, L.n);
  I.grow(L, pos0 + n_tok, s);
  if (I.higgs) {
    cuda::record_append(I.rec, n_tok, pos0, I.tok_bytes, k, v, kv_tok_stride, I.grid2.data<float>(),
                        I.signs2.bytes() ? I.signs2.data<float>() : nullptr, L.host.device_ptr<uint8_t>(), s);
  } else {
    EntryAppendParams ep;
    ep.n_kv_head = I.H;
    ep.head_dim = I.D;
    ep.n_tok = n_tok;
    ep.pos0 = pos0;
    ep.elt = I.elt;
    ep.row_stride = I.entry;
    ep.tok_stride = I.tok_bytes;
    cuda::entry_append(ep, k, v, kv_tok_stride, L.host.device_ptr<uint8_t>(), s);
  }
  IndexAppendParams ip;
  ip.n_kv_head = I.H;
  ip.n_tok = n_tok;
  ip.pos0 = pos0;
  ip.row_stride = L.row_stride;
  ip.scale_offset = 32 * L.cap;
  cuda::index_append(ip, k, kv_tok_stride, I.grid.data<float>(), I.signs.bytes() ? I.signs.data<float>() : nullptr,
                     L.index.data<uint8_t>(), s);
  cuda::resident_append(k, v, kv_tok_stride, I.H, I.D, pos0, n_tok, I.p.sink, I.p.local, L.resident.data(), s);
  L.n = pos0 + n_tok;
}

void GpuTieredKv::reserve(int64_t n_tok, cudaStream_t s) {
  Impl& I = *impl_;
  for (auto& L : I.layers)
    I.grow(L, n_tok, s, /*exact=*/true);
}

void GpuTieredKv::start_decode(int64_t n_prompt) {
  Impl& I = *impl_;
  KVT_CHECK(!I.decoding, "GPU tiered KV: decode already started");
  I.decoding = true;
  I.budget = budget_tokens(I.p, n_prompt);
  KVT_CHECK(I.budget <= kSlotGatherMaxK, "GPU tiered KV: a budget of {} tokens exceeds the slot cache's {}",
            I.budget, kSlotGatherMaxK);
  const int64_t kmax = I.budget;
  GatherParams gp;
  gp.n_rows = I.H;
  gp.k = int(kmax);
  gp.entry_bytes = I.entry;
  I.scratch = DeviceBuffer(size_t(cuda::gather_slots_scratch_bytes(gp)));
  if (I.higgs) I.deq = DeviceBuffer(size_t(I.H * kmax * 4 * I.D));
  for (auto& L : I.layers) {
    L.slots = DeviceBuffer(size_t(I.H * kmax * I.entry));
    for (int i = 0; i < 2; ++i) {
      L.sel[i] = DeviceBuffer(size_t(I.H * kmax * 4));
      L.slot_of[i] = DeviceBuffer(size_t(I.H * kmax * 4));
    }
  }
}

bool GpuTieredKv::decoding() const { return impl_->decoding; }
int64_t GpuTieredKv::budget() const { return impl_->budget; }
int64_t GpuTieredKv::entry_bytes() const { return impl_->entry; }

void GpuTieredKv::attend(int layer, const void* q, float scale, void* out, cudaStream_t s) {
  Impl& I = *impl_;
  KVT_CHECK(I.decoding, "GPU tiered KV: attend before start_decode");
  Impl::Layer& L = I.layers[size_t(layer)];
  const int64_t n = L.n, sink = I.p.sink, local = I.p.local;
  // Resident: sinks, then the window (a prefix of the ring until it fills).
  const int64_t n_resident = std::min(n, sink) + std::min(local, std::max<int64_t>(0, n - sink));
  // Selectable: tokens [sink, n − local), of which the top `budget` by score.
  const int64_t n_mid = std::max<int64_t>(0, n - local - sink);
  const int k = int(std::min(I.budget, n_mid));
  const int splits = k > 0 ? cuda::decode_attn_splits(I.H, k, 128) : 0;
  I.ensure_parts(1 + splits, s);

  DecodeAttnParams ap;
  ap.n_seq = 1;
  ap.n_head = I.QH;
  ap.n_kv_head = I.H;
  ap.head_dim = I.D;
  ap.scale = scale;
  // Resident tokens into part 0 on the side stream, overlapped with score → select → gather.
  L.fork->record(s);
  KVT_CUDA_CHECK(cudaStreamWaitEvent(I.side.get(), L.fork->get()));
  {
    DecodeAttnParams rp = ap;
    rp.elt = KvElt::bf16;
    rp.row_stride = I.n_res * 2 * I.D * 2;
    rp.tok_stride = 2 * I.D * 2;
    rp.n_tok = n_resident;
    const uint8_t* res = L.resident.data<uint8_t>();
    cuda::decode_attn(rp, q, res, res + I.D * 2, nullptr, I.part_out.data<float>(), I.part_lse.data<float>(),
                      I.side.get());
  }
  L.join->record(I.side.get());
  if (k > 0) {
    if (I.scores_cap < I.H * n_mid) {
      KVT_CUDA_CHECK(cudaStreamSynchronize(s));  // the last layer's step may still read the old buffer
      I.scores = DeviceBuffer(size_t(I.H * std::max<int64_t>(n_mid, 2 * I.scores_cap / I.H)) * 4);
      I.scores_cap = int64_t(I.scores.bytes() / 4);
    }
    // Score: gqa=mean ranks by the group's mean query; gqa=shadowkv by the
    // max over the group's queries of each one's softmax over all n tokens.
    const bool mean = I.p.gqa == GqaMode::mean;
    const int n_q = mean ? 1 : I.QH / I.H;
    cuda::index_query(q, 1, I.QH, I.H, I.D, mean, true, I.signs.bytes() ? I.signs.data<float>() : nullptr,
                      I.qidx.data<float>(), s);
    IndexScoreParams sp;
    sp.n_kv_head = I.H;
    sp.head_dim = I.D;
    sp.n_q = n_q;
    sp.row_stride = L.row_stride;
    sp.scale_offset = 32 * L.cap;
    if (mean) {
      sp.n_tok = n_mid;
      sp.tok_offset = sink;
      cuda::index_score(IndexElt::higgs2, sp, I.qidx.data<float>(), L.index.data<uint8_t>(), I.grid.data<float>(),
                        I.scores.data<float>(), s);
    } else {
      if (I.raw_cap < I.H * n_q * n) {
        KVT_CUDA_CHECK(cudaStreamSynchronize(s));
        I.raw = DeviceBuffer(size_t(I.H * n_q * std::max<int64_t>(n, 2 * I.raw_cap / (I.H * n_q))) * 4);
        I.raw_cap = int64_t(I.raw.bytes() / 4);
      }
      sp.n_tok = n;
      sp.per_query = true;
      cuda::index_score(IndexElt::higgs2, sp, I.qidx.data<float>(), L.index.data<uint8_t>(), I.grid.data<float>(),
                        I.raw.data<float>(), s);
      cuda::index_gqa_softmax_max(I.raw.data<float>(), I.H, n_q, n, scale, sink, n_mid, I.gqa_scratch.data(),
                                  I.scores.data<float>(), s);
    }
    const int cur = L.parity, prev = 1 - L.parity;
    int32_t* sel = L.sel[cur].data<int32_t>();
    cuda::topk(I.scores.data<float>(), I.H, n_mid, n_mid, k, sink, sel, s);
    if (k != L.k_prev) {  // the cache's layout follows k: start it afresh
      KVT_CUDA_CHECK(cudaMemsetAsync(L.sel[prev].data(), 0xff, size_t(I.H) * k * 4, s));
      KVT_CUDA_CHECK(cudaMemsetAsync(L.slot_of[prev].data(), 0xff, size_t(I.H) * k * 4, s));
    }
    GatherParams gp;
    gp.n_rows = I.H;
    gp.k = k;
    gp.entry_bytes = I.entry;
    gp.src_row_stride = I.higgs && !I.rec.per_head ? 0 : I.entry;  // layer-wide records: every head reads the token's entry
    gp.src_tok_stride = I.tok_bytes;
    gp.dst_row_stride = int64_t(k) * I.entry;
    int32_t* slot = L.slot_of[cur].data<int32_t>();
    uint8_t* cache = L.slots.data<uint8_t>();
    cuda::gather_slots(gp, L.host.device_ptr<uint8_t>(), sel, L.sel[prev].data<int32_t>(),
                       L.slot_of[prev].data<int32_t>(), slot, I.scratch.data(), cache,
                       I.misses.data<unsigned long long>(), s);
    const uint8_t* kv_slots = cache;  // [n_kv_head, k] slots of K|V as attention reads them
    int64_t slot_bytes = I.entry;
    if (I.higgs) {  // rebuild each listed slot's head K|V (bf16) from its records
      RecordDequantParams dp;
      dp.n_rows = I.H;
      dp.n_kv_head = I.H;
      dp.k = k;
      dp.src_row_stride = int64_t(k) * I.entry;
      dp.dst_row_stride = int64_t(k) * 4 * I.D;
      cuda::record_dequant(I.rec, dp, cache, slot, I.grid2.data<float>(),
                           I.signs2.bytes() ? I.signs2.data<float>() : nullptr, I.deq.data<uint8_t>(), s);
      kv_slots = I.deq.data<uint8_t>();
      slot_bytes = 4 * I.D;
    }
    DecodeAttnParams gp2 = ap;
    gp2.elt = I.higgs ? KvElt::bf16 : I.elt;
    gp2.row_stride = int64_t(k) * slot_bytes;
    gp2.tok_stride = slot_bytes;
    gp2.n_tok = k;
    gp2.idx_stride = k;
    gp2.n_split = splits;
    gp2.part0 = 1;
    cuda::decode_attn(gp2, q, kv_slots, kv_slots + slot_bytes / 2, slot, I.part_out.data<float>(),
                      I.part_lse.data<float>(), s);
    L.parity = prev;
    L.k_prev = k;
  }
  KVT_CUDA_CHECK(cudaStreamWaitEvent(s, L.join->get()));
  cuda::attn_merge(1 + splits, I.QH, I.D, I.part_out.data<float>(), I.part_lse.data<float>(), out, nullptr, nullptr,
                   s);
}

KvMemory GpuTieredKv::memory() const {
  const Impl& I = *impl_;
  KvMemory m;
  const double n_layer = double(I.layers.size());
  m.gpu_bytes_per_token = n_layer * I.H * 34.0;  // higgs2 landmarks
  m.host_bytes_per_token = n_layer * double(I.tok_bytes);
  for (const auto& L : I.layers) {
    m.gpu_bytes += L.n * I.H * 34 + int64_t(L.resident.bytes() + L.slots.bytes());
  m.gpu_bytes += int64_t(I.deq.bytes());
    m.host_bytes += L.n * I.tok_bytes;
  }
  return m;
}

uint64_t GpuTieredKv::host_entries_read() const {
  unsigned long long n = 0;
  KVT_CUDA_CHECK(cudaMemcpy(&n, impl_->misses.data(), 8, cudaMemcpyDeviceToHost));
  return uint64_t(n);
}

}  // namespace kvtier
