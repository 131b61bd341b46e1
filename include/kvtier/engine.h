// kvtier's public API: load a model, tokenize, and generate with a chosen KV
// policy, token by token (streaming) or all at once. Errors are thrown as
// kvtier::Error (src/core/status.h) with a message for the user.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/kv_store.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {

struct EngineOptions {
  std::string model_path;     // .gguf file or Hugging Face directory
  int n_threads = 0;          // 0: all hardware threads
  int prefill_chunk = 512;    // prompt tokens per forward pass (bounds memory)
  int64_t max_context = 0;    // 0: the model's training context
  int64_t host_kv_budget_bytes = 0;  // 0: unlimited; else longer contexts are refused
  // Where the forward pass runs: "cpu", or "cuda" (weights dequantized to bf16
  // on CUDA device 0; see src/gpu/gpu_model.h for where each policy's KV lives).
  std::string device = "cpu";
};

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int max_new_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated tokens (stop string and EOS excluded)
  std::string text;
  std::string finish_reason;  // "stop" (EOS or stop string), "length", "cancelled"
  int64_t n_prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  KvMemory kv_memory;
  std::string kv_policy;  // resolved policy description
};

class Model;

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
  bool step(std::string* piece);
  bool finished() const;
  const GenerationResult& result() const;
  // Runs to completion, calling on_piece for every non-empty piece; a false
  // return from on_piece cancels.
  const GenerationResult& run(const std::function<bool(const std::string&)>& on_piece);
  void cancel();
  KvStore& kv();

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
  const EngineOptions& options() const;
  std::string model_name() const;

  std::vector<int32_t> tokenize(const std::string& text, bool add_special = true) const;
  std::string chat_prompt(const std::vector<ChatMessage>& messages) const;

  // Starts a generation; throws kvtier::Error for a bad policy string and
  // kvtier::LimitError when the prompt exceeds the context or host budget.
  std::unique_ptr<Sequence> start(std::vector<int32_t> prompt, const SamplingParams& sampling,
                                  const std::string& kv_policy = "full");

  // Convenience: start + run.
  GenerationResult generate(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                            const std::string& kv_policy = "full",
                            const std::function<bool(const std::string&)>& on_piece = {});

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

  struct Impl;  // public so that Sequence's state can refer to it

 private:
  Engine() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
