// The one option table shared by `run`, `bench`, `analyze` and `serve`
// (STYLE rule 11): model and threads, sampling, KV policy.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "kvtier/engine.h"

namespace kvtier::tools {

void add_engine_options(CLI::App& app, EngineOptions& o);
void add_sampling_options(CLI::App& app, SamplingParams& s);
void add_kv_option(CLI::App& app, std::string& policy);
// The same --kv option, repeatable (memory, analyze compare several policies).
void add_kv_list_option(CLI::App& app, std::vector<std::string>& policies);

// Engine::load plus the tools' warnings about the options (a context above
// the model's trained one).
std::unique_ptr<Engine> load_engine(const EngineOptions& o);

// The default model's location (set up by scripts/fetch_default_model.sh).
std::string default_model_path();

// Prefill progress on stderr ("[kvtier] prefill 2048/7000 tokens (29%),
// 1,234 tok/s, 12.3 s, ETA 3.2 s"): rewritten in place on a terminal, else one
// line at most every 5 s (and the last). For Sequence::set_prefill_progress.
std::function<void(int64_t, int64_t)> prefill_progress();

}  // namespace kvtier::tools
