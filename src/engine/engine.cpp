// Engine: model + tokenizer + options; it starts Sequences (sequence.cpp) and
// steps several at once (step_batch).
#include "kvtier/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "backend/stage_clock.h"
#include "core/status.h"
#include "core/threads.h"
#include "engine/engine_detail.h"
#include "kv/analysis.h"
#include "kv/kv_cache.h"
#include "kv/kv_plan.h"
#include "model/model.h"
#include "model/model_cuda.h"
#include "ops/matmul/matmul.h"

namespace kvtier {

using namespace engine_detail;

namespace {

// Most sequences in one GPU decode forward (its activations grow to this).
constexpr int kGpuBatch = 256;

// EngineOptions::tokenizer_path: a tokenizer.json, or a directory with one
// (and tokenizer_config.json if present). Its ids must fit the model's vocabulary.
std::unique_ptr<Tokenizer> load_tokenizer_override(const std::string& path, int64_t n_vocab) {
  namespace fs = std::filesystem;
  KVT_CHECK(fs::exists(path), "--tokenizer {}: not found", path);
  const fs::path json_path = fs::is_directory(path) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  KVT_CHECK(fs::is_regular_file(json_path), "--tokenizer {}: no tokenizer.json there", path);
  const fs::path config = json_path.parent_path() / "tokenizer_config.json";
  auto tok = Tokenizer::from_hf(json_path.string(), fs::is_regular_file(config) ? config.string() : std::string());
  KVT_CHECK(tok->n_vocab() <= n_vocab, "--tokenizer {}: {} tokens, more than the model's vocabulary of {}", path,
            tok->n_vocab(), n_vocab);
  return tok;
}

// A sequence's KV cache for `policy` on the engine's device ("analyze:…": the
// CPU analysis cache).
// n_total bounds the tokens the sequence will ever hold (fit_plan_to_tokens).
std::unique_ptr<KvCache> make_cache(const Engine::Impl& e, const std::string& policy, int64_t n_prompt,
                                    int64_t n_total) {
  const KvGeometry g = e.model->kv_geometry();
  if (policy.rfind(kAnalysisPrefix, 0) == 0) {
    KVT_CHECK(!e.gpu, "kv analysis runs on the CPU (use --device cpu)");
    return std::make_unique<AnalysisKv>(policy.substr(kAnalysisPrefix.size()), g, e.cpu);
  }
  PolicyConfig p = parse_policy(policy);
  if (e.gpu_kv_budget_bytes > 0) p = policy_under_gpu_budget(p, g, n_prompt, n_total, e.gpu_kv_budget_bytes);
  KvPlan plan = plan_kv(p, g, e.device().kind());
  fit_plan_to_tokens(plan, n_total);
  return make_kv_cache(plan, e.device());
}

}  // namespace

namespace engine_detail {

// The forward pass on the engine's device (Model::forward's contract).
// With stage timing on, a decode step's work outside the KV cache's stages
// is charged to "model", a prompt chunk's to "prefill_model".
void forward(const Engine::Impl& e, GpuSequence* gpu, ForwardScratch& scratch, const int32_t* tokens, int n_tok,
             int64_t pos0, KvCache& kv, int n_logits, float* logits) {
  const Exec& x = e.device().exec();
  stage(x, n_tok == 1 ? "model" : "prefill_model");
  if (gpu) gpu->forward(tokens, n_tok, pos0, kv, n_logits, logits);
  else e.model->forward(tokens, n_tok, pos0, kv, scratch, n_logits, logits);
  stage_stop(x);
}

}  // namespace engine_detail

// ---- Engine ---------------------------------------------------------------

std::vector<Engine::StepResult> Engine::step_batch(const std::vector<Sequence*>& seqs) {
  Impl& e = *impl_;
  std::vector<StepResult> out(seqs.size());
  auto step_alone = [&](size_t i) {
    try {
      out[i].stepped = seqs[i]->step(&out[i].piece);
    } catch (...) {
      out[i].error = std::current_exception();
    }
  };
  std::vector<size_t> batch;  // sequences that decode together
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence::State& s = *seqs[i]->s_;
    KVT_CHECK(s.engine == &e, "step_batch: sequence {} belongs to another engine", i);
    if (s.prefilled && !s.finished) batch.push_back(i);
    else step_alone(i);
  }
  // CPU: batches the quantized decode products take whole (each row then
  // equals its solo result). CUDA: one forward for up to kGpuBatch.
  const size_t most = e.gpu ? size_t(kGpuBatch) : size_t(matmul_decode_max_tokens());
  for (size_t b0 = 0; b0 < batch.size(); b0 += most) {
    const size_t b1 = std::min(batch.size(), b0 + most);
    if (b1 - b0 == 1) {
      step_alone(batch[b0]);
      continue;
    }
    std::vector<Sequence::State*> states;
    for (size_t j = b0; j < b1; ++j) states.push_back(seqs[batch[j]]->s_.get());
    const auto t0 = Clock::now();
    std::exception_ptr failed;
    try {
      decode_together(e, states);
    } catch (...) {
      failed = std::current_exception();
    }
    for (size_t j = b0; j < b1; ++j) {
      StepResult& r = out[batch[j]];
      if (failed) {
        r.error = failed;
        continue;
      }
      try {
        r.stepped = take_token(*states[j - b0], &r.piece, t0);
      } catch (...) {
        r.error = std::current_exception();
      }
    }
  }
  return out;
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const EngineOptions& options) {
  KVT_CHECK(!options.model_path.empty(), "no model given (use -m PATH)");
  KVT_CHECK(options.model_path.rfind("shape:", 0) == 0 || std::filesystem::exists(options.model_path),
            "model not found: {} (run scripts/fetch_default_model.sh for the default model)",
            options.model_path);
  KVT_CHECK(options.prefill_chunk > 0, "prefill chunk must be positive, got {}", options.prefill_chunk);
  KVT_CHECK(options.device == "cpu" || options.device == "cuda", "device \"{}\": expected \"cpu\" or \"cuda\"",
            options.device);
  if (options.n_threads > 0) {
    set_default_threads(options.n_threads);
    set_blas_threads(options.n_threads);  // prefill's GEMMs honour -t as well
  }
  std::unique_ptr<Engine> e(new Engine());
  e->impl_ = std::make_unique<Impl>();
  Impl& impl = *e->impl_;
  impl.options = options;
  ModelSource source = open_model_source(options.model_path);
  impl.extra_eos = source.eos_token_ids;
  impl.model = std::make_unique<Model>(std::move(source));
  KVT_CHECK(options.gpu_kv_budget >= 0 && std::isfinite(options.gpu_kv_budget),
            "--gpu-kv-budget {}: expected bytes (>= 1) or a fraction of the free GPU memory in (0, 1)",
            options.gpu_kv_budget);
  KVT_CHECK(options.gpu_kv_budget == 0 || options.device == "cuda",
            "--gpu-kv-budget needs --device cuda (on the CPU the key index and windows live in host memory and "
            "are charged to --host-kv-budget)");
  KVT_CHECK(options.prefill_gemm == "bf16" || options.prefill_gemm == "fp8",
            "--prefill-gemm \"{}\": expected bf16 or fp8", options.prefill_gemm);
  KVT_CHECK(options.prefill_gemm == "bf16" || options.device == "cuda",
            "--prefill-gemm fp8 needs --device cuda (the CPU's prompt products are f32 sgemm)");
  if (options.device == "cuda")
    impl.gpu = make_gpu_model(*impl.model, options.cuda_graphs && !options.stage_times,
                              options.prefill_gemm == "fp8" ? PrefillGemm::fp8 : PrefillGemm::bf16);
  if (options.gpu_kv_budget >= 1) {
    impl.gpu_kv_budget_bytes = int64_t(options.gpu_kv_budget);
  } else if (options.gpu_kv_budget > 0) {
    const auto [free_b, total_b] = impl.gpu->device().mem_info();
    impl.gpu_kv_budget_bytes = std::max<int64_t>(1, int64_t(options.gpu_kv_budget * double(free_b)));
  }
  if (options.stage_times) {
    impl.clock = std::make_unique<StageClock>(options.device == "cuda" ? DeviceKind::cuda : DeviceKind::cpu);
    (impl.gpu ? impl.gpu->device() : impl.cpu).set_clock(impl.clock.get());
  }
  const ModelSource& src = impl.model->source();
  if (!options.tokenizer_path.empty()) {
    impl.tokenizer = load_tokenizer_override(options.tokenizer_path, impl.model->config().n_vocab);
  } else if (src.gguf) {
    impl.tokenizer = Tokenizer::from_gguf(*src.gguf);
  } else if (!src.tokenizer_json.empty()) {
    impl.tokenizer = Tokenizer::from_hf(src.tokenizer_json, src.tokenizer_config_json);
  }
  const int64_t train_ctx = impl.model->config().n_ctx_train;
  impl.max_context = options.max_context > 0 ? options.max_context : (train_ctx > 0 ? train_ctx : 4096);
  return e;
}

