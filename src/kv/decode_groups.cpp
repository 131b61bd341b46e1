#include "kv/decode_groups.h"

#include <algorithm>
#include <numeric>

#include "kv/tiered_kv.h"

namespace kvtier {

void DecodeGroups::arrange(KvCache* const* kvs, int n) {
  // A tiered cache in decode joins the group of its policy; the rest step alone.
  std::vector<std::string> key(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto* t = dynamic_cast<TieredKv*>(kvs[i]);
    if (t && t->decoding()) key[size_t(i)] = to_string(t->plan().policy);
  }
  order_.resize(size_t(n));
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) { return key[size_t(a)] < key[size_t(b)]; });
  groups_.clear();
  group_at_.assign(size_t(n), -1);
  std::vector<std::string> used;
  for (int j = 0; j < n;) {
    const std::string& k = key[size_t(order_[size_t(j)])];
    int e = j + 1;
    while (e < n && key[size_t(order_[size_t(e)])] == k) ++e;
    if (!k.empty() && e - j > 1) {
      std::vector<TieredSeq*> seqs;
      std::vector<uint64_t> uids;
      for (int r = j; r < e; ++r) {
        TieredSeq& q = static_cast<TieredKv*>(kvs[order_[size_t(r)]])->seq();
        seqs.push_back(&q);
        uids.push_back(q.uid());
      }
      Held& h = held_[k];
      if (!h.batch) h.batch = std::make_unique<DecodeBatch>(seqs[0]->plan(), dev_);
      if (h.uids != uids) {  // sequences joined or left
        h.batch->set_sequences(seqs);
        h.uids = uids;
      }
      group_at_[size_t(j)] = int(groups_.size());
      groups_.push_back({j, e - j, h.batch.get()});
      used.push_back(k);
    }
    j = e;
  }
  // A policy no longer batched drops its DecodeBatch (and the sequences it points to).
  for (auto it = held_.begin(); it != held_.end();)
    it = std::find(used.begin(), used.end(), it->first) != used.end() ? std::next(it) : held_.erase(it);
}

const DecodeGroups::Group* DecodeGroups::starting_at(int row) const {
  const int g = row >= 0 && row < int(group_at_.size()) ? group_at_[size_t(row)] : -1;
  return g >= 0 ? &groups_[size_t(g)] : nullptr;
}

void DecodeGroups::begin_step(KvCache* const* rows, int n) const {
  for (int j = 0; j < n;) {
    if (const Group* g = starting_at(j)) {
      g->batch->begin_step();
      j += g->n;
    } else {
      rows[j++]->begin_step(1);
    }
  }
}

uint64_t DecodeGroups::graph_key(uint64_t key) const {
  for (const Group& g : groups_)
    key = (key ^ (g.batch->builds() + 1)) * 0x100000001B3ull ^ uint64_t(reinterpret_cast<uintptr_t>(g.batch));
  return key;
}

}  // namespace kvtier
