// A decode batch's sequences arranged for one forward pass: the sequences of
// one tiered policy sit side by side and step through one DecodeBatch, so
// each stage of their attention (scoring, top-k, fetch, attention, merge) is
// one launch for the group; `full` and a policy's lone sequence step through
// their own caches. Used by the GPU model's batched decode.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "kv/decode_batch.h"
#include "kv/kv_cache.h"

namespace kvtier {

class DecodeGroups {
 public:
  explicit DecodeGroups(const Device& dev) : dev_(dev) {}
  struct Group {
    int first = 0, n = 0;  // rows [first, first + n) of the forward
    DecodeBatch* batch = nullptr;
  };
  // Orders kvs[0, n): row j of the forward is the caller's sequence order()[j].
  // A group whose sequences changed rebuilds its tables at its next step.
  void arrange(KvCache* const* kvs, int n);
  const std::vector<int>& order() const { return order_; }
  const std::vector<Group>& groups() const { return groups_; }
  // The group whose rows start at `row`, or null.
  const Group* starting_at(int row) const;
  // Before layer 0: every group's step, and each other row's cache (rows in
  // the arranged order).
  void begin_step(KvCache* const* rows, int n) const;
  // Folds what a captured graph of the step depends on (each group's tables) into key.
  uint64_t graph_key(uint64_t key) const;

 private:
  struct Held {
    std::unique_ptr<DecodeBatch> batch;
    std::vector<uint64_t> uids;  // its sequences (TieredSeq::uid), in order
  };
  const Device& dev_;
  std::vector<int> order_;
  std::vector<Group> groups_;
  std::vector<int> group_at_;         // row → index in groups_ of the group starting there, else −1
  std::map<std::string, Held> held_;  // by policy
};

}  // namespace kvtier
