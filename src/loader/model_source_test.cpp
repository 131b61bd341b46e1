#include "loader/model_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/test_model_writer.h"
#include "ops/dequant/dequant.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test under the build's temp area.
fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("kvt_loader_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

ModelConfig tiny_config(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.name = "tiny";
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 32;  // not n_embd / n_head: any head dimension
  c.n_ff = 96;
  c.n_vocab = 50;
  c.n_ctx_train = 512;
  c.rms_eps = 1e-6f;
  c.rope_theta = 50000.0f;
  c.tied_embeddings = arch != "qwen2";
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  return c;
}

std::string error_of(const std::string& path) {
  try {
    open_model_source(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<float> rows_f32(const TensorRef& t) {
  std::vector<float> out(size_t(t.n_elements()));
  int64_t row = t.shape.back();
  size_t row_bytes = ggml_row_bytes(t.type, row);
  for (int64_t r = 0; r < t.n_elements() / row; ++r)
    dequantize_row(t.type, t.data + size_t(r) * row_bytes, out.data() + r * row, row);
  return out;
}

TEST(ModelSource, DefaultModelLoads) {
  std::string path = std::string(KVT_SOURCE_DIR) + "/models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing (scripts/fetch_default_model.sh)";
  ModelSource m = open_model_source(path);
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_kv_head, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_ff, 1536);
  EXPECT_EQ(c.n_vocab, 49152);
  EXPECT_EQ(c.n_ctx_train, 8192);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_NEAR(c.rms_eps, 1e-5f, 1e-9f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(m.tensors.size(), 272u);
  EXPECT_EQ(m.tensor("token_embd.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(m.tensor("blk.0.ffn_down.weight").shape, (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(m.tensor("blk.0.attn_k.weight").type, GgmlType::Q4_1);
  EXPECT_EQ(m.eos_token_ids, std::vector<int>{2});
  ASSERT_NE(m.gguf, nullptr);
  EXPECT_EQ(m.gguf->get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  // the weights decode to finite, non-trivial values
  auto norm = rows_f32(m.tensor("output_norm.weight"));
  double sum = 0;
  for (float v : norm) sum += std::fabs(v);
  EXPECT_GT(sum, 1.0);
  EXPECT_THROW(m.tensor("nope"), Error);
}

TEST(ModelSource, TinyGgufPerArchitecture) {
  auto dir = temp_dir("gguf_arch");
  for (std::string arch : {"llama", "qwen2", "qwen3"}) {
    ModelConfig c = tiny_config(arch);
    std::string path = (dir / (arch + ".gguf")).string();
    write_tiny_gguf(path, c, GgmlType::Q8_0, 1);
    ModelSource m = open_model_source(path);
    EXPECT_EQ(m.config.arch, arch);
    EXPECT_EQ(m.config.n_layer, 2);
    EXPECT_EQ(m.config.head_dim, 32);
    EXPECT_EQ(m.config.n_kv_head, 2);
    EXPECT_EQ(m.config.n_vocab, 50);
    EXPECT_FLOAT_EQ(m.config.rope_theta, 50000.0f);
    EXPECT_EQ(m.config.rope_interleaved, arch == "llama");
    EXPECT_EQ(m.config.tied_embeddings, arch != "qwen2");
    EXPECT_EQ(m.config.qkv_bias, arch == "qwen2");
    EXPECT_EQ(m.config.qk_norm, arch == "qwen3");
    EXPECT_EQ(m.tensor("blk.1.attn_q.weight").shape, (std::vector<int64_t>{128, 64}));
    EXPECT_EQ(m.tensor("blk.1.attn_output.weight").shape, (std::vector<int64_t>{64, 128}));
    EXPECT_NE(m.tensor("blk.1.attn_q.weight").source.find("blk.1.attn_q.weight"), std::string::npos);
  }
}

TEST(ModelSource, GgufLlama3KeepsRopeFreqs) {
  auto dir = temp_dir("gguf_llama3");
  ModelConfig c = tiny_config("llama");
  c.rope_scaling = RopeScaling::llama3;
  c.rope_factor = 8.0f;
  c.rope_original_ctx = 64;
  std::string path = (dir / "l3.gguf").string();
  write_tiny_gguf(path, c, GgmlType::F16, 2);
  ModelSource m = open_model_source(path);
  const TensorRef& f = m.tensor("rope_freqs.weight");
  EXPECT_EQ(f.shape, std::vector<int64_t>{16});
  auto v = rows_f32(f);
  EXPECT_FLOAT_EQ(v.front(), 1.0f);  // highest frequency: unscaled
  EXPECT_FLOAT_EQ(v.back(), 8.0f);   // lowest frequency: divided by the factor
}

TEST(ModelSource, HfDirectoryMatchesGgufWeights) {
  auto dir = temp_dir("hf_vs_gguf");
  ModelConfig c = tiny_config("llama");
  c.tied_embeddings = false;
  c.rope_scaling = RopeScaling::llama3;
  c.rope_factor = 8.0f;
  HfDirOptions o;
  o.n_shards = 3;
  o.generation_config = {{"eos_token_id", {7, 9}}};
  o.tokenizer_json = "{}";
  write_tiny_hf_dir((dir / "hf").string(), c, GgmlType::F32, 5, o);
  write_tiny_gguf((dir / "m.gguf").string(), c, GgmlType::F32, 5);
  ModelSource hf = open_model_source((dir / "hf").string());
  ModelSource gg = open_model_source((dir / "m.gguf").string());
  EXPECT_EQ(hf.files.size(), 3u);
  EXPECT_FALSE(hf.config.rope_interleaved);
  EXPECT_EQ(hf.config.rope_scaling, RopeScaling::llama3);
  EXPECT_FLOAT_EQ(hf.config.rope_factor, 8.0f);
  EXPECT_FALSE(hf.config.tied_embeddings);
  EXPECT_EQ(hf.eos_token_ids, (std::vector<int>{7, 9}));
  EXPECT_EQ(hf.tokenizer_json, (dir / "hf" / "tokenizer.json").string());
  EXPECT_EQ(hf.tokenizer_config_json, "");
  EXPECT_EQ(hf.gguf, nullptr);
  // every GGUF tensor except the llama3 factors has the same values in the HF
  // directory, q/k after undoing the GGUF row permutation
  for (const auto& [name, t] : gg.tensors) {
    if (name == "rope_freqs.weight") continue;
    const TensorRef* h = hf.find(name);
    ASSERT_NE(h, nullptr) << name;
    ASSERT_EQ(h->shape, t.shape) << name;
    auto hv = rows_f32(*h);
    if (name.find("attn_q.") != std::string::npos || name.find("attn_k.") != std::string::npos) {
      int n_heads = name.find("attn_q.") != std::string::npos ? c.n_head : c.n_kv_head;
      hv = permute_for_gguf_llama(hv, n_heads, c.head_dim, t.shape.size() == 2 ? t.shape[1] : 1);
    }
    EXPECT_EQ(hv, rows_f32(t)) << name;
  }
}

TEST(ModelSource, HfConfigVariants) {
  auto dir = temp_dir("hf_variants");
  // qwen2 always has q/k/v bias; eos from config.json when there is no generation_config
  ModelConfig c = tiny_config("qwen2");
  nlohmann::json j = hf_config_for(c);
  j.erase("attention_bias");
  j.erase("head_dim");
  j["head_dim"] = nullptr;
  j["eos_token_id"] = 3;
  std::vector<WriterTensor> t;
  for (auto& w : make_tiny_weights(c, GgmlType::BF16, 3)) {
    w.name = canonical_to_hf_name(w.name);
    t.push_back(w);
  }
  // head_dim null → hidden / heads = 16, but the tensors are made for 32
  write_hf_dir((dir / "q2").string(), j, t);
  std::string err = error_of((dir / "q2").string());
  EXPECT_NE(err.find("blk.0.attn_q.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("expected [64, 64]"), std::string::npos) << err;
  j["head_dim"] = 32;
  write_hf_dir((dir / "q2").string(), j, t);
  ModelSource m = open_model_source((dir / "q2").string());
  EXPECT_TRUE(m.config.qkv_bias);
  EXPECT_EQ(m.eos_token_ids, std::vector<int>{3});
  EXPECT_EQ(m.tensor("blk.0.attn_q.bias").type, GgmlType::F32);
  EXPECT_EQ(m.tensor("blk.0.ffn_up.weight").type, GgmlType::BF16);

  // config errors name the file and key
  j["model_type"] = "gpt2";
  write_hf_dir((dir / "bad").string(), j, t);
  err = error_of((dir / "bad").string());
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("gpt2"), std::string::npos) << err;
  j["model_type"] = "llama";
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  write_hf_dir((dir / "bad").string(), j, t);
  EXPECT_NE(error_of((dir / "bad").string()).find("yarn"), std::string::npos);
  j["rope_scaling"] = nullptr;
  j["num_hidden_layers"] = "two";
  write_hf_dir((dir / "bad").string(), j, t);
  EXPECT_NE(error_of((dir / "bad").string()).find("num_hidden_layers"), std::string::npos);
  EXPECT_NE(error_of((dir / "nothing").string()).find("no such file"), std::string::npos);
  fs::create_directories(dir / "empty");
  EXPECT_NE(error_of((dir / "empty").string()).find("config.json"), std::string::npos);
}

TEST(ModelSource, HfShardErrors) {
  auto dir = temp_dir("hf_shards");
  ModelConfig c = tiny_config("llama");
  c.tied_embeddings = false;
  HfDirOptions o;
  o.n_shards = 2;
  write_tiny_hf_dir((dir / "m").string(), c, GgmlType::F16, 1, o);
  EXPECT_NO_THROW(open_model_source((dir / "m").string()));
  // the index points a tensor at a shard that does not hold it
  auto index_path = dir / "m" / "model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
  index["weight_map"]["model.embed_tokens.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(index_path) << index.dump();
  std::string err = error_of((dir / "m").string());
  EXPECT_NE(err.find("weight_map"), std::string::npos) << err;
  // a shard that is missing entirely
  index["weight_map"]["lm_head.weight"] = "model-00009-of-00009.safetensors";
  std::ofstream(index_path) << index.dump();
  err = error_of((dir / "m").string());
  EXPECT_NE(err.find("model-00009-of-00009.safetensors"), std::string::npos) << err;
  // untied config without lm_head
  ModelConfig u = tiny_config("llama");
  u.tied_embeddings = false;
  std::vector<WriterTensor> t;
  for (auto& w : make_tiny_weights(u, GgmlType::F32, 1))
    if (w.name != "output.weight") t.push_back({canonical_to_hf_name(w.name), w.type, w.shape, w.data});
  write_hf_dir((dir / "nohead").string(), hf_config_for(u), t);
  err = error_of((dir / "nohead").string());
  EXPECT_NE(err.find("missing tensor 'output.weight'"), std::string::npos) << err;
  // a canonical tensor with a dtype we cannot compute with: patch F32 → I32
  // (same element size) in the header of model.norm.weight
  write_tiny_hf_dir((dir / "i32").string(), u, GgmlType::F32, 1);
  auto st_path = dir / "i32" / "model.safetensors";
  std::string bytes((std::istreambuf_iterator<char>(std::ifstream(st_path, std::ios::binary).rdbuf())), {});
  size_t at = bytes.find("\"model.norm.weight\"");
  ASSERT_NE(at, std::string::npos);
  size_t dt = bytes.find("\"F32\"", at);
  bytes.replace(dt, 5, "\"I32\"");
  std::ofstream(st_path, std::ios::binary) << bytes;
  err = error_of((dir / "i32").string());
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("dtype I32, expected F32, F16 or BF16"), std::string::npos) << err;
}

TEST(ModelSource, GgufMissingAndMisshapedTensors) {
  auto dir = temp_dir("gguf_errors");
  ModelConfig c = tiny_config("llama");
  auto tensors = make_tiny_weights(c, GgmlType::F32, 1);
  auto meta = gguf_metadata_for(c);
  // missing
  std::vector<WriterTensor> missing;
  for (auto& t : tensors)
    if (t.name != "blk.1.ffn_up.weight") missing.push_back(t);
  write_gguf((dir / "missing.gguf").string(), meta, missing);
  std::string err = error_of((dir / "missing.gguf").string());
  EXPECT_NE(err.find("missing.gguf"), std::string::npos) << err;
  EXPECT_NE(err.find("missing tensor 'blk.1.ffn_up.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("[96, 64]"), std::string::npos) << err;
  // wrong shape
  auto bad = tensors;
  for (auto& t : bad)
    if (t.name == "blk.0.attn_k.weight") t = make_tensor(t.name, GgmlType::F32, {32, 64}, std::vector<float>(32 * 64));
  write_gguf((dir / "shape.gguf").string(), meta, bad);
  err = error_of((dir / "shape.gguf").string());
  EXPECT_NE(err.find("blk.0.attn_k.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("has shape [32, 64], expected [64, 64]"), std::string::npos) << err;
  // quantized norm
  bad = tensors;
  for (auto& t : bad)
    if (t.name == "output_norm.weight") t = make_tensor(t.name, GgmlType::Q8_0, {64}, std::vector<float>(64));
  write_gguf((dir / "qnorm.gguf").string(), meta, bad);
  EXPECT_NE(error_of((dir / "qnorm.gguf").string()).find("expected F32, F16 or BF16"), std::string::npos);
  // unsupported architecture and missing hyper-parameters
  auto meta2 = meta;
  meta2[0].second = GgufMetaValue::str("gpt2");
  write_gguf((dir / "arch.gguf").string(), meta2, tensors);
  err = error_of((dir / "arch.gguf").string());
  EXPECT_NE(err.find("architecture 'gpt2' is not supported"), std::string::npos) << err;
  GgufMetadata meta3;
  for (auto& kv : meta)
    if (kv.first != "llama.embedding_length") meta3.push_back(kv);
  write_gguf((dir / "key.gguf").string(), meta3, tensors);
  EXPECT_NE(error_of((dir / "key.gguf").string()).find("llama.embedding_length"), std::string::npos);
  // heads that do not divide
  ModelConfig h = c;
  h.n_kv_head = 3;
  write_gguf((dir / "heads.gguf").string(), gguf_metadata_for(h), tensors);
  EXPECT_NE(error_of((dir / "heads.gguf").string()).find("not a multiple of 3 KV heads"), std::string::npos);
}

TEST(ModelSource, HfNameMapping) {
  EXPECT_EQ(hf_to_canonical_name("model.layers.12.self_attn.o_proj.weight"), "blk.12.attn_output.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(hf_to_canonical_name("model.layers.3.self_attn.q_norm.weight"), "blk.3.attn_q_norm.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.3.post_attention_layernorm.weight"), "blk.3.ffn_norm.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(hf_to_canonical_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(hf_to_canonical_name("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.x.mlp.down_proj.weight"), "");
  EXPECT_EQ(hf_to_canonical_name("model.layers.1.rotary_emb.inv_freq"), "");
  EXPECT_EQ(canonical_to_hf_name("blk.7.attn_v.weight"), "model.layers.7.self_attn.v_proj.weight");
  EXPECT_EQ(canonical_to_hf_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(canonical_to_hf_name("rope_freqs.weight"), "");
}

}  // namespace
}  // namespace kvtier
