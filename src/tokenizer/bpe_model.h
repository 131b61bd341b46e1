// Byte-level BPE: merges applied by rank to the byte symbols of one
// pre-tokenized piece, with a per-piece cache.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvtier {

class BpeModel {
 public:
  // token_texts: vocabulary entries in byte-level spelling, indexed by id
  // (entries that are not BPE tokens, e.g. special tokens, may be included:
  // they only become reachable if a merge produces them). merges: pairs in
  // priority order (rank = index). `where` names the source in messages.
  // Throws kvtier::Error when a merge names a token missing from the
  // vocabulary.
  //
  // A byte whose symbol is not in the vocabulary (SmolLM2 lacks 21, e.g.
  // 0x04 and 0xF5..0xFF) yields no token, as in both peers, which differ in
  // one detail: llama.cpp keeps it as a symbol that merges with nothing (a
  // barrier), HF tokenizers drops it before merging, so its neighbours may
  // merge. `missing_byte` picks the behaviour.
  enum class MissingByte { barrier, drop };
  BpeModel(const std::vector<std::string>& token_texts,
           const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
           MissingByte missing_byte, const std::string& where);

  // Appends the ids of one piece (raw bytes) to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // -1 when absent.
  int32_t find(std::string_view byte_level_text) const;
  size_t n_merges() const { return merge_rank_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void merge_symbols(std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> text_to_id_;
  std::unordered_map<uint64_t, Merge> merge_rank_;
  int32_t byte_id_[256];
  bool ignore_merges_ = false;
  MissingByte missing_byte_ = MissingByte::barrier;

  // Pieces repeat a lot in natural text; caching them makes BPE nearly free
  // after warm-up. Bounded, cleared when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kvtier