const ModelConfig& Engine::config() const { return impl_->model->config(); }
const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::gpu_kv_budget_bytes() const { return impl_->gpu_kv_budget_bytes; }
int64_t Engine::max_context() const { return impl_->max_context; }
int64_t Engine::gpu_memory_in_use() const {
  if (!impl_->gpu) return 0;
  const auto [free_b, total_b] = impl_->device().mem_info();
  return int64_t(total_b) - int64_t(free_b);
}
Model& Engine::model() { return *impl_->model; }

std::vector<std::pair<std::string, double>> Engine::stage_times_ms(bool reset) {
  if (!impl_->clock) return {};
  auto t = impl_->clock->totals_ms();
  if (reset) impl_->clock->reset();
  return t;
}

const Tokenizer& Engine::tokenizer() const {
  KVT_CHECK(impl_->tokenizer, "{}: this model has no tokenizer (no tokenizer.json)",
            impl_->options.model_path);
  return *impl_->tokenizer;
}

std::string Engine::model_name() const {
  const auto& name = impl_->model->config().name;
  return name.empty() ? std::filesystem::path(impl_->options.model_path).filename().string() : name;
}

std::vector<int32_t> Engine::tokenize(const std::string& text, bool add_special) const {
  const Tokenizer& tok = tokenizer();
  return tok.encode(text, add_special && tok.add_bos_default(), true);
}

