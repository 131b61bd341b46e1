// index_rows.h on the GPU against its CPU specification: step plans, the
// index query, scoring of every index layout (planar 2-bit HIGGS, dense bf16 /
// fp8, any quant_format record, residual landmarks) over ragged rows, the GQA
// softmax-max, masks, top-k (exact, ties included), chunk expansion and the
// resident lists (exact).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/index_score/index_rows.h"
#include "ops/index_score/index_rows_cuda.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/residual_quant.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

// Ragged step ranges for n_seq sequences (both devices compute them; they must agree).
std::vector<StepRanges> ranges_for(const StepPlanParams& sp, const std::vector<int64_t>& n,
                                   const std::vector<int32_t>& budget, const Exec& x, cuda::DeviceBuffer* d_ranges) {
  std::vector<StepRanges> cpu(n.size());
  step_plan_rows_cpu(sp, n.data(), budget.data(), nullptr, cpu.data());
  auto dn = to_device(n), db = to_device(budget);
  *d_ranges = cuda::DeviceBuffer(n.size() * sizeof(StepRanges));
  poison(*d_ranges);
  step_plan_rows(x, sp, dn.data<int64_t>(), db.data<int32_t>(), nullptr, d_ranges->data<StepRanges>());
  sync(x);
  auto got = to_host<StepRanges>(*d_ranges, n.size());
  for (size_t s = 0; s < n.size(); ++s) {
    EXPECT_EQ(got[s].n, cpu[s].n);
    EXPECT_EQ(got[s].n_chunk, cpu[s].n_chunk) << s;
    EXPECT_EQ(got[s].c_lo, cpu[s].c_lo) << s;
    EXPECT_EQ(got[s].c_hi, cpu[s].c_hi) << s;
    EXPECT_EQ(got[s].k, cpu[s].k) << s;
    EXPECT_EQ(got[s].n_res, cpu[s].n_res) << s;
    EXPECT_EQ(got[s].win_lo, cpu[s].win_lo) << s;
  }
  return cpu;
}

TEST(IndexRowsCuda, StepPlanMatchesCpu) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  for (int chunk : {1, 4, 8})
    for (int m : {1, 8}) {
      StepPlanParams sp{5, chunk, chunk * m, 4, 64, std::max(64, chunk * m - 1), 100};
      std::vector<int64_t> n{1, 63, 70, 1000, 131072};
      std::vector<int32_t> budget{1, 5, 50, 100, 4096};
      cuda::DeviceBuffer d;
      ranges_for(sp, n, budget, dev.exec(), &d);
    }
}

// reselect=N's ops: which sequences pick (and the counts they store), and
// the kept selections, equal to the CPU's over a run of steps of ragged
// sequences (width 40, kslots up to it).
TEST(IndexRowsCuda, ReselectAndKeptSelectionsMatchCpu) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec x = dev.exec();
  std::mt19937 rng(9);
  const int B = 5, H = 3, W = 40, every = 3;
  const int64_t R = int64_t(B) * H;
  std::vector<int64_t> at_cpu{0, 0, 57, 300, 1000};
  const std::vector<int32_t> kslots{40, 17, 1, 40, 23};
  std::vector<std::vector<int32_t>> kept_cpu(static_cast<size_t>(R));
  std::vector<cuda::DeviceBuffer> kept_dev;
  std::vector<int32_t*> kept_cpu_ptrs, kept_dev_ptrs;
  for (int64_t r = 0; r < R; ++r) {
    kept_cpu[size_t(r)].assign(size_t(kslots[size_t(r / H)]), -1);
    kept_cpu_ptrs.push_back(kept_cpu[size_t(r)].data());
    kept_dev.push_back(to_device(kept_cpu[size_t(r)]));
    kept_dev_ptrs.push_back(kept_dev.back().data<int32_t>());
  }
  auto d_kept = to_device(kept_dev_ptrs);
  auto d_at = to_device(at_cpu);
  std::vector<int64_t*> at_ptrs;
  for (int s = 0; s < B; ++s) at_ptrs.push_back(d_at.data<int64_t>() + s);
  auto d_at_ptrs = to_device(at_ptrs);
  std::vector<int64_t*> at_cpu_ptrs;
  for (int s = 0; s < B; ++s) at_cpu_ptrs.push_back(&at_cpu[size_t(s)]);
  auto d_kslots = to_device(kslots);
  std::vector<int64_t> n{100, 2000, 58, 299, 1001};  // 299 < 300: rewound
  int fresh_seen = 0, kept_seen = 0;
  for (int step = 0; step < 7; ++step) {
    std::vector<StepRanges> ranges(static_cast<size_t>(B)), want(static_cast<size_t>(B));
    for (int s = 0; s < B; ++s) {
      StepRanges& r = ranges[size_t(s)];
      r.n = n[size_t(s)] + step;
      r.n_chunk = r.n;
      r.c_lo = 1;
      r.c_hi = r.n - 4;
      r.k = std::min<int64_t>(kslots[size_t(s)], r.c_hi - r.c_lo);
      r.win_lo = r.n - 4;
    }
    reselect_rows_cpu(B, every, 0, at_cpu_ptrs.data(), ranges.data(), want.data());
    auto d_ranges = to_device(ranges);
    cuda::DeviceBuffer d_out(size_t(B) * sizeof(StepRanges));
    poison(d_out);
    reselect_rows(x, B, every, 0, d_at_ptrs.data<int64_t* const>(), d_ranges.data<StepRanges>(),
                  d_out.data<StepRanges>());
    const auto got = to_host<StepRanges>(d_out, size_t(B));
    for (int s = 0; s < B; ++s) {
      EXPECT_EQ(got[size_t(s)].fresh, want[size_t(s)].fresh) << "step " << step << " seq " << s;
      EXPECT_EQ(got[size_t(s)].k, want[size_t(s)].k);
      EXPECT_EQ(got[size_t(s)].c_hi, want[size_t(s)].c_hi);
      EXPECT_EQ(got[size_t(s)].n_chunk, want[size_t(s)].n_chunk);
      EXPECT_EQ(got[size_t(s)].win_lo, want[size_t(s)].win_lo);
      (want[size_t(s)].fresh ? fresh_seen : kept_seen)++;
    }
    EXPECT_EQ(to_host<int64_t>(d_at, size_t(B)), at_cpu);
    // A new selection in every row (right-aligned, −1 before); the kept rows get theirs back.
    std::vector<int32_t> sel(static_cast<size_t>(R) * W);
    for (int64_t r = 0; r < R; ++r) {
      const int k = std::uniform_int_distribution<int>(0, kslots[size_t(r / H)])(rng);
      for (int i = 0; i < W; ++i) sel[size_t(r * W + i)] = i < W - k ? -1 : int32_t(rng() % 5000);
    }
    auto d_sel = to_device(sel);
    keep_selection_cpu(KeepSelParams{R, H, W}, want.data(), kslots.data(), kept_cpu_ptrs.data(), sel.data());
    keep_selection(x, KeepSelParams{R, H, W}, d_out.data<StepRanges>(), d_kslots.data<int32_t>(),
                   d_kept.data<int32_t* const>(), d_sel.data<int32_t>());
    EXPECT_EQ(to_host<int32_t>(d_sel, sel.size()), sel) << "step " << step;
    for (int64_t r = 0; r < R; ++r)
      EXPECT_EQ(to_host<int32_t>(kept_dev[size_t(r)], kept_cpu[size_t(r)].size()), kept_cpu[size_t(r)]) << r;
  }
  EXPECT_GT(fresh_seen, B);
  EXPECT_GT(kept_seen, B);
}

