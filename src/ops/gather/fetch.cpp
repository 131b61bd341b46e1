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

}  // namespace kvtier
