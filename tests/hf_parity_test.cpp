// Logits of tiny random-weight Llama (Llama 3.1 RoPE scaling, sharded
// safetensors), Qwen2 (q/k/v bias, tied embeddings) and Qwen3 (q/k norm,
// head_dim != hidden/heads) against HF transformers' (fixtures made by
// scripts/gen_hf_parity.py with transformers 5.17 on the GPU machine), and of
// the mixtures of experts Qwen3-MoE (top-2 of 8 renormalized; a dense layer
// between MoE layers with top-3 of 4 unnormalized) and Mixtral (transformers
// 5.24, CPU).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "kvtier/engine.h"

namespace kvtier {
namespace {

class HfParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfParity, LogitsMatchTransformers) {
  const std::string dir = std::string(KVT_SOURCE_DIR) + "/tests/fixtures/" + GetParam();
  std::ifstream in(dir + "/golden_logits.json");
  ASSERT_TRUE(in.good()) << dir;
  const auto golden = nlohmann::json::parse(in);
  const auto tokens = golden["tokens"].get<std::vector<int32_t>>();
  EngineOptions opt;
  opt.model_path = dir;
  opt.prefill_chunk = 37;  // several chunks: exercises the KV store across prefill calls
  auto engine = Engine::load(opt);
  const int n_vocab = engine->config().n_vocab;
  ASSERT_EQ(n_vocab, golden["n_vocab"].get<int>());
  const auto logits = engine->logits(tokens, "full,kv=f32");
  double max_abs = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto& row = golden["logits"][t];
    for (int v = 0; v < n_vocab; ++v) {
      const double d = std::fabs(logits[t * n_vocab + v] - row[v].get<double>());
      ASSERT_TRUE(std::isfinite(logits[t * n_vocab + v]));
      max_abs = std::max(max_abs, d);
    }
  }
  EXPECT_LE(max_abs, 1e-3) << GetParam();
  RecordProperty("max_abs_diff", std::to_string(max_abs));
  std::printf("%s: max |logit - HF| = %.3g over %zu tokens\n", GetParam(), max_abs, tokens.size());
}

INSTANTIATE_TEST_SUITE_P(Models, HfParity,
                         ::testing::Values("hf_tiny_llama", "hf_tiny_qwen2", "hf_tiny_qwen3", "hf_tiny_qwen3_moe",
                                           "hf_tiny_qwen3_moe_mixed", "hf_tiny_mixtral"));

}  // namespace
}  // namespace kvtier
