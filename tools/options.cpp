#include "options.h"

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "core/cpu_features.h"
#include "core/status.h"

namespace kvtier::tools {

std::string default_model_path() {
  // The demo and the tests use SmolLM2-135M-Instruct, fetched by
  // scripts/fetch_default_model.sh into models/cache/.
  const char* env = std::getenv("KVTIER_MODEL");  // tools only; the library never reads env
  if (env && *env) return env;
  for (const char* p : {"models/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
                        KVT_DEFAULT_MODEL_FALLBACK}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
}

void add_engine_options(CLI::App& app, EngineOptions& o) {
  o.model_path = default_model_path();
  app.add_option("-m,--model", o.model_path, "model: .gguf file or Hugging Face directory")
      ->capture_default_str();
  // More threads than the machine has only oversubscribes it (-t 100000 once
  // drove a 2-core machine's load to 200).
  const int n_hw = int(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("-t,--threads", o.n_threads, fmt::format("CPU threads, 0..{} (0: all)", n_hw))
      ->check(CLI::Validator(
          [n_hw](const std::string& v) -> std::string {
            int x = 0;
            size_t used = 0;
            try {
              x = std::stoi(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != v.size() || used == 0 || x < 0 || x > n_hw)
              return fmt::format("-t {}: expected 0 (all) to {} (this machine's hardware threads)", v, n_hw);
            return "";
          },
          "INT in [0, hardware threads]"))
      ->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer_path,
                 "tokenizer.json (or its directory) to use instead of the model's, e.g. for a shape: model");
  app.add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per forward pass")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-c,--ctx", o.max_context, "maximum context in tokens (0: the model's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--host-kv-budget", o.host_kv_budget_bytes,
                 "refuse prompts whose host KV would exceed this many bytes (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gpu-kv-budget", o.gpu_kv_budget,
                 "--device cuda: GPU memory for KV (full K/V, key indexes, windows, slot caches), in bytes, or a "
                 "fraction in (0, 1) of what the weights leave free (0: no limit); the server queues requests "
                 "until both budgets hold them")
      ->check(CLI::NonNegativeNumber);
  // Process-wide (the kernels are chosen per process, core/cpu_features.h).
  app.add_option_function<std::string>(
         "--cpu-isa",
         [](const std::string& name) {
           const CpuPath path = parse_cpu_path(name);
           KVT_CHECK(cpu_supports(path), "--cpu-isa {}: this CPU ({}) lacks it; its widest path is {}", name,
                     cpu_features().brand, cpu_path_name(cpu_best_path()));
           set_cpu_path_limit(path);
         },
         "CPU kernel path: auto (the widest this CPU has, the default), avx2 or avx512")
      ->check(CLI::IsMember({"auto", "avx2", "avx512"}));
  app.add_option("--device", o.device, "where the model runs: cpu, or cuda (bf16 weights on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--cuda-graphs,!--no-cuda-graphs", o.cuda_graphs,
               "--device cuda: replay each decode step as a captured CUDA graph (default on)");
  app.add_option("--prefill-gemm", o.prefill_gemm,
                 "--device cuda: precision of the prompt's weight products: bf16, or fp8 (E4M3 with a scale per "
                 "token and per output channel; decode stays bf16)")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
}

void add_sampling_options(CLI::App& app, SamplingParams& s) {
  app.add_option("--temp", s.temperature, "temperature (0: greedy)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  app.add_option("--top-k", s.top_k, "top-k sampling (0: off)")
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            long long x = -1;
            size_t used = 0;
            try {
              x = std::stoll(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != v.size() || used == 0 || x < 0 || x > (1 << 30))
              return fmt::format("--top-k {}: expected an integer ≥ 0 (0: off)", v);
            return "";
          },
          "INT ≥ 0"));
  app.add_option("--top-p", s.top_p, "nucleus sampling (1: off)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", s.seed, "sampling seed")->capture_default_str();
  app.add_option("-n,--max-tokens", s.max_new_tokens, "maximum new tokens")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app.add_option("--stop", s.stop, "stop string (repeatable)");
  app.add_flag("--ignore-eos", s.ignore_eos, "keep generating past end-of-generation tokens");
}

void add_kv_option(CLI::App& app, std::string& policy) {
  app.add_option("--kv", policy,
                 "KV policy: full | shadowkv | yakv | oracle, with overrides "
                 "(e.g. 'yakv,budget=0.05,local=128'); see README")
      ->capture_default_str();
}

void add_kv_list_option(CLI::App& app, std::vector<std::string>& policies) {
  app.add_option("--kv", policies,
                 "KV policy (repeatable): full | shadowkv | yakv | oracle | landmarks, with "
                 "overrides (e.g. 'yakv,budget=0.05,local=128'); see README")
      ->capture_default_str();
}

std::unique_ptr<Engine> load_engine(const EngineOptions& o) {
  auto engine = Engine::load(o);
  const int64_t train_ctx = engine->config().n_ctx_train;
  if (o.max_context > 0 && train_ctx > 0 && o.max_context > train_ctx)
    fmt::print(stderr,
               "warning: -c {} is above the model's trained context of {} tokens: positions past it were "
               "never trained, so answers there are unreliable\n",
               o.max_context, train_ctx);
  return engine;
}

std::function<void(int64_t, int64_t)> prefill_progress() {
  const bool tty = isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  auto last = std::make_shared<double>(-1e9);
  return [tty, t0, last](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!tty && done < total && s - *last < 5) return;
    *last = s;
    const double rate = s > 0 ? double(done) / s : 0;
    const std::string eta = done < total && rate > 0 ? fmt::format(", ETA {:.1f} s", double(total - done) / rate) : "";
    fmt::print(stderr, "{}[kvtier] prefill {}/{} tokens ({:.0f}%), {:.0f} tok/s, {:.1f} s{}{}", tty ? "\r" : "", done,
               total, 100.0 * double(done) / double(total), rate, s, eta, tty && done < total ? "" : "\n");
  };
}

}  // namespace kvtier::tools
