// Speed of the key-index hot path (score over many records) and of the
// quantizers, for Llama-3.1-8B shapes (head_dim 128; host rows 8×128).
// Not wired into CMake by the module rule (it excludes *_bench.cpp); build it
// with benchmark::benchmark_main and kvt_ops.
#include <benchmark/benchmark.h>

#include <vector>

#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

const char* kSpecs[] = {"bf16", "fp8", "nvfp4", "int2", "int4", "higgs2:g128", "higgs4:g128", "higgs1:g128",
                        "higgs0.5:g128", "higgs2:g64"};

// args: spec index, n_q, dim. 32768 records (one head, 32K tokens).
void BM_score(benchmark::State& state) {
  QuantSpec spec = parse_quant_spec(kSpecs[state.range(0)]);
  const int dim = int(state.range(2)), n_q = int(state.range(1));
  const int64_t n_vec = 32768;
  std::vector<float> x(static_cast<size_t>(n_vec * dim)), q(static_cast<size_t>(n_q * dim));
  gaussian_fill(x.data(), int64_t(x.size()), 1);
  gaussian_fill(q.data(), int64_t(q.size()), 2);
  std::vector<uint8_t> codes(bytes_per_vector(spec, dim) * size_t(n_vec));
  quantize(spec, x.data(), n_vec, dim, codes.data());
  std::vector<float> scores(static_cast<size_t>(n_q * n_vec));
  ScoreParams p;
  p.q = q.data(), p.n_q = n_q, p.codes = codes.data(), p.n_vec = n_vec, p.dim = dim, p.scores = scores.data();
  for (auto _ : state) {
    score(spec, p);
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetLabel(to_string(spec));
  state.counters["records/s"] = benchmark::Counter(double(n_vec), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_score)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8}, {1, 4}, {128}})->Unit(benchmark::kMicrosecond);
// SmolLM2-135M's key index: a GQA group of 3 queries, head_dim 64 (g64: one group per head).
BENCHMARK(BM_score)->Args({9, 3, 64})->Unit(benchmark::kMicrosecond);

// args: spec index into kQuantSpecs. 4096 rows.
const char* kQuantSpecs[] = {"fp8", "nvfp4", "int2:g128", "higgs2:g128", "higgs4:g1024", "higgs4:g128",
                             "higgs1:g128"};
void BM_quantize(benchmark::State& state) {
  QuantSpec spec = parse_quant_spec(kQuantSpecs[state.range(0)]);
  const int dim = 1024;
  const int64_t n_vec = 512;
  std::vector<float> x(static_cast<size_t>(n_vec * dim));
  gaussian_fill(x.data(), int64_t(x.size()), 3);
  std::vector<uint8_t> codes(bytes_per_vector(spec, dim) * size_t(n_vec));
  for (auto _ : state) {
    quantize(spec, x.data(), n_vec, dim, codes.data());
    benchmark::DoNotOptimize(codes.data());
  }
  state.SetLabel(to_string(spec));
  state.counters["values/s"] = benchmark::Counter(double(n_vec * dim), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_quantize)->DenseRange(0, 6)->Unit(benchmark::kMillisecond);

void BM_dequantize(benchmark::State& state) {
  QuantSpec spec = parse_quant_spec(kQuantSpecs[state.range(0)]);
  const int dim = 1024;
  const int64_t n_vec = 512;
  std::vector<float> x(static_cast<size_t>(n_vec * dim)), y(x.size());
  gaussian_fill(x.data(), int64_t(x.size()), 3);
  std::vector<uint8_t> codes(bytes_per_vector(spec, dim) * size_t(n_vec));
  quantize(spec, x.data(), n_vec, dim, codes.data());
  for (auto _ : state) {
    dequantize(spec, codes.data(), n_vec, dim, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(to_string(spec));
  state.counters["values/s"] = benchmark::Counter(double(n_vec * dim), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_dequantize)->DenseRange(0, 6)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvtier
