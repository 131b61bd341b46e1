// Log-probabilities of tokens under a row of logits: what the server returns
// for OpenAI's `logprobs` / `top_logprobs` and `echo` (prompt log-likelihoods
// for evaluation harnesses). Computed from the raw logits (log-softmax,
// before temperature, top-k or top-p), as vLLM does by default.
#pragma once
#include <cstdint>

#include "kvtier/engine.h"

namespace kvtier {

// log_softmax(logits)[token] with the n_top most likely tokens (best first,
// ties to the lower id). logits: [n_vocab] f32.
TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t token, int n_top);

}  // namespace kvtier
