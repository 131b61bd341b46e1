// kvtier memory: exact GPU-tier and host bytes of KV policies for a model (its
// config only, no weights read) or a built-in shape, per token and for a context.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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
  double gpu_mem_gib = 139.0;  // the H200's usable memory
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
  ModelConfig c;
  std::string what;
  if (!a.shape.empty()) {
    c = model_shape(a.shape);
    what = a.shape;
  } else {
    c = open_model_source(a.model).config;
    what = a.model;
  }
  const KvGeometry g{c.n_layer, c.n_head, c.n_kv_head, c.head_dim};
  KVT_CHECK(a.ctx >= 0, "--ctx {} must be ≥ 0", a.ctx);
  KVT_CHECK(a.gpu_mem_gib > 0, "--gpu-mem {} must be positive (GiB)", a.gpu_mem_gib);
  fmt::print("{}: {} layers, {} query heads, {} KV heads, head dim {}; context {} tokens\n", what,
             g.n_layer, g.n_head, g.n_kv_head, g.head_dim, a.ctx);
  // The GPU keeps every weight in bf16 (kvtier --device cuda).
  const double weights = 2.0 * double(c.n_weights()), gpu = a.gpu_mem_gib * double(1 << 30);
  if (c.is_moe())
    fmt::print("mixture of experts: {} experts of width {}, {} used per token\n", c.n_expert, c.n_ff_expert,
               c.n_expert_used);
  fmt::print("weights: {:.2f} B parameters, {} in bf16 ({:.1f} GB); GPU {} (--gpu-mem) leaves {} for KV\n",
             double(c.n_weights()) / 1e9, human(weights), weights / 1e9, human(gpu), human(std::max(0.0, gpu - weights)));
  fmt::print("{:<44} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10}\n", "policy", "GPU B/tok", "host B/tok",
             "GPU fixed", "GPU total", "host total", "seqs/GPU");
  for (const std::string& pol : a.kv) {
    PolicyConfig p = parse_policy(pol);
    KvFootprint f = kv_footprint(p, g, a.ctx);
    // Sequences of this context whose GPU tier fits next to the weights.
    const double fit = f.gpu_bytes > 0 ? std::floor(std::max(0.0, gpu - weights) / double(f.gpu_bytes)) : 0;
    fmt::print("{:<44} {:>12.1f} {:>12.1f} {:>12} {:>12} {:>12} {:>10.0f}\n", pol, f.gpu_bytes_per_token,
               f.host_bytes_per_token, human(double(f.gpu_fixed_bytes)), human(double(f.gpu_bytes)),
               human(double(f.host_bytes)), fit);
    fmt::print("  = {}\n", to_string(p));
  }
}

Registration reg(60, [](CLI::App& app) {
  auto a = std::make_shared<MemoryArgs>();
  auto* cmd = app.add_subcommand("memory", "GPU-tier and host KV bytes of policies, per token and "
                                           "for a context");
  cmd->add_option("-m,--model", a->model, "model (.gguf or Hugging Face directory; config only)");
  cmd->add_option("--shape", a->shape, fmt::format("built-in shape: {}", fmt::join(model_shape_names(), ", ")));
  add_kv_list_option(*cmd, a->kv);
  cmd->add_option("-c,--ctx", a->ctx, "context length in tokens")->capture_default_str();
  cmd->add_option("--gpu-mem", a->gpu_mem_gib, "GPU memory in GiB, for the sequences that fit next to the weights")
      ->capture_default_str();
  cmd->callback([a] { run_memory(*a); });
});

}  // namespace
}  // namespace kvtier::tools
