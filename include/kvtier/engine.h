// kvtier's public API: load a model, tokenize, and generate with a chosen KV
// policy, token by token (streaming) or all at once. Errors are thrown as
// kvtier::Error (src/core/status.h) with a message for the user.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/kv_report.h"
#include "kvtier/model_config.h"
#include "kvtier/status.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {

class ConstraintFactory;  // src/grammar/constraint.h
class GrammarVocab;

struct EngineOptions {
  std::string model_path;     // .gguf file or Hugging Face directory
  // A tokenizer.json (or a directory holding one, with tokenizer_config.json
  // beside it if present) used instead of the model's own: for a model that
  // ships none, such as a random-weight `shape:` model. Empty: the model's.
  std::string tokenizer_path;
  int n_threads = 0;          // 0: all hardware threads
  int prefill_chunk = 512;    // prompt tokens per forward pass (bounds memory)
  // Sequence::step runs one prefill chunk per call until the prompt is done
  // (the server: a long prompt that arrives does not stall the sequences
  // already decoding for its whole prefill); false: the whole prompt and the
  // first token in one call.
  bool prefill_chunk_per_step = false;
  int64_t max_context = 0;    // 0: the model's training context
  int64_t host_kv_budget_bytes = 0;  // 0: unlimited; else longer contexts are refused
  // --device cuda: the GPU memory, weights aside, that sequences' KV may hold
  // (kv_gpu_charge: full K/V pages, key indexes, resident windows, slot
  // caches): bytes when ≥ 1, a fraction of the memory free after the weights
  // load when in (0, 1); 0: no limit. Under a budget, cache=auto keeps
  // budget-sized slots (step): the budget holds what it was charged.
  double gpu_kv_budget = 0;
  // Where the forward pass runs: "cpu", or "cuda" (weights dequantized to bf16
  // on CUDA device 0; the policy's plan says where its KV lives: kv/kv_plan.h).
  std::string device = "cpu";
  bool cuda_graphs = true;  // decode steps replay a captured CUDA graph
  // --device cuda: the precision of the prompt's weight products, "bf16" or
  // "fp8" (E4M3, one scale per token and per output channel, over an FP8
  // copy of the dense matrices; decode steps stay bf16).
  std::string prefill_gemm = "bf16";
  // Time each stage of the decode steps (Engine::stage_times_ms; turns CUDA
  // graphs off and adds a timing event per stage: for benchmarks).
  bool stage_times = false;
};

// One token's log-probability and the most likely alternatives at its position.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (token, logprob), most likely first
};

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int max_new_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;
  // Log-probabilities (from the raw logits): -1 off; else each generated
  // token's, with this many most likely alternatives (GenerationResult::logprobs).
  int n_logprobs = -1;
  // -1 off; else every prompt token's after the first, with this many
  // alternatives (GenerationResult::prompt_logprobs). With max_new_tokens 0
  // the sequence still runs its prefill, to score the prompt.
  int n_prompt_logprobs = -1;
  // Structured generation: when set, every step samples only among the
  // tokens that keep the output a valid prefix of the factory's language
  // (greedy and sampled alike), and the sequence stops ("stop") once the
  // value is complete and only end of generation can follow.
  std::shared_ptr<const ConstraintFactory> constraint;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated tokens (stop string and EOS excluded)
  std::string text;
  std::string finish_reason;  // "stop" (EOS or stop string), "length", "cancelled"
  int64_t n_prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  KvMemory kv_memory;
  KvStats kv_stats;       // decode steps' selection and host-tier reads
  std::string kv_policy;  // resolved policy description
  std::vector<TokenLogprob> logprobs;         // one per token of `tokens` (n_logprobs ≥ 0)
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1..n-1 (n_prompt_logprobs ≥ 0)
};

class Model;
class KvCache;