// rescore=D's ops over a run of steps of ragged sequences, equal to the
// CPU's: who picks (and the candidate counts stored), the candidates of a
// fresh pick (long picks: several scan tiles), the records gathered for the
// rows that rescore, and the positions they pick mapped back to ids.
TEST(IndexRowsCuda, RescoreCandidatesMatchCpu) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec x = dev.exec();
  std::mt19937 rng(21);
  const int B = 4, H = 2, every = 3, D = 2, kmax = 700;
  const int64_t R = int64_t(B) * H, bytes0 = 32, bytes1 = 2, cap = 6000;
  const int64_t wmax = int64_t(kmax) * (D + 1);
  std::vector<int64_t> at_cpu(2 * B, 0);
  at_cpu[4] = 300;  // sequence 2: picked at 300 tokens, n = 299 below: rewound
  auto d_at = to_device(at_cpu);
  std::vector<int64_t*> at_ptrs, at_cpu_ptrs;
  for (int s = 0; s < B; ++s) {
    at_ptrs.push_back(d_at.data<int64_t>() + 2 * s);
    at_cpu_ptrs.push_back(&at_cpu[size_t(2 * s)]);
  }
  auto d_at_ptrs = to_device(at_ptrs);
  // Candidates per row, and index planes of random bytes.
  std::vector<std::vector<int32_t>> cand_cpu(static_cast<size_t>(R), std::vector<int32_t>(size_t(wmax), -1));
  std::vector<cuda::DeviceBuffer> cand_dev;
  std::vector<int32_t*> cand_cpu_ptrs, cand_dev_ptrs;
  std::vector<std::vector<uint8_t>> p0(static_cast<size_t>(R)), p1(static_cast<size_t>(R));
  std::vector<cuda::DeviceBuffer> p0_dev, p1_dev;
  std::vector<const uint8_t*> p0_cpu_ptrs, p1_cpu_ptrs, p0_dev_ptrs, p1_dev_ptrs;
  for (int64_t r = 0; r < R; ++r) {
    cand_cpu_ptrs.push_back(cand_cpu[size_t(r)].data());
    cand_dev.push_back(to_device(cand_cpu[size_t(r)]));
    cand_dev_ptrs.push_back(cand_dev.back().data<int32_t>());
    p0[size_t(r)].resize(size_t(cap * bytes0));
    p1[size_t(r)].resize(size_t(cap * bytes1));
    for (auto& b : p0[size_t(r)]) b = uint8_t(rng());
    for (auto& b : p1[size_t(r)]) b = uint8_t(rng());
    p0_cpu_ptrs.push_back(p0[size_t(r)].data());
    p1_cpu_ptrs.push_back(p1[size_t(r)].data());
    p0_dev.push_back(to_device(p0[size_t(r)]));
    p1_dev.push_back(to_device(p1[size_t(r)]));
    p0_dev_ptrs.push_back(p0_dev.back().data<uint8_t>());
    p1_dev_ptrs.push_back(p1_dev.back().data<uint8_t>());
  }
  auto d_cand = to_device(cand_dev_ptrs);
  auto d_p0 = to_device(p0_dev_ptrs), d_p1 = to_device(p1_dev_ptrs);
  const GatherCandParams gp{R, H, bytes0, bytes1, wmax * bytes0, (wmax * bytes1 + 15) / 16 * 16};
  std::vector<uint8_t> s0(size_t(R * gp.stride0)), s1(size_t(R * gp.stride1));
  cuda::DeviceBuffer d_s0(s0.size()), d_s1(s1.size()), d_rows(size_t(2 * R) * sizeof(void*));
  std::vector<const uint8_t*> rows_cpu(size_t(2 * R));
  const std::vector<int64_t> n{100, 5000, 299, 2600};
  const std::vector<int32_t> budget{40, 700, 90, 640};
  int fresh_seen = 0, kept_seen = 0, all_seen = 0;
  for (int step = 0; step < 7; ++step) {
    std::vector<StepRanges> ranges(static_cast<size_t>(B)), want(static_cast<size_t>(B));
    for (int s = 0; s < B; ++s) {
      StepRanges& r = ranges[size_t(s)];
      r.n = r.n_chunk = n[size_t(s)] + step;
      r.c_lo = 4;
      r.c_hi = r.win_lo = r.n - 16;
      r.k = std::min<int64_t>(budget[size_t(s)], r.c_hi - r.c_lo);
    }
    reselect_rows_cpu(B, every, D, at_cpu_ptrs.data(), ranges.data(), want.data());
    auto d_ranges = to_device(ranges);
    cuda::DeviceBuffer d_want(size_t(B) * sizeof(StepRanges));
    poison(d_want);
    reselect_rows(x, B, every, D, d_at_ptrs.data<int64_t* const>(), d_ranges.data<StepRanges>(),
                  d_want.data<StepRanges>());
    const auto got = to_host<StepRanges>(d_want, size_t(B));
    for (int s = 0; s < B; ++s) {
      const StepRanges &g = got[size_t(s)], &w = want[size_t(s)];
      EXPECT_EQ(g.fresh, w.fresh) << "step " << step << " seq " << s;
      EXPECT_EQ(g.k, w.k);
      EXPECT_EQ(g.c_lo, w.c_lo);
      EXPECT_EQ(g.c_hi, w.c_hi);
      EXPECT_EQ(g.n_chunk, w.n_chunk);
      (w.fresh ? fresh_seen : kept_seen)++;
      if (w.fresh && candidate_count(w, D) < w.k * (D + 1)) ++all_seen;
    }
    EXPECT_EQ(to_host<int64_t>(d_at, at_cpu.size()), at_cpu);
    // The records the rescoring rows read.
    gather_candidates_cpu(gp, want.data(), cand_cpu_ptrs.data(), p0_cpu_ptrs.data(), p1_cpu_ptrs.data(), s0.data(),
                          s1.data(), rows_cpu.data());
    gather_candidates(x, gp, d_want.data<StepRanges>(), d_cand.data<const int32_t* const>(),
                      d_p0.data<const uint8_t* const>(), d_p1.data<const uint8_t* const>(), d_s0.data<uint8_t>(),
                      d_s1.data<uint8_t>(), d_rows.data<const uint8_t*>());
    const auto rows_got = to_host<const uint8_t*>(d_rows, size_t(2 * R));
    const auto s0_got = to_host<uint8_t>(d_s0, s0.size()), s1_got = to_host<uint8_t>(d_s1, s1.size());
    for (int64_t r = 0; r < R; ++r) {
      const StepRanges& w = want[size_t(r / H)];
      if (w.fresh) {
        EXPECT_EQ(rows_got[size_t(r)], p0_dev_ptrs[size_t(r)]);
        EXPECT_EQ(rows_got[size_t(R + r)], p1_dev_ptrs[size_t(r)]);
        continue;
      }
      EXPECT_EQ(rows_got[size_t(r)], d_s0.data<uint8_t>() + r * gp.stride0);
      EXPECT_EQ(rows_got[size_t(R + r)], d_s1.data<uint8_t>() + r * gp.stride1);
      const size_t o0 = size_t(r * gp.stride0), o1 = size_t(r * gp.stride1);
      EXPECT_TRUE(std::equal(s0.begin() + o0, s0.begin() + o0 + w.c_hi * bytes0, s0_got.begin() + o0)) << r;
      EXPECT_TRUE(std::equal(s1.begin() + o1, s1.begin() + o1 + w.c_hi * bytes1, s1_got.begin() + o1)) << r;
    }
    // A top-k per row: fresh rows pick ids, rescoring rows positions among their candidates.
    std::vector<int32_t> sel(static_cast<size_t>(R) * kmax, -1);
    for (int64_t r = 0; r < R; ++r) {
      const StepRanges& w = want[size_t(r / H)];
      std::vector<int32_t> pool(size_t(w.c_hi - w.c_lo));
      for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(w.c_lo + int64_t(i));
      std::shuffle(pool.begin(), pool.end(), rng);
      std::sort(pool.begin(), pool.begin() + w.k);
      std::copy(pool.begin(), pool.begin() + w.k, sel.begin() + (r + 1) * kmax - w.k);
    }
    auto d_sel = to_device(sel);
    candidate_rows_cpu(CandidateRowsParams{R, H, kmax, D}, want.data(), cand_cpu_ptrs.data(), sel.data());
    candidate_rows(x, CandidateRowsParams{R, H, kmax, D}, d_want.data<StepRanges>(), d_cand.data<int32_t* const>(),
                   d_sel.data<int32_t>());
    EXPECT_EQ(to_host<int32_t>(d_sel, sel.size()), sel) << "step " << step;
    for (int64_t r = 0; r < R; ++r)
      EXPECT_EQ(to_host<int32_t>(cand_dev[size_t(r)], size_t(wmax)), cand_cpu[size_t(r)]) << "step " << step << " row " << r;
  }
  EXPECT_GT(fresh_seen, B);
  EXPECT_GT(kept_seen, B);
  EXPECT_GT(all_seen, 0);
}

struct Rows {
  std::vector<std::vector<uint8_t>> host;  // per row: plane bytes
  std::vector<cuda::DeviceBuffer> dev;
  cuda::DeviceBuffer table;
  std::vector<const uint8_t*> host_ptrs;
  void finish() {
    std::vector<const uint8_t*> ptrs;
    for (size_t r = 0; r < host.size(); ++r) {
      dev.push_back(to_device(host[r]));
      ptrs.push_back(dev.back().data<uint8_t>());
      host_ptrs.push_back(host[r].data());
    }
    table = to_device(ptrs);
  }
  const uint8_t* const* d() const { return table.data<const uint8_t* const>(); }
};

