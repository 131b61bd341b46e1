// The host tier: the full K and V of every layer, append-only, one quantized
// record per token per layer (a record spans the layer's whole KV width, so a
// HIGGS Hadamard group can cover all KV heads as SPEC's YAKV asks). Prompt and
// generated tokens are stored alike; nothing is ever dropped.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/quant/quant_format.h"

namespace kvtier {

// Append-only array of quantized vectors of `dim` values.
class CodedRows {
 public:
  CodedRows() = default;
  CodedRows(const std::string& spec, int dim);

  // x: [n, dim] f32
  void append(const float* x, int64_t n);
  // out: [n, dim] f32, rows [first, first + n)
  void decode(int64_t first, int64_t n, float* out) const;
  int64_t size() const { return n_rows_; }
  int dim() const { return dim_; }
  size_t row_bytes() const { return row_bytes_; }
  int64_t bytes() const;  // records plus the per-tensor constant
  const QuantSpec& spec() const { return spec_; }
  const uint8_t* row(int64_t i) const { return data_.data() + size_t(i) * row_bytes_; }  // the record of row i

 private:
  QuantSpec spec_;
  int dim_ = 0;
  size_t row_bytes_ = 0;
  int64_t n_rows_ = 0;
  bool scale_set_ = false;
  std::vector<uint8_t> data_;  // [n_rows, row_bytes]
};

class HostStore {
 public:
  // keys_prerope: host keys are stored before RoPE (SPEC: HIGGS keys are
  // quantized pre-RoPE where the policy says so); rope then re-applies it at
  // gather time. rope(k, pos, n): k [n, n_kv_head, head_dim] f32 in place.
  using RopeFn = std::function<void(float* k, const int64_t* pos, int64_t n)>;
  HostStore(int n_layer, int n_kv_head, int head_dim, const std::string& spec, bool keys_prerope,
            RopeFn rope);

  // k_pre, k, v: [n_tok, n_kv_head, head_dim] f32 (k_pre may be null unless keys_prerope).
  // with_keys=false stores values only (shadowkv's prompt: its keys come from
  // the SVD); keyless tokens must all precede keyed ones.
  void append(int layer, const float* k_pre, const float* k, const float* v, int64_t n_tok,
              bool with_keys = true);
  // Post-RoPE keys / values of tokens `tok` of `layer`.
  // tok: [n] positions; k_out, v_out: [n, n_kv_head, head_dim] f32 (either may be null)
  void fetch(int layer, const int64_t* tok, int64_t n, float* k_out, float* v_out) const;

  int64_t n_tokens(int layer) const { return v_[layer].size(); }
  // Tokens [0, first_key_token) have no host key.
  int64_t first_key_token(int layer) const { return k_first_[layer]; }
  int64_t bytes() const;
  bool keys_prerope() const { return keys_prerope_; }

 private:
  int n_kv_head_, head_dim_;
  bool keys_prerope_;
  RopeFn rope_;
  std::vector<CodedRows> k_, v_;  // per layer: [n_tok, n_kv_head * head_dim] records
  std::vector<int64_t> k_first_;  // per layer: k_ row i holds token k_first_ + i
};

}  // namespace kvtier
