// The one decision of where a sequence's KV lives and how its decode step
// runs (DESIGN: plan once, run many). plan_kv turns a parsed policy, the
// model's KV geometry and the device into a typed plan: the layouts of the
// key index, the host tier, the resident tokens and the slot cache, with the
// reason for each choice in `notes` (printed by `kvtier run -v`, `perf`,
// `memory`). Nothing downstream parses policy strings; a policy that cannot
// run on the device is refused here with the reason.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/device.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/quant/quant_format.h"

namespace kvtier {

// How the key index of one (layer, KV head) row is laid out.
enum class IndexLayout {
  none,           // dense attention (policy full)
  higgs2_planar,  // per-token 2-bit HIGGS at head_dim 128: codes plane [n][32] + bf16 scales plane [n]
  records,        // one quant_format record per chunk: [n_chunk][rec_bytes]
  residual,       // meta records per unit [n_unit][meta_bytes] + residual records per chunk [n_chunk][res_bytes]
};

// How the host tier holds a token's K and V (one layer).
enum class HostLayout {
  per_head,     // per (token, KV head) one entry: K record ‖ V record (quant_format, dim = head_dim), 16-byte padded
  layer_wide,   // per token one entry: K record ‖ V record over the layer's KV width (HIGGS group > head_dim)
  values_only,  // shadowkv: V entries per (token, KV head) for the prompt; keys rebuilt from the SVD; generated
                // tokens' keys in a second per-head K plane
};

struct KvPlan {
  PolicyConfig policy;
  KvGeometry geometry;
  DeviceKind device = DeviceKind::cpu;
  bool dense = true;  // policy full

  // full: the resident K/V element type (bf16 on the GPU; the policy's kv
  // rounding on the CPU, held as f32 rows).
  // Tiered policies:
  IndexLayout index = IndexLayout::none;
  QuantSpec index_spec;       // records: the landmark / key format; residual: the residual format
  QuantSpec meta_spec;        // residual: the meta-landmark format
  int64_t index_rec_bytes = 0;   // bytes per chunk record (planar: 34)
  int64_t meta_rec_bytes = 0;    // residual: bytes per meta record
  int chunk = 1;              // tokens per landmark
  int unit = 1;               // tokens per indexed unit (chunk, or chunk·m for residual)
  bool rotate_query = false;  // HIGGS index: score q_rot = H·D·q against the codes
  int rotate_group = 0;       // the Hadamard group of that rotation

  HostLayout host = HostLayout::per_head;
  QuantSpec host_spec;        // the policy's kv, group resolved
  int host_dim = 0;           // values per host record (head_dim, or the KV width for layer_wide)
  int64_t host_rec_bytes = 0;    // one K (or V) record
  int64_t host_entry_bytes = 0;  // K ‖ V (values_only: V), padded to 16
  int64_t host_tok_bytes = 0;    // per token and layer

  int sink = 0, local = 0;
  int ring = 0;               // resident ring of the last tokens: local + unit − 1 (≥ 1)
  int n_outlier_tok = 0;      // shadowkv: outlier chunks · chunk, per KV head
  int rank = 0;               // shadowkv SVD rank
  KvElt resident_elt = KvElt::bf16;  // f32 on the CPU with kv=f32 (exact reference runs)

  // The fetched K/V that attention reads: the host entry itself when its
  // format is bf16 or FP8 (GPU slot cache of raw entries; CPU: the host tier
  // in place), else a bf16 (CPU: f32 for kv=f32) copy rebuilt from the records.
  bool dequant_on_fetch = false;
  KvElt fetch_elt = KvElt::bf16;
  int64_t slot_bytes = 0;     // one fetched K|V
  // The attention reads the selected records in the store itself (policy
  // cache=none, or auto where it can; record_attn.h): no slot cache.
  bool in_place = false;

  std::vector<std::string> notes;  // where each part lives and why
  std::string describe() const;    // the policy, the device, the notes
};

// Throws kvtier::Error when the policy cannot run on `device` for geometry g,
// naming the knob and the supported values.
KvPlan plan_kv(const PolicyConfig& p, const KvGeometry& g, DeviceKind device);

// Bytes per token and totals for n_ctx tokens, from the plan's layouts (the
// only bytes-per-token arithmetic of the tiered cache).
KvFootprint plan_footprint(const KvPlan& plan, int64_t n_ctx);

// Sizes the resident slots for a sequence that will never hold more than
// n_total tokens: a sink longer than that holds them all, and a window
// (`local=`, or a residual unit's unindexed tail) longer than the tokens past
// the sink never wraps (window rows start past the sink). Same slots, same
// results; a large `sink=` or `local=` costs only the tokens that can exist.
void fit_plan_to_tokens(KvPlan& plan, int64_t n_total);

// The fewest tokens a tiered cache allocates room for (its buffers then
// double as the sequence grows past them).
constexpr int64_t kTieredMinCapacity = 256;
// Streamed prefill (policy prefill=stream): tokens fetch_dense decodes per pass.
constexpr int64_t kStreamTokensPerPass = 8192;
// Layer-sized K|V copies a streamed prefill holds: on CUDA with more than two
// layers, two (the next layer is read on a side stream while one attends);
// otherwise one, read serially (two copies of a two-layer model would cost
// the dense copy's memory).
constexpr int stream_layer_copies(bool cuda, int n_layer) { return cuda && n_layer > 2 ? 2 : 1; }

}  // namespace kvtier
