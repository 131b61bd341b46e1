// svd_gemm.h on the GPU (cuBLASLt, bf16 operands, f32 accumulation) and
// copy_rows. The Gram matrix is one matmul per prefill chunk: row-major keys
// K [n, W] are the column-major Kc [W, n], so G += Kc · Kcᵀ.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <memory>
#include <mutex>

#include "backend/cuda_backend.h"
#include "ops/gemm/gemm_cuda.h"
#include "ops/gemm/svd_gemm_cuda.h"

namespace kvtier::cuda {
namespace {

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error {} in {}", int(s), what);
}
#define KVT_LT(expr) check_lt((expr), #expr)

// One handle and workspace for these prefill-time products.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace{32 << 20};
  Lt() { KVT_LT(cublasLtCreate(&handle)); }
  ~Lt() { cublasLtDestroy(handle); }
};
Lt& lt() {
  static Lt l;
  return l;
}
Gemm& gemm() {
  static Gemm g;
  return g;
}

__global__ void copy_rows_kernel(int64_t row_bytes, const uint8_t* const* __restrict__ src,
                                 uint8_t* const* __restrict__ dst) {
  const int64_t r = blockIdx.x;
  const uint4* s = reinterpret_cast<const uint4*>(src[r]);
  uint4* d = reinterpret_cast<uint4*>(dst[r]);
  for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x) d[i] = s[i];
}

__global__ void copy_rows_at_kernel(int64_t row_bytes, const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                    int64_t dst_stride, const int64_t* __restrict__ pos) {
  const int64_t r = blockIdx.x;
  const uint4* s = reinterpret_cast<const uint4*>(src + r * row_bytes);
  uint4* d = reinterpret_cast<uint4*>(dst + (*pos + r) * dst_stride);
  for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x) d[i] = s[i];
}

}  // namespace

void copy_rows_at(const Exec& x, int64_t n, int64_t row_bytes, const void* src, void* dst, int64_t dst_stride,
                  const int64_t* pos) {
  KVT_CHECK(row_bytes % 16 == 0 && dst_stride % 16 == 0, "copy_rows_at: rows of {} bytes, stride {}", row_bytes,
            dst_stride);
  if (n == 0) return;
  copy_rows_at_kernel<<<unsigned(n), 128, 0, st(x)>>>(row_bytes, static_cast<const uint8_t*>(src),
                                                      static_cast<uint8_t*>(dst), dst_stride, pos);
  KVT_CUDA_LAUNCH_CHECK("copy_rows_at_kernel");
}

void gram_accumulate(const Exec& x, const void* k_bf16, int64_t n, int W, int64_t ld, float* G) {
  if (n <= 0) return;
  Lt& l = lt();
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  KVT_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_T;
  KVT_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KVT_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  KVT_LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, uint64_t(W), uint64_t(n), ld));  // Kc [W, n]
  KVT_LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(W), uint64_t(n), ld));  // Kc, used transposed
  KVT_LT(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, uint64_t(W), uint64_t(W), W));
  const float alpha = 1.f, beta = 1.f;
  KVT_LT(cublasLtMatmul(l.handle, op, &alpha, k_bf16, a, k_bf16, b, &beta, G, c, G, c, nullptr,
                        l.workspace.data(), l.workspace.bytes(), st(x)));
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(op);
}

void project_rows(const Exec& x, const void* k_bf16, int64_t n, int W, int64_t ld, const uint16_t* basis, int rank,
                  uint16_t* out) {
  if (n <= 0) return;
  // out [n, rank] = K [n, W] · basisᵀ, basis [rank, W]: the Linear-layer product.
  gemm().run(n, rank, W, k_bf16, basis, out, st(x), 0.f, ld, rank);
}

void copy_rows(const Exec& x, int64_t n, int64_t row_bytes, const uint8_t* const* src, uint8_t* const* dst) {
  KVT_CHECK(row_bytes % 16 == 0, "copy_rows: rows of {} bytes must be 16-byte multiples", row_bytes);
  if (n == 0) return;
  copy_rows_kernel<<<unsigned(n), 128, 0, st(x)>>>(row_bytes, src, dst);
  KVT_CUDA_LAUNCH_CHECK("copy_rows_kernel");
}

}  // namespace kvtier::cuda
