#include "bench/compose.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace kvtier::bench {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Rng::below(uint64_t n) {
  // Rejection sampling keeps the draw exactly uniform.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next();
  } while (x >= limit);
  return x % n;
}

int64_t Rng::range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo + 1))); }

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t sample_seed(uint64_t seed, uint64_t index, const std::string& salt) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the salt, mixed with seed and index
  for (unsigned char c : salt) h = (h ^ c) * 1099511628211ull;
  Rng r(h ^ (seed * 0x9E3779B97F4A7C15ull) ^ (index + 1) * 0xD1B54A32D192ED03ull);
  return r.next();
}

std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if ((c == '.' || c == '!' || c == '?') && i + 1 < text.size() &&
        (text[i + 1] == ' ' || text[i + 1] == '\n')) {
      size_t end = i + 1;
      while (end < text.size() && (text[end] == ' ' || text[end] == '\n')) ++end;
      out.push_back(text.substr(start, end - start));
      start = end;
      i = end - 1;
    }
  }
  if (start < text.size()) out.push_back(text.substr(start));
  return out;
}

namespace {

std::string assemble(const ComposeRequest& req, const std::vector<std::string>& filler, size_t n_filler) {
  // Item k goes before filler piece round(depth * n_filler).
  std::vector<std::vector<const std::string*>> before(n_filler + 1);
  for (const auto& item : req.items) {
    const double d = std::clamp(item.depth, 0.0, 1.0);
    before[static_cast<size_t>(std::lround(d * static_cast<double>(n_filler)))].push_back(&item.text);
  }
  std::string body = req.head;
  for (size_t i = 0; i <= n_filler; ++i) {
    for (const std::string* t : before[i]) body += *t;
    if (i < n_filler) body += filler[i];
  }
  body += req.tail;
  return body;
}

}  // namespace

Composed compose(const ComposeRequest& req, const CountTokens& count_tokens) {
  KVT_CHECK(req.target_tokens > 0, "target length must be positive, got {}", req.target_tokens);
  int64_t fixed = count_tokens(req.head) + count_tokens(req.tail);
  for (const auto& item : req.items) fixed += count_tokens(item.text);
  const int64_t tolerance = std::max<int64_t>(16, req.target_tokens / 100);

  std::vector<std::string> filler;
  std::vector<int64_t> filler_tokens;
  auto add_piece = [&] {
    std::string piece = req.next_filler();
    KVT_CHECK(!piece.empty(), "filler source ran dry");
    filler_tokens.push_back(count_tokens(piece));
    filler.push_back(std::move(piece));
  };
  int64_t estimate = fixed;
  while (estimate < req.target_tokens) {
    add_piece();
    estimate += filler_tokens.back();
  }
  size_t n_use = filler.size();
  Composed best, last;
  best.n_tokens = -1;
  // Counting pieces apart differs from counting the joined text by a few
  // tokens per boundary; a handful of exact recounts corrects for it. The
  // result is the longest text not over the target.
  for (int iter = 0; iter < 8; ++iter) {
    last.text = assemble(req, filler, n_use);
    last.n_tokens = count_tokens(last.text);
    const int64_t over = last.n_tokens - req.target_tokens;
    if (over <= 0 && last.n_tokens > best.n_tokens) best = last;
    if (over <= 0 && -over <= tolerance) break;
    if (over > 0) {
      if (n_use == 0) break;  // the fixed parts alone are over the target
      int64_t drop = 0;
      while (n_use > 0 && drop < over) drop += filler_tokens[--n_use];
    } else {
      int64_t add = 0;
      while (add < -over - tolerance / 2) {
        if (n_use == filler.size()) add_piece();
        add += filler_tokens[n_use++];
      }
    }
  }
  return best.n_tokens >= 0 ? best : last;
}

}  // namespace kvtier::bench
