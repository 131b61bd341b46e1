// Speed of the quantized decode matmul (src/ops/matmul) by batch size: a
// SmolLM2-135M feed-forward matrix (1536 x 576) and its Q8_0 output matrix
// (49152 x 576), Q4_1 and Q8_0, for 1..15 tokens per call (the batched
// decode step of Engine::step_batch). Tokens/s per size shows what a batch
// gains from reading and unpacking each weight once for all its tokens.
//
//   cmake --build build --target matmul_bench && build/bench/matmul_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/ggml_type.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/matmul/matmul.h"

namespace kvtier {
namespace {

// args: n_out, n_in, type, tokens per call.
void BM_MatmulDecode(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), n_tok = state.range(3);
  const GgmlType type = static_cast<GgmlType>(state.range(2));
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
  ThreadPool& pool = default_pool();
  for (auto _ : state) {
    matmul(view, x.data(), n_tok, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n_tok);  // tokens
  state.SetBytesProcessed(state.iterations() * int64_t(w.size()));  // weight bytes per call
}

void sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n_out", "n_in", "type", "tokens"});
  for (int type : {int(GgmlType::Q4_1), int(GgmlType::Q8_0)})
    for (int n_tok : {1, 2, 4, 8, 15}) b->Args({1536, 576, type, n_tok});
  for (int n_tok : {1, 4, 8}) b->Args({49152, 576, int(GgmlType::Q8_0), n_tok});
}
BENCHMARK(BM_MatmulDecode)->Apply(sizes)->UseRealTime();

}  // namespace
}  // namespace kvtier
