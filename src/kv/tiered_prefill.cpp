// TieredSeq's prefill (tiered_kv.h): the prompt's K/V appended to the host
// tier, the key index and the resident tokens, and attention over every
// earlier token: a dense working copy, or each layer streamed from the host
// tier (fetch_dense), as choose_prefill_stream decides.
#include <algorithm>
#include <vector>

#include "backend/stage_clock.h"
#include "core/status.h"
#include "kv/tiered_kv.h"
#include "ops/attention/prefill_attention.h"
#include "ops/gather/fetch.h"
#include "ops/gemm/svd_gemm.h"
#include "ops/kv_append/kv_write.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

int act_bytes(DeviceKind d) { return d == DeviceKind::cuda ? 2 : 4; }

}  // namespace

// Uploads this sequence's row tables (prefill appends: a batch of one).
namespace {
struct SoloRows {
  uint8_t* const* plane0;
  uint8_t* const* plane1;
  uint8_t* const* resident;
  float* const* stats;
  uint8_t* const* host;
  uint8_t* const* kplane;
  const int64_t* pos0;
  const int64_t* key_first;
};
}  // namespace

void TieredSeq::append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) {
  const KvGeometry& g = plan_.geometry;
  const int H = g.n_kv_head, W = H * g.head_dim;
  KVT_CHECK(layer >= 0 && layer < g.n_layer && n_tok >= 1, "tiered cache: append of {} tokens to layer {}", n_tok,
            layer);
  KVT_CHECK(!decoding_, "tiered cache: decode steps append through a DecodeBatch");
  TieredLayer& L = layers_[size_t(layer)];
  const int64_t n = n_[size_t(layer)];
  if (n + n_tok > cap_) grow(n + n_tok);
  if (!prefill_chosen_) begin_prefill();
  const int ab = act_bytes(dev_.kind());
  KVT_CHECK(tok_stride == W, "tiered cache: prefill rows must be dense ({} elements, not {})", W, tok_stride);
  // nvfp4's per-tensor scales, fixed by the first rows (4x headroom, as the CPU store's CodedRows).
  if (!L.scales_set) {
    if (plan_.host_spec.kind == QuantKind::nvfp4) {
      L.k_scale = 4.f * nvfp4_scale_of(x_, plan_.policy.keys_prerope ? k_pre : k, int64_t(n_tok) * W);
      L.v_scale = 4.f * nvfp4_scale_of(x_, v, int64_t(n_tok) * W);
    }
    if (plan_.index_spec.kind == QuantKind::nvfp4) L.index_scale = 4.f * nvfp4_scale_of(x_, k, int64_t(n_tok) * W);
    const float sc[3] = {L.k_scale, L.v_scale, L.index_scale};
    copy(x_, scales_.data<float>() + 3 * layer, sc, sizeof(sc));
    sync(x_);
    L.scales_set = true;
  }
  // Row tables of this sequence for this layer (host values; uploaded to the device).
  const int64_t key_first = -1;
  std::vector<uintptr_t> t(size_t(4 * H + 4));
  for (int h = 0; h < H; ++h) {
    t[size_t(h)] = uintptr_t(L.plane0.data<uint8_t>() + h * p0_row_);
    t[size_t(H + h)] = L.plane1 ? uintptr_t(L.plane1.data<uint8_t>() + h * p1_row_) : 0;
    t[size_t(2 * H + h)] = uintptr_t(L.resident.data<uint8_t>() + h * res_slots_ * res_slot_);
    t[size_t(3 * H + h)] = L.stats ? uintptr_t(L.stats.data<float>() + h * cap_chunks_) : 0;
  }
  t[size_t(4 * H)] = uintptr_t(L.host.data());
  t[size_t(4 * H + 1)] = uintptr_t(L.kplane.data());
  t[size_t(4 * H + 2)] = uintptr_t(n);
  t[size_t(4 * H + 3)] = uintptr_t(key_first);
  void* dt = upload(x_, tables_, t.data(), t.size() * sizeof(uintptr_t));
  if (x_.cuda()) sync(x_);  // t is pageable and freed on return
  auto* d = static_cast<uintptr_t*>(dt);
  SoloRows r{reinterpret_cast<uint8_t* const*>(d),          reinterpret_cast<uint8_t* const*>(d + H),
             reinterpret_cast<uint8_t* const*>(d + 2 * H),  reinterpret_cast<float* const*>(d + 3 * H),
             reinterpret_cast<uint8_t* const*>(d + 4 * H),  reinterpret_cast<uint8_t* const*>(d + 4 * H + 1),
             reinterpret_cast<const int64_t*>(d + 4 * H + 2), reinterpret_cast<const int64_t*>(d + 4 * H + 3)};
  const HostWriteParams hp = host_write_params(layer, 1, n_tok, tok_stride);
  host_write(x_, hp, k, k_pre, v, r.pos0, r.host, r.kplane, r.key_first);
  const IndexWriteParams ip = index_write_params(layer, 1, n_tok, tok_stride);
  index_write(x_, ip, k, r.pos0, r.plane0, r.plane1, r.resident, ip.cos_stats ? r.stats : nullptr);
  ResidentWriteParams rp{1, n_tok, H, g.head_dim, plan_.sink, plan_.ring, tok_stride, plan_.resident_elt};
  resident_write(x_, rp, k, v, r.pos0, r.resident);
  // The prompt's working copy (dense prefill attention) and, for shadowkv, its pre-RoPE keys.
  if (!stream_) {
    copy(x_, L.dense_k.data<uint8_t>() + n * W * ab, k, size_t(n_tok) * W * ab);
    copy(x_, L.dense_v.data<uint8_t>() + n * W * ab, v, size_t(n_tok) * W * ab);
  }
  if (plan_.host == HostLayout::values_only) {
    KVT_CHECK(k_pre, "kv policy shadowkv: append needs the pre-RoPE keys");
    copy(x_, L.kpre.data<uint8_t>() + n * W * ab, k_pre, size_t(n_tok) * W * ab);
    if (L.gram) gram_accumulate(x_, k_pre, n_tok, W, W, L.gram.data<float>());
  }
  n_[size_t(layer)] = n + n_tok;
}