// rescore=D on the mma16 scorer: a rescoring row's candidates read by id
// (ScoreRowsParams::cand) score exactly as their records gathered first
// (gather_candidates, tested against the CPU above) and scored in order;
// fresh rows are scored as without ids. Rows of several spans and a short
// one, 1, 4 and 7 (= 4 + 3) queries, forced block counts, and the softmax
// partials the GQA top-k reads.
TEST(IndexRowsCuda, Mma16ReadsCandidatesById) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec x = dev.exec();
  ScoreRowsParams probe;
  probe.layout = IndexRecLayout::planar_higgs2;
  probe.head_dim = 128;
  probe.planar_scorer = PlanarScorer::mma16;
  ASSERT_TRUE(score_rows_reads_candidates(x, probe));
  probe.planar_scorer = PlanarScorer::mma;
  EXPECT_FALSE(score_rows_reads_candidates(x, probe));
  std::mt19937 rng(5);
  const int H = 2, B = 4, D = 128;
  const int64_t R = int64_t(B) * H, cnt = 9000, stride = 9000;
  const QuantSpec fmt = parse_quant_spec("higgs2:g128");
  auto grid = to_device(higgs_grid(fmt.grid_dim, fmt.grid_size).points);
  RecordFormat rf{fmt, D, int64_t(bytes_per_vector(fmt, D))};
  rf.grid = grid.data<float>();
  // Planes of random codes and bf16 scales in [0.25, 2); candidates: distinct ascending ids.
  Rows p0, p1;
  std::vector<std::vector<int32_t>> cand(static_cast<size_t>(R));
  // Sequences: fresh over 7,000 chunks; rescoring 5,000 (several spans a
  // block), 77 (one partial span) and 0 candidates.
  const std::vector<int64_t> w{7000, 5000, 77, 0};
  const std::vector<int64_t> fresh{1, 0, 0, 0};
  for (int64_t r = 0; r < R; ++r) {
    std::vector<uint8_t> codes(size_t(cnt) * 32 + 64), scales(size_t(cnt) * 2);
    for (auto& b : codes) b = uint8_t(rng());
    for (int64_t t = 0; t < cnt; ++t) {
      const float v = std::uniform_real_distribution<float>(0.25f, 2.f)(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      scales[size_t(2 * t)] = uint8_t(bits >> 16);
      scales[size_t(2 * t + 1)] = uint8_t(bits >> 24);
    }
    p0.host.push_back(codes);
    p1.host.push_back(scales);
    std::vector<int32_t> ids(static_cast<size_t>(cnt));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    const int64_t m = std::max<int64_t>(w[size_t(r / H)], 1);
    ids.resize(size_t(m));
    std::sort(ids.begin(), ids.end());
    cand[size_t(r)] = ids;
  }
  p0.finish();
  p1.finish();
  std::vector<cuda::DeviceBuffer> cand_dev;
  std::vector<const int32_t*> cand_ptrs;
  for (const auto& c : cand) {
    cand_dev.push_back(to_device(c));
    cand_ptrs.push_back(cand_dev.back().data<int32_t>());
  }
  auto d_cand = to_device(cand_ptrs);
  std::vector<StepRanges> ranges(static_cast<size_t>(B));
  for (int s = 0; s < B; ++s) {
    StepRanges& g = ranges[size_t(s)];
    g.n = cnt;
    g.n_chunk = g.c_hi = w[size_t(s)];
    g.c_lo = 0;
    g.k = std::min<int64_t>(64, g.c_hi);
    g.fresh = fresh[size_t(s)];
  }
  auto d_ranges = to_device(ranges);
  // The reference: the candidates' records gathered, then scored in order.
  const GatherCandParams gp{R, H, 32, 2, (stride * 32 + 64 + 15) / 16 * 16, (stride * 2 + 15) / 16 * 16};
  cuda::DeviceBuffer d_s0(size_t(R * gp.stride0)), d_s1(size_t(R * gp.stride1)),
      d_rows(size_t(2 * R) * sizeof(void*));
  gather_candidates(x, gp, d_ranges.data<StepRanges>(), d_cand.data<const int32_t* const>(), p0.d(), p1.d(),
                    d_s0.data<uint8_t>(), d_s1.data<uint8_t>(), d_rows.data<const uint8_t*>());
  const auto* rows0 = d_rows.data<const uint8_t* const>();
  int checked = 0;
  for (const int n_q : {1, 4, 7})
    for (const int bx : {0, 3}) {
      std::vector<float> qh(size_t(R) * n_q * D);
      for (float& v : qh) v = std::normal_distribution<float>(0.f, 1.f)(rng);
      auto d_q = to_device(qh);
      ScoreRowsParams p;
      p.n_seq = B;
      p.n_kv_head = H;
      p.head_dim = D;
      p.n_q = n_q;
      p.layout = IndexRecLayout::planar_higgs2;
      p.fmt = rf;
      p.candidates_only = n_q == 1;
      p.scale = 0.0884f;
      p.out_stride = stride;
      p.blocks_per_row = bx;
      p.planar_scorer = PlanarScorer::mma16;
      const size_t n_out = size_t(R) * n_q * stride;
      cuda::DeviceBuffer d_want(n_out * 4), d_got(n_out * 4);
      cuda::DeviceBuffer g_want(size_t(gqa_rows_scratch_bytes(R, n_q))), g_got(size_t(gqa_rows_scratch_bytes(R, n_q)));
      poison(d_want);
      poison(d_got);
      if (n_q > 1) p.gqa_scratch = g_want.data();
      score_rows(x, p, d_q.data<float>(), rows0, rows0 + R, d_ranges.data<StepRanges>(), d_want.data<float>());
      p.cand = d_cand.data<const int32_t* const>();
      if (n_q > 1) p.gqa_scratch = g_got.data();
      score_rows(x, p, d_q.data<float>(), p0.d(), p1.d(), d_ranges.data<StepRanges>(), d_got.data<float>());
      sync(x);
      const auto want = to_host<float>(d_want, n_out), got = to_host<float>(d_got, n_out);
      for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < n_q; ++j)
          for (int64_t i = 0; i < w[size_t(r / H)]; ++i) {
            const size_t at = size_t((r * n_q + j) * stride + i);
            ASSERT_TRUE(std::isfinite(want[at])) << r << " " << i;
            ASSERT_EQ(got[at], want[at])
                << "n_q " << n_q << " bx " << bx << " row " << r << " query " << j << " chunk " << i;
            ++checked;
          }
      if (n_q == 1) continue;
      // The same softmax partials: gqa_rows gives the same aggregates from either.
      std::vector<float> agg[2];
      for (int v = 0; v < 2; ++v) {
        GqaRowsParams gq{B, H, n_q, stride, stride, v ? g_got.data() : g_want.data(), true};
        cuda::DeviceBuffer d_agg(size_t(R * stride) * 4);
        poison(d_agg);
        gqa_rows(x, gq, (v ? d_got : d_want).data<float>(), d_ranges.data<StepRanges>(), d_agg.data<float>());
        sync(x);
        agg[v] = to_host<float>(d_agg, size_t(R * stride));
      }
      for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < w[size_t(r / H)]; ++i)
          ASSERT_EQ(agg[1][size_t(r * stride + i)], agg[0][size_t(r * stride + i)]) << r << " " << i;
    }
  EXPECT_GT(checked, 100000);
}

struct ScoreCase {
  const char* spec;  // records format; "planar" for the GPU's higgs2 planes ("planar:U4": U4 codes, scored in
                     // integers); "residual" (higgs4 meta + 1bit)
  int head_dim = 128;
  int n_q = 1;
  bool candidates_only = true;
  bool by_table = false;      // must run on the byte-table scorer (score_lut_cuda.cu)
  bool meta_scratch = true;   // residual: give the meta scratch (else the thread-per-chunk kernel)
  int blocks_per_row = 0;     // table scorers: forced (0: chosen by table_blocks_per_row)
  PlanarScorer planar_scorer = PlanarScorer::xor_table;  // planar: which scorer
};

class ScoreRowsCuda : public ::testing::TestWithParam<ScoreCase> {};

