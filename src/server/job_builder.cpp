#include "server/job_builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "grammar/constraint.h"
#include "grammar/tool_calls.h"
#include "kv/policy.h"

namespace kvtier::server {

ServerLimits make_limits(const Engine& engine, int64_t max_prompt_tokens, int64_t max_new_tokens,
                         const std::string& default_kv_policy) {
  ServerLimits l;
  const int64_t max_ctx = engine.options().max_context;
  const int64_t train_ctx = engine.config().n_ctx_train;
  // The engine's own rule: --ctx, else the training context, else 4096.
  l.n_ctx = max_ctx > 0 ? max_ctx : (train_ctx > 0 ? train_ctx : 4096);
  KVT_CHECK(l.n_ctx >= 2, "server: the model's context ({} tokens) is too small to serve",
            l.n_ctx);
  KVT_CHECK(max_prompt_tokens >= 0, "--max-prompt-tokens must be ≥ 0, got {}", max_prompt_tokens);
  KVT_CHECK(max_new_tokens >= 1, "--max-new-tokens must be ≥ 1, got {}", max_new_tokens);
  l.max_prompt_tokens = max_prompt_tokens > 0 ? std::min(max_prompt_tokens, l.n_ctx - 1) : l.n_ctx - 1;
  l.max_new_tokens = max_new_tokens;
  l.default_kv_policy = default_kv_policy;
  parse_policy(default_kv_policy);  // a bad --kv fails at start-up, not per request
  return l;
}

namespace {

KvGeometry geometry_of(const ModelConfig& c) {
  KvGeometry g;
  g.n_layer = c.n_layer;
  g.n_head = c.n_head;
  g.n_kv_head = c.n_kv_head;
  g.head_dim = c.head_dim;
  return g;
}

uint64_t fresh_seed() {
  // OpenAI: without a seed, sampling is not reproducible.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

Job build_job(const ApiRequest& r, const Engine& engine, const ServerLimits& limits) {
  Job job;
  job.kv_policy = r.kv_policy.value_or(limits.default_kv_policy);
  PolicyConfig policy;
  try {
    policy = parse_policy(job.kv_policy);
  } catch (const Error& e) {
    throw RequestError(400, fmt::format("invalid kv_policy '{}': {}", job.kv_policy, e.what()),
                       "kv_policy");
  }

  const char* prompt_param = r.endpoint == Endpoint::chat ? "messages" : "prompt";
  if (r.endpoint == Endpoint::chat) {
    std::string text;
    try {
      text = engine.tokenizer().apply_chat_template(r.messages, true, r.tools);
    } catch (const Error& e) {
      throw RequestError(400, e.what(), r.tools.empty() ? "messages" : "tools");
    }
    job.prompt = engine.tokenize(text, true);
  } else if (r.prompt_tokens) {
    const int32_t n_vocab = engine.tokenizer().n_vocab();
    for (size_t i = 0; i < r.prompt_tokens->size(); ++i) {
      const int32_t id = (*r.prompt_tokens)[i];
      if (id < 0 || id >= n_vocab) {
        throw RequestError(400,
                           fmt::format("prompt token {} at index {} is outside the vocabulary "
                                       "[0, {})",
                                       id, i, n_vocab),
                           "prompt");
      }
    }
    job.prompt = *r.prompt_tokens;
  } else {
    job.prompt = engine.tokenize(*r.prompt_text, true);
  }
  const int64_t n_prompt = int64_t(job.prompt.size());
  if (n_prompt == 0) throw RequestError(400, "the prompt is empty (no tokens)", prompt_param);
  if (n_prompt > limits.max_prompt_tokens) {
    throw RequestError(400,
                       fmt::format("the prompt has {} tokens; this server accepts at most {}",
                                   n_prompt, limits.max_prompt_tokens),
                       prompt_param, "context_length_exceeded");
  }

  const int64_t room = limits.n_ctx - n_prompt;  // ≥ 1 since max_prompt_tokens < n_ctx
  int64_t max_new = 0;
  if (r.max_tokens) {
    max_new = *r.max_tokens;
    if (max_new > limits.max_new_tokens) {
      throw RequestError(400,
                         fmt::format("max_tokens is {}; this server generates at most {} tokens "
                                     "per request",
                                     max_new, limits.max_new_tokens),
                         "max_tokens");
    }
    if (max_new > room) {
      throw RequestError(400,
                         fmt::format("the context is {} tokens, but the prompt has {} and "
                                     "max_tokens asks for {} more",
                                     limits.n_ctx, n_prompt, max_new),
                         "max_tokens", "context_length_exceeded");
    }
  } else {
    const int64_t wanted = r.endpoint == Endpoint::chat ? limits.max_new_tokens
                                                        : kDefaultCompletionTokens;
    max_new = std::min({wanted, limits.max_new_tokens, room});
  }

  SamplingParams& s = job.sampling;
  s.temperature = r.temperature;
  s.top_p = r.top_p;
  s.top_k = r.top_k;
  s.seed = r.seed ? *r.seed : fresh_seed();
  s.max_new_tokens = int(max_new);
  s.stop = r.stop;
  s.ignore_eos = r.ignore_eos;
  s.n_logprobs = r.logprobs;
  // echo with logprobs scores the prompt too (evaluation harnesses' log-likelihoods).
  s.n_prompt_logprobs = r.echo && r.logprobs >= 0 ? r.logprobs : -1;
  try {  // structured output: compiled here, on the request's thread, not in the decode loop
    if (r.response_format == "json_object") {
      s.constraint = engine.grammar_vocab()->json_object();
    } else if (r.response_format == "json_schema") {
      s.constraint = engine.grammar_vocab()->json_schema(r.json_schema, r.json_schema_name);
    } else if (!r.tools.empty() && r.tool_choice != "none" && r.tool_choice != "auto") {
      s.constraint = tool_call_constraint(*engine.grammar_vocab(), engine.tokenizer().tool_format(),
                                          parse_tool_specs(r.tools), r.tool_choice == "required" ? "" : r.tool_choice);
    }
  } catch (const GrammarError& e) {
    throw RequestError(400, e.what(), r.response_format != "text" ? "response_format" : "tools");
  }

  try {
    check_policy_fits_context(policy, limits.n_ctx);
  } catch (const Error& e) {
    throw RequestError(400, fmt::format("invalid kv_policy '{}': {}", job.kv_policy, e.what()),
                       "kv_policy");
  }
  try {
    // Charged to --host-kv-budget: on the CPU device the GPU tier is host memory too.
    job.host_kv_bytes = kv_charge_bytes(policy, geometry_of(engine.config()), n_prompt + max_new,
                                        engine.options().device == "cpu");
    // Charged to --gpu-kv-budget (--device cuda): what the sequence holds on the GPU.
    if (engine.options().device == "cuda") {
      const KvGeometry geo = geometry_of(engine.config());
      const int64_t budget = engine.gpu_kv_budget_bytes();
      const KvGpuCharge g =
          kv_gpu_charge(budget > 0 ? policy_under_gpu_budget(policy, geo, n_prompt, n_prompt + max_new, budget) : policy,
                        geo, n_prompt, n_prompt + max_new);
      job.gpu_kv_prefill_bytes = g.prefill_bytes;
      job.gpu_kv_bytes = g.decode_bytes;
    }
  } catch (const Error& e) {
    throw RequestError(400, fmt::format("kv_policy '{}' does not fit this model: {}",
                                        job.kv_policy, e.what()),
                       "kv_policy");
  }
  return job;
}

}  // namespace kvtier::server
