#include "kv/analysis.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/status.h"
#include "kv/dense_kv.h"
#include "kv/decode_batch.h"
#include "kv/policy.h"
#include "kv/tiered_kv.h"
#include "ops/index_score/index_rows.h"

namespace kvtier {

HeadMetrics PolicyAnalysis::total() const {
  HeadMetrics t;
  for (const HeadMetrics& h : by_head) {
    t.token_recall += h.token_recall;
    t.mass_recall += h.mass_recall;
    t.rel_error += h.rel_error;
    t.n += h.n;
  }
  return t;
}

HeadMetrics PolicyAnalysis::layer(int l, int n_head) const {
  HeadMetrics t;
  for (int h = 0; h < n_head; ++h) {
    const HeadMetrics& m = by_head[size_t(l) * n_head + h];
    t.token_recall += m.token_recall;
    t.mass_recall += m.mass_recall;
    t.rel_error += m.rel_error;
    t.n += m.n;
  }
  return t;
}

namespace {

// True scaled scores: raw [n_head, n] f32.
void exact_scores(const KvGeometry& g, const float* q, float scale, const float* k, int64_t n,
                  float* raw) {
  const int H = g.n_kv_head, D = g.head_dim, group = g.n_head / g.n_kv_head;
  for (int h = 0; h < g.n_head; ++h) {
    const float* qh = q + size_t(h) * D;
    const int kv = h / group;
    for (int64_t t = 0; t < n; ++t) {
      const float* kt = k + (t * H + kv) * D;
      double s = 0;
      for (int d = 0; d < D; ++d) s += double(qh[d]) * kt[d];
      raw[size_t(h) * n + t] = float(s * scale);
    }
  }
}

}  // namespace

AttentionStats sum_attention(const AttentionStats* by_head, int n_head) {
  AttentionStats t;
  for (int h = 0; h < n_head; ++h) {
    t.entropy += by_head[h].entropy;
    t.norm_entropy += by_head[h].norm_entropy;
    t.top_mass += by_head[h].top_mass;
    t.n += by_head[h].n;
  }
  return t;
}

void accumulate_attention(const KvGeometry& g, const float* q, float scale, const float* k,
                          int64_t n, double top_fraction, AttentionStats* by_head) {
  KVT_CHECK(top_fraction > 0 && top_fraction <= 1, "attention statistics: top fraction {} outside (0, 1]",
            top_fraction);
  std::vector<float> raw(size_t(g.n_head) * n);
  exact_scores(g, q, scale, k, n, raw.data());
  const int64_t n_top = std::max<int64_t>(1, int64_t(std::ceil(top_fraction * double(n))));
  std::vector<double> p(n);
  for (int h = 0; h < g.n_head; ++h) {
    const float* r = raw.data() + size_t(h) * n;
    const float mx = *std::max_element(r, r + n);
    double z = 0;
    for (int64_t t = 0; t < n; ++t) z += p[t] = std::exp(double(r[t]) - mx);
    double ent = 0;
    for (int64_t t = 0; t < n; ++t) {
      p[t] /= z;
      if (p[t] > 0) ent -= p[t] * std::log(p[t]);
    }
    std::nth_element(p.begin(), p.begin() + (n_top - 1), p.end(), std::greater<double>());
    double top = 0;
    for (int64_t t = 0; t < n_top; ++t) top += p[t];
    AttentionStats& s = by_head[h];
    s.entropy += ent;
    s.norm_entropy += n > 1 ? ent / std::log(double(n)) : 0.0;
    s.top_mass += std::min(1.0, top);
    s.n += 1;
  }
}

void oracle_selection(const KvGeometry& g, const PolicyConfig& p, int64_t budget,
                      const float* q, float scale, const float* k, int64_t n_visible,
                      Selection* out) {
  std::vector<float> raw(size_t(g.n_head) * n_visible), agg(size_t(g.n_kv_head) * n_visible);
  exact_scores(g, q, scale, k, n_visible, raw.data());
  aggregate_gqa(p.gqa, g.n_head, g.n_kv_head, n_visible, raw.data(), agg.data());
  SelectParams sp;
  sp.n_visible = n_visible;
  sp.chunk = 1;
  sp.n_chunk = n_visible;
  sp.budget = budget;
  sp.sink = p.sink;
  sp.local = p.local;
  select_tokens(sp, g.n_kv_head, agg.data(), nullptr, out);
}

void accumulate_metrics(const KvGeometry& g, const float* q, float scale, const float* k,
                        int64_t n, const float* out_dense, const float* out_policy,
                        const Selection& sel, const Selection& oracle, HeadMetrics* by_head) {
  const int D = g.head_dim, group = g.n_head / g.n_kv_head;
  std::vector<float> raw(size_t(g.n_head) * n);
  exact_scores(g, q, scale, k, n, raw.data());
  std::vector<uint8_t> in_sel(n), in_orc(n);
  for (int kv = 0; kv < g.n_kv_head; ++kv) {
    std::fill(in_sel.begin(), in_sel.end(), 0);
    std::fill(in_orc.begin(), in_orc.end(), 0);
    for (int64_t i = sel.indptr[kv]; i < sel.indptr[kv + 1]; ++i) in_sel[sel.indices[i]] = 1;
    int64_t n_orc = 0, n_hit = 0;
    for (int64_t i = oracle.indptr[kv]; i < oracle.indptr[kv + 1]; ++i) {
      in_orc[oracle.indices[i]] = 1;
      ++n_orc;
      n_hit += in_sel[oracle.indices[i]];
    }
    const double token_recall = n_orc ? double(n_hit) / double(n_orc) : 1.0;
    for (int j = 0; j < group; ++j) {
      const int h = kv * group + j;
      const float* r = raw.data() + size_t(h) * n;
      const float mx = *std::max_element(r, r + n);
      double z = 0, m_sel = 0, m_orc = 0;
      for (int64_t t = 0; t < n; ++t) {
        const double e = std::exp(double(r[t]) - mx);
        z += e;
        if (in_sel[t]) m_sel += e;
        if (in_orc[t]) m_orc += e;
      }
      double err = 0, nrm = 0;
      for (int d = 0; d < D; ++d) {
        const double a = out_dense[size_t(h) * D + d], b = out_policy[size_t(h) * D + d];
        err += (a - b) * (a - b);
        nrm += a * a;
      }
      HeadMetrics& m = by_head[h];
      m.token_recall += token_recall;
      m.mass_recall += m_orc > 0 ? m_sel / m_orc : 1.0;
      m.rel_error += nrm > 0 ? std::sqrt(err / nrm) : std::sqrt(err);
      m.n += 1;
    }
  }
}

namespace {

// Every token a tiered cache's last decode query of `layer` attended, per KV
// head: sinks, the window (and not-yet-indexed tokens), outliers, and the
// tokens its index selected.
Selection attended(TieredKv& t, int layer, int64_t n) {
  const KvPlan& k = t.plan();
  const int H = k.geometry.n_kv_head;
  StepPlanParams sp;
  sp.n_seq = 1;
  sp.chunk = k.chunk;
  sp.unit = k.unit;
  sp.sink = k.sink;
  sp.local = k.local;
  sp.ring = k.ring;
  sp.kmax = t.batch().kmax_chunks();
  const int32_t budget = t.batch().kmax_chunks();
  StepRanges r;
  step_plan_rows_cpu(sp, &n, &budget, nullptr, &r);
  const int32_t* sel = t.batch().last_selection();
  const int width = t.batch().selection_width();
  const int n_out = t.seq().outlier_tokens() / k.chunk, max_out = k.n_outlier_tok / k.chunk;
  const int32_t* out_ids = n_out > 0 ? t.seq().layer(layer).outliers.data<int32_t>() : nullptr;
  Selection s;
  s.indptr.assign(size_t(H) + 1, 0);
  std::vector<int64_t> row;
  for (int h = 0; h < H; ++h) {
    row.clear();
    for (int64_t i = 0; i < std::min<int64_t>(n, k.sink); ++i) row.push_back(i);
    for (int64_t i = r.win_lo; i < n; ++i) row.push_back(i);
    for (int i = 0; i < n_out; ++i) {
      const int64_t ch = out_ids[size_t(h) * max_out + (max_out - n_out) + i];
      for (int j = 0; j < k.chunk; ++j) row.push_back(ch * k.chunk + j);
    }
    const bool chunk_ids = width == t.batch().kmax_chunks() && k.chunk > 1;
    for (int i = 0; i < width; ++i) {
      const int32_t v = sel[int64_t(h) * width + i];
      if (v < 0) continue;
      if (chunk_ids)
        for (int j = 0; j < k.chunk; ++j) row.push_back(int64_t(v) * k.chunk + j);
      else
        row.push_back(v);
    }
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    s.indices.insert(s.indices.end(), row.begin(), row.end());
    s.indptr[size_t(h) + 1] = int64_t(s.indices.size());
  }
  return s;
}

}  // namespace

AnalysisKv::AnalysisKv(const std::string& policies, const KvGeometry& g, const Device& cpu)
    : g_(g), dense_plan_(plan_kv(parse_policy("full,kv=f32"), g, DeviceKind::cpu)) {
  KVT_CHECK(cpu.kind() == DeviceKind::cpu, "kv analysis runs on the CPU (--device cpu)");
  dense_ = make_kv_cache(dense_plan_, cpu);
  attention_.assign(size_t(g.n_layer) * g.n_head, AttentionStats{});
  size_t start = 0;
  while (!policies.empty() && start <= policies.size()) {
    size_t bar = policies.find('|', start);
    std::string one = policies.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    KVT_CHECK(!one.empty(), "kv analysis '{}': empty policy between '|'", policies);
    PolicyConfig p = parse_policy(one);
    KVT_CHECK(p.index != IndexKind::none,
              "kv analysis: policy '{}' is dense; the analysis compares sparse policies with "
              "the oracle (dense attention is the reference already)", one);
    stores_.push_back(make_kv_cache(plan_kv(p, g, DeviceKind::cpu), cpu));
    PolicyAnalysis a;
    a.policy = one;
    a.resolved = to_string(p);
    a.by_head.assign(size_t(g.n_layer) * g.n_head, HeadMetrics{});
    results_.push_back(std::move(a));
    distinct_.push_back({0, 0});
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
}

AnalysisKv::~AnalysisKv() = default;

void AnalysisKv::reserve(int64_t n) {
  dense_->reserve(n);
  for (auto& s : stores_) s->reserve(n);
}

void AnalysisKv::append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) {
  dense_->append(layer, k_pre, k, v, tok_stride, n_tok);
  for (auto& s : stores_) s->append(layer, k_pre, k, v, tok_stride, n_tok);
}

void AnalysisKv::begin_step(int n_tok) {
  dense_->begin_step(n_tok);
  for (auto& s : stores_) s->begin_step(n_tok);
}

void AnalysisKv::start_decode() {
  decoding_ = true;
  dense_->start_decode();
  for (auto& s : stores_) s->start_decode();
}

const KvPlan& AnalysisKv::policy_plan(size_t i) const { return stores_[i]->plan(); }
int64_t AnalysisKv::budget_tokens(size_t i) const {
  return static_cast<TieredKv&>(*stores_[i]).seq().budget_tokens();
}
KvStats AnalysisKv::policy_stats(size_t i) const { return stores_[i]->stats(); }

void AnalysisKv::attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) {
  dense_->attend(layer, q, q_stride, n_tok, scale, out);
  if (!decoding_) return;
  KVT_CHECK(n_tok == 1, "kv analysis: decode queries come one at a time");
  const int64_t qs = int64_t(g_.n_head) * g_.head_dim;
  const int64_t n = dense_->n_tokens(layer);
  const float* qf = static_cast<const float*>(q);
  const auto& dense = static_cast<const DenseKv&>(*dense_);
  KVT_CHECK(dense.element() == KvElt::f32, "kv analysis: the reference cache must hold f32 rows");
  const float* keys = static_cast<const float*>(dense.keys(layer));
  std::vector<float> out_p(static_cast<size_t>(qs));
  Selection orc;
  accumulate_attention(g_, qf, scale, keys, n, k_top_mass_fraction, attention_.data() + size_t(layer) * g_.n_head);
  for (size_t j = 0; j < stores_.size(); ++j) {
    auto& t = static_cast<TieredKv&>(*stores_[j]);
    t.attend(layer, q, q_stride, 1, scale, out_p.data());
    const Selection sel = attended(t, layer, n);
    oracle_selection(g_, t.plan().policy, t.seq().budget_tokens(), qf, scale, keys, n, &orc);
    accumulate_metrics(g_, qf, scale, keys, n, static_cast<const float*>(out), out_p.data(), sel, orc,
                       results_[j].by_head.data() + size_t(layer) * g_.n_head);
    // Distinct tokens among the rows read from the host tier (the index's picks).
    const int32_t* s = t.batch().last_selection();
    const int w = t.batch().selection_width();
    std::vector<int32_t> toks;
    for (int i = 0; i < g_.n_kv_head * w; ++i)
      if (s[i] >= 0) toks.push_back(s[i]);
    distinct_[j].second += int64_t(toks.size());
    std::sort(toks.begin(), toks.end());
    distinct_[j].first += int64_t(std::unique(toks.begin(), toks.end()) - toks.begin());
  }
  if (layer == 0) ++n_queries_;
}

}  // namespace kvtier
