// The same random MoE weights as a GGUF file (experts stacked, Llama's q/k
// rows permuted) and as a Hugging Face directory (one tensor per expert) give
// the same logits: both layouts reach the same experts, router and routing.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "backend/device.h"
#include "kv/kv_cache.h"
#include "loader/test_model_writer.h"
#include "model/model.h"

namespace kvtier {
namespace {
namespace fs = std::filesystem;

// Logits of every token, prompt fed in chunks of 16 (f32 KV).
std::vector<float> logits_of(const std::string& path, const std::vector<int32_t>& tokens) {
  const Model model(open_model_source(path));
  const int n_vocab = model.config().n_vocab, chunk = 16;
  const Device cpu(DeviceKind::cpu);
  auto kv = make_kv_cache(plan_kv(parse_policy("full,kv=f32"), model.kv_geometry(), DeviceKind::cpu), cpu);
  kv->reserve(int64_t(tokens.size()));
  ForwardScratch scratch = model.make_scratch(chunk);
  std::vector<float> out(tokens.size() * size_t(n_vocab));  // [n_tok, n_vocab]
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const int n = int(std::min<size_t>(chunk, tokens.size() - i));
    model.forward(&tokens[i], n, int64_t(i), *kv, scratch, n, &out[i * size_t(n_vocab)]);
  }
  return out;
}

ModelConfig tiny_moe(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 32;
  c.n_vocab = 96;
  c.n_ctx_train = 1024;
  c.rms_eps = 1e-6f;
  c.rope_theta = 100000.0f;
  c.qk_norm = arch == "qwen3moe";
  c.n_expert = 8;
  c.n_expert_used = 3;
  c.n_ff_expert = 32;
  c.n_ff = arch == "qwen3moe" ? 128 : 32;
  return c;
}

TEST(MoeModel, GgufAndHfLayoutsGiveTheSameLogits) {
  const fs::path dir = fs::temp_directory_path() / ("kvt_moe_model_test_" + std::to_string(::getpid()));
  for (const std::string arch : {"qwen3moe", "llama"}) {
    const ModelConfig c = tiny_moe(arch);
    const std::string gguf = (dir / (arch + ".gguf")).string(), hf = (dir / (arch + "_hf")).string();
    fs::create_directories(dir);
    write_tiny_gguf(gguf, c, GgmlType::F32, 41);
    write_tiny_hf_dir(hf, c, GgmlType::F32, 41);
    std::vector<int32_t> tokens(70);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 5) % c.n_vocab);
    std::vector<std::vector<float>> logits;
    for (const std::string& path : {gguf, hf}) logits.push_back(logits_of(path, tokens));
    ASSERT_EQ(logits[0].size(), logits[1].size());
    double max_abs = 0, scale = 0;
    for (size_t i = 0; i < logits[0].size(); ++i) {
      max_abs = std::max(max_abs, double(std::fabs(logits[0][i] - logits[1][i])));
      scale = std::max(scale, double(std::fabs(logits[1][i])));
    }
    EXPECT_GT(scale, 0.1) << arch;
    EXPECT_LT(max_abs, 1e-4 * scale) << arch;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtier
