// fetch_rows' and fetch_fill's dispatchers (fetch.h).
#include "core/status.h"
#include "ops/index_score/index_rows.h"
#include "ops/gather/fetch.h"
#ifdef KVT_CUDA
#include "ops/gather/fetch_cuda.h"
#endif

namespace kvtier {

int64_t fetch_scratch_bytes(const Exec& x, const FetchParams& p) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::fetch_scratch_bytes(p);
#endif
  return 0;
}

void fetch_rows(const Exec& x, const FetchParams& p, const int32_t* sel, const FetchRows& r,
                const uint8_t** view_rows, FetchView* view) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::fetch_rows(x, p, sel, r, view);
#endif
  KVT_CHECK(!x.cuda(), "fetch_rows: built without CUDA");
  note_cpu_decode_op();
  fetch_rows_cpu(p, sel, r, view_rows, view);
}

void fetch_fill(const Exec& x, const FetchParams& p, const FetchRows& r, const int64_t* fill_n, int64_t max_fill) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::fetch_fill(x, p, r, fill_n, max_fill);
#endif
  KVT_CHECK(!x.cuda(), "fetch_fill: built without CUDA");
  fetch_fill_cpu(p, r, fill_n);
}

void fetch_dense(const Exec& x, const FetchParams& p, const FetchRows& r, int64_t t0, int64_t t1, void* k_out,
                 void* v_out) {
  KVT_CHECK(p.n_seq == 1 && t0 >= 0 && t0 <= t1, "fetch_dense: tokens [{}, {}) of {} sequences", t0, t1, p.n_seq);
  if (t0 == t1) return;
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::fetch_dense(x, p, r, t0, t1, k_out, v_out);
#endif
  KVT_CHECK(!x.cuda(), "fetch_dense: built without CUDA");
  fetch_dense_cpu(p, r, t0, t1, static_cast<float*>(k_out), static_cast<float*>(v_out));
}

int64_t fetch_dense_scratch_bytes(const Exec& x, FetchParams p) {
  p.raw = false;  // records are always staged and decoded
  return fetch_scratch_bytes(x, p);
}

}  // namespace kvtier
