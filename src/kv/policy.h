// KV policies (SPEC "Policies"): what the key index holds, how tokens are
// stored on the host, how many tokens each KV head attends to in decode.
//
// Grammar: PRESET ("," KEY "=" VALUE)*   e.g. "yakv,budget=0.05,local=128"
//   presets : full | shadowkv | yakv | oracle | landmarks
//   index   : none | landmarks | exact | shadowkv
//   chunk   : tokens per landmark (≥ 1)
//   lm      : landmark precision, a quant spec (ops/quant/quant_format.h:
//             bf16, fp8, nvfp4, int4:g32, 1bit, higgs2:g128 …) or "residual"
//             ("residual:meta=SPEC" also sets the meta precision)
//   meta    : residual landmarks: precision of the meta-landmark (mean of m landmarks)
//   res     : residual landmarks: precision of the per-landmark residual
//   m       : residual landmarks: landmarks per meta-landmark
//   rank    : shadowkv SVD rank: an integer ≥ 1, a fraction of the layer's KV
//             width in (0, 1) or "P%", or "full"
//   kv      : host K/V precision (quant spec; f32 for exact CPU reference runs)
//   keys_prerope : 0|1, host keys stored before RoPE (RoPE applied at gather)
//   budget  : sparse budget, tokens if ≥ 1, else a fraction of the prompt
//   min_budget : floor of the budget in tokens (budget = max(fraction·n_prompt, min_budget))
//   sink, local, outliers : always-attended prefix tokens, recent tokens, outlier chunks
//   reselect : decode steps per selection (≥ 1, default 1): with N > 1 a
//             sequence scores its index and picks its top-k on every Nth
//             step only; the steps between attend to the tokens that last
//             pick chose (with the sinks and the current window), which
//             skips the index and the top-k on N − 1 of N steps
//   rescore : with reselect > 1, the steps between picks rescore candidates
//             instead of reusing the pick (default 0: reuse it): each token
//             of the last pick and the D tokens after it (runs of D + 1,
//             pushed right where they overlap: k·(D + 1) candidates), scored
//             with the current query, and the top-k of them attended. Needs
//             chunk=1 and no outlier chunks
//   gqa     : shadowkv (softmax per query head over chunks, max over the group) | mean
//   cache   : the decoded K/V kept on the GPU between steps: step (the last
//             step's selection, kmax slots per KV head), all (every token of the
//             context, filled from the host tier when decode starts, so only
//             generated tokens cross PCIe, once), none (no decoded K/V: the
//             attention reads the selected tokens' records where the store
//             lies; store=gpu with HIGGS byte-code records of one group per
//             head, e.g. the default kv), auto (none where store=gpu allows
//             it, else all when free GPU memory holds it twice with a margin,
//             else step; step on the CPU)
//   store   : where the quantized K/V store (the host tier) lives: host
//             (pinned RAM) or gpu (device memory, on a CUDA device: the
//             sequence takes no host memory and its misses are read from
//             device memory instead of over PCIe; about 3.6x less GPU memory
//             than bf16 K/V at HIGGS4, so more sequences fit when the batch
//             is bound by GPU memory; cache=auto is then none or step). On the CPU
//             device every tier is in RAM and the knob changes nothing.
//   prefill : what the prompt's attention reads: dense (a copy of every
//             layer's K/V at the activation precision, on the device until
//             decode starts), stream (each layer's K/V decoded from the host
//             tier into one layer-sized buffer as the layer runs: the device
//             holds one layer's copy, and earlier tokens are read at the
//             precision the host stores), auto (dense when the copy fits in
//             free GPU memory with a margin, else stream; dense on the CPU)
#pragma once
#include <cstdint>
#include <string>

#include "kv/kv_store.h"
#include "ops/quant/quant_format.h"

namespace kvtier {

enum class IndexKind { none, landmarks, exact, shadowkv };
enum class GqaMode { shadowkv, mean };
enum class CacheMode { auto_, step, all, none };
const char* cache_mode_name(CacheMode m);
enum class PrefillMode { auto_, dense, stream };
const char* prefill_mode_name(PrefillMode m);
enum class StoreMode { host, gpu };
const char* store_mode_name(StoreMode m);

struct PolicyConfig {
  std::string preset = "full";
  IndexKind index = IndexKind::none;
  int chunk = 1;
  QuantSpec lm = bf16_spec();  // landmark precision (index=landmarks|shadowkv)
  bool residual = false;    // residual landmarks (index=landmarks)
  QuantSpec res_meta = parse_quant_spec("higgs4");
  QuantSpec res = parse_quant_spec("1bit");
  int res_m = 8;
  double rank = 0;  // shadowkv: absolute (integer) or a fraction of the KV width
  bool rank_fraction = true;
  QuantSpec kv = bf16_spec();  // host K/V precision (full: the resident K/V)
  bool keys_prerope = false;
  double budget = 0;  // ≥ 1 tokens, (0, 1) fraction of the prompt
  int min_budget = 0;  // floor in tokens of the resolved budget (0: none)
  int sink = 0;
  int local = 0;
  int outliers = 0;  // outlier chunks (shadowkv)
  int reselect = 1;  // decode steps per selection
  int rescore = 0;   // reselect > 1: successors per pick token rescored between picks (0: reuse the pick)
  GqaMode gqa = GqaMode::shadowkv;
  CacheMode cache = CacheMode::auto_;
  PrefillMode prefill = PrefillMode::auto_;
  StoreMode store = StoreMode::host;
};

// Throws kvtier::Error naming the offending key/value and the valid values.
PolicyConfig parse_policy(const std::string& text);
// The fully resolved policy in the grammar above (parse_policy round-trips it).
std::string to_string(const PolicyConfig& p);

// Knobs that size memory in tokens (sink, local, budget in tokens,
// min_budget, chunk, outliers·chunk) must fit a context of n_ctx tokens:
// throws kvtier::LimitError naming the knob otherwise. Called when a
// sequence starts, so that no knob can allocate beyond the context.
void check_policy_fits_context(const PolicyConfig& p, int64_t n_ctx);

// Sparse budget in tokens for a prompt of n_prompt tokens (≥ 1 when budget > 0),
// at least min_budget.
int64_t budget_tokens(const PolicyConfig& p, int64_t n_prompt);
// ShadowKV rank for a layer KV width of kv_width = n_kv_head * head_dim.
int resolved_rank(const PolicyConfig& p, int kv_width);
// A landmark spec for a head of head_dim: a HIGGS/uniform group larger than
// the head is clamped to head_dim (yakv's "group 128 or the head dimension if
// smaller").
QuantSpec resolved_lm_spec(const QuantSpec& spec, int head_dim);

// Per-token and context totals of a policy, computed without allocating.
// GPU tier: key index (landmarks, SVD projection rows, exact keys) and, for
// `full`, the whole K/V (dense attention reads it resident). Host tier: the
// full K and V of every layer (tiered policies; counted as GPU bytes under
// store=gpu). Fixed GPU bytes: sink and
// local windows, outlier chunks, SVD bases (independent of the context).
struct KvFootprint {
  double gpu_bytes_per_token = 0;
  double host_bytes_per_token = 0;
  int64_t gpu_fixed_bytes = 0;
  int64_t gpu_bytes = 0;   // for n_ctx tokens, fixed part included
  int64_t host_bytes = 0;  // for n_ctx tokens
};
KvFootprint kv_footprint(const PolicyConfig& p, const KvGeometry& g, int64_t n_ctx);

// What a sequence of up to n_ctx tokens may hold in host memory, the bytes a
// host KV budget is charged: the host tier, plus the GPU tier when
// `gpu_tier_in_host` (the CPU device keeps the key index and the resident
// sink/local windows in host memory too). Windows count at most n_ctx tokens.
int64_t kv_charge_bytes(const PolicyConfig& p, const KvGeometry& g, int64_t n_ctx, bool gpu_tier_in_host);

// What a sequence with an n_prompt-token prompt and up to n_total tokens holds
// in GPU memory on a CUDA device, the bytes a GPU KV budget is charged: while
// its prompt runs (an offloaded policy prefills over a bf16 K/V copy, then
// moves the K/V to the host tier) and while it decodes (key index, resident
// windows, SVD factors, and the slot cache: budget-sized under cache=step and
// cache=auto, every token's under cache=all, none when the attention reads the
// store in place: cache=none, or auto under store=gpu where it can). `full` holds the same bf16 K/V
// in both phases. Buffers are counted at the capacity the engine reserves
// under a GPU budget: n_total tokens.
struct KvGpuCharge {
  int64_t prefill_bytes = 0;
  int64_t decode_bytes = 0;
  int64_t peak() const { return prefill_bytes > decode_bytes ? prefill_bytes : decode_bytes; }
};
// prefill=stream counts one layer's K|V copy (and fetch_dense's staging)
// instead of every layer's; prefill=auto counts the dense copy.
KvGpuCharge kv_gpu_charge(const PolicyConfig& p, const KvGeometry& g, int64_t n_prompt, int64_t n_total);

// The policy a sequence runs under a GPU KV budget of `budget` bytes (> 0),
// its automatic choices made by what is charged rather than by free memory:
// cache=auto is step (none where the store is read in place), and prefill=auto is dense when the dense copy's charge
// fits the budget, else stream.
PolicyConfig policy_under_gpu_budget(PolicyConfig p, const KvGeometry& g, int64_t n_prompt, int64_t n_total,
                                     int64_t budget);

}  // namespace kvtier
