#include <cublasLt.h>
#include <fmt/format.h>

#include <map>
#include <tuple>

#include "backend/cuda_backend.h"
#include "ops/gemm/gemm_cuda.h"

namespace kvtier::cuda {
namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error {} in {}", int(st), what);
}
#define KVT_LT(expr) check_lt((expr), #expr)

constexpr size_t kWorkspace = 64 << 20;

}  // namespace

void require_fp8_tensor_cores(const char* who) {
  int dev = 0, major = 0, minor = 0;
  KVT_CUDA_CHECK(cudaGetDevice(&dev));
  KVT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KVT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  KVT_CHECK(major * 10 + minor >= 89, "{} need FP8 tensor cores (compute capability 8.9 or later; this GPU: {}.{})",
            who, major, minor);
}

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace{kWorkspace};
  bool fp8_checked = false;  // require_fp8_tensor_cores passed for this Gemm
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // bf16 × bf16 → bf16 or f32; E4M3 × E4M3 → bf16 (unit scales).
  enum class Kind { bf16, bf16_to_f32, fp8 };
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, Kind>, Plan> plans;

  const Plan& plan(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, Kind kind) {
    auto key = std::make_tuple(m, n, k, ldx, ldy, kind);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    // Column-major view: Y^T [n, m] = W [n, k] · X^T [k, m]; W is stored as a
    // column-major [k, n] matrix (ld k) used transposed; X as [k, m] (ld ldx).
    Plan p;
    KVT_LT(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    KVT_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    KVT_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const cudaDataType_t in = kind == Kind::fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    KVT_LT(cublasLtMatrixLayoutCreate(&p.a, in, uint64_t(k), uint64_t(n), k));
    KVT_LT(cublasLtMatrixLayoutCreate(&p.b, in, uint64_t(k), uint64_t(m), ldx));
    KVT_LT(cublasLtMatrixLayoutCreate(&p.c, kind == Kind::bf16_to_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n),
                                      uint64_t(m), ldy));
    cublasLtMatmulPreference_t pref = nullptr;
    KVT_LT(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    KVT_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t res{};
    int n_res = 0;
    KVT_LT(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &n_res));
    cublasLtMatmulPreferenceDestroy(pref);
    KVT_CHECK(n_res > 0, "cuBLASLt: no algorithm for {} GEMM m={} n={} k={}",
              kind == Kind::fp8 ? "FP8" : "bf16", m, n, k);
    p.algo = res.algo;
    return plans.emplace(key, p).first->second;
  }

  ~Impl() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (handle) cublasLtDestroy(handle);
  }
};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) { KVT_LT(cublasLtCreate(&impl_->handle)); }
Gemm::~Gemm() = default;

void Gemm::run(int64_t m, int64_t n, int64_t k, const void* x, const void* w, void* y, cudaStream_t s, float beta,
               int64_t ldx, int64_t ldy) {
  KVT_CHECK(m > 0 && n > 0 && k > 0, "gemm: empty shape m={} n={} k={}", m, n, k);
  if (ldx == 0) ldx = k;
  if (ldy == 0) ldy = n;
  KVT_CHECK(ldx >= k && ldy >= n, "gemm: leading dimensions ldx={} (k={}) ldy={} (n={})", ldx, k, ldy, n);
  const Impl::Plan& p = impl_->plan(m, n, k, ldx, ldy, Impl::Kind::bf16);
  const float alpha = 1.f;
  KVT_LT(cublasLtMatmul(impl_->handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                        impl_->workspace.data(), kWorkspace, s));
}

void Gemm::run_f32(int64_t m, int64_t n, int64_t k, const void* x, const void* w, float* y, cudaStream_t s) {
  KVT_CHECK(m > 0 && n > 0 && k > 0, "gemm: empty shape m={} n={} k={}", m, n, k);
  const Impl::Plan& p = impl_->plan(m, n, k, k, n, Impl::Kind::bf16_to_f32);
  const float alpha = 1.f, beta = 0.f;
  KVT_LT(cublasLtMatmul(impl_->handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                        impl_->workspace.data(), kWorkspace, s));
}

void Gemm::run_fp8_codes(int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const uint8_t* w_q, void* y,
                         cudaStream_t s) {
  KVT_CHECK(m > 0 && n > 0 && k > 0 && k % 16 == 0, "gemm (FP8): shape m={} n={} k={} (k a multiple of 16)", m, n,
            k);
  if (!impl_->fp8_checked) {
    require_fp8_tensor_cores("FP8 GEMMs");
    impl_->fp8_checked = true;
  }
  const Impl::Plan& p = impl_->plan(m, n, k, k, n, Impl::Kind::fp8);
  const float alpha = 1.f, beta = 0.f;
  KVT_LT(cublasLtMatmul(impl_->handle, p.op, &alpha, w_q, p.a, x_q, p.b, &beta, y, p.c, y, p.c, &p.algo,
                        impl_->workspace.data(), kWorkspace, s));
}

}  // namespace kvtier::cuda
