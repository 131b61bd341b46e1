// The decode step's index scoring at Llama-3.1-8B shapes (8 KV heads, 4
// queries per KV head, head_dim 128) on the planar 2-bit HIGGS index, as a
// batch of sequences scores it: one score_rows launch set over every
// sequence's rows, with gqa_rows' softmax partials left as the engine asks.
// For each batch size and each blocks-per-row setting ("auto" is
// table_blocks_per_row's choice, "wave" the most blocks that fit one wave,
// max(1, SMs / rows), the rule before it) and each scorer
// (ScoreRowsParams::planar_scorer: the table layouts xor and rotated, the
// tensor-core mma and mma16, whose "auto" blocks their launches pick by
// their occupancy; and "u4", the U4 index's int8 tensor-core scorer):
// the median and minimum of CUDA-event
// timings with the L2 flushed before each (a step's 32 layers read 32
// different indexes), µs per sequence, and the codes' read rate. Speed
// belongs here, not in the tests; index_rows_cuda_test checks the scores.
//
// usage: kvt_score_bench [--tokens 131072] [--batch 1,6,12,20] [--blocks auto,wave,4]
//            [--table xor,rotated,mma,mma16,u4] [--reps 20] [--json out.json]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "ops/bench_args.h"
#include "ops/bench_timing_cuda.h"
#include "backend/device.h"
#include "core/status.h"
#include "ops/index_score/index_rows.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier::cuda {
namespace {

constexpr int kKvHeads = 8, kNq = 4, kHd = 128, kCodeBytes = 32;

struct Options {
  int64_t tokens = 131072;
  std::vector<int> batch = {1, 6, 12, 20};
  std::vector<int> blocks = {0, -1};  // 0: auto, -1: one wave
  std::vector<PlanarScorer> scorers = {PlanarScorer::mma};  // the scorers timed
  std::vector<bool> u4 = {false};                           // per scorer: the U4 index instead
  int reps = 20;
  std::string json_path;
};

Options parse(int argc, char** argv) {
  Options o;
  for_each_option(argc, argv, [&](const std::string& a, const std::string& val) {
    if (a == "--tokens") {
      o.tokens = std::stoll(val);
    } else if (a == "--batch") {
      o.batch.clear();
      for (auto& x : split_list(val)) o.batch.push_back(std::stoi(x));
    } else if (a == "--blocks") {
      o.blocks.clear();
      for (auto& x : split_list(val)) o.blocks.push_back(x == "auto" ? 0 : x == "wave" ? -1 : std::stoi(x));
    } else if (a == "--table") {
      o.scorers.clear();
      o.u4.clear();
      for (auto& x : split_list(val)) {
        o.u4.push_back(x == "u4");
        o.scorers.push_back(x == "u4" ? PlanarScorer::automatic : planar_scorer_from_name(x));
      }
    } else if (a == "--reps") {
      o.reps = std::stoi(val);
    } else if (a == "--json") {
      o.json_path = val;
    } else {
      fail("unknown option {} (--tokens, --batch, --blocks, --table, --reps, --json)", a);
    }
  });
  KVT_CHECK(o.reps >= 1 && o.tokens >= 1024 && !o.batch.empty() && !o.blocks.empty() && !o.scorers.empty(),
            "nothing to time");
  for (int b : o.batch) KVT_CHECK(b >= 1 && b <= 256, "batch {} outside 1..256", b);
  for (int b : o.blocks) KVT_CHECK(b >= -1 && b <= 256, "blocks per row {} outside 1..256 (or auto, wave)", b);
  return o;
}

int run(const Options& o) {
  KVT_CHECK(cuda_device_count() > 0, "{}", cuda_device_summary());
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  const int max_b = *std::max_element(o.batch.begin(), o.batch.end());
  const int64_t n = o.tokens, max_rows = int64_t(max_b) * kKvHeads;
  fmt::print("device: {}\n", cuda_device_summary());
  fmt::print("planar higgs2 index: {} tokens per row, {} KV heads x {} queries, head_dim {}\n", n, kKvHeads, kNq,
             kHd);
  fmt::print("timing: median (min) of {} CUDA-event timings after a warm-up, L2 flushed before each\n\n", o.reps);
  fmt::print("{:>5} {:>6} {:>7} {:>8} {:>10} {:>10} {:>10} {:>9}\n", "batch", "rows", "blocks", "table", "median us",
             "min us", "us/seq", "GB/s");

  // Every row its own codes and scales (random bytes: speed only).
  std::mt19937 rng(7);
  std::vector<uint8_t> codes_h(size_t(n * kCodeBytes + 64));
  for (auto& b : codes_h) b = uint8_t(rng());
  std::vector<uint16_t> scales_h(static_cast<size_t>(n));
  for (auto& s : scales_h) s = uint16_t(0x3f80 + (rng() & 0x7f));  // bf16 in [1, 2)
  std::vector<Buffer> codes, scales;
  std::vector<const uint8_t*> p0, p1;
  for (int64_t r = 0; r < max_rows; ++r) {
    codes.push_back(dev.alloc(codes_h.size()));
    scales.push_back(dev.alloc(scales_h.size() * 2));
    copy(x, codes.back().data(), codes_h.data(), codes_h.size());
    copy(x, scales.back().data(), scales_h.data(), scales_h.size() * 2);
    sync(x);
    p0.push_back(codes.back().data<uint8_t>());
    p1.push_back(scales.back().data<uint8_t>());
  }
  Buffer d_p0 = dev.alloc(p0.size() * sizeof(void*)), d_p1 = dev.alloc(p1.size() * sizeof(void*));
  copy(x, d_p0.data(), p0.data(), p0.size() * sizeof(void*));
  copy(x, d_p1.data(), p1.data(), p1.size() * sizeof(void*));
  const QuantSpec fmt = parse_quant_spec("higgs2:g128"), fmt_u4 = parse_quant_spec("higgs:U4:g128");
  const auto& pts = higgs_grid_of(fmt).points;
  const auto& pts_u4 = higgs_grid_of(fmt_u4).points;
  Buffer grid = dev.alloc(pts.size() * 4), grid_u4 = dev.alloc(pts_u4.size() * 4);
  copy(x, grid.data(), pts.data(), pts.size() * 4);
  copy(x, grid_u4.data(), pts_u4.data(), pts_u4.size() * 4);
  std::vector<float> q_h(size_t(max_rows * kNq * kHd));
  for (auto& v : q_h) v = std::normal_distribution<float>(0.f, 1.f)(rng);
  Buffer q = dev.alloc(q_h.size() * 4);
  copy(x, q.data(), q_h.data(), q_h.size() * 4);
  // Each sequence's step: sinks and the local window outside the candidates.
  StepRanges sr;
  sr.n = n;
  sr.n_chunk = n;
  sr.c_lo = 4;
  sr.c_hi = n - 64;
  std::vector<StepRanges> ranges_h(size_t(max_b), sr);
  Buffer ranges = dev.alloc(ranges_h.size() * sizeof(StepRanges));
  copy(x, ranges.data(), ranges_h.data(), ranges_h.size() * sizeof(StepRanges));
  Buffer scores = dev.alloc(size_t(max_rows * kNq * n * 4));
  Buffer gqa = dev.alloc(size_t(gqa_rows_scratch_bytes(max_rows, kNq)));
  Buffer flush = dev.alloc(size_t(256) << 20);  // > the 60 MB L2
  sync(x);
  const cudaStream_t s = static_cast<cudaStream_t>(x.stream);

  nlohmann::json js;
  js["device"] = cuda_device_summary();
  js["tokens"] = n;
  for (int b : o.batch) {
    for (int bpr : o.blocks) {
      for (size_t si = 0; si < o.scorers.size(); ++si) {
        const PlanarScorer sc = o.scorers[si];
        const bool u4 = o.u4[si];
        ScoreRowsParams p;
        p.n_seq = b;
        p.n_kv_head = kKvHeads;
        p.head_dim = kHd;
        p.n_q = kNq;
        p.layout = IndexRecLayout::planar_higgs2;
        p.fmt = RecordFormat{u4 ? fmt_u4 : fmt, kHd, kCodeBytes + 2};
        p.fmt.grid = (u4 ? grid_u4 : grid).data<float>();
        p.candidates_only = true;
        p.scale = 1.f / std::sqrt(float(kHd));
        p.out_stride = n;
        p.gqa_scratch = gqa.data();
        const int64_t rows = int64_t(b) * kKvHeads;
        const int n_sm = device_info().n_sm;
        const bool mma = u4 || sc == PlanarScorer::mma || sc == PlanarScorer::mma16;
        const int chosen = bpr > 0   ? bpr
                           : bpr < 0 ? int(std::max<int64_t>(1, n_sm / rows))
                           : mma     ? 0
                                     : table_blocks_per_row(rows, n_sm, 64);
        p.blocks_per_row = chosen;
        p.planar_scorer = sc;
        auto launch = [&] {
          score_rows(x, p, q.data<float>(), d_p0.data<const uint8_t* const>(), d_p1.data<const uint8_t* const>(),
                     ranges.data<StepRanges>(), scores.data<float>());
        };
        launch();  // warm-up: attributes, module load
        sync(x);
        std::vector<double> t = time_launches_ms(s, o.reps, flush.data(), flush.bytes(), launch);
        for (double& v : t) v *= 1e3;  // µs
        const double med = t[t.size() / 2];
        const double gbs = double(rows) * double(sr.c_hi - sr.c_lo) * (kCodeBytes + 2) / (med * 1e-6) / 1e9;
        fmt::print("{:>5} {:>6} {:>7} {:>8} {:>10.1f} {:>10.1f} {:>10.1f} {:>9.0f}\n", b, rows,
                   chosen == 0 ? std::string("auto") : fmt::format("{}{}", chosen, bpr == 0 ? "*" : bpr < 0 ? "w" : ""),
                   u4 ? "u4" : planar_scorer_name(sc), med, t[0],
                   med / b, gbs);
        std::fflush(stdout);
        js["rows"].push_back({{"batch", b}, {"rows", rows}, {"blocks_per_row", chosen},
                              {"setting", bpr == 0 ? "auto" : bpr < 0 ? "wave" : "forced"},
                              {"table", u4 ? "u4" : planar_scorer_name(sc)},
                              {"median_us", med}, {"min_us", t[0]}, {"us_per_seq", med / b}, {"gb_per_s", gbs},
                              {"times_us", t}});
      }
    }
  }
  fmt::print("\n* chosen by table_blocks_per_row; w: one wave, max(1, SMs / rows)\n");
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << js.dump(1) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cuda

int main(int argc, char** argv) {
  try {
    return kvtier::cuda::run(kvtier::cuda::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvt_score_bench: %s\n", e.what());
    return 1;
  }
}
