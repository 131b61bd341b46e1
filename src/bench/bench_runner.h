// kvtier bench: task x KV policies x context lengths x samples on one model,
// greedy decoding, one JSONL record per finished sample (appended and flushed,
// so that an interrupted run resumes without redoing finished samples).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/tasks.h"
#include "core/status.h"
#include "kvtier/engine.h"

namespace kvtier::bench {

struct BenchConfig {
  std::vector<std::string> tasks;
  std::vector<std::string> policies;  // KV policy strings, as for `kvtier run --kv`
  // Target prompt lengths (tokens of the user message). A cell whose prompt
  // would leave less than the answer's room in the engine's context (at the
  // model's own limit: 64K for a 64K model) gets prompts that leave it:
  // max_context − max_new_tokens − the chat template's tokens; its records
  // say so in "prompt_target".
  std::vector<int64_t> ctx;
  int64_t n_samples = 5;
  uint64_t seed = 1;
  SamplingParams sampling;  // temperature 0 (greedy) and max_new_tokens
  std::string output;       // JSONL; existing records are kept and skipped
  std::string data_root;
  std::string text2json_file;
  bool progress = true;  // a progress bar on stderr
  // Greedy generation, scored by the task's metric.
  bool generate = true;
  // Teacher-forced fidelity to full attention (bench/fidelity.h): answer_nll,
  // answer_token_acc, top1_agree_full, kl_full per record. Full attention's
  // pass over each sample's reference answer is run once and shared by its policies.
  bool fidelity = true;
  // Generations that decode together (Engine::step_batch: one forward pass
  // per step on the CPU); each gets the tokens it gets alone.
  int batch = 1;
};

// Resume key of a record: task, id, policy, ctx.
std::string record_key(const nlohmann::json& record);

// Records already in `path` (none when it does not exist). A truncated last
// line (an interrupted write) is ignored; other malformed lines are errors.
std::vector<nlohmann::json> read_bench_records(const std::string& path);

// Truncates `path` after its last newline when its last line is incomplete
// (an interrupted write), so that appending starts a fresh line.
void drop_partial_last_line(const std::string& path);

// Runs every (task, ctx, sample, policy) not yet in the output, appending one
// record each: task, id, policy, ctx, context_tokens; when generating:
// prediction, score (0-100), excluded, details, prefill and decode seconds,
// new tokens, finish reason; with fidelity: n_answer_tokens, answer_nll,
// answer_token_acc, top1_agree_full, kl_full, fidelity_s; and GPU/host bytes
// and bytes per token. A record already in the output is not redone, even when
// it lacks fields the present configuration would add. Returns all records.
std::vector<nlohmann::json> run_bench(Engine& engine, const BenchConfig& config);

}  // namespace kvtier::bench