TEST_P(ScoreRowsCuda, MatchesTheCpuQuantizersScores) {
  KVT_REQUIRE_GPU();
  const ScoreCase c = GetParam();
  const std::string spec = c.spec;
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(21 + c.head_dim + c.n_q);
  const int D = c.head_dim, H = 3, n_seq = 2;
  const int64_t rows = int64_t(n_seq) * H;
  StepPlanParams sp{n_seq, 1, spec == "residual" ? 8 : 1, 4, 64, 64, 64};
  const std::vector<int64_t> n{900, 2500};
  const std::vector<int32_t> budget{64, 64};
  cuda::DeviceBuffer d_ranges;
  const auto ranges = ranges_for(sp, n, budget, x, &d_ranges);
  // mma16 with forced blocks: a row stride not a multiple of 4 (its score
  // stores then go one float at a time, not 16 bytes).
  const int64_t stride = c.planar_scorer == PlanarScorer::mma16 && c.blocks_per_row == 9 ? 2602 : 2600;
  const bool planar = spec.starts_with("planar"), residual = spec == "residual", u4 = spec == "planar:U4";
  const QuantSpec fmt = parse_quant_spec(u4 ? "higgs:U4:g128" : planar ? "higgs2:g128" : residual ? "1bit" : spec);
  const QuantSpec meta = parse_quant_spec("higgs4");
  const size_t rb = bytes_per_vector(fmt, D), mb = bytes_per_vector(meta, D);
  Rows p0, p1;
  std::vector<float> keys(size_t(3000) * D);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : keys) v = std::normal_distribution<float>(0.f, 1.f)(rng);
    const int64_t cnt = n[size_t(r / H)];
    std::vector<uint8_t> recs(size_t(cnt) * rb);
    if (residual) {
      ResidualSpec rs{meta, fmt, 8};
      std::vector<uint8_t> metas(size_t(residual_n_meta(rs, cnt)) * mb);
      quantize_residual(rs, keys.data(), cnt, D, metas.data(), recs.data());
      p1.host.push_back(metas);
    } else {
      QuantSpec s = fmt;
      if (s.kind == QuantKind::nvfp4) s.tensor_scale = 0.01f;
      quantize(s, keys.data(), cnt, D, recs.data());
    }
    if (planar) {  // the GPU's planes: codes [n][32], then scales [n] bf16
      std::vector<uint8_t> codes(size_t(cnt) * 32), scales(size_t(cnt) * 2);
      for (int64_t t = 0; t < cnt; ++t) {
        std::copy_n(recs.data() + t * rb, 32, codes.data() + t * 32);
        std::copy_n(recs.data() + t * rb + 32, 2, scales.data() + t * 2);
      }
      p0.host.push_back(codes);
      p1.host.push_back(scales);
      p0.host.back().resize(p0.host.back().size() + 64);  // the kernel reads ahead
    } else {
      p0.host.push_back(recs);
    }
    if (!planar && !residual) p1.host.push_back({0});
  }
  p0.finish();
  p1.finish();
  // Queries: the CPU scores raw queries; the planar GPU kernel takes them rotated.
  const int n_q = c.n_q;
  std::vector<float> q(size_t(rows) * n_q * D);
  for (float& v : q) v = std::normal_distribution<float>(0.f, 1.f)(rng);
  std::vector<float> q_gpu = q;
  if (planar)
    for (size_t i = 0; i < q_gpu.size(); i += D) hadamard_transform(q_gpu.data() + i, D);
  RecordFormat rf{fmt, D, int64_t(rb)};
  if (fmt.kind == QuantKind::nvfp4) rf.spec.tensor_scale = 0.01f;
  RecordFormat mf{meta, D, int64_t(mb)};
  cuda::DeviceBuffer grid, signs, mgrid;
  if (fmt.kind == QuantKind::higgs) {
    grid = to_device(higgs_grid_of(fmt).points);
    rf.grid = grid.data<float>();
    if (fmt.random_signs) {
      std::vector<float> sg(size_t(resolved_group(fmt, D)));
      hadamard_signs(fmt.sign_seed, int(sg.size()), sg.data());
      signs = to_device(sg);
      rf.signs = signs.data<float>();
    }
  }
  if (residual) {
    mgrid = to_device(higgs_grid(meta.grid_dim, meta.grid_size).points);
    mf.grid = mgrid.data<float>();
  }
  ScoreRowsParams p;
  p.n_seq = n_seq;
  p.n_kv_head = H;
  p.head_dim = D;
  p.n_q = n_q;
  p.layout = planar ? IndexRecLayout::planar_higgs2 : residual ? IndexRecLayout::residual : IndexRecLayout::records;
  p.meta = mf;
  p.m = 8;
  p.candidates_only = c.candidates_only;
  p.blocks_per_row = c.blocks_per_row;
  p.planar_scorer = c.planar_scorer;
  p.scale = 0.125f;
  p.out_stride = stride;
  // CPU reference (records layout; planar's records are the same bytes).
  ScoreRowsParams pc = p;
  pc.layout = residual ? IndexRecLayout::residual : IndexRecLayout::records;
  RecordFormat cf = rf;
  cf.grid = nullptr;
  cf.signs = nullptr;
  pc.fmt = cf;
  std::vector<const uint8_t*> cpu_p0, cpu_p1;
  std::vector<std::vector<uint8_t>> aos;  // planar: the CPU reads the AoS records
  for (int64_t r = 0; r < rows; ++r) {
    if (planar) {
      const int64_t cnt = n[size_t(r / H)];
      aos.emplace_back(size_t(cnt) * rb);
      for (int64_t t = 0; t < cnt; ++t) {
        std::copy_n(p0.host[size_t(r)].data() + t * 32, 32, aos.back().data() + t * rb);
        std::copy_n(p1.host[size_t(r)].data() + t * 2, 2, aos.back().data() + t * rb + 32);
      }
      cpu_p0.push_back(aos.back().data());
    } else {
      cpu_p0.push_back(p0.host_ptrs[size_t(r)]);
    }
    cpu_p1.push_back(p1.host_ptrs[size_t(r)]);
  }
  std::vector<float> want(size_t(rows) * n_q * stride, 0.f);
  score_rows_cpu(pc, q.data(), cpu_p0.data(), cpu_p1.data(), ranges.data(), want.data());
  p.fmt = rf;
  auto d_q = to_device(q_gpu);
  cuda::DeviceBuffer d_s(want.size() * 4);
  poison(d_s);
  cuda::DeviceBuffer d_meta(size_t(rows) * n_q * size_t(residual_meta_stride(stride, p.m)) * 4);
  if (residual && c.meta_scratch) {
    poison(d_meta);
    p.meta_scratch = d_meta.data<float>();
  }
  if (c.by_table) {
    EXPECT_TRUE(score_rows_by_table(p)) << spec;
  }
  score_rows(x, p, d_q.data<float>(), p0.d(), p1.d(), d_ranges.data<StepRanges>(), d_s.data<float>());
  sync(x);
  const auto got = to_host<float>(d_s, want.size());
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const StepRanges& sr = ranges[size_t(r / H)];
    const int64_t cnt = c.candidates_only ? sr.c_hi - sr.c_lo : sr.n_chunk;
    for (int j = 0; j < n_q; ++j)
      for (int64_t i = 0; i < cnt; ++i) {
        const size_t at = size_t((r * n_q + j) * stride + i);
        ASSERT_TRUE(std::isfinite(got[at])) << r << " " << i;
        worst = std::max(worst, double(std::abs(got[at] - want[at])) / (1.0 + std::abs(want[at])));
      }
  }
  EXPECT_LT(worst, 2e-5) << spec;
  if (u4) EXPECT_EQ(worst, 0.0) << "the U4 scores are integer sums: the GPU's equal the CPU's";
  if (!score_rows_leaves_partials(p) || c.candidates_only) return;
  // The planar and byte-table scorers' softmax partials (ScoreRowsParams::gqa_scratch) give
  // gqa_rows the GQA aggregate of the CPU's scores without its own pass.
  std::vector<float> agg_c(size_t(rows) * stride, 0.f);
  GqaRowsParams gp{n_seq, H, n_q, stride, stride};
  gqa_rows_cpu(gp, want.data(), ranges.data(), agg_c.data());
  cuda::DeviceBuffer d_gs(size_t(gqa_rows_scratch_bytes(rows, n_q)));
  poison(d_gs);
  p.gqa_scratch = d_gs.data();
  score_rows(x, p, d_q.data<float>(), p0.d(), p1.d(), d_ranges.data<StepRanges>(), d_s.data<float>());
  gp.scratch = d_gs.data();
  gp.partials_ready = true;
  cuda::DeviceBuffer d_agg(agg_c.size() * 4);
  poison(d_agg);
  gqa_rows(x, gp, d_s.data<float>(), d_ranges.data<StepRanges>(), d_agg.data<float>());
  sync(x);
  const auto agg_g = to_host<float>(d_agg, agg_c.size());
  for (int64_t r = 0; r < rows; ++r) {
    const StepRanges& sr = ranges[size_t(r / H)];
    for (int64_t i = 0; i < sr.c_hi - sr.c_lo; ++i)
      ASSERT_NEAR(agg_g[size_t(r * stride + i)], agg_c[size_t(r * stride + i)], 2e-4) << r << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ScoreRowsCuda,
    ::testing::Values(ScoreCase{"planar"}, ScoreCase{"planar", 128, 4, false}, ScoreCase{"planar", 128, 7, false},
                      ScoreCase{"bf16"}, ScoreCase{"fp8", 128, 2, false}, ScoreCase{"bf16", 64, 3, false},
                      ScoreCase{"bf16", 256}, ScoreCase{"fp8", 64}, ScoreCase{"higgs1:rs"},
                      ScoreCase{"higgs2:g64"}, ScoreCase{"higgs0.5", 64}, ScoreCase{"int3:g16", 128, 2, false},
                      ScoreCase{"1bit"}, ScoreCase{"fp8s"}, ScoreCase{"nvfp4"}, ScoreCase{"higgs2", 256},
                      ScoreCase{"residual"}, ScoreCase{"residual", 128, 2, false},
                      ScoreCase{"residual", 128, 4, false, false, false},
                      // blocks of a few hundred tokens each, their softmax partials combined
                      ScoreCase{"planar", 128, 4, false, false, true, 9},
                      // the rotated table: 1, 2 and 4 queries per pass (7 = 4 + 2 + 1)
                      ScoreCase{"planar", 128, 1, true, false, true, 0, PlanarScorer::rotated_table},
                      ScoreCase{"planar", 128, 7, false, false, true, 0, PlanarScorer::rotated_table},
                      ScoreCase{"planar", 128, 4, false, false, true, 9, PlanarScorer::rotated_table},
                      // the tensor-core scorer: passes of 4 queries and fewer (7 = 4 + 3)
                      ScoreCase{"planar", 128, 1, true, false, true, 0, PlanarScorer::mma},
                      ScoreCase{"planar", 128, 2, false, false, true, 0, PlanarScorer::mma},
                      ScoreCase{"planar", 128, 7, false, false, true, 0, PlanarScorer::mma},
                      ScoreCase{"planar", 128, 4, false, false, true, 9, PlanarScorer::mma},
                      // tokens as the product's rows (16 per product)
                      ScoreCase{"planar", 128, 1, true, false, true, 0, PlanarScorer::mma16},
                      ScoreCase{"planar", 128, 2, false, false, true, 0, PlanarScorer::mma16},
                      ScoreCase{"planar", 128, 7, false, false, true, 0, PlanarScorer::mma16},
                      ScoreCase{"planar", 128, 4, false, false, true, 9, PlanarScorer::mma16},
                      // U4 codes, scored in integers (passes of 8 queries: 12 = 8 + 4)
                      ScoreCase{"planar:U4", 128, 1, true}, ScoreCase{"planar:U4", 128, 4, false},
                      ScoreCase{"planar:U4", 128, 7, false}, ScoreCase{"planar:U4", 128, 12, false},
                      ScoreCase{"planar:U4", 128, 4, false, false, true, 9}));

