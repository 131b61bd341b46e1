#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "backend/cuda_backend.h"
#include "ops/gemm/gemm_cuda.h"

namespace kvtier::cuda {
namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error {} in {}", int(st), what);
}
#define KVT_LT(expr) check_lt((expr), #expr)

constexpr size_t kWorkspace = 64 << 20;
constexpr int kMaxCandidates = 8;  // cuBLASLt heuristic results kept per shape (kvt_gemm_bench times them)

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
    std::vector<cublasLtMatmulAlgo_t> algos;  // the heuristic's candidates, best first by its estimate; run() uses the first
  };
  // bf16 × bf16 → bf16 or f32; E4M3 × E4M3 → bf16 (unit scales).
  using Kind = Gemm::Kind;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, Kind>, Plan> plans;

  Plan& plan(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, Kind kind) {
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
    cublasLtMatmulHeuristicResult_t res[kMaxCandidates]{};
    int n_res = 0;
    KVT_LT(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, kMaxCandidates, res, &n_res));
    cublasLtMatmulPreferenceDestroy(pref);
    KVT_CHECK(n_res > 0, "cuBLASLt: no algorithm for {} GEMM m={} n={} k={}",
              kind == Kind::fp8 ? "FP8" : "bf16", m, n, k);
    for (int i = 0; i < n_res; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS) p.algos.push_back(res[i].algo);
    KVT_CHECK(!p.algos.empty(), "cuBLASLt: no usable algorithm for GEMM m={} n={} k={}", m, n, k);
    return plans.emplace(key, std::move(p)).first->second;
  }

  // The product by candidate `algo` of p, with workspace ws; its status (callers check it).
  cublasStatus_t matmul(const Plan& p, int algo, const void* x, const void* w, void* y, float beta, void* ws,
                        cudaStream_t s) const {
    const float alpha = 1.f;
    return cublasLtMatmul(handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algos[size_t(algo)], ws,
                          kWorkspace, s);
  }

  // Milliseconds per product of each candidate of p (the least of `reps`
  // runs, the candidates interleaved), on a stream of its own with scratch
  // input, output and workspace, and the L2 flushed before each run (a
  // step's layers each read their own weights from memory). A candidate
  // that fails to launch gets +∞.
  std::vector<double> timing_ms(const Plan& p, int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, Kind kind,
                                const void* w, int reps) {
    cudaStream_t ts = nullptr;
    KVT_CUDA_CHECK(cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking));
    const size_t in_bytes = size_t(m) * size_t(ldx) * (kind == Kind::fp8 ? 1 : 2);
    const size_t out_bytes = size_t(m) * size_t(ldy) * (kind == Kind::bf16_to_f32 ? 4 : 2);
    void *x = nullptr, *y = nullptr, *ws = nullptr;
    KVT_CUDA_CHECK(cudaMallocAsync(&x, in_bytes, ts));
    KVT_CUDA_CHECK(cudaMallocAsync(&y, out_bytes, ts));
    KVT_CUDA_CHECK(cudaMallocAsync(&ws, kWorkspace, ts));
    KVT_CUDA_CHECK(cudaMemsetAsync(x, 0x3c, in_bytes, ts));  // bf16 ≈ 0.0115 each, E4M3 1.5
    std::vector<double> best(p.algos.size(), std::numeric_limits<double>::infinity());
    Event e0, e1;
    for (int r = 0; r <= reps; ++r)  // round 0 warms up
      for (size_t i = 0; i < p.algos.size(); ++i) {
        KVT_CUDA_CHECK(cudaMemsetAsync(ws, r & 0xff, kWorkspace, ts));  // 64 MiB: more than the L2
        e0.record(ts);
        const cublasStatus_t st = matmul(p, int(i), x, w, y, 0.f, ws, ts);
        e1.record(ts);
        e1.synchronize();
        if (st != CUBLAS_STATUS_SUCCESS) continue;
        if (r > 0) best[i] = std::min(best[i], double(e1.elapsed_ms_since(e0)));
      }
    KVT_CUDA_CHECK(cudaFreeAsync(x, ts));
    KVT_CUDA_CHECK(cudaFreeAsync(y, ts));
    KVT_CUDA_CHECK(cudaFreeAsync(ws, ts));
    KVT_CUDA_CHECK(cudaStreamSynchronize(ts));
    KVT_CUDA_CHECK(cudaStreamDestroy(ts));
    return best;
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
  const Impl::Plan& p = impl_->plan(m, n, k, ldx, ldy, Kind::bf16);
  KVT_LT(impl_->matmul(p, 0, x, w, y, beta, impl_->workspace.data(), s));
}

void Gemm::run_f32(int64_t m, int64_t n, int64_t k, const void* x, const void* w, float* y, cudaStream_t s) {
  KVT_CHECK(m > 0 && n > 0 && k > 0, "gemm: empty shape m={} n={} k={}", m, n, k);
  const Impl::Plan& p = impl_->plan(m, n, k, k, n, Kind::bf16_to_f32);
  KVT_LT(impl_->matmul(p, 0, x, w, y, 0.f, impl_->workspace.data(), s));
}

void Gemm::run_fp8_codes(int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const uint8_t* w_q, void* y,
                         cudaStream_t s) {
  KVT_CHECK(m > 0 && n > 0 && k > 0 && k % 16 == 0, "gemm (FP8): shape m={} n={} k={} (k a multiple of 16)", m, n,
            k);
  if (!impl_->fp8_checked) {
    require_fp8_tensor_cores("FP8 GEMMs");
    impl_->fp8_checked = true;
  }
  const Impl::Plan& p = impl_->plan(m, n, k, k, n, Kind::fp8);
  KVT_LT(impl_->matmul(p, 0, x_q, w_q, y, 0.f, impl_->workspace.data(), s));
}

int Gemm::candidates(int64_t m, int64_t n, int64_t k, Kind kind) {
  KVT_CHECK(m > 0 && n > 0 && k > 0, "gemm: empty shape m={} n={} k={}", m, n, k);
  return int(impl_->plan(m, n, k, k, n, kind).algos.size());
}

void Gemm::run_candidate(int i, int64_t m, int64_t n, int64_t k, Kind kind, const void* x, const void* w, void* y,
                         cudaStream_t s) {
  const Impl::Plan& p = impl_->plan(m, n, k, k, n, kind);
  KVT_CHECK(i >= 0 && i < int(p.algos.size()), "gemm: candidate {} of {}", i, p.algos.size());
  KVT_LT(impl_->matmul(p, i, x, w, y, 0.f, impl_->workspace.data(), s));
}

std::vector<double> Gemm::time_candidates(int64_t m, int64_t n, int64_t k, Kind kind, const void* w, int reps) {
  const Impl::Plan& p = impl_->plan(m, n, k, k, n, kind);
  return impl_->timing_ms(p, m, n, k, k, n, kind, w, reps);
}

}  // namespace kvtier::cuda
