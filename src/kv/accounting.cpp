// Exact byte accounting of a policy for a geometry (SPEC "Policies": every
// configuration reports its GPU and host bytes per token). The record sizes
// come from ops/quant's bytes_per_vector, so they are the sizes the stores use.
#include <algorithm>

#include "core/status.h"
#include "kv/policy.h"
#include "ops/quant/quant_format.h"
#include "ops/quant/residual_quant.h"

namespace kvtier {

KvFootprint kv_footprint(const PolicyConfig& p, const KvGeometry& g, int64_t n_ctx) {
  KVT_CHECK(g.n_layer > 0 && g.n_kv_head > 0 && g.head_dim > 0 && g.n_head % g.n_kv_head == 0,
            "kv geometry: n_layer={} n_head={} n_kv_head={} head_dim={} is not valid",
            g.n_layer, g.n_head, g.n_kv_head, g.head_dim);
  const int width = g.n_kv_head * g.head_dim;  // one layer's K (or V) row
  const double n_layer = g.n_layer;
  const QuantSpec kv = parse_quant_spec(p.kv);
  const double kv_row = double(bytes_per_vector(kv, width));  // K or V, one token, one layer
  const int64_t kv_const = int64_t(tensor_constant_bytes(kv)) * 2 * g.n_layer;
  const double bf16_row = 2.0 * width;
  KvFootprint f;
  if (p.index == IndexKind::none) {
    // Dense attention reads every token: the whole K/V is GPU-resident.
    f.gpu_bytes_per_token = 2 * kv_row * n_layer;
    f.gpu_fixed_bytes = kv_const;
  } else {
    // ShadowKV offloads values only: prompt keys are rebuilt from the SVD
    // (generated tokens add their key rows too, which this per-token figure leaves out).
    f.host_bytes_per_token = (p.index == IndexKind::shadowkv ? 1 : 2) * kv_row * n_layer;
    double index = 0;  // per token per layer
    if (p.index == IndexKind::exact) {
      index = bf16_row;  // exact keys held in bf16
    } else if (p.index == IndexKind::landmarks && p.residual) {
      ResidualSpec rs;
      rs.meta = parse_quant_spec(resolved_lm_spec(p.res_meta, g.head_dim));
      rs.resid = parse_quant_spec(resolved_lm_spec(p.res, g.head_dim));
      rs.group = p.res_m;
      const double per_landmark = residual_bytes_per_vector(rs, g.head_dim);
      index = per_landmark * g.n_kv_head / p.chunk;
    } else {
      const QuantSpec lm = parse_quant_spec(resolved_lm_spec(p.lm, g.head_dim));
      index = double(bytes_per_vector(lm, g.head_dim)) * g.n_kv_head / p.chunk;
    }
    if (p.index == IndexKind::shadowkv) {
      // U·S rows of the pre-RoPE key SVD, bf16 (ShadowKV's GPU copy).
      const int r = resolved_rank(p, width);
      index += 2.0 * r;
      f.gpu_fixed_bytes += int64_t(2) * r * width * g.n_layer;  // V^T [r, width] bf16
      // Outlier chunks: exact K and V in bf16 (chosen per KV head, the same
      // count in every head, so the total is that of outliers·chunk full rows).
      f.gpu_fixed_bytes += int64_t(p.outliers) * p.chunk * 2 * int64_t(bf16_row) * g.n_layer;
    }
    f.gpu_bytes_per_token = index * n_layer;
    // Sinks and the local window stay resident, exact (bf16).
    f.gpu_fixed_bytes += int64_t(p.sink + p.local) * 2 * int64_t(bf16_row) * g.n_layer;
    f.host_bytes = kv_const;
  }
  f.gpu_bytes = f.gpu_fixed_bytes + int64_t(f.gpu_bytes_per_token * double(n_ctx) + 0.5);
  f.host_bytes += int64_t(f.host_bytes_per_token * double(n_ctx) + 0.5);
  return f;
}

int64_t kv_charge_bytes(const PolicyConfig& p, const KvGeometry& g, int64_t n_ctx, bool gpu_tier_in_host) {
  PolicyConfig q = p;
  q.sink = int(std::min<int64_t>(q.sink, n_ctx));
  q.local = int(std::min<int64_t>(q.local, n_ctx));
  const KvFootprint f = kv_footprint(q, g, n_ctx);
  return f.host_bytes + (gpu_tier_in_host ? f.gpu_bytes : 0);
}

}  // namespace kvtier