// The byte-table scorer: every format family it takes, head_dim 64 to 256,
// query counts that split into passes of 4, 2 and 1, and with gqa=shadowkv's
// per-query scores its softmax partials (checked through gqa_rows).
INSTANTIATE_TEST_SUITE_P(
    ByteTable, ScoreRowsCuda,
    ::testing::Values(ScoreCase{"higgs1", 128, 4, false, true}, ScoreCase{"higgs1", 64, 1, true, true},
                      ScoreCase{"higgs1:g64:rs", 256, 7, false, true}, ScoreCase{"higgs4", 128, 4, false, true},
                      ScoreCase{"higgs2:g32", 128, 3, false, true}, ScoreCase{"higgs0.5", 128, 2, false, true},
                      ScoreCase{"1bit", 128, 4, false, true}, ScoreCase{"1bit:g32", 64, 1, true, true},
                      ScoreCase{"int2:g32", 128, 4, false, true}, ScoreCase{"int4", 256, 1, true, true},
                      ScoreCase{"int8", 128, 2, false, true}, ScoreCase{"int1:g16", 128, 4, false, true},
                      ScoreCase{"residual", 128, 4, false, true}, ScoreCase{"residual", 64, 1, true, true},
                      ScoreCase{"residual", 256, 2, false, true},
                      ScoreCase{"higgs1", 128, 4, false, true, true, 5}));

TEST(IndexRowsCuda, GqaMaskTopkExpandAndResidentListMatchCpu) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(5);
  for (int chunk : {1, 8}) {
    const int H = 2, n_seq = 3, n_q = 4, kmax = 40, n_forced = chunk > 1 ? 5 : 0;
    const int64_t rows = int64_t(n_seq) * H, stride = 30000;
    StepPlanParams sp{n_seq, chunk, chunk, 3, 16, 16, kmax};
    const std::vector<int64_t> n{50, 3000, 29000 * int64_t(chunk) / 8 + 100};
    const std::vector<int32_t> budget{1, 40, 17};
    cuda::DeviceBuffer d_ranges;
    const auto ranges = ranges_for(sp, n, budget, x, &d_ranges);
    // Raw per-query scores with many exact ties (values on a coarse grid).
    std::vector<float> raw(size_t(rows) * n_q * stride);
    for (float& v : raw) v = float(int(rng() % 64)) * 0.25f;
    std::vector<float> agg_c(size_t(rows) * stride, 0.f);
    GqaRowsParams gp{n_seq, H, n_q, stride, stride};
    gqa_rows_cpu(gp, raw.data(), ranges.data(), agg_c.data());
    cuda::DeviceBuffer d_gs(size_t(gqa_rows_scratch_bytes(rows, n_q)));
    gp.scratch = d_gs.data();
    auto d_raw = to_device(raw);
    cuda::DeviceBuffer d_agg(agg_c.size() * 4);
    poison(d_agg);
    gqa_rows(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), d_agg.data<float>());
    sync(x);
    auto agg_g = to_host<float>(d_agg, agg_c.size());
    for (int64_t r = 0; r < rows; ++r) {
      const StepRanges& s = ranges[size_t(r / H)];
      for (int64_t i = 0; i < s.c_hi - s.c_lo; ++i)
        ASSERT_NEAR(agg_g[size_t(r * stride + i)], agg_c[size_t(r * stride + i)], 2e-4) << r << " " << i;
    }
    // Exact inputs for the selection: the CPU's aggregate on both devices.
    std::vector<int32_t> forced(size_t(rows) * std::max(1, n_forced), -1);
    for (int64_t r = 0; r < rows && n_forced; ++r) {
      std::vector<int32_t> f;
      for (int i = 1; i < n_forced; ++i) f.push_back(int32_t(rng() % uint32_t(std::max<int64_t>(1, ranges[size_t(r / H)].n_chunk))));
      std::sort(f.begin(), f.end());
      f.erase(std::unique(f.begin(), f.end()), f.end());
      std::copy(f.begin(), f.end(), forced.begin() + r * n_forced + (n_forced - int(f.size())));
    }
    auto d_sc = to_device(agg_c);
    auto d_forced = to_device(forced);
    if (n_forced) {
      mask_rows_cpu(rows, H, stride, n_forced, forced.data(), ranges.data(), agg_c.data());
      mask_rows(x, rows, H, stride, n_forced, d_forced.data<int32_t>(), d_ranges.data<StepRanges>(), d_sc.data<float>());
    }
    std::vector<int32_t> top_c(size_t(rows) * kmax);
    topk_rows_cpu(rows, H, stride, kmax, agg_c.data(), ranges.data(), top_c.data());
    cuda::DeviceBuffer d_top(top_c.size() * 4);
    poison(d_top);
    topk_rows(x, rows, H, stride, kmax, d_sc.data<float>(), d_ranges.data<StepRanges>(), d_top.data<int32_t>());
    sync(x);
    ASSERT_EQ(to_host<int32_t>(d_top, top_c.size()), top_c) << "chunk " << chunk;
    ExpandRowsParams ep{rows, H, kmax, chunk, 3, n_forced};
    std::vector<int32_t> tok_c(size_t(rows) * kmax * chunk);
    expand_rows_cpu(ep, top_c.data(), n_forced ? forced.data() : nullptr, ranges.data(), tok_c.data());
    cuda::DeviceBuffer d_tok(tok_c.size() * 4);
    poison(d_tok);
    expand_rows(x, ep, d_top.data<int32_t>(), n_forced ? d_forced.data<int32_t>() : nullptr,
                d_ranges.data<StepRanges>(), d_tok.data<int32_t>());
    sync(x);
    ASSERT_EQ(to_host<int32_t>(d_tok, tok_c.size()), tok_c) << "chunk " << chunk;
    ResidentListParams rl{rows, H, 3, 16, 3 + 16 + n_forced * chunk, chunk, n_forced};
    std::vector<int32_t> res_c(size_t(rows) * rl.n_slots);
    resident_list_cpu(rl, n_forced ? forced.data() : nullptr, ranges.data(), res_c.data());
    cuda::DeviceBuffer d_res(res_c.size() * 4);
    poison(d_res);
    resident_list(x, rl, n_forced ? d_forced.data<int32_t>() : nullptr, d_ranges.data<StepRanges>(),
                  d_res.data<int32_t>());
    sync(x);
    ASSERT_EQ(to_host<int32_t>(d_res, res_c.size()), res_c);
  }
}

