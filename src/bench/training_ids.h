// Token ids a model is trained on for a benchmark sample: the prompt exactly
// as `kvtier bench` feeds it (chat template, then the answer prefix) and the
// reference answer closed by the chat format's end-of-turn token. Train and
// evaluation then see the same ids (train/ builds its batches from these).
#pragma once
#include <cstdint>
#include <vector>

#include "bench/bench_sample.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::bench {

struct TrainingIds {
  std::vector<int32_t> prompt;  // chat-formatted user turn + assistant header + answer_prefix
  std::vector<int32_t> answer;  // reference + end of turn
};

// The token that closes an assistant turn: <|im_end|> (ChatML), <|eot_id|>
// (Llama 3), else EOS. Throws kvtier::Error when the tokenizer has none.
int32_t end_of_turn(const Tokenizer& tok);

// Throws kvtier::Error when the sample has no reference answer.
TrainingIds training_ids(const Tokenizer& tok, const BenchSample& sample);

}  // namespace kvtier::bench
