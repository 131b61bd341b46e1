#include "kv/host_store.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace kvtier {

CodedRows::CodedRows(const std::string& spec, int dim)
    : spec_(parse_quant_spec(spec)), dim_(dim), row_bytes_(bytes_per_vector(spec_, dim)) {}

void CodedRows::append(const float* x, int64_t n) {
  if (n <= 0) return;
  if (spec_.kind == QuantKind::nvfp4 && !scale_set_) {
    // One FP32 scale per tensor, fixed by the first rows (the store grows, so
    // it cannot see the whole tensor); 4× headroom so later rows with a
    // larger amax are not clipped at E4M3's largest block scale.
    float s = nvfp4_tensor_scale(x, n * dim_);
    spec_.tensor_scale = s * 4.0f;
  }
  scale_set_ = true;
  size_t old = data_.size();
  data_.resize(old + size_t(n) * row_bytes_);
  quantize(spec_, x, n, dim_, data_.data() + old);
  n_rows_ += n;
}

void CodedRows::decode(int64_t first, int64_t n, float* out) const {
  KVT_CHECK(first >= 0 && first + n <= n_rows_, "coded rows: [{}, {}) outside [0, {})", first,
            first + n, n_rows_);
  dequantize(spec_, data_.data() + size_t(first) * row_bytes_, n, dim_, out);
}

int64_t CodedRows::bytes() const {
  return int64_t(data_.size()) + int64_t(tensor_constant_bytes(spec_));
}

HostStore::HostStore(int n_layer, int n_kv_head, int head_dim, const std::string& spec,
                     bool keys_prerope, RopeFn rope)
    : n_kv_head_(n_kv_head), head_dim_(head_dim), keys_prerope_(keys_prerope),
      rope_(std::move(rope)) {
  KVT_CHECK(!keys_prerope_ || rope_,
            "kv policy: keys_prerope=1 needs the model's RoPE (KvGeometry::apply_rope is unset)");
  const int width = n_kv_head * head_dim;
  for (int l = 0; l < n_layer; ++l) {
    k_.emplace_back(spec, width);
    v_.emplace_back(spec, width);
  }
  k_first_.assign(n_layer, 0);
}

void HostStore::append(int layer, const float* k_pre, const float* k, const float* v,
                       int64_t n_tok, bool with_keys) {
  if (with_keys) {
    KVT_CHECK(!keys_prerope_ || k_pre,
              "host store: keys_prerope needs pre-RoPE keys (k_pre is null)");
    k_[layer].append(keys_prerope_ ? k_pre : k, n_tok);
  } else {
    KVT_CHECK(k_[layer].size() == 0, "host store: keyless tokens after keyed ones (layer {})",
              layer);
    k_first_[layer] += n_tok;
  }
  v_[layer].append(v, n_tok);
}

void HostStore::fetch(int layer, const int64_t* tok, int64_t n, float* k_out,
                      float* v_out) const {
  const int width = n_kv_head_ * head_dim_;
  // Runs of consecutive positions decode in one call (selections are sorted).
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && tok[j] == tok[j - 1] + 1) ++j;
    if (k_out) {
      KVT_CHECK(tok[i] >= k_first_[layer], "host store: token {} of layer {} has no host key",
                tok[i], layer);
      k_[layer].decode(tok[i] - k_first_[layer], j - i, k_out + i * width);
    }
    if (v_out) v_[layer].decode(tok[i], j - i, v_out + i * width);
    i = j;
  }
  if (k_out && keys_prerope_) rope_(k_out, tok, n);
}

int64_t HostStore::bytes() const {
  int64_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += k_[l].bytes() + v_[l].bytes();
  return b;
}

}  // namespace kvtier
