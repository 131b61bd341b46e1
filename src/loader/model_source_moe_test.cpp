// Loading mixture-of-experts models: Qwen3-MoE and Mixtral from Hugging Face
// directories (one tensor per expert) and GGUF files (experts stacked), the
// dense/sparse layer mix of Qwen3-MoE, and clear refusals of what is not
// supported.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <unistd.h>

#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/model_source.h"
#include "loader/test_model_writer.h"

namespace kvtier {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("kvt_loader_moe_test_" + std::to_string(::getpid())) / name;
  fs::create_directories(p);
  return p;
}

ModelConfig tiny_moe(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.name = "tiny";
  c.n_layer = 3;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 32;
  c.n_vocab = 50;
  c.n_ctx_train = 512;
  c.rms_eps = 1e-6f;
  c.rope_theta = 50000.0f;
  c.qk_norm = arch == "qwen3moe";
  c.n_expert = 6;
  c.n_expert_used = 2;
  c.n_ff_expert = 32;
  c.n_ff = arch == "qwen3moe" ? 96 : 32;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelSourceMoe, HfNamesOfExpertsAndRouters) {
  EXPECT_EQ(hf_to_canonical_name("model.layers.3.mlp.experts.5.up_proj.weight"), "blk.3.ffn_up.5.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.3.mlp.experts.12.down_proj.weight"), "blk.3.ffn_down.12.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.0.mlp.gate.weight"), "blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.0.mlp.gate_proj.weight"), "blk.0.ffn_gate.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.block_sparse_moe.experts.0.w1.weight"), "blk.1.ffn_gate.0.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.block_sparse_moe.experts.7.w2.weight"), "blk.1.ffn_down.7.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.block_sparse_moe.experts.7.w3.weight"), "blk.1.ffn_up.7.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.block_sparse_moe.gate.weight"), "blk.1.ffn_gate_inp.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.mlp.experts.x.up_proj.weight"), "");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.mlp.experts.2.w4.weight"), "");
  EXPECT_EQ(canonical_to_hf_name("blk.3.ffn_up.5.weight"), "model.layers.3.mlp.experts.5.up_proj.weight");
  EXPECT_EQ(canonical_to_hf_name("blk.3.ffn_gate_inp.weight"), "model.layers.3.mlp.gate.weight");
  EXPECT_EQ(canonical_to_hf_name("blk.3.ffn_down.2.weight", "mixtral"),
            "model.layers.3.block_sparse_moe.experts.2.w2.weight");
  EXPECT_EQ(canonical_to_hf_name("blk.3.ffn_gate_inp.weight", "mixtral"), "model.layers.3.block_sparse_moe.gate.weight");
  EXPECT_EQ(canonical_to_hf_name("blk.3.ffn_gate.weight", "mixtral"), "model.layers.3.mlp.gate_proj.weight");
}

