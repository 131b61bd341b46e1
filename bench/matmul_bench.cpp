// Speed of the quantized decode matmul kernels (src/ops/matmul), AVX2 and
// AVX-512 VNNI, by batch size: a SmolLM2-135M feed-forward matrix (1536 x
// 576) and its Q8_0 output matrix (49152 x 576), Q4_1 and Q8_0, for 1..15
// tokens per call (the batched decode step of Engine::step_batch). Tokens/s
// per size shows what a batch gains from reading and unpacking each weight
// once for all its tokens.
//
//   cmake --build build --target matmul_bench && build/bench/matmul_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/ggml_type.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/matmul/matmul.h"
#include "ops/matmul/matmul_kernels.h"

namespace kvtier {
namespace {

// args: n_out, n_in, type, tokens per call, kernel (0: AVX2, 1: AVX-512).
void BM_MatmulDecode(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), n_tok = state.range(3);
  const GgmlType type = static_cast<GgmlType>(state.range(2));
  const bool avx512 = state.range(4) == 1;
  if (!cpu_supports(avx512 ? CpuPath::avx512 : CpuPath::avx2)) {
    state.SkipWithError("this CPU lacks the kernel's ISA");
    return;
  }
  const matmul_kernels::RowsKernel kernel = avx512 ? matmul_kernels::rows_avx512 : matmul_kernels::rows_avx2;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  const size_t row_bytes = ggml_row_bytes(type, n_in);
  std::vector<uint8_t> w(row_bytes * size_t(n_out));
  std::vector<float> row(static_cast<size_t>(n_in)), x(static_cast<size_t>(n_tok * n_in)),
      y(static_cast<size_t>(n_tok * n_out));
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& v : row) v = nd(rng);
    quantize_row(type, row.data(), w.data() + size_t(r) * row_bytes, n_in);
  }
  for (auto& v : x) v = nd(rng);
  const WeightView view{type, w.data(), n_out, n_in, row_bytes};
  const WeightView* ws[1] = {&view};
  float* ys[1] = {y.data()};
  ThreadPool& pool = default_pool();
  for (auto _ : state) {
    matmul_kernels::matmul_quantized_with(kernel, ws, ys, 1, x.data(), n_tok, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n_tok);  // tokens
  state.SetBytesProcessed(state.iterations() * int64_t(w.size()));  // weight bytes per call
}

void sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n_out", "n_in", "type", "tokens", "avx512"});
  for (int isa : {0, 1}) {
    for (int type : {int(GgmlType::Q4_1), int(GgmlType::Q8_0)})
      for (int n_tok : {1, 2, 4, 8, 15}) b->Args({1536, 576, type, n_tok, isa});
    for (int n_tok : {1, 4, 8}) b->Args({49152, 576, int(GgmlType::Q8_0), n_tok, isa});
  }
}
BENCHMARK(BM_MatmulDecode)->Apply(sizes)->UseRealTime();

}  // namespace
}  // namespace kvtier
