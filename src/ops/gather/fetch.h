// Fetching the selected tokens' K|V of a batch of rows for decode attention
// (row r = sequence s · n_kv_head + KV head). Input: per row up to kmax
// selected token ids, ascending, −1 first (expand_rows / topk_rows). Output:
// a FetchView that decode_attn reads (slot bases per row, strides, and the
// slot of every selected entry).
//
// CUDA: a slot cache per row that persists across steps (gather.h's
// assignment: a token selected again keeps its slot, the others are read
// from pinned host memory into freed slots, zero-copy), holding either the
// host entries as they are (bf16 / FP8 per head) or K|V rebuilt in bf16 from
// the records (HIGGS, NVFP4, f32, layer-wide records, pre-RoPE keys, and
// shadowkv's keys from the SVD). Only misses cross PCIe.
// CPU: no copy when attention can read the host entries in place (the view
// points at the host tier); else the row keeps the same slot cache as the
// GPU (same assignment), holding K|V decoded to f32, and decodes only the
// misses. Both devices report the same statistics.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/device.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/kv_append/kv_write.h"

namespace kvtier {

struct FetchParams {
  int n_seq = 0, n_kv_head = 0, head_dim = 0;
  int kmax = 0;                 // selected entries per row at most
  // host tier (kv_write.h's HostWriteParams)
  bool layer_wide = false, values_only = false, keys_prerope = false;
  RecordFormat fmt;
  int64_t entry_bytes = 0, tok_bytes = 0;
  float k_scale = 1.f, v_scale = 1.f;
  const float* seq_scales = nullptr;   // [n_seq][2] (k, v) nvfp4 scales per sequence, overriding k_scale/v_scale
  // what attention reads
  bool raw = false;             // the host entries themselves (bf16 / fp8 / CPU f32, per head)
  KvElt elt = KvElt::bf16;
  int64_t slot_bytes = 0;       // 2 · head_dim · elt
  // RoPE of pre-RoPE keys and of shadowkv's rebuilt keys: angle t · inv_freq[i]
  const float* inv_freq = nullptr;  // [head_dim / 2]
  bool interleaved = false;
  int rank = 0;                 // shadowkv SVD rank (values_only)
};

// Per-sequence / per-row storage the fetch reads and updates. The selection
// rows are kmax wide (the batch's widest); sequence s owns kslots[s] ≤ kmax
// slots per row and its selected entries are the row's last kslots[s]
// (right-aligned; the entries before them are −1).
struct FetchRows {
  uint8_t* const* host = nullptr;          // [n_seq] the layer's host tier
  uint8_t* const* kplane = nullptr;        // [n_seq] values_only: generated tokens' keys
  const int64_t* key_first = nullptr;      // [n_seq] values_only: first token of kplane (= n_svd)
  const uint16_t* const* svd_a = nullptr;  // [n_seq] values_only: U·S [n_svd, rank] bf16
  const uint16_t* const* svd_b = nullptr;  // [n_seq] values_only: Vᵀ [rank, n_kv_head·head_dim] bf16
  const int32_t* kslots = nullptr;         // [n_seq] slots per row
  uint8_t* const* slots = nullptr;         // [rows] slot cache, kslots slots each
  int32_t* const* prev_sel = nullptr;      // [rows] kslots entries: the last step's selection (−1: none)
  int32_t* const* prev_slot = nullptr;     // [rows] kslots entries: its slots
  int32_t* slot_of = nullptr;              // [rows, kmax] out: this step's slot per entry (−1: none)
  void* scratch = nullptr;                 // CUDA: fetch_scratch_bytes(p)
  unsigned long long* const* counters = nullptr;  // [n_seq] → [2]: += selected entries, += misses
  // [n_seq] or null. 1: the sequence's rows cache every token (policy
  // cache=all): token t lives in slot t (slots hold the context's capacity)
  // and prev_sel is a bitmap of the tokens held ([capacity / 32] words,
  // uint32); a selected token not yet held is a miss, read once. 0: the slot
  // cache above.
  const int32_t* cache_all = nullptr;
  // fetch_dense only. prefill_kpre, values_only: the pre-RoPE keys of the
  // prompt, [token][n_kv_head·head_dim] at the activation precision (pinned
  // host memory). dense_k / dense_v: the outputs (fetch_dense sets them).
  const uint8_t* prefill_kpre = nullptr;
  // fetch_dense on CUDA, optional: the sequence's host tier at its CPU address.
  // Given, each pass's token range is copied by the copy engine (no SM time,
  // so it overlaps kernels on other streams) and decoded from device memory.
  const uint8_t* dense_host = nullptr;
  void* dense_k = nullptr;
  void* dense_v = nullptr;
};

struct FetchView {
  const uint8_t* const* rows = nullptr;  // [rows] slot bases
  int64_t tok_stride = 0, v_offset = 0;
  KvElt elt = KvElt::bf16;
  const int32_t* idx = nullptr;          // [rows, kmax] slot of each selected entry (−1: none)
};

int64_t fetch_scratch_bytes(const Exec& x, const FetchParams& p);
// sel: [rows, kmax] tokens. On return prev_sel/prev_slot hold this step's
// selection (the next step's cache state); view points into `r`'s storage
// (CPU: host rows when raw; the view's row table lives in view_rows, a
// caller-owned [rows] array of the device).
void fetch_rows(const Exec& x, const FetchParams& p, const int32_t* sel, const FetchRows& r,
                const uint8_t** view_rows, FetchView* view);
void fetch_rows_cpu(const FetchParams& p, const int32_t* sel, const FetchRows& r, const uint8_t** view_rows,
                    FetchView* view);

// The slot cache's assignment for one row of k slots (the CPU fetch's, and
// the CUDA kernel's): `now` this step's selection (ascending, −1 first),
// prev_sel / prev_slot the last step's. A token held keeps its slot; the
// misses take the free slots in ascending order. Writes slot_of [k] (−1 for
// no token), the misses' positions in `now` to *miss, and this step's
// selection into prev_sel / prev_slot. Returns the tokens selected.
int64_t assign_slots(const int32_t* now, int k, int32_t* prev_sel, int32_t* prev_slot, int32_t* slot_of,
                     std::vector<int32_t>* miss);

// cache=all: decodes tokens [0, fill_n[s]) of every row of sequence s into
// their slots and marks them held (counted neither as selected nor as
// misses): the prompt, read from the host tier in order when decode starts.
// fill_n: [n_seq] on x's device, each ≤ max_fill. The CPU only marks them
// (it decodes what it selects at every step; its bitmap is the statistic).
void fetch_fill(const Exec& x, const FetchParams& p, const FetchRows& r, const int64_t* fill_n, int64_t max_fill);
void fetch_fill_cpu(const FetchParams& p, const FetchRows& r, const int64_t* fill_n);

// The streamed prefill's read (policy prefill=stream): tokens [t0, t1) of one
// sequence's host tier (p.n_seq = 1; r.host, r.key_first = −1 and r.kplane
// as for fetch_rows) decoded into dense rows k_out / v_out
// [t1 − t0][n_kv_head·head_dim] at the activation precision (CPU f32, CUDA
// bf16): the values a decode step reads for a selected token, RoPE applied.
// values_only (shadowkv): V from the host tier, K = RoPE(r.prefill_kpre).
// p.kmax: tokens decoded per pass (CUDA: the scratch holds
// fetch_dense_scratch_bytes(x, p)); p.raw, p.elt and p.slot_bytes are ignored.
void fetch_dense(const Exec& x, const FetchParams& p, const FetchRows& r, int64_t t0, int64_t t1, void* k_out,
                 void* v_out);
int64_t fetch_dense_scratch_bytes(const Exec& x, FetchParams p);
void fetch_dense_cpu(const FetchParams& p, const FetchRows& r, int64_t t0, int64_t t1, float* k_out, float* v_out);

}  // namespace kvtier
