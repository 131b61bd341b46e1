// Builds long prompts of a target length in the model's tokens: fixed head and
// tail text, items placed at chosen depths, and filler text in between.
// Generators are written against a token counter so that they can be tested
// with a stand-in counter and run with the model's tokenizer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvtier::bench {

using CountTokens = std::function<int64_t(const std::string&)>;

// A small deterministic generator (SplitMix64): identical streams on every
// platform, unlike the std:: distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n);
  int64_t range(int64_t lo, int64_t hi);  // inclusive
  double uniform();                        // [0, 1)
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};

// Seed of sample `index` of a task from the user's seed.
uint64_t sample_seed(uint64_t seed, uint64_t index, const std::string& salt);

struct PlacedItem {
  double depth = 0;  // 0: before all filler, 1: after all filler
  std::string text;
};

struct ComposeRequest {
  std::string head;
  std::string tail;
  std::vector<PlacedItem> items;  // kept in this order when depths are equal
  // Returns the next filler piece (a sentence or paragraph, with its own
  // trailing separator); called as often as needed.
  std::function<std::string()> next_filler;
  int64_t target_tokens = 0;  // of head + body + tail
};

struct Composed {
  std::string text;
  int64_t n_tokens = 0;  // counted on the final text
};

// Fills the body with as many filler pieces as bring the whole text to the
// target (within ~1 % or 16 tokens, never over it unless the fixed parts alone
// are), placing each item between pieces at its depth.
Composed compose(const ComposeRequest& req, const CountTokens& count_tokens);

// Sentences of a text (split after '.', '!' or '?' followed by whitespace),
// each keeping the whitespace that follows it.
std::vector<std::string> split_sentences(const std::string& text);

}  // namespace kvtier::bench
