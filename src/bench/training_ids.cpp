#include "bench/training_ids.h"

#include "core/status.h"

namespace kvtier::bench {

int32_t end_of_turn(const Tokenizer& tok) {
  const char* text = tok.chat_template() == ChatTemplate::chatml   ? "<|im_end|>"
                     : tok.chat_template() == ChatTemplate::llama3 ? "<|eot_id|>"
                                                                   : nullptr;
  if (text) {
    const auto ids = tok.encode(text, false, true);
    if (ids.size() == 1) return ids[0];
  }
  KVT_CHECK(tok.eos_id() >= 0, "the tokenizer has no end-of-turn or EOS token");
  return tok.eos_id();
}

TrainingIds training_ids(const Tokenizer& tok, const BenchSample& s) {
  KVT_CHECK(!s.reference.empty(), "sample '{}' has no reference answer", s.id);
  TrainingIds t;
  // As bench_runner.cpp builds the prompt (Engine::chat_prompt + answer_prefix, Engine::tokenize).
  const std::string text = tok.apply_chat_template({{"user", s.prompt}}, true) + s.answer_prefix;
  t.prompt = tok.encode(text, tok.add_bos_default(), true);
  t.answer = tok.encode(s.reference, false, false);
  t.answer.push_back(end_of_turn(tok));
  return t;
}

}  // namespace kvtier::bench