// topk_rows on score distributions that stress its radix passes: every key
// equal, two values, one exponent (every key in a few bins of the first
// pass), both signs with −inf among them, rows long enough for two tiles
// per block, and a row (131,200 candidates) whose last block's part fits one
// tile while the others' take two (the one-tile path, with its cluster
// barrier, must be the whole cluster's or none's); against topk_rows_cpu,
// exactly.
TEST(IndexRowsCuda, TopkOnEdgeDistributionsMatchesCpu) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int kmax = 4096;
  const std::vector<int64_t> n{5000, 5000, 70000, 70000, 200000, 140000, 131236};
  const std::vector<int32_t> budget{700, 4096, 4096, 1000, 4096, 3000, 4096};
  const int n_seq = int(n.size()), H = 1;
  const int64_t stride = 200000;
  StepPlanParams sp{n_seq, 1, 1, 4, 32, 32, kmax};
  cuda::DeviceBuffer d_ranges;
  const auto ranges = ranges_for(sp, n, budget, x, &d_ranges);
  {
    const int64_t m = ranges[6].c_hi - ranges[6].c_lo, chunk = ((m + 7) / 8 + 31) / 32 * 32;  // the kernel's split
    ASSERT_GT(chunk, 16384) << "two tiles in the first blocks";
    ASSERT_LE(m - 7 * chunk, 16384) << "one tile in the last";
  }
  std::vector<float> sc(size_t(n_seq) * stride, 0.f);
  for (int s = 0; s < n_seq; ++s) {
    float* r = sc.data() + size_t(s) * stride;
    for (int64_t i = 0; i < stride; ++i) {
      switch (s) {
        case 0: r[i] = -3.5f; break;                                                // all equal
        case 1: r[i] = (rng() % 3 == 0) ? 2.f : 1.f; break;                         // two values
        case 2: r[i] = -12.f + 0.5f * nd(rng); break;                              // one exponent
        case 3: r[i] = (rng() % 50 == 0) ? -INFINITY : 100.f * nd(rng); break;     // both signs, −inf
        case 4: r[i] = -9.f - std::abs(nd(rng)); break;                            // two tiles per block
        case 5: r[i] = float(int(rng() % 40)) * 0.125f - 2.f; break;                // many ties
        default: r[i] = 4.f * nd(rng); break;                                       // one tile in the last block
      }
    }
  }
  std::vector<int32_t> top_c(size_t(n_seq) * kmax);
  topk_rows_cpu(n_seq, H, stride, kmax, sc.data(), ranges.data(), top_c.data());
  auto d_sc = to_device(sc);
  cuda::DeviceBuffer d_top(top_c.size() * 4);
  poison(d_top);
  topk_rows(x, n_seq, H, stride, kmax, d_sc.data<float>(), d_ranges.data<StepRanges>(), d_top.data<int32_t>());
  sync(x);
  const auto got = to_host<int32_t>(d_top, top_c.size());
  for (int s = 0; s < n_seq; ++s)
    ASSERT_TRUE(std::equal(got.begin() + s * kmax, got.begin() + (s + 1) * kmax, top_c.begin() + s * kmax))
        << "distribution " << s;
}

// The picks of the unfused GPU path for raw scores on the device: gqa_rows'
// aggregate row (poisoned first), then topk_rows over it.
std::vector<int32_t> gqa_then_topk(const Exec& x, const GqaRowsParams& gp, const float* d_raw,
                                   const StepRanges* d_ranges, int kmax) {
  const int64_t rows = int64_t(gp.n_seq) * gp.n_kv_head;
  cuda::DeviceBuffer d_agg(size_t(rows) * gp.out_stride * 4), d_top(size_t(rows) * kmax * 4);
  poison(d_agg);
  gqa_rows(x, gp, d_raw, d_ranges, d_agg.data<float>());
  topk_rows(x, rows, gp.n_kv_head, gp.out_stride, kmax, d_agg.data<float>(), d_ranges, d_top.data<int32_t>());
  return to_host<int32_t>(d_top, size_t(rows) * kmax);
}

// gqa_topk_rows (the aggregate read inside the top-k, never written) picks
// exactly what gqa_rows then topk_rows pick on the GPU: ragged rows, rows
// that select everything, ties on a coarse grid, −inf, rows of two tiles per
// block, a group of 8 queries; its CPU path is gqa_rows_cpu then
// topk_rows_cpu.
TEST(IndexRowsCuda, GqaTopkMatchesGqaThenTopk) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  Device cpu(DeviceKind::cpu);
  const Exec& x = dev.exec();
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  for (const int n_q : {4, 8}) {
    const int H = 2, kmax = 4096;
    const std::vector<int64_t> n{3000, 140000, 70000, 9000, 100000};
    const std::vector<int32_t> budget{4096, 4096, 1500, 4096, 4096};
    const int n_seq = int(n.size());
    const int64_t rows = int64_t(n_seq) * H, stride = 140000;
    StepPlanParams sp{n_seq, 1, 1, 4, 64, 64, kmax};
    cuda::DeviceBuffer d_ranges;
    const auto ranges = ranges_for(sp, n, budget, x, &d_ranges);
    std::vector<float> raw(size_t(rows) * n_q * stride);
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < n_q; ++j) {
        float* v = raw.data() + (r * n_q + j) * stride;
        for (int64_t i = 0; i < stride; ++i) {
          if (r % 4 == 0) v[i] = float(int(rng() % 16)) * 0.5f;                   // ties
          else if (r % 4 == 1) v[i] = rng() % 40 == 0 ? -INFINITY : 4.f * nd(rng);  // −inf among them
          else if (r % 4 == 2) v[i] = 2.f * nd(rng) + float(j);                     // a query ahead of the rest
          else v[i] = nd(rng) + (i >= 50000 && i < 53000 ? 10.f : 0.f);             // the best in one stretch
        }
      }
    GqaRowsParams gp{n_seq, H, n_q, stride, stride};
    cuda::DeviceBuffer d_gs(size_t(gqa_rows_scratch_bytes(rows, n_q)));
    gp.scratch = d_gs.data();
    auto d_raw = to_device(raw);
    // Unfused on the GPU: the aggregate row, then its top-k.
    const auto want = gqa_then_topk(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), kmax);
    // Fused, with the partials left by gqa_rows (as a scorer leaves them) and
    // computed anew; by the cluster top-k alone, and with the sampled filter first.
    cuda::DeviceBuffer d_ts(size_t(gqa_topk_scratch_bytes(rows, n_q, stride)));
    for (const bool sampled : {false, true})
      for (const bool ready : {true, false}) {
        gp.partials_ready = ready;
        gp.topk_scratch = sampled ? d_ts.data() : nullptr;
        poison(d_ts);
        cuda::DeviceBuffer d_fused(size_t(rows) * kmax * 4);
        poison(d_fused);
        gqa_topk_rows(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), kmax, nullptr,
                      d_fused.data<int32_t>());
        sync(x);
        const auto got = to_host<int32_t>(d_fused, want.size());
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_TRUE(std::equal(got.begin() + r * kmax, got.begin() + (r + 1) * kmax, want.begin() + r * kmax))
              << "n_q " << n_q << " row " << r << " partials ready " << ready << " sampled " << sampled;
        if (!sampled) continue;
        // Which rows the sampled path did: rows too short for the sample
        // (3,000 and 9,000 candidates at k = 4,096) go whole to its last
        // kernel (2, done, without the cluster kernel); long rows of spread
        // scores finish on it; the row whose best 3,000 crowd one filter
        // block falls back. Rows of ties may go either way.
        const auto paths = cuda::gqa_topk_row_paths(x, d_ts.data(), rows);
        const std::vector<int32_t> want_path{2, 2, 2, 1, -1, 2, 2, 2, -1, 2};
        for (int64_t r = 0; r < rows; ++r) {
          if (want_path[size_t(r)] >= 0) EXPECT_EQ(paths[size_t(r)], want_path[size_t(r)]) << "n_q " << n_q << " row " << r;
          else EXPECT_TRUE(paths[size_t(r)] == 1 || paths[size_t(r)] == 2) << "n_q " << n_q << " row " << r;
        }
      }
    gp.topk_scratch = nullptr;
    // The CPU path: the specification's two steps.
    gp.scratch = nullptr;
    gp.partials_ready = false;
    std::vector<float> agg(size_t(rows) * stride), agg_c(size_t(rows) * stride);
    std::vector<int32_t> top(size_t(rows) * kmax), top_c(size_t(rows) * kmax);
    gqa_topk_rows(cpu.exec(), gp, raw.data(), ranges.data(), kmax, agg.data(), top.data());
    gqa_rows_cpu(gp, raw.data(), ranges.data(), agg_c.data());
    topk_rows_cpu(rows, H, stride, kmax, agg_c.data(), ranges.data(), top_c.data());
    EXPECT_EQ(top, top_c) << "n_q " << n_q;
  }
}