void TieredSeq::attend_prefill(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) {
  const KvGeometry& g = plan_.geometry;
  TieredLayer& L = layers_[size_t(layer)];
  AttentionParams ap{g.n_head, g.n_kv_head, g.head_dim, scale};
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim, n = n_[size_t(layer)];
  if (!stream_) {
    stage(x_, "prefill_attend");
    prefill_attention(x_, ap, q, q_stride, n_tok, L.dense_k.data(), L.dense_v.data(), W, n, out, q_stride);
    stage(x_, "prefill_model");
    return;
  }
  // Streamed: this layer's K/V [0, n) decoded from the host tier. On CUDA the
  // next layer's tokens so far are read on the side stream into the other
  // buffer while this layer attends, so only the chunk's own tokens are read
  // here (serial under stage timing, which then measures the whole read).
  const bool overlap = stream_layer_copies(x_.cuda(), g.n_layer) == 2 && !x_.clock;
  stream_bufs();
  int b = 0;
  int64_t have = 0;
  if (pref_layer_ == layer) {
    join(x_);
    b = pref_buf_;
    have = pref_n_;
  }
  pref_layer_ = -1;
  stage(x_, "prefill_read");
  stream_read(x_, layer, have, n, work_[b]);
  if (overlap) {
    const int next = (layer + 1) % g.n_layer;
    fork(x_);  // the other buffer's last reader (the previous layer's attention) is before this point
    stream_read(side_exec(x_), next, 0, n_[size_t(next)], work_[1 - b]);
    pref_layer_ = next;
    pref_buf_ = 1 - b;
    pref_n_ = n_[size_t(next)];
  }
  stage(x_, "prefill_attend");
  prefill_attention(x_, ap, q, q_stride, n_tok, work_[b].k.data(), work_[b].v.data(), W, n, out, q_stride);
  stage(x_, "prefill_model");
}

