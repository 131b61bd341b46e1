// ShadowKV's index, finished at the end of the prompt (SPEC "Why"; Sun et
// al., ICML 2025): per layer, the outlier chunks (per KV head the chunks
// whose keys are least similar to their mean: min over the chunk of
// cos(key, mean), lowest first) move to the resident tokens, exact; and the
// rank-r SVD of the pre-RoPE prompt keys (shared by the layer's KV heads)
// becomes U·S [n_prompt, r] and Vᵀ [r, H·D] in bf16, from which decode
// rebuilds the selected keys. The Gram matrix Kᵀ·K was accumulated chunk by
// chunk during prefill on the GPU (the CPU computes it here in f64); its
// eigenvectors are found by LAPACK on the host.
#include <algorithm>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "kv/key_index.h"
#include "kv/tiered_kv.h"
#include "ops/gather/copy_rows.h"
#include "ops/gemm/svd_gemm.h"

namespace kvtier {

void TieredSeq::finish_shadowkv() {
  const KvGeometry& g = plan_.geometry;
  const int H = g.n_kv_head, D = g.head_dim, W = H * D, c = plan_.chunk, rank = plan_.rank;
  const int64_t n = n_prompt_, n_chunk = n / c;
  const int n_out = int(std::min<int64_t>(plan_.policy.outliers, n_chunk));
  const int max_out = plan_.n_outlier_tok / c;
  n_outlier_tok_ = n_out * c;
  const bool gpu = x_.cuda();
  const int ab = gpu ? 2 : 4;
  for (int l = 0; l < g.n_layer; ++l) {
    TieredLayer& L = layers_[size_t(l)];
    // 1. Outlier chunks per KV head: ascending ids, −1 first when fewer than the plan's.
    std::vector<float> st(size_t(H) * cap_chunks_);
    copy(x_, st.data(), L.stats.data(), st.size() * 4);
    sync(x_);
    std::vector<int32_t> ids(size_t(H) * max_out, -1);
    std::vector<std::pair<float, int64_t>> order;
    for (int h = 0; h < H; ++h) {
      order.clear();
      for (int64_t ch = 0; ch < n_chunk; ++ch) order.push_back({st[size_t(h) * cap_chunks_ + ch], ch});
      std::partial_sort(order.begin(), order.begin() + n_out, order.end());
      std::vector<int32_t> pick;
      for (int i = 0; i < n_out; ++i) pick.push_back(int32_t(order[size_t(i)].second));
      std::sort(pick.begin(), pick.end());
      std::copy(pick.begin(), pick.end(), ids.begin() + size_t(h) * max_out + (max_out - n_out));
    }
    L.outliers = dev_.alloc(std::max<size_t>(4, ids.size() * 4));
    copy(x_, L.outliers.data(), ids.data(), ids.size() * 4);
    // 2. Their exact K and V (the prompt's working copy; a streamed prefill
    // reads the layer back from the host tier) into the resident slots after the ring.
    if (stream_) {
      stream_bufs();
      stream_read(x_, l, 0, n, work_[0]);
    }
    const uint8_t* kw = stream_ ? work_[0].k.data<uint8_t>() : L.dense_k.data<uint8_t>();
    const uint8_t* vw = stream_ ? work_[0].v.data<uint8_t>() : L.dense_v.data<uint8_t>();
    std::vector<const uint8_t*> src;
    std::vector<uint8_t*> dst;
    const int64_t elt = kv_elt_bytes(plan_.resident_elt);
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < n_out; ++i) {
        const int64_t ch = ids[size_t(h) * max_out + (max_out - n_out) + i];
        for (int t = 0; t < c; ++t) {
          const int64_t tok = ch * c + t, slot = plan_.sink + plan_.ring + int64_t(i) * c + t;
          uint8_t* res = L.resident.data<uint8_t>() + (h * res_slots_ + slot) * res_slot_;
          src.push_back(kw + (tok * W + int64_t(h) * D) * ab);
          dst.push_back(res);
          src.push_back(vw + (tok * W + int64_t(h) * D) * ab);
          dst.push_back(res + int64_t(D) * elt);
        }
      }
    if (gpu && !src.empty()) {  // bf16 rows to bf16 slots, one launch
      KVT_CHECK(elt == ab, "shadowkv: resident tokens ({} bytes) must match the activations ({} bytes)", elt, ab);
      Buffer tab = dev_.alloc(src.size() * 16);
      copy(x_, tab.data(), src.data(), src.size() * 8);
      copy(x_, tab.data<uint8_t>() + src.size() * 8, dst.data(), dst.size() * 8);
      copy_rows(x_, int64_t(src.size()), int64_t(D) * ab, tab.data<const uint8_t* const>(),
                reinterpret_cast<uint8_t* const*>(tab.data<uint8_t>() + src.size() * 8));
      sync(x_);  // the tables are freed here
    } else {  // CPU: f32 rows into bf16 (or f32) slots
      for (size_t i = 0; i < src.size(); ++i) {
        const float* f = reinterpret_cast<const float*>(src[i]);
        if (plan_.resident_elt == KvElt::f32) std::copy_n(f, D, reinterpret_cast<float*>(dst[i]));
        else
          for (int d = 0; d < D; ++d) reinterpret_cast<uint16_t*>(dst[i])[d] = f32_to_bf16(f[d]);
      }
    }
    // 3. The SVD of the pre-RoPE keys: Vᵀ, then U·S = K_pre · V, both bf16.
    L.svd_a = dev_.alloc(size_t(std::max<int64_t>(1, n)) * rank * 2);
    if (gpu) {
      std::vector<float> gf(size_t(W) * W);
      copy(x_, gf.data(), L.gram.data(), gf.size() * 4);
      sync(x_);
      std::vector<double> gram(gf.begin(), gf.end());
      const std::vector<float> basis = svd_basis_from_gram(gram, W, rank);
      std::vector<uint16_t> b16(basis.size());
      for (size_t i = 0; i < basis.size(); ++i) b16[i] = f32_to_bf16(basis[i]);
      L.svd_b = dev_.alloc(b16.size() * 2);
      copy(x_, L.svd_b.data(), b16.data(), b16.size() * 2);
      // The GPU reads the staged keys from pinned host memory in place (a zero-copy GEMM operand).
      project_rows(x_, L.kpre.data(), n, W, W, L.svd_b.data<uint16_t>(), rank, L.svd_a.data<uint16_t>());
      sync(x_);
    } else {  // the CPU store's SVD (f64 Gram, LAPACK), rounded to bf16 as the GPU holds it
      const KeySvd s = key_svd(L.kpre.data<float>(), n, W, rank);
      L.svd_b = dev_.alloc(s.basis.size() * 2);
      for (size_t i = 0; i < s.basis.size(); ++i) L.svd_b.data<uint16_t>()[i] = f32_to_bf16(s.basis[i]);
      for (size_t i = 0; i < s.proj.size(); ++i) L.svd_a.data<uint16_t>()[i] = f32_to_bf16(s.proj[i]);
    }
  }
}

}  // namespace kvtier
