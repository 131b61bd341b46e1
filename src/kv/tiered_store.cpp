#include "kv/tiered_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/half.h"
#include "core/status.h"
#include "ops/attention/attention.h"

namespace kvtier {

namespace {

// A host group larger than a head but set (yakv's g128 on a smaller head) is
// the head itself, as the tiered cache's per-head records have it.
QuantSpec clamped_kv(QuantSpec s, int head_dim) {
  if (s.kind == QuantKind::higgs && s.group > head_dim) s.group = head_dim;
  return s;
}

}  // namespace

// ---------------------------------------------------------------- tiered

TieredKvStore::TieredKvStore(const PolicyConfig& p, const KvGeometry& g)
    : p_(p), g_(checked_geometry(g)), width_(g.n_kv_head * g.head_dim),
      host_(g.n_layer, g.n_kv_head, g.head_dim, to_string(clamped_kv(p.kv, g.head_dim)), p.keys_prerope,
            g.apply_rope),
      index_(p, g) {
  const int L = g.n_layer;
  n_tok_.assign(L, 0);
  dense_k_.resize(L);
  dense_v_.resize(L);
  sink_k_.resize(L);
  sink_v_.resize(L);
  // The local window's ring grows with the tokens held (up to `local`), so
  // that a large local= costs memory only for tokens that exist.
  ring_k_.resize(L);
  ring_v_.resize(L);
  out_k_.resize(L);
  out_v_.resize(L);
  outliers_.assign(L, std::vector<std::vector<int64_t>>(g.n_kv_head));
}

void TieredKvStore::round_resident(float* x, int64_t n) const {
  // Resident rows are bf16 on the GPU; kv=f32 keeps them exact for reference runs.
  if (p_.kv.kind == QuantKind::f32) return;
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

void TieredKvStore::append(int layer, const float* k_pre, const float* k, const float* v,
                           int n_tok) {
  KVT_CHECK(layer >= 0 && layer < g_.n_layer, "kv store: layer {} outside [0, {})", layer,
            g_.n_layer);
  KVT_CHECK(n_tok >= 0, "kv store: n_tok {} < 0", n_tok);
  const int64_t n0 = n_tok_[layer];
  const int64_t w = width_;
  // shadowkv keeps no host keys for the prompt: its SVD rebuilds them.
  const bool host_keys = !(p_.index == IndexKind::shadowkv && phase_ == KvPhase::prefill);
  host_.append(layer, k_pre, k, v, n_tok, host_keys);
  index_.append(layer, k_pre, k, n_tok);
  if (phase_ == KvPhase::prefill) {
    dense_k_[layer].insert(dense_k_[layer].end(), k, k + n_tok * w);
    dense_v_[layer].insert(dense_v_[layer].end(), v, v + n_tok * w);
  }
  for (int i = 0; i < n_tok; ++i) {
    const int64_t pos = n0 + i;
    if (pos < p_.sink) {
      sink_k_[layer].insert(sink_k_[layer].end(), k + i * w, k + (i + 1) * w);
      sink_v_[layer].insert(sink_v_[layer].end(), v + i * w, v + (i + 1) * w);
      round_resident(sink_k_[layer].data() + pos * w, w);
      round_resident(sink_v_[layer].data() + pos * w, w);
    }
    if (p_.local > 0) {
      if (pos < p_.local) {
        ring_k_[layer].resize(size_t(pos + 1) * size_t(w));
        ring_v_[layer].resize(size_t(pos + 1) * size_t(w));
      }
      float* rk = ring_k_[layer].data() + (pos % p_.local) * w;
      float* rv = ring_v_[layer].data() + (pos % p_.local) * w;
      std::copy(k + i * w, k + (i + 1) * w, rk);
      std::copy(v + i * w, v + (i + 1) * w, rv);
      round_resident(rk, w);
      round_resident(rv, w);
    }
  }
  n_tok_[layer] += n_tok;
}

void TieredKvStore::set_phase(KvPhase phase) {
  if (phase == phase_) return;
  KVT_CHECK(phase == KvPhase::decode, "kv store: cannot return to prefill after decode");
  n_prompt_ = n_tok_[0];
  for (int l = 1; l < g_.n_layer; ++l)
    KVT_CHECK(n_tok_[l] == n_prompt_, "kv store: layer {} holds {} tokens, layer 0 holds {}", l,
              n_tok_[l], n_prompt_);
  budget_ = budget_tokens(p_, n_prompt_);
  index_.finish_prompt();
  if (p_.index == IndexKind::shadowkv) {
    const int H = g_.n_kv_head, D = g_.head_dim, c = index_.chunk();
    for (int l = 0; l < g_.n_layer; ++l) {
      out_k_[l].resize(H);
      out_v_[l].resize(H);
      for (int h = 0; h < H; ++h) {
        outliers_[l][h] = index_.outliers(l, h);
        for (int64_t ch : outliers_[l][h])
          for (int64_t t = ch * c; t < (ch + 1) * c; ++t) {
            const float* kr = dense_k_[l].data() + (t * H + h) * D;
            const float* vr = dense_v_[l].data() + (t * H + h) * D;
            out_k_[l][h].insert(out_k_[l][h].end(), kr, kr + D);
            out_v_[l][h].insert(out_v_[l][h].end(), vr, vr + D);
          }
        round_resident(out_k_[l][h].data(), int64_t(out_k_[l][h].size()));
        round_resident(out_v_[l][h].data(), int64_t(out_v_[l][h].size()));
      }
    }
  }
  for (int l = 0; l < g_.n_layer; ++l) {
    std::vector<float>().swap(dense_k_[l]);
    std::vector<float>().swap(dense_v_[l]);
  }
  phase_ = phase;
}

bool TieredKvStore::is_resident(int layer, int kv_head, int64_t t) const {
  if (t < int64_t(sink_k_[layer].size()) / width_) return true;
  if (p_.local > 0 && t >= n_tok_[layer] - p_.local) return true;
  const auto& out = outliers_[layer][kv_head];
  return !out.empty() && std::binary_search(out.begin(), out.end(), t / index_.chunk());
}

const float* TieredKvStore::resident_row(int layer, int kv_head, int64_t t, bool key) const {
  const int D = g_.head_dim;
  const int64_t off = int64_t(kv_head) * D;
  if (t < int64_t(sink_k_[layer].size()) / width_)
    return (key ? sink_k_ : sink_v_)[layer].data() + t * width_ + off;
  if (p_.local > 0 && t >= n_tok_[layer] - p_.local)
    return (key ? ring_k_ : ring_v_)[layer].data() + (t % p_.local) * width_ + off;
  const auto& out = outliers_[layer][kv_head];
  const int c = index_.chunk();
  const int64_t i = std::lower_bound(out.begin(), out.end(), t / c) - out.begin();
  const int64_t row = i * c + t % c;
  return (key ? out_k_ : out_v_)[layer][kv_head].data() + row * D;
}

void TieredKvStore::attend_one(int layer, const float* q, float scale, int64_t n_visible,
                               float* out, Selection* sel_out) {
  const int H = g_.n_kv_head, D = g_.head_dim, QH = g_.n_head;
  const int c = index_.chunk();
  // reselect=N: the index is scored and the top-k picked on every Nth query
  // only (and when none was picked yet, or the cache was rewound); the
  // queries between attend to the tokens of that pick that were not
  // resident then, with what is resident now.
  if (picked_at_.empty()) {
    picked_at_.assign(size_t(g_.n_layer), 0);
    kept_.assign(size_t(g_.n_layer), std::vector<std::vector<int64_t>>(size_t(H)));
  }
  int64_t& picked_at = picked_at_[size_t(layer)];
  const bool fresh =
      p_.reselect <= 1 || picked_at <= 0 || n_visible <= picked_at || n_visible - picked_at >= p_.reselect;
  // 1. score the key index (chunks fully visible to this query); rescore=D
  //    between picks: the candidates only
  const int64_t n_chunk = std::min(index_.n_chunks(layer), n_visible / c);
  std::vector<float> scores(size_t(H) * n_chunk);  // [n_kv_head, n_chunk]
  const bool rescore = !fresh && p_.rescore > 0;
  if (fresh || rescore) index_.score(layer, q, scale, n_chunk, scores.data(), rescore ? &kept_[size_t(layer)] : nullptr);
  // 2. top-k ∪ sinks ∪ window ∪ pending ∪ outliers
  Selection local_sel;
  Selection& sel = sel_out ? *sel_out : local_sel;
  SelectParams sp;
  sp.n_visible = n_visible;
  sp.chunk = c;
  sp.n_chunk = n_chunk;
  sp.budget = fresh ? budget_ : 0;
  if (rescore) sp.budget = std::min<int64_t>(budget_, int64_t(kept_[size_t(layer)][0].size()));
  sp.sink = p_.sink;
  sp.local = p_.local;
  select_tokens(sp, H, scores.data(),
                p_.index == IndexKind::shadowkv ? &outliers_[layer] : nullptr, &sel);
  if (p_.reselect > 1 && p_.rescore > 0) {
    // The candidates of a fresh pick (chunk = 1: its tokens in [sink, win_lo)):
    // runs of D + 1 tokens, each starting at its pick or right after the run
    // before, pushed left where they would reach win_lo; or every token there.
    if (fresh) {
      const int64_t lo = std::min<int64_t>(p_.sink, n_chunk);
      const int64_t hi = std::max(lo, std::min(n_chunk, n_visible - p_.local));
      const int64_t run = p_.rescore + 1;
      for (int h = 0; h < H; ++h) {
        std::vector<int64_t> pick;
        for (int64_t i = sel.indptr[h]; i < sel.indptr[h + 1]; ++i)
          if (sel.indices[i] >= lo && sel.indices[i] < hi) pick.push_back(sel.indices[i]);
        std::vector<int64_t>& cand = kept_[size_t(layer)][size_t(h)];
        cand.clear();
        const int64_t k = int64_t(pick.size());
        if (k * run >= hi - lo) {
          for (int64_t t = lo; t < hi; ++t) cand.push_back(t);
          continue;
        }
        int64_t end = lo;
        for (int64_t i = 0; i < k; ++i) {
          const int64_t start = std::max(pick[size_t(i)], end);
          for (int64_t j = 0; j < run; ++j) cand.push_back(std::min(start, hi - (k - i) * run) + j);
          end = start + run;
        }
      }
      picked_at = n_visible;
    }
  } else if (p_.reselect > 1) {
    // Resident now: the sinks, the window (the last `local` tokens and those not indexed yet), outliers.
    const int64_t win_lo =
        std::min(n_visible, std::max<int64_t>(p_.sink, n_visible - std::max<int64_t>(p_.local, n_visible - n_chunk * c)));
    Selection merged;
    merged.indptr.assign(size_t(H) + 1, 0);
    for (int h = 0; h < H; ++h) {
      std::vector<int64_t>& kept = kept_[size_t(layer)][size_t(h)];
      const auto* b = sel.indices.data() + sel.indptr[h];
      const auto* e = sel.indices.data() + sel.indptr[h + 1];
      if (fresh) {
        const auto& out = outliers_[layer][h];
        kept.clear();
        for (const auto* t = b; t != e; ++t)
          if (*t >= p_.sink && *t < win_lo && !std::binary_search(out.begin(), out.end(), *t / c)) kept.push_back(*t);
        merged.indices.insert(merged.indices.end(), b, e);
      } else {
        std::merge(b, e, kept.begin(), kept.end(), std::back_inserter(merged.indices));
      }
      merged.indptr[size_t(h) + 1] = int64_t(merged.indices.size());
    }
    sel = std::move(merged);
    if (fresh) picked_at = n_visible;
  }
  // 3. split into resident rows and host rows
  std::vector<int64_t> res_ptr(H + 1, 0), host_ptr(H + 1, 0);
  std::vector<int64_t> res_tok, host_tok;  // per head, concatenated
  for (int h = 0; h < H; ++h) {
    for (int64_t i = sel.indptr[h]; i < sel.indptr[h + 1]; ++i) {
      const int64_t t = sel.indices[i];
      (is_resident(layer, h, t) ? res_tok : host_tok).push_back(t);
    }
    res_ptr[h + 1] = int64_t(res_tok.size());
    host_ptr[h + 1] = int64_t(host_tok.size());
  }
  // 4. gather: resident rows are copied; host rows are decoded once per token
  // (a record spans all KV heads) — keys rebuilt from the SVD where shadowkv has them.
  std::vector<float> res_k(res_tok.size() * D), res_v(res_tok.size() * D);  // [n_res, head_dim]
  for (int h = 0; h < H; ++h)
    for (int64_t i = res_ptr[h]; i < res_ptr[h + 1]; ++i) {
      const float* kr = resident_row(layer, h, res_tok[i], true);
      const float* vr = resident_row(layer, h, res_tok[i], false);
      std::copy(kr, kr + D, res_k.data() + i * D);
      std::copy(vr, vr + D, res_v.data() + i * D);
    }
  std::vector<int64_t> uniq(host_tok);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  std::vector<float> uk(uniq.size() * width_), uv(uniq.size() * width_);  // [n_uniq, H, D]
  const int64_t n_svd = index_.n_svd_tokens(layer);
  const int64_t split = std::lower_bound(uniq.begin(), uniq.end(), n_svd) - uniq.begin();
  host_.fetch(layer, uniq.data(), int64_t(uniq.size()), nullptr, uv.data());
  if (split > 0) index_.reconstruct_keys(layer, uniq.data(), split, uk.data());
  if (split < int64_t(uniq.size()))
    host_.fetch(layer, uniq.data() + split, int64_t(uniq.size()) - split,
                uk.data() + split * width_, nullptr);
  std::vector<float> host_k(host_tok.size() * D), host_v(host_tok.size() * D);  // [n_host, D]
  for (int h = 0; h < H; ++h)
    for (int64_t i = host_ptr[h]; i < host_ptr[h + 1]; ++i) {
      const int64_t u = std::lower_bound(uniq.begin(), uniq.end(), host_tok[i]) - uniq.begin();
      std::copy(uk.data() + u * width_ + h * D, uk.data() + u * width_ + (h + 1) * D,
                host_k.data() + i * D);
      std::copy(uv.data() + u * width_ + h * D, uv.data() + u * width_ + (h + 1) * D,
                host_v.data() + i * D);
    }
  // 5. attend to each part, merge by log-sum-exp
  const AttentionParams ap{g_.n_head, g_.n_kv_head, g_.head_dim, scale};
  std::vector<float> lse_a(QH), lse_b(QH), out_b(size_t(QH) * D);
  attention_gathered(ap, q, res_k.data(), res_v.data(), res_ptr.data(), out, lse_a.data());
  attention_gathered(ap, q, host_k.data(), host_v.data(), host_ptr.data(), out_b.data(),
                     lse_b.data());
  merge_attention(QH, D, out, lse_a.data(), out_b.data(), lse_b.data());
  stats_.n_queries += 1;
  stats_.n_selected += int64_t(sel.indices.size());
  stats_.n_host_rows += int64_t(uniq.size());
  if (prev_host_.empty()) prev_host_.assign(size_t(g_.n_layer), std::vector<std::vector<int64_t>>(size_t(H)));
  for (int h = 0; h < H; ++h) {
    std::vector<int64_t> now(host_tok.begin() + host_ptr[h], host_tok.begin() + host_ptr[h + 1]);
    std::sort(now.begin(), now.end());
    std::vector<int64_t>& prev = prev_host_[size_t(layer)][size_t(h)];
    std::vector<int64_t> both;
    std::set_intersection(now.begin(), now.end(), prev.begin(), prev.end(), std::back_inserter(both));
    stats_.n_host_head_rows += int64_t(now.size());
    stats_.n_host_reused += int64_t(both.size());
    prev = std::move(now);
  }
}

void TieredKvStore::attend(int layer, const float* q, int n_tok, float scale, float* out) {
  const int64_t n = n_tok_[layer];
  KVT_CHECK(n_tok >= 1 && n_tok <= n, "kv store: attend to {} queries with {} tokens held",
            n_tok, n);
  const AttentionParams ap{g_.n_head, g_.n_kv_head, g_.head_dim, scale};
  if (phase_ == KvPhase::prefill) {
    attention_causal(ap, q, n_tok, dense_k_[layer].data(), dense_v_[layer].data(), n, out);
    return;
  }
  const int64_t qstride = int64_t(g_.n_head) * g_.head_dim;
  for (int i = 0; i < n_tok; ++i)
    attend_one(layer, q + i * qstride, scale, n - n_tok + i + 1, out + i * qstride, nullptr);
}

KvMemory TieredKvStore::memory() const {
  KvFootprint f = kv_footprint(p_, g_, 0);
  KvMemory m;
  m.gpu_bytes_per_token = f.gpu_bytes_per_token;
  m.host_bytes_per_token = f.host_bytes_per_token;
  int64_t resident_rows = 0;  // bf16 K and V rows of width_ (outliers: of head_dim)
  for (int l = 0; l < g_.n_layer; ++l) {
    resident_rows += int64_t(sink_k_[l].size()) / width_ + std::min<int64_t>(p_.local, n_tok_[l]);
    for (const auto& o : out_k_[l]) resident_rows += int64_t(o.size()) / g_.n_kv_head;
  }
  m.gpu_bytes = index_.gpu_bytes() + resident_rows * width_ * 2 * 2;
  m.host_bytes = host_.bytes();
  return m;
}

std::string TieredKvStore::describe() const { return to_string(p_); }

}  // namespace kvtier
