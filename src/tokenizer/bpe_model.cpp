#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "core/status.h"
#include "tokenizer/byte_level.h"

namespace kvtier {
namespace {
constexpr size_t k_cache_max_entries = 1 << 17;
constexpr size_t k_cache_max_piece = 256;  // longer pieces are rare; not worth caching
}  // namespace

BpeModel::BpeModel(const std::vector<std::string>& token_texts,
                   const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                   MissingByte missing_byte, const std::string& where)
    : ignore_merges_(ignore_merges), missing_byte_(missing_byte) {
  text_to_id_.reserve(token_texts.size() * 2);
  for (size_t id = 0; id < token_texts.size(); ++id) {
    // With duplicates the lowest id wins, like a first-come vocabulary map.
    text_to_id_.emplace(token_texts[id], int32_t(id));
  }
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    byte_level::append_utf8(sym, byte_level::byte_to_codepoint(uint8_t(b)));
    byte_id_[b] = find(sym);  // -1: see MissingByte
  }
  merge_rank_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t l = find(left);
    const int32_t r = find(right);
    const int32_t m = find(left + right);
    KVT_CHECK(l >= 0 && r >= 0 && m >= 0,
              "{}: merge #{} ('{}' '{}') uses a token missing from the vocabulary ('{}')", where, rank, left,
              right, l < 0 ? left : r < 0 ? right : left + right);
    // A repeated pair keeps its first (highest-priority) rank.
    merge_rank_.emplace(pair_key(l, r), Merge{int32_t(rank), m});
  }
}

int32_t BpeModel::find(std::string_view text) const {
  const auto it = text_to_id_.find(std::string(text));
  return it == text_to_id_.end() ? -1 : it->second;
}

// Repeatedly merges the adjacent pair of lowest rank, leftmost first — the
// rule of GPT-2's bpe() that llama.cpp and HF tokenizers share. A min-heap of
// candidate pairs keyed by (rank, left position) with lazy invalidation keeps
// this O(n log n) for long pieces.
void BpeModel::merge_symbols(std::vector<int32_t>& ids) const {
  const int n = int(ids.size());
  if (n < 2) return;
  struct Cand {
    int32_t rank;
    int32_t left;   // position of the left symbol
    int32_t right;  // position of the right symbol
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<int32_t> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  const auto push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const auto it = merge_rank_.find(pair_key(ids[l], ids[r]));
    if (it != merge_rank_.end()) heap.push(Cand{it->second.rank, l, r, ids[l], ids[r]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale when either side was merged away or changed since the push.
    if (ids[c.left] != c.left_id || ids[c.right] != c.right_id || next[c.left] != c.right) continue;
    ids[c.left] = merge_rank_.at(pair_key(c.left_id, c.right_id)).result;
    ids[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
  size_t w = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) ids[w++] = ids[i];
  ids.resize(w);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const bool cacheable = piece.size() <= k_cache_max_piece;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  int32_t whole = -1;
  if (ignore_merges_) whole = find(byte_level::encode(piece));
  if (whole >= 0) {
    ids.push_back(whole);
  } else {
    ids.reserve(piece.size());
    bool has_missing = false;
    for (unsigned char b : piece) {
      const int32_t id = byte_id_[b];
      if (id < 0 && missing_byte_ == MissingByte::drop) continue;
      has_missing |= id < 0;
      ids.push_back(id);  // -1 never appears in a merge: a barrier
    }
    merge_symbols(ids);
    if (has_missing) ids.erase(std::remove(ids.begin(), ids.end(), -1), ids.end());
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= k_cache_max_entries) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

}  // namespace kvtier