void TieredSeq::stream_bufs() {
  const size_t bytes = layer_copy_bytes();
  for (int b = 0; b < stream_layer_copies(x_.cuda(), plan_.geometry.n_layer); ++b) {
    StreamBuf& w = work_[b];
    if (w.k.bytes() == bytes) continue;
    w = StreamBuf();
    w.k = dev_.alloc(bytes);
    w.v = dev_.alloc(bytes);
    w.scratch = dev_.alloc(size_t(fetch_dense_scratch_bytes(x_, stream_params(0, cap_))));
  }
}

int64_t TieredSeq::prefill_work_bytes() const {
  int64_t b = 0;
  for (const StreamBuf& w : work_) b += int64_t(w.k.bytes() + w.v.bytes() + w.scratch.bytes());
  for (const TieredLayer& L : layers_) b += int64_t(L.dense_k.bytes() + L.dense_v.bytes());
  return b;
}

FetchParams TieredSeq::stream_params(int layer, int64_t cap) const {
  FetchParams p = fetch_params(1);
  p.kmax = int(std::min<int64_t>(kStreamTokensPerPass, cap));
  p.seq_scales = layer_scales(layer);  // k, v
  return p;
}

void TieredSeq::stream_read(const Exec& x, int layer, int64_t t0, int64_t t1, StreamBuf& w) {
  const int64_t row = int64_t(plan_.geometry.n_kv_head) * plan_.geometry.head_dim * act_bytes(dev_.kind());
  auto* d = stream_tables_.data<uintptr_t>() + 3 * layer;
  FetchRows r;
  r.host = reinterpret_cast<uint8_t* const*>(d);
  r.kplane = reinterpret_cast<uint8_t* const*>(d + 1);
  r.key_first = reinterpret_cast<const int64_t*>(d + 2);
  r.scratch = w.scratch.data();
  r.prefill_kpre = layers_[size_t(layer)].kpre.data<uint8_t>();
  if (x.cuda() && !store_on_gpu()) r.dense_host = layers_[size_t(layer)].host.host_ptr<uint8_t>();
  fetch_dense(x, stream_params(layer, cap_), r, t0, t1, w.k.data<uint8_t>() + t0 * row, w.v.data<uint8_t>() + t0 * row);
}

bool choose_prefill_stream(PrefillMode mode, bool gpu, int64_t dense_bytes, int64_t free, int64_t total) {
  switch (mode) {
    case PrefillMode::dense: return false;
    case PrefillMode::stream: return true;
    default: return gpu && dense_bytes + std::max<int64_t>(int64_t(1) << 30, total / 10) > free;
  }
}

void TieredSeq::begin_prefill() {
  const KvGeometry& g = plan_.geometry;
  const bool gpu = dev_.kind() == DeviceKind::cuda;
  const size_t bytes = layer_copy_bytes();  // K or V of one layer
  int64_t free_b = 0, total_b = 0;
  if (gpu) {
    const auto [f, t] = dev_.mem_info();
    free_b = int64_t(f), total_b = int64_t(t);
  }
  stream_ = choose_prefill_stream(plan_.policy.prefill, gpu, int64_t(2 * bytes) * g.n_layer, free_b, total_b);
  prefill_chosen_ = true;
  if (stream_) {
    upload_stream_tables();
    return;
  }
  for (TieredLayer& L : layers_) {
    L.dense_k = dev_.alloc(bytes);
    L.dense_v = dev_.alloc(bytes);
  }
}

size_t TieredSeq::layer_copy_bytes() const {
  const KvGeometry& g = plan_.geometry;
  return size_t(cap_ * g.n_kv_head * g.head_dim * act_bytes(dev_.kind()));
}

void TieredSeq::upload_stream_tables() {
  const int n_layer = plan_.geometry.n_layer;
  std::vector<uintptr_t> t(size_t(3 * n_layer));  // per layer: host tier, kplane (none), key_first (−1)
  for (int l = 0; l < n_layer; ++l) {
    t[size_t(3 * l)] = uintptr_t(layers_[size_t(l)].host.data());
    t[size_t(3 * l + 2)] = uintptr_t(int64_t(-1));
  }
  upload(x_, stream_tables_, t.data(), t.size() * sizeof(uintptr_t));
  if (x_.cuda()) sync(x_);  // t is pageable and freed on return
}

}  // namespace kvtier
