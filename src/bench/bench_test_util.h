// Helpers of the generator tests (bench_gen_test, split_gen_test): a stand-in
// tokenizer and essay-like filler, so that the generators run without a model
// or the benchmark data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_text.h"

namespace kvtier::bench {

// One token per whitespace-separated word.
inline int64_t count_words(const std::string& s) { return static_cast<int64_t>(py_split_ws(s).size()); }

// n_essays texts of 300 sentences, "Essay <e> sentence <i><about><word><tail>", with a
// vocabulary of a few hundred made-up words (the RULER word tasks draw from it).
inline std::vector<std::string> filler_texts(int n_essays, const std::string& about, const std::string& tail) {
  const char* syl[] = {"ka", "lo", "mer", "tis", "van", "pru", "del", "sor", "nim", "qua", "res", "bol"};
  std::vector<std::string> t;
  for (int e = 0; e < n_essays; ++e) {
    std::string text;
    for (int i = 0; i < 300; ++i) {
      const int k = e * 300 + i;
      const std::string word = std::string(syl[k % 12]) + syl[(k / 12) % 12] + syl[(k / 144) % 12];
      text += "Essay " + std::to_string(e) + " sentence " + std::to_string(i) + about + word + tail;
    }
    t.push_back(text);
  }
  return t;
}

}  // namespace kvtier::bench
