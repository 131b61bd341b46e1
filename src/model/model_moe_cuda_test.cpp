// Mixture-of-experts models on the GPU against the CPU model (the oracle): a
// Qwen3-MoE GGUF with Q8_0 experts (stacked), a Mixtral Hugging Face
// directory (one tensor per expert), a Qwen3-MoE directory with a dense layer
// and unnormalized top-3 routing, and a Qwen3-MoE whose tokens use every
// expert; the prompt prefilled in chunks (grouped-GEMM experts), then decode
// (GEMV experts, replayed from a CUDA graph) under `full` and the offloaded
// policies, each decoding natively on the device, one sequence at a time and
// in batches.
//
// The GPU decodes the CPU's tokens (teacher forcing), so that every step
// compares the same context. bf16 activations move a router logit by ~1e-2
// of its scale, and a sparse policy's attention output differs between the
// devices by more (its selections and quantized K/V round differently), so
// wherever a token's k-th and (k+1)-th experts are that close the GPU may pick
// the other one: a discrete change of that token's expert mix, which moves
// that step's logits far more than the dense bound. Such steps are isolated
// (the next step agrees again), and a model whose tokens use every expert has
// no discrete choice: there every step must agree within the dense models'
// bounds (model_cuda_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <unistd.h>

#include "backend/cuda_test_util.h"
#include "core/status.h"
#include "kv/kv_cache.h"
#include "loader/test_model_writer.h"
#include "model/model.h"
#include "model/model_cuda.h"
#include "ops/index_score/index_rows.h"

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
  c.name = "tiny-gpu-moe-" + arch;
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
  c.n_ff = arch == "qwen3moe" ? 384 : 128;  // Mixtral's experts are n_ff wide
  c.qk_norm = arch == "qwen3moe";
  return c;
}

struct MoeCase {
  std::string name;
  std::function<std::string()> write;  // returns the path to load
};

std::vector<MoeCase> moe_cases() {
  std::vector<MoeCase> cases;
  cases.push_back({"gguf-qwen3moe-q8_0-hd128", [] {
                     const std::string p = (temp_dir("q3") / "m.gguf").string();
                     write_tiny_gguf(p, tiny_moe("qwen3moe", 128), GgmlType::Q8_0, 21);
                     return p;
                   }});
  cases.push_back({"hf-mixtral-f32-hd64", [] {
                     const std::string p = (temp_dir("mx") / "m").string();
                     write_tiny_hf_dir(p, tiny_moe("llama", 64), GgmlType::F32, 22);
                     return p;
                   }});
  cases.push_back({"hf-qwen3moe-f32-dense0-top3", [] {
                     ModelConfig c = tiny_moe("qwen3moe", 128);
                     c.n_expert_used = 3;
                     c.expert_norm_topk = false;
                     c.moe_dense_layers = {0};  // layer 0 a SwiGLU, layer 1 the experts
                     const std::string p = (temp_dir("q3d") / "m").string();
                     write_tiny_hf_dir(p, c, GgmlType::F32, 23);
                     return p;
                   }});
  cases.push_back({"hf-qwen3moe-f32-hd64-every-expert", [] {
                     ModelConfig c = tiny_moe("qwen3moe", 64);
                     c.n_expert = 4;
                     c.n_expert_used = 4;  // no discrete choice: the output is smooth in the router logits
                     const std::string p = (temp_dir("q3all") / "m").string();
                     write_tiny_hf_dir(p, c, GgmlType::F32, 24);
                     return p;
                   }});
  return cases;
}

