// decode_attn's dispatcher: the one place that picks the CPU or CUDA version.
#include <algorithm>

#include "core/status.h"
#include "ops/index_score/index_rows.h"
#include "core/threads.h"
#include "ops/decode_attn/decode_attn.h"
#ifdef KVT_CUDA
#include "ops/decode_attn/decode_attn_cuda.h"
#endif

namespace kvtier {

void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse);
void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse, float* out,
                    float* lse);

void decode_attn(const Exec& x, const DecodeAttnParams& p, const void* q, const uint8_t* const* rows,
                 const int32_t* idx, float* part_out, float* part_lse) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::decode_attn(x, p, q, rows, idx, part_out, part_lse);
#endif
  KVT_CHECK(!x.cuda(), "decode_attn: built without CUDA");
  note_cpu_decode_op();
  decode_attn_cpu(p, static_cast<const float*>(q), rows, idx, part_out, part_lse);
}

int decode_attn_splits(const Exec& x, int64_t n_rows, int64_t n_tok, int64_t min_tokens) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::decode_attn_splits(n_rows, n_tok, min_tokens);
#endif
  // Two jobs per thread balance the static partition of parallel_for when the
  // rows do not divide evenly among the threads.
  const int64_t want = (2 * int64_t(default_pool().n_threads()) + n_rows - 1) / std::max<int64_t>(1, n_rows);
  const int64_t cap = std::max<int64_t>(1, n_tok / std::max<int64_t>(1, min_tokens));
  return int(std::max<int64_t>(1, std::min(want, cap)));
}

void attn_merge(const Exec& x, int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                void* out, bool out_f32, float* lse) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::attn_merge(x, n_part, n_qh, head_dim, part_out, part_lse, out, out_f32, lse);
#endif
  KVT_CHECK(!x.cuda(), "attn_merge: built without CUDA");
  note_cpu_decode_op();
  attn_merge_cpu(n_part, n_qh, head_dim, part_out, part_lse, static_cast<float*>(out), lse);
}

}  // namespace kvtier
