// score_rows on the CPU: long rows are scored in blocks of chunks spread
// over the threads; every block must score exactly what one pass over the
// whole row scores (the quantizer's score(), times the scale). gqa_rows on
// the CPU (vector max, sums and e^x, blocks over the threads) against the
// formula in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/index_score/index_rows.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

TEST(ScoreRowsCpu, BlocksOfALongRowScoreAsTheWholeRow) {
  const int D = 64, H = 3;
  const int64_t n = 5000;  // several blocks of ≥ 1024 chunks per row
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const char* text : {"higgs2:g64", "int4:g32"}) {
    for (int n_q : {1, 3}) {
      SCOPED_TRACE(std::string(text) + " n_q " + std::to_string(n_q));
      RecordFormat f;
      f.spec = parse_quant_spec(text);
      f.dim = D;
      f.bytes = int64_t(bytes_per_vector(f.spec, D));
      std::vector<std::vector<uint8_t>> planes(H, std::vector<uint8_t>(size_t(n * f.bytes)));
      std::vector<const uint8_t*> p0(H);
      for (int h = 0; h < H; ++h) {
        std::vector<float> x(size_t(n) * D);
        for (float& v : x) v = nd(rng);
        quantize(f.spec, x.data(), n, D, planes[size_t(h)].data());
        p0[size_t(h)] = planes[size_t(h)].data();
      }
      std::vector<float> q(size_t(H) * n_q * D);
      for (float& v : q) v = nd(rng);
      StepRanges r;
      r.n = r.n_chunk = n;
      r.c_lo = 7, r.c_hi = n - 3;  // candidates only: an offset start, a short end
      ScoreRowsParams p;
      p.n_seq = 1, p.n_kv_head = H, p.head_dim = D, p.n_q = n_q;
      p.fmt = f;
      p.candidates_only = true;
      p.scale = 0.125f;
      p.out_stride = n;
      std::vector<float> got(size_t(H) * n_q * n, -1.f);
      score_rows_cpu(p, q.data(), p0.data(), nullptr, &r, got.data());
      const int64_t m = r.c_hi - r.c_lo;
      for (int h = 0; h < H; ++h) {
        std::vector<float> want(size_t(n_q) * m);
        ScoreParams sp;
        sp.q = q.data() + size_t(h) * n_q * D, sp.n_q = n_q, sp.dim = D;
        sp.codes = p0[size_t(h)] + r.c_lo * f.bytes, sp.n_vec = m, sp.scores = want.data();
        score(f.spec, sp);
        for (int j = 0; j < n_q; ++j)
          for (int64_t i = 0; i < m; ++i)
            ASSERT_EQ(got[(size_t(h) * n_q + j) * n + i], want[size_t(j) * m + i] * p.scale)
                << "head " << h << " query " << j << " chunk " << i;
      }
    }
  }
}

TEST(GqaRowsCpu, TakesEachCandidatesBestQueryLogSoftmax) {
  // out[c] = max_j (raw_j[c] − log Σ_i e^raw_j[i]) over the row's chunks.
  const int H = 2, n_q = 3, n_seq = 2;
  const std::vector<int64_t> n_chunks{5003, 13};  // blocks of 2048 and 8-lane tails; a short row
  const int64_t stride = 5003;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<float> raw(size_t(n_seq) * H * n_q * stride, NAN);
  std::vector<StepRanges> ranges(n_seq);
  for (int s = 0; s < n_seq; ++s) {
    StepRanges& r = ranges[size_t(s)];
    r.n = r.n_chunk = n_chunks[size_t(s)];
    r.c_lo = 3, r.c_hi = r.n_chunk - 2;
    for (int64_t row = s * H; row < (s + 1) * H; ++row)
      for (int j = 0; j < n_q; ++j)
        for (int64_t i = 0; i < r.n_chunk; ++i) raw[size_t((row * n_q + j) * stride + i)] = nd(rng);
  }
  for (int64_t i = 0; i < 40; ++i) raw[size_t(i * 7)] = -INFINITY;  // masked chunks
  GqaRowsParams p;
  p.n_seq = n_seq, p.n_kv_head = H, p.n_q = n_q;
  p.in_stride = p.out_stride = stride;
  std::vector<float> got(size_t(n_seq) * H * stride, 0.f);
  gqa_rows_cpu(p, raw.data(), ranges.data(), got.data());
  for (int64_t row = 0; row < int64_t(n_seq) * H; ++row) {
    const StepRanges& r = ranges[size_t(row / H)];
    std::vector<double> lse(n_q);
    for (int j = 0; j < n_q; ++j) {
      const float* x = raw.data() + (row * n_q + j) * stride;
      double m = -INFINITY, sum = 0;
      for (int64_t i = 0; i < r.n_chunk; ++i) m = std::max(m, double(x[i]));
      for (int64_t i = 0; i < r.n_chunk; ++i) sum += std::exp(double(x[i]) - m);
      lse[size_t(j)] = m + std::log(sum);
    }
    for (int64_t i = 0; i < r.c_hi - r.c_lo; ++i) {
      double want = -INFINITY;
      for (int j = 0; j < n_q; ++j)
        want = std::max(want, double(raw[size_t((row * n_q + j) * stride + r.c_lo + i)]) - lse[size_t(j)]);
      ASSERT_NEAR(got[size_t(row * stride + i)], want, 1e-5 * (1 + std::abs(want))) << row << " " << i;
    }
  }
}

}  // namespace
}  // namespace kvtier