TEST(ModelSourceMoe, Qwen3MoeGgufStacksExperts) {
  const ModelConfig c = tiny_moe("qwen3moe");
  const std::string path = (temp_dir("gguf") / "q3.gguf").string();
  write_tiny_gguf(path, c, GgmlType::Q8_0, 3);
  const ModelSource m = open_model_source(path);
  EXPECT_EQ(m.config.arch, "qwen3moe");
  EXPECT_TRUE(m.config.qk_norm);
  EXPECT_FALSE(m.config.rope_interleaved);
  EXPECT_EQ(m.config.n_expert, 6);
  EXPECT_EQ(m.config.n_expert_used, 2);
  EXPECT_EQ(m.config.n_ff_expert, 32);
  EXPECT_EQ(m.config.n_ff, 96);
  EXPECT_TRUE(m.config.expert_norm_topk);
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(m.config.is_moe_layer(l));
  EXPECT_EQ(m.tensor("blk.2.ffn_gate_exps.weight").shape, (std::vector<int64_t>{6, 32, 64}));
  EXPECT_EQ(m.tensor("blk.2.ffn_down_exps.weight").shape, (std::vector<int64_t>{6, 64, 32}));
  EXPECT_EQ(m.tensor("blk.2.ffn_up_exps.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(m.tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);
  EXPECT_EQ(m.find("blk.0.ffn_gate.weight"), nullptr);
}

TEST(ModelSourceMoe, GgufWithOneTensorPerExpertLoads) {
  // Early Mixtral GGUFs kept each expert apart: blk.N.ffn_gate.E.weight.
  const ModelConfig c = tiny_moe("qwen3moe");
  const std::string path = (temp_dir("gguf") / "split.gguf").string();
  write_gguf(path, gguf_metadata_for(c), make_tiny_weights(c, GgmlType::Q8_0, 9));
  const ModelSource m = open_model_source(path);
  EXPECT_EQ(m.config.n_expert, 6);
  EXPECT_EQ(m.find("blk.0.ffn_gate_exps.weight"), nullptr);
  EXPECT_EQ(m.tensor("blk.2.ffn_down.5.weight").shape, (std::vector<int64_t>{64, 32}));
}

TEST(ModelSourceMoe, MixtralGgufIsALlamaWithExperts) {
  ModelConfig c = tiny_moe("llama");
  const std::string path = (temp_dir("gguf") / "mx.gguf").string();
  write_tiny_gguf(path, c, GgmlType::Q4_0, 4);
  const ModelSource m = open_model_source(path);
  EXPECT_EQ(m.config.arch, "llama");
  EXPECT_TRUE(m.config.rope_interleaved);
  EXPECT_EQ(m.config.n_expert, 6);
  EXPECT_EQ(m.config.n_ff_expert, 32);
}

TEST(ModelSourceMoe, HfQwen3MoeWithDenseLayersAndMixtral) {
  ModelConfig c = tiny_moe("qwen3moe");
  c.moe_dense_layers = {1};
  c.expert_norm_topk = false;
  const std::string dir = (temp_dir("hf") / "q3").string();
  write_tiny_hf_dir(dir, c, GgmlType::BF16, 5);
  const ModelSource m = open_model_source(dir);
  EXPECT_EQ(m.config.arch, "qwen3moe");
  EXPECT_FALSE(m.config.expert_norm_topk);
  EXPECT_TRUE(m.config.is_moe_layer(0));
  EXPECT_FALSE(m.config.is_moe_layer(1));
  EXPECT_TRUE(m.config.is_moe_layer(2));
  EXPECT_EQ(m.tensor("blk.1.ffn_gate.weight").shape, (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(m.tensor("blk.2.ffn_down.5.weight").shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(m.tensor("blk.0.ffn_gate_inp.weight").shape, (std::vector<int64_t>{6, 64}));

  const std::string mdir = (temp_dir("hf") / "mx").string();
  write_tiny_hf_dir(mdir, tiny_moe("llama"), GgmlType::F32, 6, HfDirOptions{3});
  const ModelSource mx = open_model_source(mdir);
  EXPECT_EQ(mx.config.arch, "llama");
  EXPECT_EQ(mx.config.n_expert, 6);
  EXPECT_TRUE(mx.config.expert_norm_topk);
  EXPECT_EQ(mx.tensor("blk.1.ffn_up.3.weight").shape, (std::vector<int64_t>{32, 64}));
}

TEST(ModelSourceMoe, DecoderSparseStep) {
  nlohmann::json j = hf_config_for(tiny_moe("qwen3moe"));
  j["decoder_sparse_step"] = 2;
  j["num_hidden_layers"] = 5;
  const ModelConfig c = parse_hf_config(j, "config.json");
  std::vector<bool> moe;
  for (int l = 0; l < 5; ++l) moe.push_back(c.is_moe_layer(l));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, true, false}));  // HF: (l + 1) % step == 0
}

TEST(ModelSourceMoe, UnsupportedConfigurationsAreRefusedClearly) {
  auto hf = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = hf_config_for(tiny_moe("qwen3moe"));
    edit(j);
    return error_of([&] { parse_hf_config(j, "config.json"); });
  };
  EXPECT_NE(hf([](auto& j) { j["use_sliding_window"] = true; }).find("use_sliding_window"), std::string::npos);
  EXPECT_NE(hf([](auto& j) { j["num_experts_per_tok"] = 7; }).find("num_experts_per_tok"), std::string::npos);
  EXPECT_NE(hf([](auto& j) { j["mlp_only_layers"] = {9}; }).find("mlp_only_layers"), std::string::npos);
  EXPECT_NE(hf([](auto& j) { j.erase("moe_intermediate_size"); }).find("moe_intermediate_size"), std::string::npos);
  EXPECT_NE(hf([](auto& j) { j["model_type"] = "qwen2_moe"; }).find("not supported"), std::string::npos);
  nlohmann::json mx = hf_config_for(tiny_moe("llama"));
  mx["sliding_window"] = 4096;
  EXPECT_NE(error_of([&] { parse_hf_config(mx, "config.json"); }).find("sliding_window"), std::string::npos);

  // GGUF: shared experts, and a missing expert tensor.
  const ModelConfig c = tiny_moe("qwen3moe");
  const std::string shared = (temp_dir("bad") / "shared.gguf").string();
  write_tiny_gguf(shared, c, GgmlType::F32, 7, {{"qwen3moe.expert_shared_count", GgufMetaValue::u32(1)}});
  EXPECT_NE(error_of([&] { open_model_source(shared); }).find("shared experts"), std::string::npos);
  const std::string dir = (temp_dir("bad") / "hf").string();
  write_tiny_hf_dir(dir, c, GgmlType::F32, 8);
  std::vector<WriterTensor> kept;
  for (auto& t : make_tiny_weights(c, GgmlType::F32, 8))
    if (t.name != "blk.1.ffn_up.4.weight") kept.push_back({canonical_to_hf_name(t.name), t.type, t.shape, t.data});
  write_safetensors(dir + "/model.safetensors", kept);
  const std::string err = error_of([&] { open_model_source(dir); });
  EXPECT_NE(err.find("blk.1.ffn_up.4.weight"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvtier
