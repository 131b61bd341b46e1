// Mixture-of-experts models on the GPU against the CPU model: a Qwen3-MoE
// GGUF with Q8_0 experts (stacked) and a Mixtral Hugging Face directory (one
// tensor per expert), prompt prefilled in chunks (grouped-GEMM experts), then
// greedy decode (GEMV experts), under `full` and natively offloaded `yakv`.
//
// bf16 activations move a router logit by ~1e-2 of its scale, so wherever a
// token's k-th and (k+1)-th experts are that close the GPU may pick the other
// one: a discrete change of that token's expert mix. Most steps must still
// agree within the dense models' bounds (gpu_model_cuda_test.cpp), and the
// greedy tokens until the first step where the CPU's top-2 margin is small.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "backend/cuda_test_util.h"
#include "gpu/gpu_model.h"
#include "kv/kv_store.h"
#include "loader/test_model_writer.h"
#include "model/model.h"

namespace kvtier {
namespace {
namespace fs = std::filesystem;
using namespace cuda::testing;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("kvt_gpu_moe_test_" + std::to_string(::getpid())) / name;
  fs::create_directories(p);
  return p;
}

ModelConfig tiny_moe(const std::string& arch, int head_dim) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_embd = 256;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = head_dim;
  c.n_vocab = 512;
  c.n_ctx_train = 4096;
  c.rms_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.n_expert = 8;
  c.n_expert_used = 2;
  c.n_ff_expert = 128;
  c.n_ff = arch == "qwen3moe" ? 384 : 128;  // llama experts are n_ff wide
  c.qk_norm = arch == "qwen3moe";
  return c;
}

std::vector<float> run(const Model& model, GpuModel* gpu, const std::string& policy, const std::vector<int32_t>& prompt,
                       int chunk, int n_gen, std::vector<int32_t>* tokens) {
  const int n_vocab = model.config().n_vocab;
  auto kv = make_kv_store(policy, model.kv_geometry());
  ForwardScratch scratch;
  std::unique_ptr<GpuSequence> seq;
  if (gpu) seq = gpu->start(chunk, *kv);
  else scratch = model.make_scratch(chunk);
  auto forward = [&](const int32_t* t, int n, int64_t pos, float* logits) {
    if (seq) seq->forward(t, n, pos, *kv, 1, logits);
    else model.forward(t, n, pos, *kv, scratch, 1, logits);
  };
  std::vector<float> all;  // [n_gen, n_vocab]: the logits each token was picked from
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  kv->set_phase(KvPhase::prefill);
  const int64_t n = int64_t(prompt.size());
  for (int64_t i = 0; i < n; i += chunk) {
    const int n_tok = int(std::min<int64_t>(chunk, n - i));
    forward(&prompt[size_t(i)], n_tok, i, logits.data());
  }
  kv->set_phase(KvPhase::decode);
  for (int step = 0; step < n_gen; ++step) {
    all.insert(all.end(), logits.begin(), logits.end());
    const int32_t tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    tokens->push_back(tok);
    if (step + 1 < n_gen) forward(&tok, 1, n + step, logits.data());
  }
  return all;
}

TEST(GpuModelMoe, MatchesCpuModel) {
  KVT_REQUIRE_GPU();
  struct Case {
    std::string name;
    std::string path;
  };
  std::vector<Case> cases;
  {
    const ModelConfig c = tiny_moe("qwen3moe", 128);
    cases.push_back({"gguf-qwen3moe-q8_0", (temp_dir("q3") / "m.gguf").string()});
    write_tiny_gguf(cases.back().path, c, GgmlType::Q8_0, 21);
  }
  {
    const ModelConfig c = tiny_moe("llama", 64);
    cases.push_back({"hf-mixtral-f32", (temp_dir("mx") / "m").string()});
    write_tiny_hf_dir(cases.back().path, c, GgmlType::F32, 22);
  }
  constexpr int kGen = 24;
  for (const Case& mc : cases) {
    Model model(open_model_source(mc.path));
    ASSERT_TRUE(model.config().is_moe()) << mc.name;
    auto gpu = make_gpu_model(model);
    std::vector<int32_t> prompt(160);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % model.config().n_vocab);
    for (const std::string policy : {"full", "yakv"}) {
      if (policy == "yakv" && model.config().head_dim != 128) continue;
      std::vector<int32_t> t_cpu, t_gpu;
      const auto cpu = run(model, nullptr, policy, prompt, 48, kGen, &t_cpu);
      const auto got = run(model, gpu.get(), policy, prompt, 48, kGen, &t_gpu);
      const size_t V = size_t(model.config().n_vocab);
      int n_close = 0, first_split = kGen;
      double worst = 0;
      for (int s = 0; s < kGen; ++s) {
        const double e = rel_l2(&got[s * V], &cpu[s * V], V);
        worst = std::max(worst, e);
        n_close += e < 2e-2;
        if (first_split == kGen && t_cpu[size_t(s)] != t_gpu[size_t(s)]) first_split = s;
      }
      std::printf("[gpu-vs-cpu moe] %-20s %-5s steps within 2e-2: %d/%d, worst rel-L2 %.2e, tokens equal until %d\n",
                  mc.name.c_str(), policy.c_str(), n_close, kGen, worst, first_split);
      EXPECT_LT(rel_l2(&got[0], &cpu[0], V), 2e-2) << mc.name << " " << policy << ": prefill logits";
      EXPECT_GE(n_close, kGen * 3 / 4) << mc.name << " " << policy;
      EXPECT_LT(worst, 0.5) << mc.name << " " << policy;
      if (policy == "full") {
        EXPECT_GE(first_split, 4) << mc.name;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier
