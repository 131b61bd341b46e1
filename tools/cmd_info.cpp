// kvtier info -m MODEL: the model's configuration, its tensor table (name, type,
// shape, bytes) and total size, as the loader sees it (canonical names,
// outermost-first shapes). Loading validates every tensor the architecture
// needs, so this is also the quickest check that a model file is usable.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <memory>

#include "command.h"
#include "core/cpu_features.h"
#include "loader/model_source.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct InfoArgs {
  std::string model = default_model_path();
  bool no_tensors = false;
  std::string cpu_isa = "auto";
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::llama3: return "llama3";
    case RopeScaling::linear: return "linear";
    default: return "none";
  }
}

// Orders blk.N.* numerically by layer, everything else by name.
bool tensor_order(const std::string& a, const std::string& b) {
  auto layer = [](const std::string& s) {
    if (s.rfind("blk.", 0) != 0) return -1;
    int n = 0;
    std::from_chars(s.data() + 4, s.data() + s.size(), n);
    return n;
  };
  int la = layer(a), lb = layer(b);
  return la != lb ? la < lb : a < b;
}

void run_info(const InfoArgs& a) {
  set_cpu_path_limit(parse_cpu_path(a.cpu_isa));
  ModelSource m = open_model_source(a.model);
  const ModelConfig& c = m.config;
  fmt::print("model            {}\n", m.path);
  fmt::print("name             {}\n", c.name);
  fmt::print("format           {}\n",
             m.gguf ? fmt::format("GGUF v{}", m.gguf->version()) : std::string("Hugging Face safetensors"));
  fmt::print("architecture     {}\n", c.arch);
  fmt::print("layers           {}\n", c.n_layer);
  fmt::print("embedding        {}\n", c.n_embd);
  fmt::print("heads            {} (KV heads {}, head dim {})\n", c.n_head, c.n_kv_head, c.head_dim);
  fmt::print("feed-forward     {}\n", c.n_ff);
  fmt::print("vocabulary       {}\n", c.n_vocab);
  fmt::print("train context    {}\n", c.n_ctx_train);
  fmt::print("rms epsilon      {:g}\n", c.rms_eps);
  fmt::print("rope             theta {:g}, {}, scaling {}", c.rope_theta,
             c.rope_interleaved ? "interleaved pairs" : "neox halves", rope_scaling_name(c.rope_scaling));
  if (c.rope_scaling == RopeScaling::llama3)
    fmt::print(" (factor {:g}, low {:g}, high {:g}, original context {})", c.rope_factor,
               c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_ctx);
  if (c.rope_scaling == RopeScaling::linear) fmt::print(" (factor {:g})", c.rope_factor);
  if (m.find("rope_freqs.weight")) fmt::print(", rope_freqs.weight present");
  fmt::print("\n");
  fmt::print("tied embeddings  {}\n", c.tied_embeddings ? "yes" : "no");
  fmt::print("qkv bias         {}\n", c.qkv_bias ? "yes" : "no");
  fmt::print("q/k norm         {}\n", c.qk_norm ? "yes" : "no");
  if (c.is_moe()) {
    int n_moe = 0;
    for (int l = 0; l < c.n_layer; ++l) n_moe += c.is_moe_layer(l);
    fmt::print("experts          {} of width {}, {} per token ({}renormalized{}), in {} of {} layers\n", c.n_expert,
               c.n_ff_expert, c.n_expert_used, c.expert_norm_topk ? "" : "not ",
               c.expert_weights_scale != 1.0f ? fmt::format(", scale {:g}", c.expert_weights_scale) : "", n_moe,
               c.n_layer);
  }
  fmt::print("eos token ids    [{}]\n", fmt::join(m.eos_token_ids, ", "));
  if (!m.gguf) {
    fmt::print("tokenizer.json   {}\n", m.tokenizer_json.empty() ? "(absent)" : m.tokenizer_json);
    fmt::print("tokenizer_config {}\n",
               m.tokenizer_config_json.empty() ? "(absent)" : m.tokenizer_config_json);
    fmt::print("generation_config {}\n",
               m.generation_config_json.empty() ? "(absent)" : m.generation_config_json);
  }

  // The CPU kernels this machine gets (chosen once, at run time).
  fmt::print("{}", cpu_features_report());

  std::vector<std::string> names;
  size_t total = 0, name_width = 4;
  for (const auto& [name, t] : m.tensors) {
    names.push_back(name);
    total += t.n_bytes;
    name_width = std::max(name_width, name.size());
  }
  std::sort(names.begin(), names.end(), tensor_order);
  if (!a.no_tensors) {
    fmt::print("\n{:<{}}  {:<5}  {:<16}  {:>12}\n", "name", name_width, "type", "shape", "bytes");
    for (const auto& name : names) {
      const TensorRef& t = m.tensors.at(name);
      fmt::print("{:<{}}  {:<5}  {:<16}  {:>12}\n", name, name_width, ggml_type_name(t.type),
                 fmt::format("[{}]", fmt::join(t.shape, ", ")), t.n_bytes);
    }
  }
  fmt::print("\n{} tensors, {} ({} bytes)\n", names.size(), human_bytes(double(total)), total);
}

Registration reg(50, [](CLI::App& app) {
  auto a = std::make_shared<InfoArgs>();
  auto* cmd = app.add_subcommand("info", "print a model's configuration and tensor table");
  cmd->add_option("-m,--model", a->model, "model: .gguf file or Hugging Face directory")
      ->capture_default_str();
  cmd->add_flag("--no-tensors", a->no_tensors, "configuration and totals only");
  cmd->add_option("--cpu-isa", a->cpu_isa, "cap the CPU kernel path: auto, avx2 or avx512")
      ->check(CLI::IsMember({"auto", "avx2", "avx512"}))
      ->capture_default_str();
  cmd->callback([a] { run_info(*a); });
});

}  // namespace
}  // namespace kvtier::tools
