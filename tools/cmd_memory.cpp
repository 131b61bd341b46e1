// kvtier memory: exact GPU-tier and host bytes of KV policies for a model (its
// config only, no weights read) or a built-in shape, per token and for a context.
#include <fmt/format.h>

#include "command.h"
#include "kv/policy.h"
#include "loader/model_shapes.h"
#include "loader/model_source.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct MemoryArgs {
  std::string model;
  std::string shape;
  std::vector<std::string> kv = {"full", "shadowkv", "yakv", "oracle"};
  int64_t ctx = 131072;
};

std::string human(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, unit[u]);
}

void run_memory(const MemoryArgs& a) {
  KVT_CHECK(a.model.empty() != a.shape.empty(), "give --model or --shape (one of them)");
  KvGeometry g;
  std::string what;
  if (!a.shape.empty()) {
    const ModelConfig c = model_shape(a.shape);
    g = KvGeometry{c.n_layer, c.n_head, c.n_kv_head, c.head_dim};
    what = a.shape;
  } else {
    ModelSource src = open_model_source(a.model);
    const ModelConfig& c = src.config;
    g = KvGeometry{c.n_layer, c.n_head, c.n_kv_head, c.head_dim};
    what = a.model;
  }
  KVT_CHECK(a.ctx >= 0, "--ctx {} must be ≥ 0", a.ctx);
  fmt::print("{}: {} layers, {} query heads, {} KV heads, head dim {}; context {} tokens\n", what,
             g.n_layer, g.n_head, g.n_kv_head, g.head_dim, a.ctx);
  fmt::print("{:<44} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "policy", "GPU B/tok", "host B/tok",
             "GPU fixed", "GPU total", "host total");
  for (const std::string& pol : a.kv) {
    PolicyConfig p = parse_policy(pol);
    KvFootprint f = kv_footprint(p, g, a.ctx);
    fmt::print("{:<44} {:>12.1f} {:>12.1f} {:>12} {:>12} {:>12}\n", pol, f.gpu_bytes_per_token,
               f.host_bytes_per_token, human(double(f.gpu_fixed_bytes)), human(double(f.gpu_bytes)),
               human(double(f.host_bytes)));
    fmt::print("  = {}\n", to_string(p));
  }
}

Registration reg(60, [](CLI::App& app) {
  auto a = std::make_shared<MemoryArgs>();
  auto* cmd = app.add_subcommand("memory", "GPU-tier and host KV bytes of policies, per token and "
                                           "for a context");
  cmd->add_option("-m,--model", a->model, "model (.gguf or Hugging Face directory; config only)");
  cmd->add_option("--shape", a->shape,
                  "built-in shape: llama3.1-8b, llama3.1-70b, llama3.2-3b, qwen3-4b, smollm2-135m");
  add_kv_list_option(*cmd, a->kv);
  cmd->add_option("-c,--ctx", a->ctx, "context length in tokens")->capture_default_str();
  cmd->callback([a] { run_memory(*a); });
});

}  // namespace
}  // namespace kvtier::tools
