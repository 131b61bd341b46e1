// The MoE block at Qwen3-30B-A3B's shapes (n_embd 2048, 128 experts of width
// 768, 8 used) on the GPU, its two ways of running the experts
// (ops/moe/moe_cuda.h): kvtier's kernels (device-side plan, grouped
// tensor-core GEMM or active-expert GEMV, no host synchronization) and
// cuBLASLt, one GEMM per active expert over its gathered rows (the plan made
// on the host: one synchronization per layer). Both share the router GEMM,
// the routing kernel, the SwiGLU and the combine; the outputs are compared
// (rel-L2, and the output's RMS to show it is not empty). For each token
// count: the median of CUDA-event timings over --reps, after one warm-up
// run; the last column is what MoeExperts::automatic picks. Speed belongs
// here, not in the tests; this sets kMoeCublasMinTokens.
//
// usage: kvt_moe_bench [--tokens 1,8,64,512,4096,8192,12288,16384,32768] [--reps 20] [--json out.json]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "core/status.h"
#include "ops/gemm/gemm_cuda.h"
#include "ops/moe/moe_cuda.h"

namespace kvtier::cuda {
namespace {

std::vector<double> to_f64(const DeviceBuffer& a, size_t n) {
  std::vector<uint16_t> h(n);
  KVT_CUDA_CHECK(cudaMemcpy(h.data(), a.data(), n * 2, cudaMemcpyDeviceToHost));
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t w = uint32_t(h[i]) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    v[i] = f;
  }
  return v;
}

// rel-L2 of a against b, and the RMS of b.
std::pair<double, double> compare(const DeviceBuffer& a, const DeviceBuffer& b, size_t n) {
  const std::vector<double> x = to_f64(a, n), y = to_f64(b, n);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return {std::sqrt(num / std::max(den, 1e-30)), std::sqrt(den / double(n))};
}

template <class F>
double median_ms(int reps, cudaStream_t s, F&& fn) {
  fn();  // warm-up: cuBLASLt plans, lazy state
  KVT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> ms;
  cudaEvent_t a, b;
  KVT_CUDA_CHECK(cudaEventCreate(&a));
  KVT_CUDA_CHECK(cudaEventCreate(&b));
  for (int r = 0; r < reps; ++r) {
    KVT_CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    KVT_CUDA_CHECK(cudaEventRecord(b, s));
    KVT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    KVT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run_bench(int argc, char** argv) {
  std::vector<int> tokens = {1, 8, 64, 512, 4096, 8192, 12288, 16384, 32768};
  int reps = 20;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    KVT_CHECK(i + 1 < argc, "{} needs a value (usage: kvt_moe_bench [--tokens 1,8,...] [--reps N] [--json F])", a);
    const std::string v = argv[++i];
    if (a == "--tokens") {
      tokens.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::stoi(t));
    } else if (a == "--reps") {
      reps = std::stoi(v);
    } else if (a == "--json") {
      json_path = v;
    } else {
      fail("unknown option {} (--tokens, --reps, --json)", a);
    }
  }
  KVT_CHECK(reps > 0 && !tokens.empty(), "--reps and --tokens must be positive");
  for (int t : tokens) KVT_CHECK(t > 0 && t <= 65536, "--tokens {} out of [1, 65536]", t);
  const MoeConfig c{2048, 768, 128, 8, true, 1.0f};
  const int cap = *std::max_element(tokens.begin(), tokens.end());
  cudaStream_t s = nullptr;
  KVT_CUDA_CHECK(cudaStreamCreate(&s));
  const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert;
  DeviceBuffer router(size_t(X * E) * 2), gate_up(size_t(X * 2 * F * E) * 2), down(size_t(X * E * F) * 2);
  DeviceBuffer x(size_t(cap) * size_t(E) * 2), y_own(size_t(cap) * size_t(E) * 2), y_blas(size_t(cap) * size_t(E) * 2);
  fill_uniform_bf16(router.data(), X * E, 1, -1.f / std::sqrt(float(E)), 1.f / std::sqrt(float(E)), s);
  fill_uniform_bf16(gate_up.data(), X * 2 * F * E, 2, -1.f / std::sqrt(float(E)), 1.f / std::sqrt(float(E)), s);
  fill_uniform_bf16(down.data(), X * E * F, 3, -1.f / std::sqrt(float(F)), 1.f / std::sqrt(float(F)), s);
  fill_uniform_bf16(x.data(), int64_t(cap) * E, 4, -1.f, 1.f, s);
  const MoeDeviceWeights w{router.data(), gate_up.data(), down.data()};
  Gemm gemm;
  MoeRunner moe(c, cap);
  nlohmann::json rows = nlohmann::json::array();
  fmt::print("MoE block, n_embd {}, {} experts of width {}, {} used; median of {} runs\n", E, X, F,
             c.n_expert_used, reps);
  fmt::print("| tokens | kvtier kernels ms | kernel | cuBLASLt per expert ms | cuBLASLt / kvtier | rel-L2 | y RMS | "
             "automatic |\n");
  fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int n : tokens) {
    const double t_own =
        median_ms(reps, s, [&] { moe.run(w, x.data(), n, y_own.data(), gemm, s, MoeExperts::device); });
    const double t_blas =
        median_ms(reps, s, [&] { moe.run(w, x.data(), n, y_blas.data(), gemm, s, MoeExperts::cublas); });
    KVT_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto [err, rms] = compare(y_blas, y_own, size_t(n) * size_t(E));
    const char* kernel = n <= kMoeGemvMaxTokens ? "GEMV" : "grouped GEMM";
    const char* pick = n >= kMoeCublasMinTokens ? "cuBLASLt" : kernel;
    fmt::print("| {} | {:.3f} | {} | {:.3f} | {:.2f}x | {:.1e} | {:.3f} | {} |\n", n, t_own, kernel, t_blas,
               t_blas / t_own, err, rms, pick);
    rows.push_back({{"tokens", n}, {"kvtier_ms", t_own}, {"kvtier_kernel", kernel}, {"cublaslt_ms", t_blas},
                    {"rel_l2", err}, {"y_rms", rms}, {"automatic", pick}});
  }
  if (!json_path.empty()) {
    const nlohmann::json out{{"device", cuda_device_summary()}, {"reps", reps}, {"rows", rows}};
    std::ofstream(json_path) << out.dump(1) << "\n";
  }
  cudaStreamDestroy(s);
  return 0;
}

}  // namespace
}  // namespace kvtier::cuda

int main(int argc, char** argv) {
  try {
    return kvtier::cuda::run_bench(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvt_moe_bench: {}\n", e.what());
    return 1;
  }
}