// The sampled path over many long rows at once: 96 rows of 60k–140k
// candidates (15–35 filter blocks each), three calls on the same scratch
// (nothing of one call's filter or kept state may leak into the next),
// against the cluster kernel's picks; every row finishes on the path.
TEST(IndexRowsCuda, GqaTopkSampledPathOverManyLongRows) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const int H = 2, n_q = 4, kmax = 4096, n_seq = 48;
  std::vector<int64_t> n;
  for (int s = 0; s < n_seq; ++s) n.push_back(60000 + int64_t(rng() % 80000));
  const std::vector<int32_t> budget(static_cast<size_t>(n_seq), 4096);
  const int64_t rows = int64_t(n_seq) * H, stride = 140064;
  StepPlanParams sp{n_seq, 1, 1, 4, 64, 64, kmax};
  cuda::DeviceBuffer d_ranges;
  const auto ranges = ranges_for(sp, n, budget, x, &d_ranges);
  std::vector<float> raw(size_t(rows) * n_q * stride);
  for (float& v : raw) v = 2.f * nd(rng);
  GqaRowsParams gp{n_seq, H, n_q, stride, stride};
  cuda::DeviceBuffer d_gs(size_t(gqa_rows_scratch_bytes(rows, n_q)));
  gp.scratch = d_gs.data();
  auto d_raw = to_device(raw);
  const auto want = gqa_then_topk(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), kmax);
  cuda::DeviceBuffer d_ts(size_t(gqa_topk_scratch_bytes(rows, n_q, stride)));
  poison(d_ts);
  gp.topk_scratch = d_ts.data();
  for (int call = 0; call < 3; ++call) {
    cuda::DeviceBuffer d_got(size_t(rows) * kmax * 4);
    poison(d_got);
    gqa_topk_rows(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), kmax, nullptr, d_got.data<int32_t>());
    sync(x);
    EXPECT_EQ(to_host<int32_t>(d_got, want.size()), want) << "call " << call;
    const auto paths = cuda::gqa_topk_row_paths(x, d_ts.data(), rows);
    EXPECT_EQ(std::count(paths.begin(), paths.end(), 2), rows) << "call " << call;
  }
}

// After the sampled path, the cluster top-k runs as many clusters as fit at
// once, each passing over rows: 120 rows, half of them (20,000 candidates at
// k = 4,096, too dense for the sample) left to it, more than the clusters
// that fit, between rows already done (3,000 candidates, the kept kernel's).
TEST(IndexRowsCuda, GqaTopkClustersPassOverMoreRowsThanFit) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  const int H = 2, n_q = 4, kmax = 4096, n_seq = 60;
  std::vector<int64_t> n;
  for (int s = 0; s < n_seq; ++s) n.push_back(s % 2 ? 3000 : 20000);
  const std::vector<int32_t> budget(static_cast<size_t>(n_seq), 4096);
  const int64_t rows = int64_t(n_seq) * H, stride = 20000;
  StepPlanParams sp{n_seq, 1, 1, 4, 64, 64, kmax};
  cuda::DeviceBuffer d_ranges;
  const auto ranges = ranges_for(sp, n, budget, x, &d_ranges);
  std::vector<float> raw(size_t(rows) * n_q * stride);
  for (float& v : raw) v = rng() % 7 == 0 ? float(int(rng() % 8)) : 3.f * nd(rng);  // ties among them
  GqaRowsParams gp{n_seq, H, n_q, stride, stride};
  cuda::DeviceBuffer d_gs(size_t(gqa_rows_scratch_bytes(rows, n_q)));
  gp.scratch = d_gs.data();
  auto d_raw = to_device(raw);
  const auto want = gqa_then_topk(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), kmax);
  cuda::DeviceBuffer d_ts(size_t(gqa_topk_scratch_bytes(rows, n_q, stride)));
  poison(d_ts);
  gp.topk_scratch = d_ts.data();
  cuda::DeviceBuffer d_fused(size_t(rows) * kmax * 4);
  poison(d_fused);
  gqa_topk_rows(x, gp, d_raw.data<float>(), d_ranges.data<StepRanges>(), kmax, nullptr, d_fused.data<int32_t>());
  sync(x);
  EXPECT_EQ(to_host<int32_t>(d_fused, want.size()), want);
  const auto paths = cuda::gqa_topk_row_paths(x, d_ts.data(), rows);
  int left = 0;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(paths[size_t(r)], (r / H) % 2 ? 2 : 0) << "row " << r;
    left += paths[size_t(r)] == 0;
  }
  EXPECT_EQ(left, 60);
}

