// svd_gemm.h's and copy_rows' dispatchers.
#include <cstring>

#include "core/status.h"
#include "ops/gather/copy_rows.h"
#include "ops/gemm/svd_gemm.h"
#ifdef KVT_CUDA
#include "ops/gemm/svd_gemm_cuda.h"
#endif

namespace kvtier {

void gram_accumulate_cpu(const float* k, int64_t n, int W, int64_t ld, float* G);
void project_rows_cpu(const float* k, int64_t n, int W, int64_t ld, const uint16_t* basis, int rank, uint16_t* out);

void gram_accumulate(const Exec& x, const void* k, int64_t n, int W, int64_t ld, float* G) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::gram_accumulate(x, k, n, W, ld, G);
#endif
  KVT_CHECK(!x.cuda(), "gram_accumulate: built without CUDA");
  gram_accumulate_cpu(static_cast<const float*>(k), n, W, ld, G);
}

void project_rows(const Exec& x, const void* k, int64_t n, int W, int64_t ld, const uint16_t* basis, int rank,
                  uint16_t* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::project_rows(x, k, n, W, ld, basis, rank, out);
#endif
  KVT_CHECK(!x.cuda(), "project_rows: built without CUDA");
  project_rows_cpu(static_cast<const float*>(k), n, W, ld, basis, rank, out);
}

void copy_rows_at(const Exec& x, int64_t n, int64_t row_bytes, const void* src, void* dst, int64_t dst_stride,
                  const int64_t* pos) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::copy_rows_at(x, n, row_bytes, src, dst, dst_stride, pos);
#endif
  KVT_CHECK(!x.cuda(), "copy_rows_at: built without CUDA");
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(static_cast<uint8_t*>(dst) + (*pos + i) * dst_stride, static_cast<const uint8_t*>(src) + i * row_bytes,
                size_t(row_bytes));
}

void copy_rows(const Exec& x, int64_t n, int64_t row_bytes, const uint8_t* const* src, uint8_t* const* dst) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::copy_rows(x, n, row_bytes, src, dst);
#endif
  KVT_CHECK(!x.cuda(), "copy_rows: built without CUDA");
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst[i], src[i], size_t(row_bytes));
}

}  // namespace kvtier
