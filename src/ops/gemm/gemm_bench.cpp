// The decode step's weight products at Llama-3.1-8B shapes (model stage of
// `kvtier perf --stages`), as a batch of m sequences runs them: for each
// product and each m, every candidate algorithm cuBLASLt's heuristic offers
// (Gemm::time_candidates: the least of `reps` runs with the L2 flushed),
// the heuristic's first against the fastest, and the weights' read rate;
// then a step's 32 layers plus the output head, summed both ways, with the
// three products q, k, v as one product of their stacked weights (as the
// engine runs them) and, for comparison, alone. Speed belongs here, not in the tests; gemm_cuda_test checks
// every candidate's product.
//
// usage: kvt_gemm_bench [--m 1,8,21,32] [--reps 10] [--json out.json]
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "core/status.h"
#include "ops/bench_args.h"
#include "ops/gemm/gemm_cuda.h"

namespace kvtier::cuda {
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
  Gemm::Kind kind;
  int per_step;  // products of this shape per decode step (0: the alternative the engine does not run)
};

// Llama-3.1-8B: n_embd 4096, 32 heads and 8 KV heads of 128, n_ff 14336, vocabulary 128,256.
const Shape kShapes[] = {
    {"q", 4096, 4096, Gemm::Kind::bf16, 0},
    {"k,v", 1024, 4096, Gemm::Kind::bf16, 0},
    {"qkv stacked", 6144, 4096, Gemm::Kind::bf16, 32},
    {"o", 4096, 4096, Gemm::Kind::bf16, 32},
    {"gate+up", 28672, 4096, Gemm::Kind::bf16, 32},
    {"down", 4096, 14336, Gemm::Kind::bf16, 32},
    {"head (f32 out)", 128256, 4096, Gemm::Kind::bf16_to_f32, 1},
};

int run(int argc, char** argv) {
  std::vector<int64_t> ms = {1, 8, 21, 32};
  int reps = 10;
  std::string json_path;
  for_each_option(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--m") {
      ms.clear();
      for (auto& x : split_list(v)) ms.push_back(std::stoll(x));
    } else if (a == "--reps") {
      reps = std::stoi(v);
    } else if (a == "--json") {
      json_path = v;
    } else {
      fail("unknown option {}", a);
    }
  });
  KVT_CHECK(reps >= 1, "--reps must be ≥ 1");
  for (int64_t m : ms) KVT_CHECK(m >= 1 && m <= 4096, "--m: {} rows", m);
  Gemm gemm;
  nlohmann::json out = nlohmann::json::array();
  fmt::print("{:>4} {:<15} {:>5} {:>10} {:>10} {:>5} {:>9} {:>9}\n", "m", "product", "cands", "first ms", "best ms",
             "best", "first GB/s", "best GB/s");
  for (int64_t m : ms) {
    double step_first = 0, step_best = 0, qkv_sep_first = 0, qkv_sep_best = 0, qkv_st_first = 0, qkv_st_best = 0;
    for (const Shape& s : kShapes) {
      DeviceBuffer w(size_t(s.n) * size_t(s.k) * 2);
      KVT_CUDA_CHECK(cudaMemset(w.data(), 0x3c, w.bytes()));
      const std::vector<double> t = gemm.time_candidates(m, s.n, s.k, s.kind, w.data(), reps);
      const size_t bi = size_t(std::min_element(t.begin(), t.end()) - t.begin());
      const double gb = double(w.bytes()) / 1e9;
      fmt::print("{:>4} {:<15} {:>5} {:>10.4f} {:>10.4f} {:>5} {:>9.0f} {:>9.0f}\n", m, s.name, t.size(), t[0], t[bi],
                 bi, gb / (t[0] * 1e-3), gb / (t[bi] * 1e-3));
      step_first += s.per_step * t[0];
      step_best += s.per_step * t[bi];
      const std::string name = s.name;
      if (name == "q" || name == "k,v") {
        const int times = name == "q" ? 1 : 2;
        qkv_sep_first += times * t[0];
        qkv_sep_best += times * t[bi];
      } else if (name == "qkv stacked") {
        qkv_st_first = t[0];
        qkv_st_best = t[bi];
      }
      out.push_back({{"m", m},
                     {"product", s.name},
                     {"n", s.n},
                     {"k", s.k},
                     {"candidates_ms", t},
                     {"first_ms", t[0]},
                     {"best_ms", t[bi]},
                     {"best", bi}});
    }
    fmt::print(
        "{:>4} step: 32 layers + head {:.3f} ms (heuristic's first), {:.3f} ms (fastest); q, k, v: {:.4f} / "
        "{:.4f} ms alone, {:.4f} / {:.4f} ms stacked\n",
        m, step_first, step_best, qkv_sep_first, qkv_sep_best, qkv_st_first, qkv_st_best);
    out.push_back({{"m", m}, {"step_first_ms", step_first}, {"step_best_ms", step_best}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace kvtier::cuda

int main(int argc, char** argv) {
  try {
    return kvtier::cuda::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvt_gemm_bench: {}\n", e.what());
    return 1;
  }
}
