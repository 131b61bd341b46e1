// score_rows on the CPU: long rows are scored in blocks of chunks spread
// over the threads; every block must score exactly what one pass over the
// whole row scores (the quantizer's score(), times the scale). gqa_rows on
// the CPU (vector max, sums and e^x, blocks over the threads) against the
// formula in double precision. topk_rows on the CPU (a sampled bound, then
// an exact selection among the candidates) equals the reference top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/index_score/index_rows.h"
#include "ops/quant/quant_format.h"
#include "ops/topk/topk.h"

namespace kvtier {
namespace {

TEST(ScoreRowsCpu, BlocksOfALongRowScoreAsTheWholeRow) {
  const int D = 64, H = 3;
  const int64_t n = 5000;  // several blocks of ≥ 1024 chunks per row
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const char* text : {"higgs2:g64", "int4:g32", "higgs:U4:g64"}) {
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


TEST(TopkRowsCpu, EqualsTheReferenceOnEveryKindOfRow) {
  // Rows long enough for the sampled bound and short ones; ties; −∞ and NaN;
  // rows whose sampled positions hold the best scores (the bound then leaves
  // too few candidates) or the worst ones.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int kmax = 700;
  for (int64_t n : {int64_t(1), int64_t(40), int64_t(2047), int64_t(2048), int64_t(8128), int64_t(20011)}) {
    for (int kind = 0; kind < 5; ++kind) {
      for (int64_t k : {int64_t(1), int64_t(7), n / 32 + 1, n / 16, int64_t(kmax)}) {
        if (k < 1) continue;
        SCOPED_TRACE("n " + std::to_string(n) + " kind " + std::to_string(kind) + " k " + std::to_string(k));
        const int64_t c_lo = 5, stride = n + 9;
        std::vector<float> row(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          float v = nd(rng);
          if (kind == 1) v = std::round(v * 2.f);                       // many ties
          if (kind == 2 && i % 5 == 0) v = -INFINITY;                    // masked chunks
          if (kind == 2 && i % 97 == 3) v = NAN;
          if (kind == 3) v = (i * 256 % n < 256) ? 10.f + v : v;         // the sample holds the best
          if (kind == 4) v = (i * 256 % n < 256) ? v - 10.f : v;         // the sample holds the worst
          row[size_t(i)] = v;
        }
        std::vector<float> scores(size_t(2 * stride), 0.f);
        std::copy(row.begin(), row.end(), scores.begin() + stride);  // row 1; row 0 has no candidates
        StepRanges r[2];
        r[0].c_lo = r[0].c_hi = 0, r[0].k = k;
        r[1].c_lo = c_lo, r[1].c_hi = c_lo + n, r[1].k = k;
        std::vector<int32_t> got(size_t(2) * kmax, 7);
        topk_rows_cpu(2, 1, stride, kmax, scores.data(), r, got.data());
        for (int i = 0; i < kmax; ++i) ASSERT_EQ(got[size_t(i)], -1);
        const int64_t kk = std::min<int64_t>({k, n, kmax});
        std::vector<int32_t> want(static_cast<size_t>(kk));
        topk_ref(row.data(), 1, n, int(kk), c_lo, want.data());
        for (int64_t i = 0; i < kmax - kk; ++i) ASSERT_EQ(got[size_t(kmax + i)], -1);
        for (int64_t i = 0; i < kk; ++i) ASSERT_EQ(got[size_t(kmax + kmax - kk + i)], want[size_t(i)]) << i;
      }
    }
  }
}

// How many blocks a row of a table scorer takes: one wave while the rows
// fit the GPU's slots, then whole waves that leave few slots idle.
// reselect=3: a sequence picks on its first step, keeps that pick for two
// steps, picks again on the third; one that was rewound picks at once.
// A fresh row stores its last kslots ids; a kept row gets them back,
// right-aligned, −1 before.
TEST(ReselectRowsCpu, PicksEveryNStepsAndKeepsThePickBetween) {
  std::vector<int64_t> at{0, 100, 100, 100};
  std::vector<int64_t*> last{&at[0], &at[1], &at[2], &at[3]};  // rescore = 0: one word each
  std::vector<StepRanges> ranges(4), out(4);
  const int64_t n[4] = {500, 101, 103, 90};  // never picked; 1 step on; 3 steps on; rewound
  for (int s = 0; s < 4; ++s) {
    ranges[size_t(s)].n = n[s];
    ranges[size_t(s)].n_chunk = n[s];
    ranges[size_t(s)].c_lo = 4;
    ranges[size_t(s)].c_hi = n[s] - 8;
    ranges[size_t(s)].k = 5;
    ranges[size_t(s)].win_lo = n[s] - 8;
  }
  reselect_rows_cpu(4, 3, 0, last.data(), ranges.data(), out.data());
  EXPECT_EQ(std::vector<int64_t>({out[0].fresh, out[1].fresh, out[2].fresh, out[3].fresh}),
            std::vector<int64_t>({1, 0, 1, 1}));
  EXPECT_EQ(at, std::vector<int64_t>({500, 100, 103, 90}));
  EXPECT_EQ(out[1].k, 0);
  EXPECT_EQ(out[1].c_hi, out[1].c_lo);
  EXPECT_EQ(out[1].n_chunk, 0);
  EXPECT_EQ(out[1].win_lo, ranges[1].win_lo);  // what the resident attention reads is unchanged
  EXPECT_EQ(out[0].k, 5);

  // Two sequences of one KV head each; width 6; kslots 4 and 6.
  const std::vector<int32_t> kslots{4, 6};
  std::vector<int32_t> kept0(4, -1), kept1(6, -1);
  std::vector<int32_t*> kept{kept0.data(), kept1.data()};
  std::vector<int32_t> sel{-1, -1, -1, 7, 9, 11, /**/ 1, 2, 3, 4, 5, 6};
  std::vector<StepRanges> two(2);
  two[0].fresh = 1;
  two[1].fresh = 1;
  keep_selection_cpu(KeepSelParams{2, 1, 6}, two.data(), kslots.data(), kept.data(), sel.data());
  EXPECT_EQ(kept0, std::vector<int32_t>({-1, 7, 9, 11}));
  EXPECT_EQ(kept1, std::vector<int32_t>({1, 2, 3, 4, 5, 6}));
  std::vector<int32_t> later{5, 5, 5, 5, 5, 5, /**/ 0, 0, 0, 0, 0, 0};
  two[0].fresh = 0;
  keep_selection_cpu(KeepSelParams{2, 1, 6}, two.data(), kslots.data(), kept.data(), later.data());
  EXPECT_EQ(later, std::vector<int32_t>({-1, -1, -1, 7, 9, 11, /**/ 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(kept1, std::vector<int32_t>({0, 0, 0, 0, 0, 0}));  // row 1 was fresh again: stored anew
}

// rescore=D: a fresh sequence stores its candidate count next to its token
// count; a kept one's ranges are its candidates, as chunks 0 .. W − 1.
TEST(ReselectRowsCpu, RescoreRangesAreTheCandidates) {
  std::vector<int64_t> at{0, 0, 100, 30};  // [tokens at the pick, candidates] per sequence
  std::vector<int64_t*> last{&at[0], &at[2]};
  std::vector<StepRanges> ranges(2), out(2);
  for (int s = 0; s < 2; ++s) {
    ranges[size_t(s)].n = ranges[size_t(s)].n_chunk = 102;
    ranges[size_t(s)].c_lo = 4;
    ranges[size_t(s)].c_hi = ranges[size_t(s)].win_lo = 94;
    ranges[size_t(s)].k = 11;
  }
  reselect_rows_cpu(2, 4, 2, last.data(), ranges.data(), out.data());
  EXPECT_EQ(out[0].fresh, 1);
  EXPECT_EQ(at[0], 102);
  EXPECT_EQ(at[1], 33);  // 11 picks · 3
  EXPECT_EQ(out[1].fresh, 0);
  EXPECT_EQ(at[2], 100);
  EXPECT_EQ(out[1].c_lo, 0);
  EXPECT_EQ(out[1].c_hi, 30);
  EXPECT_EQ(out[1].n_chunk, 30);
  EXPECT_EQ(out[1].k, 11);
  EXPECT_EQ(out[1].win_lo, 94);
  ranges[0].k = 40;  // 120 > 90 ids: every id is a candidate
  at[0] = 0;
  reselect_rows_cpu(1, 4, 2, last.data(), ranges.data(), out.data());
  EXPECT_EQ(at[1], 90);
}

// A pick's candidates: distinct, ascending, in [c_lo, c_hi), k·(D + 1) of
// them (or all of [c_lo, c_hi)), holding every pick and the D ids after it
// below c_hi; and a rescored row's positions map back to those ids.
TEST(CandidateRowsCpu, RunsCoverEveryPickAndItsSuccessors) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int D = 1 + int(rng() % 4), kmax = 1 + int(rng() % 24);
    StepRanges sr;
    sr.c_lo = rng() % 5;
    sr.c_hi = sr.c_lo + 1 + rng() % 120;
    sr.k = std::min<int64_t>(kmax, sr.c_hi - sr.c_lo);
    sr.fresh = 1;
    std::vector<int32_t> ids(size_t(sr.c_hi - sr.c_lo));
    std::iota(ids.begin(), ids.end(), int32_t(sr.c_lo));
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> pick(ids.begin(), ids.begin() + sr.k);
    std::sort(pick.begin(), pick.end());
    std::vector<int32_t> sel(size_t(kmax), -1);
    std::copy(pick.begin(), pick.end(), sel.end() - sr.k);
    std::vector<int32_t> cand(size_t(kmax) * (D + 1), -7);
    int32_t* rows[1] = {cand.data()};
    candidate_rows_cpu(CandidateRowsParams{1, 1, kmax, D}, &sr, rows, sel.data());
    const int64_t w = candidate_count(sr, D);
    ASSERT_EQ(w, std::min<int64_t>(sr.k * (D + 1), sr.c_hi - sr.c_lo));
    const std::vector<int32_t> c(cand.begin(), cand.begin() + w);
    ASSERT_TRUE(std::is_sorted(c.begin(), c.end()));
    ASSERT_EQ(std::adjacent_find(c.begin(), c.end()), c.end());
    ASSERT_TRUE(c.empty() || (c.front() >= sr.c_lo && c.back() < sr.c_hi));
    for (int32_t p : pick)
      for (int d = 0; d <= D && p + d < sr.c_hi; ++d)
        ASSERT_TRUE(std::binary_search(c.begin(), c.end(), p + d)) << trial << " pick " << p << " + " << d;
    // Rescored: positions (ascending, −1 first) → the candidates' ids.
    StepRanges kept = sr;
    kept.fresh = 0;
    std::vector<int32_t> pos(size_t(kmax), -1);
    const int64_t kk = std::min<int64_t>(sr.k, w);
    for (int64_t i = 0; i < kk; ++i) pos[size_t(kmax - kk + i)] = int32_t(w - kk + i);
    candidate_rows_cpu(CandidateRowsParams{1, 1, kmax, D}, &kept, rows, pos.data());
    for (int64_t i = 0; i < kmax; ++i)
      ASSERT_EQ(pos[size_t(i)], i < kmax - kk ? -1 : c[size_t(w - kk + (i - (kmax - kk)))]);
  }
}

// Kept rows read their candidates' records from scratch, in order; fresh
// rows read their own planes.
TEST(GatherCandidatesCpu, KeptRowsReadTheirCandidatesRecords) {
  const int64_t R = 2, bytes0 = 5, bytes1 = 2, W = 3;
  std::vector<uint8_t> p0(R * 10 * bytes0), p1(R * 10 * bytes1);
  std::iota(p0.begin(), p0.end(), uint8_t(0));
  std::iota(p1.begin(), p1.end(), uint8_t(100));
  const uint8_t* plane0[2] = {p0.data(), p0.data() + 10 * bytes0};
  const uint8_t* plane1[2] = {p1.data(), p1.data() + 10 * bytes1};
  std::vector<int32_t> c0{1, 4, 9}, c1{0, 2, 3};
  const int32_t* cand[2] = {c0.data(), c1.data()};
  std::vector<StepRanges> sr(2);
  sr[0].fresh = 1;
  sr[1].fresh = 0;
  sr[1].c_hi = W;
  std::vector<uint8_t> s0(R * 16), s1(R * 8);
  const uint8_t* rows[4] = {};
  gather_candidates_cpu(GatherCandParams{R, 1, bytes0, bytes1, 16, 8}, sr.data(), cand, plane0, plane1, s0.data(),
                        s1.data(), rows);
  EXPECT_EQ(rows[0], plane0[0]);
  EXPECT_EQ(rows[2], plane1[0]);
  ASSERT_EQ(rows[1], s0.data() + 16);
  ASSERT_EQ(rows[3], s1.data() + 8);
  for (int64_t i = 0; i < W; ++i) {
    for (int64_t b = 0; b < bytes0; ++b) EXPECT_EQ(rows[1][i * bytes0 + b], plane0[1][c1[size_t(i)] * bytes0 + b]);
    for (int64_t b = 0; b < bytes1; ++b) EXPECT_EQ(rows[3][i * bytes1 + b], plane1[1][c1[size_t(i)] * bytes1 + b]);
  }
}

TEST(ScoreRowsTable, BlocksPerRowKeepEverySlotBusy) {
  EXPECT_EQ(table_blocks_per_row(8, 132, 64), 16);   // batch 1: 128 blocks, one wave
  EXPECT_EQ(table_blocks_per_row(96, 132, 64), 4);   // batch 12: 384 blocks in 3 waves (97 %), not 96
  EXPECT_EQ(table_blocks_per_row(132, 132, 64), 1);  // exactly one wave
  EXPECT_EQ(table_blocks_per_row(160, 132, 64), 4);  // 640 blocks in 5 waves (97 %), not 2 waves at 61 %
  EXPECT_EQ(table_blocks_per_row(48, 132, 64), 8);   // batch 6: 384 blocks in 3 waves, not 96 blocks
  EXPECT_EQ(table_blocks_per_row(1000, 132, 64), 3);
  EXPECT_EQ(table_blocks_per_row(96, 132, 2), 1);    // capped: 2 per row would not be busier
  EXPECT_EQ(table_blocks_per_row(0, 132, 64), 1);
  for (int64_t rows = 1; rows <= 400; ++rows) {
    const int bx = table_blocks_per_row(rows, 132, 64);
    const int64_t blocks = rows * bx, waves = (blocks + 131) / 132;
    ASSERT_GE(bx, 1);
    ASSERT_LE(bx, 64);
    // never less busy than one block per row
    EXPECT_GE(double(blocks) / double(waves * 132) + 1e-9, double(rows) / double(((rows + 131) / 132) * 132)) << rows;
  }
}

// The planar scorer's names (ScoreRowsParams::planar_scorer, $KVT_PLANAR_SCORER).
TEST(ScoreRowsTable, PlanarScorerNamesRoundTripAndUnknownOnesFail) {
  for (PlanarScorer s :
       {PlanarScorer::xor_table, PlanarScorer::rotated_table, PlanarScorer::mma, PlanarScorer::mma16}) {
    EXPECT_EQ(planar_scorer_from_name(planar_scorer_name(s)), s);
    EXPECT_EQ(planar_scorer_resolved(s), s);
  }
  // automatic always resolves to a concrete scorer ($KVT_PLANAR_SCORER or the default).
  EXPECT_NE(planar_scorer_resolved(PlanarScorer::automatic), PlanarScorer::automatic);
  // Without $KVT_PLANAR_SCORER the default is mma16 (16 tokens per tensor-core product).
  const char* env = std::getenv("KVT_PLANAR_SCORER");
  if (!env || !*env) EXPECT_EQ(planar_scorer_resolved(PlanarScorer::automatic), PlanarScorer::mma16);
  for (const char* bad : {"", "XOR", "tensor", "rotated "}) {
    try {
      planar_scorer_from_name(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unknown planar scorer"), std::string::npos) << e.what();
    }
  }
}

// Which records CUDA's byte-table scorer takes, and how many queries its
// table holds per pass (the dispatch of score_rows rests on these).
// ScoreRowsParams::cand (records read by token id) is the GPU scorer's;
// the CPU is given gather_candidates' copies and refuses ids.
TEST(ScoreRowsCpu, RefusesCandidateIds) {
  ScoreRowsParams p;
  p.n_seq = 1, p.n_kv_head = 1, p.head_dim = 64, p.out_stride = 8;
  p.fmt.spec = parse_quant_spec("int4:g32");
  p.fmt.dim = 64;
  p.fmt.bytes = int64_t(bytes_per_vector(p.fmt.spec, 64));
  const int32_t ids[1] = {0};
  const int32_t* rows[1] = {ids};
  p.cand = rows;
  StepRanges r;
  std::vector<float> q(64), out(8);
  std::vector<uint8_t> rec(size_t(p.fmt.bytes));
  const uint8_t* p0[1] = {rec.data()};
  EXPECT_THROW(score_rows_cpu(p, q.data(), p0, nullptr, &r, out.data()), Error);
}

TEST(ScoreRowsTable, TakesFormatsWhoseCodesFillBytes) {
  struct Case {
    const char* spec;
    int dim, nq;
  };
  for (const Case& c : {Case{"higgs1", 128, 4}, Case{"higgs1:g64:rs", 256, 4}, Case{"higgs4", 128, 2},
                        Case{"higgs4", 256, 1}, Case{"higgs2:g32", 128, 4}, Case{"higgs0.5", 128, 4},
                        Case{"1bit", 128, 4}, Case{"int2:g32", 128, 4}, Case{"int4", 128, 2}, Case{"int8", 128, 1},
                        Case{"int1:g16", 64, 4},
                        // codes that straddle bytes, records over 160 bytes, dense formats: not taken
                        Case{"higgs3", 128, 0}, Case{"int3:g16", 128, 0}, Case{"int4:g4", 128, 0},
                        Case{"int8", 256, 0}, Case{"bf16", 128, 0}, Case{"fp8", 128, 0}, Case{"nvfp4", 128, 0},
                        Case{"higgs:EDEN2-64:g128", 128, 0}, Case{"int2:g3", 96, 0},
                        // U<n> grids score in integers, not through f32 tables
                        Case{"higgs:U4:g128", 128, 0}, Case{"higgs:U16:g32", 128, 0}}) {
    SCOPED_TRACE(std::string(c.spec) + " dim " + std::to_string(c.dim));
    EXPECT_EQ(lut_queries_per_pass(parse_quant_spec(c.spec), c.dim), c.nq);
  }
  ScoreRowsParams p;
  p.head_dim = 128;
  p.n_q = 4;
  p.fmt.spec = parse_quant_spec("higgs1");
  EXPECT_TRUE(score_rows_by_table(p));
  EXPECT_TRUE(score_rows_leaves_partials(p));
  p.n_q = 1;
  EXPECT_FALSE(score_rows_leaves_partials(p));  // partials are gqa=shadowkv's, per query
  p.n_q = 4;
  p.layout = IndexRecLayout::residual;
  p.fmt.spec = parse_quant_spec("1bit");
  p.meta.spec = parse_quant_spec("higgs4");
  EXPECT_FALSE(score_rows_by_table(p));  // the meta scores need their scratch
  float scratch = 0;
  p.meta_scratch = &scratch;
  EXPECT_TRUE(score_rows_by_table(p));
  p.meta.spec = parse_quant_spec("higgs3");
  EXPECT_FALSE(score_rows_by_table(p));
  p.layout = IndexRecLayout::planar_higgs2;
  EXPECT_FALSE(score_rows_by_table(p));
  EXPECT_TRUE(score_rows_leaves_partials(p));
}

}  // namespace
}  // namespace kvtier
