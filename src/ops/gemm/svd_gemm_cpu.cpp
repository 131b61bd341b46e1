// svd_gemm.h on the CPU (f32 OpenBLAS; the CUDA versions are tested against these).
#include <cblas.h>

#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/gemm/svd_gemm.h"

namespace kvtier {

void gram_accumulate_cpu(const float* k, int64_t n, int W, int64_t ld, float* G) {
  if (n <= 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, W, W, int(n), 1.0f, k, int(ld), k, int(ld), 1.0f, G, W);
}

void project_rows_cpu(const float* k, int64_t n, int W, int64_t ld, const uint16_t* basis, int rank, uint16_t* out) {
  std::vector<float> b(size_t(rank) * W), o(size_t(n) * rank);
  for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_to_f32(basis[i]);
  if (n > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), rank, W, 1.0f, k, int(ld), b.data(), W, 0.0f,
                o.data(), rank);
  for (size_t i = 0; i < o.size(); ++i) out[i] = f32_to_bf16(o[i]);
}

}  // namespace kvtier
