#include <algorithm>
#include <cstring>
#include <cmath>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/index_score/index_score.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {

int64_t index_record_bytes(IndexElt elt, int head_dim) {
  switch (elt) {
    case IndexElt::higgs2:
      KVT_CHECK(head_dim == 128, "index_score: higgs2 landmarks need head_dim 128, got {}", head_dim);
      return kHiggs2RecordBytes;
    case IndexElt::bf16: return 2 * int64_t(head_dim);
    case IndexElt::fp8: return head_dim;
  }
  fail("index_score: unknown index element type {}", int(elt));
}

void index_score_ref(IndexElt elt, const IndexScoreParams& p, const float* q, const uint8_t* index,
                     const float* grid, float* scores) {
  const int64_t rec = index_record_bytes(elt, p.head_dim);
  KVT_CHECK(p.n_q >= 1 && p.n_q <= 4, "index_score: n_q {} not in 1..4", p.n_q);
  KVT_CHECK(!p.per_query || elt == IndexElt::higgs2, "index_score: per_query is for higgs2 landmarks");
  const bool planar = elt == IndexElt::higgs2;
  KVT_CHECK(!planar || (p.scale_offset >= 32 * (p.tok_offset + p.n_tok) &&
                        p.scale_offset + 2 * (p.tok_offset + p.n_tok) <= p.row_stride),
            "index_score: higgs2 scale plane at {} overlaps the codes or the next row (row_stride {})",
            p.scale_offset, p.row_stride);
  for (int64_t r = 0; r < int64_t(p.n_seq) * p.n_kv_head; ++r) {
    for (int64_t t = 0; t < p.n_tok; ++t) {
      const uint8_t* row = index + r * p.row_stride;
      const uint8_t* e = row + (p.tok_offset + t) * (planar ? 32 : rec);
      double best = -INFINITY;
      for (int j = 0; j < p.n_q; ++j) {
        const float* qv = q + (r * p.n_q + j) * p.head_dim;
        double s = 0;
        if (elt == IndexElt::higgs2) {
          uint16_t scale_bits;
          std::memcpy(&scale_bits, row + p.scale_offset + 2 * (p.tok_offset + t), 2);
          for (int c = 0; c < 32; ++c)
            for (int i = 0; i < 4; ++i) s += double(qv[4 * c + i]) * grid[e[c] * 4 + i];
          s *= bf16_to_f32(scale_bits);
        } else if (elt == IndexElt::bf16) {
          for (int d = 0; d < p.head_dim; ++d) {
            uint16_t b;
            std::memcpy(&b, e + 2 * d, 2);
            s += double(qv[d]) * bf16_to_f32(b);
          }
        } else {
          for (int d = 0; d < p.head_dim; ++d) s += double(qv[d]) * e4m3_to_f32(e[d]);
        }
        best = std::max(best, s);
        if (p.per_query) scores[(r * p.n_q + j) * p.n_tok + t] = float(s);
      }
      if (!p.per_query) scores[r * p.n_tok + t] = float(best);
    }
  }
}

void index_query_ref(const float* q, int n_seq, int n_head, int n_kv_head, int head_dim,
                     bool mean_group, bool rotate, const float* signs, float* out) {
  KVT_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "index_query: n_head {} not a multiple of n_kv_head {}",
            n_head, n_kv_head);
  const int group = n_head / n_kv_head;
  const int n_q = mean_group ? 1 : group;
  std::vector<float> v(static_cast<size_t>(head_dim));
  for (int s = 0; s < n_seq; ++s) {
    for (int g = 0; g < n_kv_head; ++g) {
      for (int j = 0; j < n_q; ++j) {
        for (int d = 0; d < head_dim; ++d) {
          double acc = 0;
          if (mean_group) {
            for (int h = 0; h < group; ++h) acc += q[((int64_t(s) * n_head) + g * group + h) * head_dim + d];
            acc /= group;
          } else {
            acc = q[((int64_t(s) * n_head) + g * group + j) * head_dim + d];
          }
          v[size_t(d)] = float(acc) * (rotate && signs ? signs[d] : 1.0f);
        }
        if (rotate) hadamard_transform_ref(v.data(), head_dim);
        std::copy(v.begin(), v.end(), out + ((int64_t(s) * n_kv_head + g) * n_q + j) * head_dim);
      }
    }
  }
}

void index_gqa_softmax_max_ref(const float* raw, int64_t n_rows, int n_q, int64_t n_tok, float scale,
                               int64_t sel_offset, int64_t n_sel, float* out) {
  KVT_CHECK(n_q >= 1 && sel_offset >= 0 && n_sel >= 0 && sel_offset + n_sel <= n_tok,
            "index_gqa_softmax_max: n_q {} tokens [{}, +{}) of {}", n_q, sel_offset, n_sel, n_tok);
  std::vector<double> lse(static_cast<size_t>(n_q));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int j = 0; j < n_q; ++j) {
      const float* x = raw + (r * n_q + j) * n_tok;
      double mx = -INFINITY, sum = 0;
      for (int64_t t = 0; t < n_tok; ++t) mx = std::max(mx, double(scale) * x[t]);
      for (int64_t t = 0; t < n_tok; ++t) sum += std::exp(double(scale) * x[t] - mx);
      lse[size_t(j)] = mx + std::log(sum);
    }
    for (int64_t i = 0; i < n_sel; ++i) {
      double best = -INFINITY;
      for (int j = 0; j < n_q; ++j)
        best = std::max(best, double(scale) * raw[(r * n_q + j) * n_tok + sel_offset + i] - lse[size_t(j)]);
      out[r * n_sel + i] = float(best);
    }
  }
}

}  // namespace kvtier