// Greedy decoding of n_gen tokens after a prompt run in chunks of `chunk`, on
// the CPU (gpu null) or the GPU; with `forced`, its tokens are decoded
// instead of the argmax (teacher forcing). Returns the logits of each step,
// [n_gen, n_vocab], and the tokens in `tokens`.
std::vector<float> greedy(const Model& model, GpuModel* gpu, const std::string& policy,
                          const std::vector<int32_t>& prompt, int chunk, int n_gen, std::vector<int32_t>* tokens,
                          const std::vector<int32_t>* forced = nullptr) {
  const size_t n_vocab = size_t(model.config().n_vocab);
  static Device cpu(DeviceKind::cpu);
  const Device& dev = gpu ? gpu->device() : cpu;
  auto kv = make_kv_cache(plan_kv(parse_policy(policy), model.kv_geometry(), dev.kind()), dev);
  kv->reserve(int64_t(prompt.size()) + n_gen);
  ForwardScratch scratch;
  std::unique_ptr<GpuSequence> seq;
  if (gpu) seq = gpu->start(chunk);
  else scratch = model.make_scratch(chunk);
  auto forward = [&](const int32_t* t, int n, int64_t pos, int n_logits, float* logits) {
    if (seq) seq->forward(t, n, pos, *kv, n_logits, logits);
    else model.forward(t, n, pos, *kv, scratch, n_logits, logits);
  };
  std::vector<float> logits(n_vocab);  // [n_vocab]
  const int64_t n = int64_t(prompt.size());
  for (int64_t i = 0; i < n; i += chunk) {
    const int n_tok = int(std::min<int64_t>(chunk, n - i));
    forward(&prompt[size_t(i)], n_tok, i, i + n_tok == n ? 1 : 0, logits.data());
  }
  kv->start_decode();
  EXPECT_EQ(kv->plan().device, dev.kind()) << policy;
  std::vector<float> all;  // [n_gen, n_vocab]
  int64_t pos = n;
  for (int step = 0; step < n_gen; ++step) {
    all.insert(all.end(), logits.begin(), logits.end());
    const int32_t tok = forced ? (*forced)[size_t(step)]
                               : int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    tokens->push_back(tok);
    if (step + 1 < n_gen) forward(&tok, 1, pos++, 1, logits.data());
  }
  return all;
}

std::vector<int32_t> test_prompt(int n, int n_vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((i * 7919 + 13) % n_vocab);
  return p;
}

bool routes_every_expert(const ModelConfig& c) { return c.n_expert_used == c.n_expert; }

constexpr double kRelL2 = 2e-2, kSparseRelL2 = 2e-1;  // the dense models' bounds (model_cuda_test.cpp)
const std::vector<std::string> kPolicies{"full", "yakv", "yakv,cache=step", "yakv,kv=fp8", "shadowkv", "oracle",
                                         "landmarks"};

TEST(GpuModelMoe, MatchesCpuModelUnderEveryPolicy) {
  KVT_REQUIRE_GPU();
  constexpr int kGen = 24;
  for (const MoeCase& mc : moe_cases()) {
    Model model(open_model_source(mc.write()));
    ASSERT_TRUE(model.config().is_moe()) << mc.name;
    auto gpu = make_gpu_model(model);
    const auto prompt = test_prompt(160, model.config().n_vocab);
    const size_t V = size_t(model.config().n_vocab);
    const bool smooth = routes_every_expert(model.config());
    for (const std::string& policy : kPolicies) {
      std::vector<int32_t> t_cpu, t_gpu, t_free;
      const auto cpu = greedy(model, nullptr, policy, prompt, 48, kGen, &t_cpu);
      const int64_t cpu_ops = cpu_decode_op_calls();
      const auto got = greedy(model, gpu.get(), policy, prompt, 48, kGen, &t_gpu, &t_cpu);
      EXPECT_EQ(cpu_decode_op_calls(), cpu_ops) << mc.name << " " << policy
                                                << ": a decode op ran on the CPU while the GPU decoded";
      greedy(model, gpu.get(), policy, prompt, 48, kGen, &t_free);  // the GPU's own greedy tokens
      const double bound = policy == "full" ? kRelL2 : kSparseRelL2;
      std::vector<double> err(kGen);
      int first_split = kGen;
      for (int s = 0; s < kGen; ++s) {
        err[size_t(s)] = rel_l2(&got[size_t(s) * V], &cpu[size_t(s) * V], V);
        if (first_split == kGen && t_cpu[size_t(s)] != t_free[size_t(s)]) first_split = s;
      }
      const int n_within = int(std::count_if(err.begin(), err.end(), [&](double e) { return e < bound; }));
      std::vector<double> sorted = err;
      std::sort(sorted.begin(), sorted.end());
      std::printf("[gpu-vs-cpu moe] %-34s %-16s steps within %.0e: %2d/%d  median rel-L2 %.1e  worst %.1e  "
                  "greedy tokens equal until %d\n",
                  mc.name.c_str(), policy.c_str(), bound, n_within, kGen, sorted[kGen / 2], sorted.back(), first_split);
      EXPECT_LT(err[0], kRelL2) << mc.name << " " << policy << ": prefill logits (dense in every policy)";
      if (policy == "full" || smooth) {
        EXPECT_EQ(n_within, kGen) << mc.name << " " << policy;
      } else {  // isolated router flips (see the top of the file)
        EXPECT_GE(n_within, kGen * 3 / 4) << mc.name << " " << policy;
        EXPECT_LT(sorted[kGen / 2], bound / 2) << mc.name << " " << policy;
      }
    }
  }
}

