#include "kv/kv_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/status.h"
#include "ops/decode_attn/record_attn.h"
#include "ops/quant/residual_quant.h"

namespace kvtier {
namespace {

int64_t pad16(int64_t b) { return (b + 15) / 16 * 16; }

bool is_grouped(const QuantSpec& s) {
  return s.kind == QuantKind::higgs || s.kind == QuantKind::uniform || s.kind == QuantKind::binary;
}

// The per-token 2-bit HIGGS landmarks that the GPU's planar scoring kernels
// read: the 4-D grid of 256 points (a code byte per 4 dims), or 4 uniform
// levels per dim (U4: four 2-bit codes per byte, scored in integers).
bool planar_higgs2(const QuantSpec& lm, int head_dim) {
  const bool grid4 = lm.grid_dim == 4 && lm.grid_size == 256 && !lm.uniform_levels;
  const bool u4 = lm.uniform_levels && lm.grid_size == 4;
  return lm.kind == QuantKind::higgs && (grid4 || u4) && head_dim == 128 && (lm.group == 128 || lm.group == 0);
}

const char* elt_name(KvElt e) { return e == KvElt::fp8 ? "fp8" : e == KvElt::f32 ? "f32" : "bf16"; }

}  // namespace

KvPlan plan_kv(const PolicyConfig& p, const KvGeometry& g, DeviceKind device) {
  KVT_CHECK(g.n_layer > 0 && g.n_head > 0 && g.n_kv_head > 0 && g.head_dim > 0 && g.n_head % g.n_kv_head == 0,
            "kv plan: geometry n_layer={} n_head={} n_kv_head={} head_dim={} is not valid", g.n_layer, g.n_head,
            g.n_kv_head, g.head_dim);
  const bool gpu = device == DeviceKind::cuda;
  const int D = g.head_dim, H = g.n_kv_head, group = g.n_head / g.n_kv_head;
  if (gpu)
    KVT_CHECK(D == 64 || D == 128 || D == 256, "--device cuda: head_dim {} is not supported (64, 128 or 256)", D);
  KVT_CHECK(!p.kv.uniform_levels, "kv policy: kv={} stores K/V on a U<n> grid, which is for the key index (lm=); "
            "use a HIGGS grid such as kv=higgs4", to_string(p.kv));
  KvPlan k;
  k.policy = p;
  k.geometry = g;
  k.device = device;
  k.dense = p.index == IndexKind::none;
  const std::string where = gpu ? "GPU" : "CPU";
  if (k.dense) {
    KVT_CHECK(p.kv.kind != QuantKind::nvfp4, "kv policy full: kv=nvfp4 needs a per-tensor scale; use it with a "
                                             "tiered policy");
    bytes_per_vector(p.kv, D);  // validates the format for a head
    k.host_spec = p.kv;
    k.resident_elt = gpu ? KvElt::bf16 : KvElt::f32;
    if (gpu && p.kv.kind == QuantKind::f32)
      k.notes.push_back("K/V: every token on the GPU in bf16 (the GPU's activations are bf16; kv=f32 is exact on the "
                        "CPU only)");
    else if (gpu && p.kv.kind != QuantKind::bf16)
      k.notes.push_back(fmt::format("K/V: every token on the GPU, rounded through {} and held as bf16 (attention "
                                    "reads bf16)",
                                    to_string(p.kv)));
    else
      k.notes.push_back(fmt::format("K/V: every token resident on the {} ({}), dense attention", where,
                                    to_string(p.kv)));
    return k;
  }

  // ---- key index
  const bool shadow = p.index == IndexKind::shadowkv;
  k.chunk = p.index == IndexKind::exact ? 1 : p.chunk;
  k.unit = p.residual ? k.chunk * p.res_m : k.chunk;
  if (p.index == IndexKind::exact) {
    k.index = IndexLayout::records;
    k.index_spec = (!gpu && p.kv.kind == QuantKind::f32) ? parse_quant_spec("f32") : bf16_spec();
    k.notes.push_back(fmt::format("index: the exact keys ({}) on the {}, scored against every token (oracle)",
                                  to_string(k.index_spec), where));
  } else if (p.residual) {
    k.index = IndexLayout::residual;
    k.meta_spec = resolved_lm_spec(p.res_meta, D);
    k.index_spec = resolved_lm_spec(p.res, D);
    k.meta_rec_bytes = int64_t(bytes_per_vector(k.meta_spec, D));
    k.notes.push_back(fmt::format("index: residual landmarks on the {}: a {} meta-landmark per {} chunks + a {} "
                                  "residual per chunk of {}, scored as q·meta + q·residual",
                                  where, to_string(k.meta_spec), p.res_m, to_string(k.index_spec), k.chunk));
  } else {
    k.index_spec = resolved_lm_spec(p.lm, D);
    if (gpu && k.chunk == 1 && planar_higgs2(k.index_spec, D)) {
      k.index = IndexLayout::higgs2_planar;
      k.notes.push_back(k.index_spec.uniform_levels
                            ? "index: per-token 2-bit HIGGS landmarks (4 uniform levels per dim) on the GPU in planes "
                              "(32 code bytes + a bf16 scale per token and head), scored by the int8 tensor-core kernel"
                            : "index: per-token 2-bit HIGGS landmarks on the GPU in planes (32 code bytes + a bf16 "
                              "scale per token and head), scored by the tensor-core kernel");
    } else {
      k.index = IndexLayout::records;
      k.notes.push_back(fmt::format("index: {} landmarks of {} on the {}{}", k.chunk == 1 ? "per-token" : "chunk-mean",
                                    to_string(k.index_spec), where,
                                    k.chunk == 1 ? std::string() : fmt::format(" (chunks of {})", k.chunk)));
    }
  }
  k.index_rec_bytes = k.index == IndexLayout::higgs2_planar ? 34 : int64_t(bytes_per_vector(k.index_spec, D));
  KVT_CHECK(!k.meta_spec.uniform_levels && !(p.residual && k.index_spec.uniform_levels),
            "kv policy: residual landmarks on a U<n> grid are not supported (U<n> scores each landmark in integers; "
            "use it as lm= of plain landmarks)");
  KVT_CHECK(k.meta_spec.kind != QuantKind::nvfp4 && !(p.residual && k.index_spec.kind == QuantKind::nvfp4),
            "kv policy: residual landmarks in nvfp4 are not supported (a residual has no stable per-tensor scale); "
            "use nvfp4 for plain landmarks or another format for meta/res");
  const QuantSpec& scored = k.index == IndexLayout::residual ? k.meta_spec : k.index_spec;
  k.rotate_query = k.index == IndexLayout::higgs2_planar;
  k.rotate_group = k.rotate_query ? 128 : 0;
  (void)scored;

  // ---- host tier
  k.host_spec = p.kv;
  if (shadow) {
    k.host = HostLayout::values_only;
    k.host_dim = D;
    KVT_CHECK(!is_grouped(p.kv) || resolved_group(p.kv, D) <= D,
              "kv policy shadowkv: kv={} must fit a head of {} values", to_string(p.kv), D);
  } else if (p.kv.kind == QuantKind::higgs && p.kv.group == 0) {
    // The paper's layout (HIGGS without a group): one Hadamard group over the
    // layer's KV width, a token's record serving every head.
    k.host = HostLayout::layer_wide;
    k.host_dim = H * D;
  } else {
    k.host = HostLayout::per_head;
    k.host_dim = D;
    if (is_grouped(k.host_spec) && k.host_spec.group > D) k.host_spec.group = D;
  }
  if (k.host == HostLayout::per_head && k.host_spec.kind == QuantKind::higgs && k.host_spec.group == 0)
    k.host_spec.group = D;
  k.host_rec_bytes = int64_t(bytes_per_vector(k.host_spec, k.host_dim));
  k.host_entry_bytes = pad16((k.host == HostLayout::values_only ? 1 : 2) * k.host_rec_bytes);
  k.host_tok_bytes = k.host == HostLayout::layer_wide ? k.host_entry_bytes : int64_t(H) * k.host_entry_bytes;
  const char* mem = gpu ? "pinned host memory (read by the GPU zero-copy)" : "host memory";
  if (k.host == HostLayout::values_only)
    k.notes.push_back(fmt::format("host: values of every token ({}, {} B per head) in {}; prompt keys rebuilt from a "
                                  "rank-{} SVD of the pre-RoPE keys, generated tokens' keys stored beside",
                                  to_string(k.host_spec), k.host_entry_bytes, mem, resolved_rank(p, H * D)));
  else if (k.host == HostLayout::layer_wide)
    k.notes.push_back(fmt::format("host: K and V of every token as {} records over the layer's {} KV values ({} B per "
                                  "token): every head reads the whole record",
                                  to_string(k.host_spec), k.host_dim, k.host_entry_bytes));
  else
    k.notes.push_back(fmt::format("host: K and V of every token as {} per KV head ({} B per head and token) in {}",
                                  to_string(k.host_spec), k.host_entry_bytes, mem));

  // ---- resident tokens
  k.sink = p.sink;
  k.local = p.local;
  k.ring = std::max({p.local, k.unit - 1, 0});
  if (shadow) {
    k.rank = resolved_rank(p, H * D);
    k.n_outlier_tok = p.outliers * k.chunk;
  }
  k.resident_elt = (!gpu && p.kv.kind == QuantKind::f32) ? KvElt::f32 : KvElt::bf16;
  k.notes.push_back(fmt::format("resident on the {}: {} sink + the last {} tokens{} in {}", where, p.sink,
                                std::max(p.local, k.unit - 1),
                                shadow ? fmt::format(" + {} outlier chunks per head", p.outliers) : std::string(),
                                elt_name(k.resident_elt)));

  // ---- fetch
  const bool raw = k.host == HostLayout::per_head && !p.keys_prerope &&
                   (k.host_spec.kind == QuantKind::bf16 || k.host_spec.kind == QuantKind::fp8 ||
                    (!gpu && k.host_spec.kind == QuantKind::f32));
  k.dequant_on_fetch = !raw;
  if (raw) k.fetch_elt = k.host_spec.kind == QuantKind::fp8 ? KvElt::fp8 : k.host_spec.kind == QuantKind::f32 ? KvElt::f32 : KvElt::bf16;
  else k.fetch_elt = gpu ? KvElt::bf16 : KvElt::f32;
  k.slot_bytes = 2 * int64_t(D) * (k.fetch_elt == KvElt::fp8 ? 1 : k.fetch_elt == KvElt::bf16 ? 2 : 4);
  // ---- in place: the store in device memory, read by the attention itself
  const bool readable = gpu && p.store == StoreMode::gpu && k.host == HostLayout::per_head && !p.keys_prerope &&
                        record_attn_supported(RecordFormat{k.host_spec, D, k.host_rec_bytes}, D, g.n_head, H);
  KVT_CHECK(readable || p.cache != CacheMode::none || !gpu,
            "kv policy {}: cache=none reads HIGGS records of byte codes, one group per KV head (kv=higgs4:g{} with "
            "head_dim 64 or 128, GQA ≤ 8, keys_prerope=0) in place; use cache=step", to_string(p), D);
  k.in_place = readable && (p.cache == CacheMode::none || p.cache == CacheMode::auto_);
  if (k.in_place)
    k.notes.push_back("decode: attention reads the selected tokens' records in the store (GPU memory), in the "
                      "rotated domain: no slot cache");
  else if (gpu)
    k.notes.push_back(fmt::format("decode: the selected tokens' K|V kept in a GPU slot cache ({} per slot{}); a token "
                                  "selected again is not read again",
                                  elt_name(k.fetch_elt), k.dequant_on_fetch ? ", rebuilt from the host records" : ""));
  else
    k.notes.push_back(k.dequant_on_fetch ? "decode: the selected records decoded from the host tier each step"
                                         : "decode: attention reads the selected host entries in place");
  if (p.keys_prerope) k.notes.push_back("host keys are stored before RoPE; RoPE is applied when they are fetched");
  (void)group;
  return k;
}

std::string KvPlan::describe() const {
  std::string s = fmt::format("{} on {}", to_string(policy), device_name(device));
  for (const std::string& n : notes) s += "\n  " + n;
  return s;
}

}  // namespace kvtier