// gqa_score_topk_rows' fused path (the scorer keeps only candidates some
// query scores at or above its threshold) picks exactly what score_rows
// then the cluster top-k pick, on the mma16 (higgs2) and U4 planar
// scorers: rows that fuse (≥ 8,192 candidates), a short one that does not,
// queries of spread and of peaked scores; 3k copies of one strong token in a
// row, whose ties at A_k go to the lower chunks (the kept kernel's second
// select); and the fallbacks, driven by moving query 0's threshold: far
// up (query 0 keeps nothing: the check A_k > θ_0 − ℓ_0 fails or too few are
// kept) and far down (query 0 keeps every candidate: more than the list
// holds). Each fallback row is scored again and still picks exactly.
TEST(IndexRowsCuda, GqaScoreTopkFusedMatchesScoreThenTopk) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  const int H = 2, n_q = 4, D = 128, kmax = 1024;
  const std::vector<int64_t> n{20000, 5000, 30000};
  const std::vector<int32_t> budget{625, 625, 1000};
  const int n_seq = int(n.size());
  const int64_t rows = int64_t(n_seq) * H, stride = 30000;
  StepPlanParams spp{n_seq, 1, 1, 4, 64, 64, kmax};
  cuda::DeviceBuffer d_ranges;
  const auto ranges = ranges_for(spp, n, budget, x, &d_ranges);
  for (const bool u4 : {false, true}) {
    const QuantSpec fmt = parse_quant_spec(u4 ? "higgs:U4:g128" : "higgs2:g128");
    const std::vector<float> grid_pts = higgs_grid_of(fmt).points;
    auto d_grid = to_device(grid_pts);
    for (const float qscale : {1.f, 4.f}) {
      // Queries as the CPU takes them and rotated (the planar kernels take
      // them so); row 0's four are one, so that its strong token leads
      // every query's softmax.
      std::vector<float> q_raw(size_t(rows) * n_q * D);
      for (float& v : q_raw) v = qscale * nd(rng);
      for (int j = 1; j < n_q; ++j) std::copy_n(q_raw.begin(), D, q_raw.begin() + j * D);
      std::vector<float> q = q_raw;
      for (size_t i = 0; i < q.size(); i += D) hadamard_transform(q.data() + i, D);
      // Row 0's strong token: per group the code closest to query 0's direction.
      std::vector<uint8_t> hot(32);
      for (int g = 0; g < 32; ++g) {
        const float* qg = q.data() + 4 * g;
        if (u4) {
          uint8_t b = 0;
          for (int j = 0; j < 4; ++j) b |= uint8_t((qg[j] > 0 ? 3 : 0) << (2 * j));
          hot[size_t(g)] = b;
        } else {
          int best = 0;
          float bv = -INFINITY;
          for (int c = 0; c < 256; ++c) {
            float d = 0;
            for (int j = 0; j < 4; ++j) d += qg[j] * grid_pts[size_t(c) * 4 + size_t(j)];
            if (d > bv) bv = d, best = c;
          }
          hot[size_t(g)] = uint8_t(best);
        }
      }
      Rows p0, p1;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t cnt = n[size_t(r / H)];
        std::vector<uint8_t> codes(size_t(cnt) * 32 + 64), scales(size_t(cnt) * 2);
        for (int64_t t = 0; t < cnt * 32; ++t) codes[size_t(t)] = uint8_t(rng());
        for (int64_t t = 0; t < cnt; ++t) {
          const uint16_t b = uint16_t(0x3e80 + rng() % 0x180);  // bf16 in [0.25, 2)
          std::memcpy(scales.data() + t * 2, &b, 2);
        }
        if (r == 0)  // 3k copies of the strong token among the candidates
          for (int64_t i = 0; i < 3 * budget[0]; ++i) {
            const int64_t t = 100 + i * 6;
            std::copy(hot.begin(), hot.end(), codes.begin() + t * 32);
            const uint16_t b = 0x4000;  // 2.0
            std::memcpy(scales.data() + t * 2, &b, 2);
          }
        p0.host.push_back(codes);
        p1.host.push_back(scales);
      }
      p0.finish();
      p1.finish();
      auto d_q = to_device(q);
      ScoreRowsParams sp;
      sp.n_seq = n_seq;
      sp.n_kv_head = H;
      sp.head_dim = D;
      sp.n_q = n_q;
      sp.layout = IndexRecLayout::planar_higgs2;
      sp.fmt = RecordFormat{fmt, D, int64_t(bytes_per_vector(fmt, D))};
      sp.fmt.grid = d_grid.data<float>();
      sp.planar_scorer = PlanarScorer::mma16;
      sp.scale = 0.0884f;
      sp.out_stride = stride;
      cuda::DeviceBuffer d_gs(size_t(gqa_rows_scratch_bytes(rows, n_q)));
      sp.gqa_scratch = d_gs.data();
      GqaRowsParams gp{n_seq, H, n_q, stride, stride, d_gs.data(), true, nullptr};
      cuda::DeviceBuffer d_scores(size_t(rows) * n_q * stride * 4), d_want(size_t(rows) * kmax * 4);
      score_rows(x, sp, d_q.data<float>(), p0.d(), p1.d(), d_ranges.data<StepRanges>(), d_scores.data<float>());
      gqa_topk_rows(x, gp, d_scores.data<float>(), d_ranges.data<StepRanges>(), kmax, nullptr,
                    d_want.data<int32_t>());
      sync(x);
      const auto want = to_host<int32_t>(d_want, size_t(rows) * kmax);
      if (u4 && qscale == 1.f) {  // the U4 scores are the CPU's: so are the picks
        std::vector<float> cpu_scores(size_t(rows) * n_q * stride);
        std::vector<int32_t> cpu_top(size_t(rows) * kmax);
        std::vector<float> agg(size_t(rows) * stride);
        ScoreRowsParams pc = sp;
        pc.layout = IndexRecLayout::records;
        pc.gqa_scratch = nullptr;
        pc.fmt.grid = nullptr;
        std::vector<std::vector<uint8_t>> aos(static_cast<size_t>(rows));
        std::vector<const uint8_t*> recs(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t cnt = n[size_t(r / H)];
          aos[size_t(r)].resize(size_t(cnt) * 34);
          for (int64_t t = 0; t < cnt; ++t) {
            std::copy_n(p0.host[size_t(r)].data() + t * 32, 32, aos[size_t(r)].data() + t * 34);
            std::copy_n(p1.host[size_t(r)].data() + t * 2, 2, aos[size_t(r)].data() + t * 34 + 32);
          }
          recs[size_t(r)] = aos[size_t(r)].data();
        }
        score_rows_cpu(pc, q_raw.data(), recs.data(), recs.data(), ranges.data(), cpu_scores.data());
        GqaRowsParams gc{n_seq, H, n_q, stride, stride};
        gqa_rows_cpu(gc, cpu_scores.data(), ranges.data(), agg.data());
        topk_rows_cpu(rows, H, stride, kmax, agg.data(), ranges.data(), cpu_top.data());
        EXPECT_EQ(cpu_top, want) << "U4 on the CPU";
      }
      // Row 0's picks: the lowest k copies of the strong token.
      for (int64_t i = 0; i < budget[0]; ++i)
        ASSERT_EQ(want[size_t(kmax - budget[0] + i)], 100 + i * 6) << "u4 " << u4 << " strong copy " << i;
      cuda::DeviceBuffer d_ts(size_t(gqa_topk_scratch_bytes(rows, n_q, stride)));
      GqaRowsParams probe{n_seq, H, n_q, stride, stride, d_gs.data(), true, d_ts.data()};
      probe.fuse = 0;
      EXPECT_FALSE(cuda::gqa_score_topk_fuses(sp, probe));
      probe.fuse = 1;
      ASSERT_TRUE(cuda::gqa_score_topk_fuses(sp, probe));
      for (const float bias : {0.f, 1e4f, -1e4f}) {
        gp.topk_scratch = d_ts.data();
        gp.fuse = 1;
        gp.keep_test_bias = bias;
        poison(d_ts);
        cuda::DeviceBuffer d_got(size_t(rows) * kmax * 4);
        poison(d_got);
        gqa_score_topk_rows(x, sp, gp, d_q.data<float>(), p0.d(), p1.d(), d_ranges.data<StepRanges>(), kmax,
                            d_scores.data<float>(), nullptr, d_got.data<int32_t>());
        sync(x);
        const auto got = to_host<int32_t>(d_got, want.size());
        const auto paths = cuda::gqa_topk_row_paths(x, d_ts.data(), rows);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_TRUE(std::equal(got.begin() + r * kmax, got.begin() + (r + 1) * kmax, want.begin() + r * kmax))
              << "u4 " << u4 << " qscale " << qscale << " bias " << bias << " row " << r;
          const bool short_row = r / H == 1;
          const int want_path = short_row ? 0 : bias != 0.f ? 4 : 2;
          // Peaked queries may send a row to the fallback; spread ones fuse.
          if (want_path != 2 || qscale == 1.f)
            EXPECT_EQ(paths[size_t(r)], want_path) << "u4 " << u4 << " qscale " << qscale << " bias " << bias
                                                  << " row " << r;
          else
            EXPECT_TRUE(paths[size_t(r)] == 2 || paths[size_t(r)] == 4) << "row " << r;
        }
      }
    }
  }
}

TEST(IndexRowsCuda, IndexQueryMatchesCpu) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  std::mt19937 rng(9);
  for (int D : {64, 128, 256})
    for (bool mean : {true, false})
      for (int G : {0, 64, D}) {
        IndexQueryParams p{2, 8, 2, D, mean, G, nullptr};
        std::vector<float> sg(static_cast<size_t>(D));
        hadamard_signs(7, D, sg.data());
        auto d_sg = to_device(sg);
        if (G) p.signs = d_sg.data<float>();
        auto qb = random_bf16(size_t(2 * 8 * D), rng);
        const auto qf = bf16_to_f32_vec(qb);
        const int n_q = mean ? 1 : 4;
        std::vector<float> want(size_t(2 * 2 * n_q * D));
        IndexQueryParams pc = p;
        pc.signs = G ? sg.data() : nullptr;
        index_query_rows_cpu(pc, qf.data(), want.data());
        auto d_q = to_device(qb);
        cuda::DeviceBuffer d_out(want.size() * 4);
        index_query_rows(dev.exec(), p, d_q.data(), d_out.data<float>());
        sync(dev.exec());
        const auto got = to_host<float>(d_out, want.size());
        EXPECT_LT(rel_l2(got.data(), want.data(), want.size()), 1e-6) << D << " " << mean << " " << G;
      }
}

}  // namespace
}  // namespace kvtier