std::string Engine::chat_prompt(const std::vector<ChatMessage>& messages) const {
  return tokenizer().apply_chat_template(messages, true);
}

std::shared_ptr<GrammarVocab> Engine::grammar_vocab() const {
  std::call_once(impl_->grammar_once, [&] {
    std::vector<int32_t> ends(impl_->extra_eos.begin(), impl_->extra_eos.end());
    impl_->grammar_vocab = GrammarVocab::build(tokenizer(), impl_->model->config().n_vocab, ends);
  });
  return impl_->grammar_vocab;
}

std::unique_ptr<Sequence> Engine::start(std::vector<int32_t> prompt, const SamplingParams& sampling,
                                        const std::string& kv_policy) {
  Impl& impl = *impl_;
  KVT_CHECK(!prompt.empty(), "the prompt is empty");
  KVT_CHECK(sampling.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", sampling.max_new_tokens);
  const int n_vocab = impl.model->config().n_vocab;
  for (int32_t t : prompt)
    KVT_CHECK(t >= 0 && t < n_vocab, "prompt token id {} outside the vocabulary [0, {})", t, n_vocab);
  if (int64_t(prompt.size()) >= impl.max_context)
    throw LimitError(fmt::format("prompt of {} tokens does not fit the context of {} tokens",
                                 prompt.size(), impl.max_context));
  // Knobs that size memory in tokens are bounded by the context before any
  // store is built (a `local=` of a billion tokens is refused, not allocated).
  // An analysis store ("analyze:P1|P2|...", none with --attention-only)
  // attends densely and runs each policy beside it: each is bounded.
  const bool analysis = kv_policy.rfind(kAnalysisPrefix, 0) == 0;
  const PolicyConfig policy = parse_policy(analysis ? std::string("full") : kv_policy);
  check_policy_fits_context(policy, impl.max_context);
  if (analysis) {
    const std::string list = kv_policy.substr(kAnalysisPrefix.size());
    for (size_t b = 0; b < list.size();) {
      const size_t e = std::min(list.find('|', b), list.size());
      check_policy_fits_context(parse_policy(list.substr(b, e - b)), impl.max_context);
      b = e + 1;
    }
  }
  auto s = std::make_unique<Sequence::State>();
  s->engine = &impl;
  const int64_t n_total = std::min<int64_t>(int64_t(prompt.size()) + sampling.max_new_tokens, impl.max_context);
  s->kv = make_cache(impl, kv_policy, int64_t(prompt.size()), n_total);
  if (impl.gpu_kv_budget_bytes > 0) {
    const KvGeometry g = impl.model->kv_geometry();
    const int64_t n_prompt = int64_t(prompt.size());
    const int64_t need =
        kv_gpu_charge(policy_under_gpu_budget(policy, g, n_prompt, n_total, impl.gpu_kv_budget_bytes), g, n_prompt,
                      n_total)
            .peak();
    if (need > impl.gpu_kv_budget_bytes)
      throw LimitError(fmt::format(
          "context of {} tokens needs {} bytes of GPU KV with policy '{}', over the GPU KV budget of {} bytes",
          n_total, need, kv_policy, impl.gpu_kv_budget_bytes));
  }
  if (impl.options.host_kv_budget_bytes > 0) {
    const int64_t need = kv_charge_bytes(policy, impl.model->kv_geometry(), n_total, !impl.gpu);
    if (need > impl.options.host_kv_budget_bytes)
      throw LimitError(fmt::format(
          "context of {} tokens needs {} bytes of host KV with policy '{}', over the budget of {} bytes",
          n_total, need, kv_policy, impl.options.host_kv_budget_bytes));
  }
  s->prompt = std::move(prompt);
  s->sampling = sampling;
  s->sampler = std::make_unique<Sampler>(sampling);
  if (sampling.constraint) s->constraint = sampling.constraint->make();
  const int capacity = std::min<int>(impl.options.prefill_chunk, int(s->prompt.size()));
  // The GPU sizes its caches for the prompt and a first stretch of generation
  // (growing later if needed): a request's max_new_tokens is often far more
  // than it generates, and concurrent sequences share the GPU.
  // Under a GPU KV budget the whole charge is reserved anyway: room for all
  // n_total tokens, so the cache never doubles past what was charged.
  const int64_t n_ctx = impl.gpu_kv_budget_bytes > 0
                            ? n_total
                            : std::min<int64_t>(int64_t(s->prompt.size()) + std::min(sampling.max_new_tokens, 4096),
                                                impl.max_context);
  s->kv->reserve(n_ctx);
  if (impl.gpu) s->gpu = impl.gpu->start(capacity);
  else s->scratch = impl.model->make_scratch(capacity);
  s->logits.resize(size_t(n_vocab));
  s->result.n_prompt_tokens = int64_t(s->prompt.size());
  s->result.kv_policy = kv_policy.rfind(kAnalysisPrefix, 0) == 0 ? kv_policy : to_string(s->kv->plan().policy);
  if (sampling.max_new_tokens == 0 && sampling.n_prompt_logprobs < 0) {
    s->finished = true;
    s->result.finish_reason = "length";
    s->result.kv_memory = kvtier::kv_memory(*s);
  }
  return std::unique_ptr<Sequence>(new Sequence(std::move(s)));
}

GenerationResult Engine::generate(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                                  const std::string& kv_policy,
                                  const std::function<bool(const std::string&)>& on_piece) {
  auto seq = start(prompt, sampling, kv_policy);
  return seq->run(on_piece);
}

std::vector<float> Engine::logits(const std::vector<int32_t>& tokens, const std::string& kv_policy) {
  KVT_CHECK(!tokens.empty(), "logits: no tokens");
  const Model& model = *impl_->model;
  const int n_vocab = model.config().n_vocab;
  auto kv = make_cache(*impl_, kv_policy, int64_t(tokens.size()), int64_t(tokens.size()));
  const int chunk = impl_->options.prefill_chunk;
  const int capacity = std::min<int>(chunk, int(tokens.size()));
  ForwardScratch scratch;
  std::unique_ptr<GpuSequence> gpu;
  kv->reserve(int64_t(tokens.size()));
  if (impl_->gpu) gpu = impl_->gpu->start(capacity);
  else scratch = model.make_scratch(capacity);
  std::vector<float> out(tokens.size() * size_t(n_vocab));  // [n_tok, n_vocab]
  for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
    const int n_tok = int(std::min<size_t>(size_t(chunk), tokens.size() - i));
    forward(*impl_, gpu.get(), scratch, &tokens[i], n_tok, int64_t(i), *kv, n_tok, &out[i * size_t(n_vocab)]);
  }
  return out;
}