// One decode step for a batch of MoE sequences under different policies (the
// experts' GEMV up to 8 tokens, the grouped GEMM beyond) gives each
// sequence's own steps: the model whose tokens use every expert, so that a
// rounding difference cannot change an expert choice.
TEST(GpuModelMoe, BatchedDecodeMatchesEachSequenceAlone) {
  KVT_REQUIRE_GPU();
  const MoeCase mc = moe_cases().back();
  Model model(open_model_source(mc.write()));
  ASSERT_TRUE(routes_every_expert(model.config()));
  auto gpu = make_gpu_model(model);
  const size_t V = size_t(model.config().n_vocab);
  constexpr int kGen = 10, kChunk = 48;
  for (const int n : {6, 11}) {  // GEMV experts, then the grouped GEMM
    std::vector<std::vector<int32_t>> prompts, tokens(static_cast<size_t>(n));
    std::vector<std::vector<float>> solo;
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<KvCache*> kvs;
    std::vector<float> logits(size_t(n) * V);
    for (int i = 0; i < n; ++i) {
      const std::string& policy = kPolicies[size_t(i) % kPolicies.size()];
      std::vector<int32_t> p = test_prompt(120 + 23 * i, int(V));
      for (auto& t : p) t = int32_t((t + 31 * i) % int(V));
      solo.push_back(greedy(model, gpu.get(), policy, p, kChunk, kGen, &tokens[size_t(i)]));
      caches.push_back(make_kv_cache(plan_kv(parse_policy(policy), model.kv_geometry(), DeviceKind::cuda),
                                     gpu->device()));
      KvCache& kv = *caches.back();
      kv.reserve(int64_t(p.size()) + kGen);
      auto seq = gpu->start(kChunk);
      for (size_t t = 0; t < p.size(); t += kChunk) {
        const int n_tok = int(std::min(size_t(kChunk), p.size() - t));
        seq->forward(&p[t], n_tok, int64_t(t), kv, t + size_t(n_tok) == p.size() ? 1 : 0, logits.data());
      }
      kv.start_decode();
      kvs.push_back(&kv);
      prompts.push_back(std::move(p));
    }
    std::vector<double> worst(size_t(n), 0.0);
    for (int step = 1; step < kGen; ++step) {
      std::vector<int32_t> tok(static_cast<size_t>(n));
      std::vector<int64_t> pos(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        tok[size_t(i)] = tokens[size_t(i)][size_t(step - 1)];
        pos[size_t(i)] = int64_t(prompts[size_t(i)].size()) + step - 1;
      }
      gpu->forward_decode(tok.data(), pos.data(), kvs.data(), n, logits.data(), nullptr, nullptr);
      for (int i = 0; i < n; ++i) {
        const double e = rel_l2(&logits[size_t(i) * V], &solo[size_t(i)][size_t(step) * V], V);
        worst[size_t(i)] = std::max(worst[size_t(i)], e);
      }
    }
    for (int i = 0; i < n; ++i) {
      const std::string& policy = kPolicies[size_t(i) % kPolicies.size()];
      std::printf("[gpu moe batch-vs-solo] batch %2d  %-16s max rel-L2 %.1e\n", n, policy.c_str(), worst[size_t(i)]);
      EXPECT_LT(worst[size_t(i)], kRelL2) << "batch " << n << " " << policy;
      EXPECT_EQ(kvs[size_t(i)]->n_tokens(0), int64_t(prompts[size_t(i)].size()) + kGen - 1) << policy;
    }
  }
}

// Decode steps replayed from a captured CUDA graph (the MoE block included:
// routing and expert planning stay on the device) give the eager steps' logits.
TEST(GpuModelMoe, GraphReplayMatchesEagerDecode) {
  KVT_REQUIRE_GPU();
  const MoeCase mc = moe_cases()[0];
  Model model(open_model_source(mc.write()));
  auto graphs = make_gpu_model(model, true);
  auto eager = make_gpu_model(model, false);
  const auto prompt = test_prompt(100, model.config().n_vocab);
  const size_t V = size_t(model.config().n_vocab);
  constexpr int kGen = 12;
  for (const std::string policy : {"full", "yakv"}) {
    std::vector<int32_t> t_graph, t_eager;
    const auto g = greedy(model, graphs.get(), policy, prompt, 32, kGen, &t_graph);
    const auto e = greedy(model, eager.get(), policy, prompt, 32, kGen, &t_eager);
    EXPECT_EQ(t_graph, t_eager) << policy;
    for (int s = 0; s < kGen; ++s)
      EXPECT_LT(rel_l2(&g[size_t(s) * V], &e[size_t(s) * V], V), 1e-3) << policy << " step " << s;
  }
}

}  // namespace
}  // namespace kvtier
