#include "kv/selector.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/status.h"

namespace kvtier {

void aggregate_gqa(GqaMode mode, int n_head, int n_kv_head, int64_t n, const float* raw,
                   float* out) {
  const int group = n_head / n_kv_head;
  for (int g = 0; g < n_kv_head; ++g) {
    float* o = out + size_t(g) * n;
    if (mode == GqaMode::mean) {
      std::fill(o, o + n, 0.0f);
      for (int j = 0; j < group; ++j) {
        const float* r = raw + size_t(g * group + j) * n;
        for (int64_t i = 0; i < n; ++i) o[i] += r[i] / float(group);
      }
      continue;
    }
    std::fill(o, o + n, -std::numeric_limits<float>::infinity());
    for (int j = 0; j < group; ++j) {
      const float* r = raw + size_t(g * group + j) * n;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, r[i]);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += std::exp(double(r[i]) - mx);
      for (int64_t i = 0; i < n; ++i)
        o[i] = std::max(o[i], float(std::exp(double(r[i]) - mx) / sum));
    }
  }
}

void select_tokens(const SelectParams& p, int n_kv_head, const float* scores,
                   const std::vector<std::vector<int64_t>>* forced, Selection* out) {
  const int64_t n = p.n_visible;
  const int c = p.chunk;
  KVT_CHECK(p.n_chunk * c <= n, "selector: {} chunks of {} exceed {} visible tokens", p.n_chunk,
            c, n);
  out->indptr.assign(n_kv_head + 1, 0);
  out->indices.clear();
  std::vector<uint8_t> taken(n);
  std::vector<uint8_t> forced_chunk(p.n_chunk);
  std::vector<int64_t> cand;
  for (int g = 0; g < n_kv_head; ++g) {
    std::fill(taken.begin(), taken.end(), 0);
    std::fill(forced_chunk.begin(), forced_chunk.end(), 0);
    for (int64_t t = 0; t < std::min<int64_t>(p.sink, n); ++t) taken[t] = 1;
    for (int64_t t = std::max<int64_t>(0, n - p.local); t < n; ++t) taken[t] = 1;
    for (int64_t t = p.n_chunk * c; t < n; ++t) taken[t] = 1;  // pending (not indexed yet)
    if (forced) {
      for (int64_t ch : (*forced)[g]) {
        if (ch >= p.n_chunk) continue;
        forced_chunk[ch] = 1;
        for (int64_t t = ch * c; t < (ch + 1) * c; ++t) taken[t] = 1;
      }
    }
    // Candidates: chunks with at least one token not already taken.
    cand.clear();
    for (int64_t ch = 0; ch < p.n_chunk; ++ch) {
      if (forced_chunk[ch]) continue;
      bool open = false;
      for (int64_t t = ch * c; t < (ch + 1) * c && !open; ++t) open = !taken[t];
      if (open) cand.push_back(ch);
    }
    const int64_t k_budget = p.budget > 0 ? std::max<int64_t>(1, p.budget / c) : 0;
    const int64_t k = std::min<int64_t>(int64_t(cand.size()), k_budget);
    const float* s = scores + size_t(g) * p.n_chunk;
    auto better = [s](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
    if (k < int64_t(cand.size())) std::nth_element(cand.begin(), cand.begin() + k, cand.end(), better);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t t = cand[i] * c; t < (cand[i] + 1) * c; ++t) taken[t] = 1;
    for (int64_t t = 0; t < n; ++t)
      if (taken[t]) out->indices.push_back(t);
    out->indptr[g + 1] = int64_t(out->indices.size());
  }
}

}  // namespace kvtier
