// Exact byte accounting of a policy for a geometry (SPEC "Policies": every
// configuration reports its GPU and host bytes per token): the plan's
// layouts (kv_plan.h) decide the record sizes, padding included, so these are
// the bytes the caches hold.
#include <algorithm>

#include "core/status.h"
#include "kv/kv_plan.h"
#include "ops/quant/quant_format.h"

namespace kvtier {

KvFootprint plan_footprint(const KvPlan& k, int64_t n_ctx) {
  const KvGeometry& g = k.geometry;
  const int D = g.head_dim, H = g.n_kv_head;
  const double L = g.n_layer;
  KvFootprint f;
  if (k.dense) {
    // The GPU holds bf16; the CPU f32 rows rounded through kv (it stands for
    // the GPU tier, so report the policy's format as SPEC's accounting does).
    const double row = k.device == DeviceKind::cuda ? 2.0 * H * D : double(bytes_per_vector(k.host_spec, H * D));
    f.gpu_bytes_per_token = 2 * row * L;
    f.gpu_bytes = int64_t(f.gpu_bytes_per_token * double(n_ctx) + 0.5);
    return f;
  }
  double index = double(k.index_rec_bytes) * H / k.chunk;
  if (k.index == IndexLayout::residual) index += double(k.meta_rec_bytes) * H / k.unit;
  if (k.rank > 0) index += 2.0 * k.rank;  // U·S rows, bf16
  f.gpu_bytes_per_token = index * L;
  // cache=all: every token's decoded K|V in its slot, and a bit.
  if (k.policy.cache == CacheMode::all)
    f.gpu_bytes_per_token += (double(k.slot_bytes) + 1.0 / 8) * H * L;
  f.host_bytes_per_token = double(k.host_tok_bytes) * L;
  const int64_t res_elt = k.resident_elt == KvElt::f32 ? 4 : 2;
  f.gpu_fixed_bytes = int64_t(k.sink + k.ring + k.n_outlier_tok) * H * 2 * D * res_elt * g.n_layer;
  if (k.rank > 0) f.gpu_fixed_bytes += int64_t(2) * k.rank * H * D * g.n_layer;  // Vᵀ, bf16
  f.gpu_bytes = f.gpu_fixed_bytes + int64_t(f.gpu_bytes_per_token * double(n_ctx) + 0.5);
  f.host_bytes = int64_t(f.host_bytes_per_token * double(n_ctx) + 0.5);
  if (k.host_spec.kind == QuantKind::nvfp4) f.host_bytes += 8 * g.n_layer;  // per-tensor scales of K and V
  if (k.policy.store == StoreMode::gpu) {  // the store in device memory (policy.h: store)
    f.gpu_bytes_per_token += f.host_bytes_per_token;
    f.gpu_bytes += f.host_bytes;
    f.host_bytes_per_token = 0;
    f.host_bytes = 0;
  }
  return f;
}

KvFootprint kv_footprint(const PolicyConfig& p, const KvGeometry& g, int64_t n_ctx) {
  return plan_footprint(plan_kv(p, g, DeviceKind::cpu), n_ctx);
}

int64_t kv_charge_bytes(const PolicyConfig& p, const KvGeometry& g, int64_t n_ctx, bool gpu_tier_in_host) {
  KvPlan plan = plan_kv(p, g, DeviceKind::cpu);
  fit_plan_to_tokens(plan, n_ctx);
  const KvFootprint f = plan_footprint(plan, n_ctx);
  return f.host_bytes + (gpu_tier_in_host ? f.gpu_bytes : 0);
}

KvGpuCharge kv_gpu_charge(const PolicyConfig& p, const KvGeometry& g, int64_t n_prompt, int64_t n_total) {
  KVT_CHECK(n_prompt >= 0 && n_total >= n_prompt, "kv_gpu_charge: {} prompt tokens of {}", n_prompt, n_total);
  KvPlan plan = plan_kv(p, g, DeviceKind::cuda);
  fit_plan_to_tokens(plan, n_total);
  const KvFootprint f = plan_footprint(plan, n_total);
  KvGpuCharge c;
  c.decode_bytes = f.gpu_bytes;
  if (plan.dense) {
    c.prefill_bytes = f.gpu_bytes;
    return c;
  }
  // Per KV head and layer (TieredSeq::memory): the selection's slot numbers
  // (and under reselect > 1 the selection kept between picks, or with
  // rescore=D the (D + 1)·kmax candidates rescored),
  // and under step the budget's slots (whole chunks) with their selection
  // state; under all every token's slot (in the footprint; the cache holds
  // room for at least kTieredMinCapacity tokens) and a bitmap word more per
  // 32 tokens than its 1/8 byte. The engine reserves n_total tokens up front
  // under a GPU budget, so the cache never doubles past them.
  const int64_t HL = int64_t(g.n_kv_head) * g.n_layer;
  const int64_t kmax = std::max<int64_t>(1, budget_tokens(plan.policy, n_prompt) / plan.chunk) * plan.chunk;
  c.decode_bytes += kmax * 4 * HL;
  if (plan.policy.reselect > 1)  // the selection kept between picks, or the candidates rescored
    c.decode_bytes += kmax * (int64_t(plan.policy.rescore) + 1) * 4 * HL;
  if (plan.in_place) {
    c.decode_bytes += kmax * 4 * HL;  // the selection state; no slot
  } else if (plan.policy.cache == CacheMode::all) {
    const int64_t room = std::max(n_total, kTieredMinCapacity) - n_total;
    c.decode_bytes += (room * plan.slot_bytes + (room + 7) / 8 + 4) * HL;
  } else {
    c.decode_bytes += kmax * (plan.slot_bytes + 4) * HL;
  }
  // While the prompt runs: the index and windows, and the bf16 K|V copy the
  // prefill attends over, both allocated for the reserved n_total tokens.
  KvPlan at_prompt = plan;
  at_prompt.policy.cache = CacheMode::step;  // no slot exists before decode starts
  const int64_t cap = std::max(n_total, kTieredMinCapacity);
  const bool stream = p.prefill == PrefillMode::stream;
  // Streamed, the CUDA cache holds one or two layers' copies (one attended,
  // the next one read on the side stream), each with fetch_dense's staging.
  const int bufs = stream_layer_copies(true, g.n_layer);
  const int64_t copies = stream ? int64_t(bufs) * g.n_kv_head : HL;  // KV heads × layers held in bf16
  c.prefill_bytes = plan_footprint(at_prompt, n_total).gpu_bytes + cap * copies * 2 * g.head_dim * 2;
  if (stream) {  // staging per KV head and token of a pass: the records and the list
    const int64_t span = plan.host == HostLayout::values_only ? 2 * plan.host_entry_bytes : plan.host_entry_bytes;
    c.prefill_bytes += bufs * (int64_t(g.n_kv_head) * std::min(kStreamTokensPerPass, cap) * (span + 9) + 16);
  }
  return c;
}

PolicyConfig policy_under_gpu_budget(PolicyConfig p, const KvGeometry& g, int64_t n_prompt, int64_t n_total,
                                     int64_t budget) {
  // auto is step, except where the store is read in place (plan_kv decides).
  if (p.cache == CacheMode::auto_ && p.store != StoreMode::gpu) p.cache = CacheMode::step;
  if (p.index != IndexKind::none && p.prefill == PrefillMode::auto_) {
    p.prefill = PrefillMode::dense;
    if (kv_gpu_charge(p, g, n_prompt, n_total).peak() > budget) p.prefill = PrefillMode::stream;
  }
  return p;
}

void fit_plan_to_tokens(KvPlan& plan, int64_t n_total) {
  plan.sink = int(std::min<int64_t>(plan.sink, n_total));
  plan.ring = int(std::min<int64_t>(plan.ring, std::max<int64_t>({n_total - plan.sink, plan.unit - 1, 0})));
}

}  // namespace kvtier
