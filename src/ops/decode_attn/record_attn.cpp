// decode_attn_records' dispatcher, its support test and its specification
// (record_attn.h). The CPU version is the specification: the CPU engine
// attends through its own slot cache (fetch.h), which decodes each miss once.
#include "ops/decode_attn/record_attn.h"

#include <vector>

#include "core/status.h"
#include "ops/quant/quant_format.h"
#include "ops/quant/quant_layout.h"

namespace kvtier {

bool record_attn_supported(const RecordFormat& fmt, int head_dim, int n_head, int n_kv_head) {
  const QuantSpec& s = fmt.spec;
  if (s.kind != QuantKind::higgs || s.grid_dim != 2 || fmt.dim != head_dim) return false;
  if (head_dim != 64 && head_dim != 128) return false;
  if (n_kv_head <= 0 || n_head % n_kv_head != 0 || n_head / n_kv_head > 8) return false;
  const quant_layout::Grouped l = quant_layout::grouped_layout(s, head_dim);
  return l.bits == 8 && l.group == head_dim && l.n_group == 1 && l.code_bytes == size_t(head_dim / 2);
}

void decode_attn_records_ref(const RecordAttnParams& p, const float* q, const uint8_t* const* host, const int32_t* sel,
                             float* part_out, float* part_lse) {
  const DecodeAttnParams& a = p.attn;
  KVT_CHECK(a.n_kv_head > 0, "decode_attn_records: n_kv_head {}", a.n_kv_head);
  const int D = a.head_dim;
  const int64_t n_rows = int64_t(a.n_seq) * a.n_kv_head, n = a.n_tok_fixed;
  // Slot j of row r holds the decoded K|V of sel[r, j] (f32).
  std::vector<float> slots(size_t(n_rows * std::max<int64_t>(1, n) * 2 * D), 0.f);
  std::vector<int32_t> idx(size_t(n_rows * std::max<int64_t>(1, n)), -1);
  std::vector<const uint8_t*> rows(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    const int s = int(r / a.n_kv_head), h = int(r % a.n_kv_head);
    float* row = slots.data() + r * n * 2 * D;
    rows[size_t(r)] = reinterpret_cast<const uint8_t*>(row);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t t = sel[r * a.idx_stride + j];
      if (t < 0) continue;
      const uint8_t* rec = host[s] + int64_t(t) * p.tok_bytes + int64_t(h) * p.entry_bytes;
      dequantize(p.fmt.spec, rec, 1, D, row + j * 2 * D);
      dequantize(p.fmt.spec, rec + p.fmt.bytes, 1, D, row + j * 2 * D + D);
      idx[size_t(r * n + j)] = int32_t(j);
    }
  }
  DecodeAttnParams d = a;
  d.elt = KvElt::f32;
  d.tok_stride = 2 * int64_t(D) * 4;
  d.v_offset = int64_t(D) * 4;
  d.idx_stride = n;
  d.n_tok = nullptr;
  decode_attn_ref(d, q, rows.data(), idx.data(), part_out, part_lse);
}

int record_attn_splits(const Exec& x, int64_t n_rows, int64_t n_tok) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::record_attn_splits(n_rows, n_tok);
#endif
  return decode_attn_splits(x, n_rows, n_tok, kRecordSplitTokens);
}

void decode_attn_records(const Exec& x, const RecordAttnParams& p, const void* q, const uint8_t* const* host,
                         const int32_t* sel, float* part_out, float* part_lse) {
  KVT_CHECK(record_attn_supported(p.fmt, p.attn.head_dim, p.attn.n_head, p.attn.n_kv_head),
            "decode_attn_records: store format {} with head_dim {} (GQA {}) is "
            "not read in place",
            to_string(p.fmt.spec), p.attn.head_dim, p.attn.n_kv_head ? p.attn.n_head / p.attn.n_kv_head : 0);
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::decode_attn_records(x, p, q, host, sel, part_out, part_lse);
#endif
  KVT_CHECK(!x.cuda(), "decode_attn_records: built without CUDA");
  decode_attn_records_ref(p, static_cast<const float*>(q), host, sel, part_out, part_lse);
}

}  // namespace kvtier