KvMemory Engine::teacher_force(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                               const std::string& kv_policy,
                               const std::function<void(int64_t i, const float* logits)>& on_logits) {
  KVT_CHECK(!answer.empty(), "teacher forcing: the answer is empty");
  const int n_vocab = impl_->model->config().n_vocab;
  for (int32_t t : answer)
    KVT_CHECK(t >= 0 && t < n_vocab, "answer token id {} outside the vocabulary [0, {})", t, n_vocab);
  const int64_t n_prompt = int64_t(prompt.size()), n_answer = int64_t(answer.size());
  if (n_prompt + n_answer > impl_->max_context)
    throw LimitError(fmt::format("prompt of {} tokens and answer of {} do not fit the context of {} tokens", n_prompt,
                                 n_answer, impl_->max_context));
  SamplingParams sampling;
  sampling.max_new_tokens = int(n_answer);
  sampling.ignore_eos = true;
  // start() checks the prompt and the host budget and builds the KV store and
  // the forward state exactly as for a generation.
  auto seq = start(prompt, sampling, kv_policy);
  Sequence::State& s = *seq->s_;
  const int chunk = impl_->options.prefill_chunk;
  for (int64_t i = 0; i < n_prompt; i += chunk) {
    const int n_tok = int(std::min<int64_t>(chunk, n_prompt - i));
    const bool last = i + n_tok == n_prompt;
    forward(*impl_, s.gpu.get(), s.scratch, &s.prompt[size_t(i)], n_tok, i, *s.kv, last ? 1 : 0, s.logits.data());
  }
  s.kv->start_decode();
  on_logits(0, s.logits.data());
  for (int64_t i = 1; i < n_answer; ++i) {
    forward(*impl_, s.gpu.get(), s.scratch, &answer[size_t(i - 1)], 1, n_prompt + i - 1, *s.kv, 1, s.logits.data());
    on_logits(i, s.logits.data());
  }
  return kvtier::kv_memory(s);
}

std::vector<float> Engine::teacher_forced_logits(const std::vector<int32_t>& prompt,
                                                 const std::vector<int32_t>& answer, const std::string& kv_policy) {
  const size_t n_vocab = size_t(impl_->model->config().n_vocab);
  std::vector<float> out(answer.size() * n_vocab);  // [n_answer, n_vocab]
  teacher_force(prompt, answer, kv_policy, [&](int64_t i, const float* logits) {
    std::copy(logits, logits + n_vocab, out.begin() + i * int64_t(n_vocab));
  });
  return out;
}

}  // namespace kvtier