// One generation in progress: its own KV store, sampler state and text
// buffer. Created by Engine::start; step() decodes one token. Lets a caller
// (the server) interleave several sequences fairly and cancel between steps.
class Sequence {
 public:
  ~Sequence();
  // Runs the prompt (if not yet done), then decodes one token. Returns false
  // (doing nothing) once the sequence has finished; the call that finishes it
  // returns true with the last text. `piece` receives the newly completed text
  // (possibly empty while a UTF-8 character or a possible stop string is held back).
  // With EngineOptions::prefill_chunk_per_step, a call runs one prompt chunk
  // and returns true without a token until the prompt is done.
  bool step(std::string* piece);
  bool finished() const;
  bool prompt_done() const;  // the prompt has run (the next step decodes)
  // Prompt tokens the next step() runs: one chunk with
  // EngineOptions::prefill_chunk_per_step, else the rest of the prompt; 0 once
  // the prompt has run. A scheduler spends its per-round prefill budget by it.
  int64_t next_prompt_tokens() const;
  const GenerationResult& result() const;
  // Runs to completion, calling on_piece for every non-empty piece; a false
  // return from on_piece cancels.
  const GenerationResult& run(const std::function<bool(const std::string&)>& on_piece);
  void cancel();
  // The sequence's KV cache (kv/kv_cache.h; internal API, for tools that
  // inspect it, such as `kvtier analyze`).
  KvCache& cache();
  KvMemory kv_memory() const;
  // Called after each prefill chunk with (prompt tokens done, prompt tokens),
  // so that a tool can show progress on a long prompt. Set before step().
  void set_prefill_progress(std::function<void(int64_t done, int64_t total)> on_progress);
  // Benchmarks only (`kvtier perf --random-kv`): the K/V of the prompt's first
  // n_tokens are random values (normal, one of a few random blocks of 4096
  // tokens) written straight into the cache, every layer, with no forward
  // pass; the rest of the prompt then runs through the model as usual. For
  // decode timings at contexts whose prefill does not fit a run: the output
  // is meaningless. Before the first step(); n_tokens < the prompt's length.
  void fill_prompt_kv_random(int64_t n_tokens, uint64_t seed);

  struct State;

 private:
  friend class Engine;
  explicit Sequence(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

class Engine {
 public:
  static std::unique_ptr<Engine> load(const EngineOptions& options);
  ~Engine();

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  // The GPU KV budget in bytes (EngineOptions::gpu_kv_budget resolved at
  // load); 0: none.
  int64_t gpu_kv_budget_bytes() const;
  // Tokens a sequence may hold, prompt and answer together (EngineOptions::max_context, else the model's).
  int64_t max_context() const;
  // --device cuda: GPU memory in use now (total − free, every allocation on
  // the device, weights included); 0 on the CPU.
  int64_t gpu_memory_in_use() const;
  const EngineOptions& options() const;
  std::string model_name() const;

  std::vector<int32_t> tokenize(const std::string& text, bool add_special = true) const;
  std::string chat_prompt(const std::vector<ChatMessage>& messages) const;

  // The vocabulary prepared for constrained generation (built on first use,
  // ≈ 0.2 s for 49K tokens; thread-safe): compiles response formats and
  // tool calls into SamplingParams::constraint.
  std::shared_ptr<GrammarVocab> grammar_vocab() const;

  // Starts a generation; throws kvtier::Error for a bad policy string and
  // kvtier::LimitError when the prompt exceeds the context or host budget.
  std::unique_ptr<Sequence> start(std::vector<int32_t> prompt, const SamplingParams& sampling,
                                  const std::string& kv_policy = "full");

  // Convenience: start + run.
  GenerationResult generate(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                            const std::string& kv_policy = "full",
                            const std::function<bool(const std::string&)>& on_piece = {});

  // One step of each of several of this engine's sequences, together. Entry
  // i holds what seqs[i]->step(&piece) would have returned, its piece, or
  // the error that step threw (the others go on). On the CPU the sequences
  // past their prompt share one forward pass: the weight products run over
  // the batch (each weight read once per step, not once per sequence) and
  // each sequence attends through its own KV cache and policy; every
  // sequence gets the logits it gets alone. A sequence whose prompt is not
  // yet run runs it alone, as step() does; on CUDA every sequence steps alone.
  struct StepResult {
    bool stepped = false;
    std::string piece;
    std::exception_ptr error;
  };
  std::vector<StepResult> step_batch(const std::vector<Sequence*>& seqs);

  // Full-sequence logits for tests: [n_tok, n_vocab] f32 (dense attention).
  std::vector<float> logits(const std::vector<int32_t>& tokens, const std::string& kv_policy = "full");

  // Teacher forcing: prefills `prompt` under the policy as start() does, then
  // feeds `answer` one token per decode step, so that the policy's sparse
  // selection applies exactly as when it generates. on_logits(i, logits)
  // receives the [n_vocab] f32 logits that predict answer[i]: i = 0 from the
  // prefill's last position (dense attention under every policy, as in
  // generation), i ≥ 1 from the decode step that fed answer[i - 1]. Returns
  // the KV memory at the end. Throws as start() does.
  KvMemory teacher_force(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                         const std::string& kv_policy,
                         const std::function<void(int64_t i, const float* logits)>& on_logits);
  // The same, collected: [n_answer, n_vocab] f32.
  std::vector<float> teacher_forced_logits(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                                           const std::string& kv_policy = "full");

  Model& model();
  // Milliseconds per decode-step stage (index, select, fetch, attend, merge,
  // append, model) summed since the last reset, all sequences together;
  // empty unless options.stage_times.
  std::vector<std::pair<std::string, double>> stage_times_ms(bool reset = false);

  struct Impl;  // public so that Sequence's state can refer to it

 private:
  Engine() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
