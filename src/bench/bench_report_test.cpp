// Resume bookkeeping and the summary/plot of bench records.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/bench_plot.h"
#include "bench/bench_report.h"
#include "bench/bench_runner.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

using nlohmann::json;

json rec(const std::string& policy, int64_t ctx, const std::string& id, double score, double gpu_bpt) {
  return {{"task", "multineedle"}, {"id", id}, {"policy", policy}, {"ctx", ctx}, {"score", score},
          {"excluded", false}, {"gpu_bytes_per_token", gpu_bpt}, {"context_tokens", ctx}};
}

TEST(BenchRecords, ResumeSkipsATruncatedLastLine) {
  const auto path = (std::filesystem::temp_directory_path() / "kvt_bench_resume.jsonl").string();
  {
    std::ofstream f(path);
    f << rec("full", 4096, "a", 50, 100).dump() << "\n" << rec("yakv", 4096, "a", 40, 10).dump() << "\n"
      << "{\"task\": \"multineedle\", \"id\": \"b\", \"pol";  // interrupted mid-write
  }
  const auto records = read_bench_records(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(record_key(records[0]), record_key(rec("full", 4096, "a", 0, 0)));
  EXPECT_NE(record_key(records[0]), record_key(rec("full", 8192, "a", 0, 0)));
  EXPECT_NE(record_key(records[0]), record_key(rec("yakv", 4096, "a", 0, 0)));
  // A malformed line that is not the last one is an error naming the line.
  {
    std::ofstream f(path);
    f << "{\"id\": 1}\n" << rec("full", 4096, "a", 50, 100).dump() << "\n";
  }
  try {
    read_bench_records(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":1:"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(read_bench_records(path + ".missing").empty());
}

TEST(BenchReport, SummaryAndPlot) {
  std::vector<json> records = {rec("full", 4096, "a", 50, 100), rec("full", 4096, "b", 100, 100),
                               rec("yakv", 4096, "a", 20, 10), rec("yakv", 4096, "b", 40, 10),
                               rec("yakv,budget=0.1", 4096, "a", 30, 20)};
  json excluded = rec("full", 4096, "c", 0, 100);
  excluded["excluded"] = true;
  records.push_back(excluded);
  const auto rows = summarize(records);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].policy, "full");
  EXPECT_EQ(rows[0].n, 2);
  EXPECT_EQ(rows[0].n_excluded, 1);
  EXPECT_DOUBLE_EQ(rows[0].score.mean, 75.0);
  EXPECT_DOUBLE_EQ(rows[0].score.lo, 50.0);  // two samples: the resampled means are 50, 75 or 100
  EXPECT_DOUBLE_EQ(rows[0].score.hi, 100.0);
  EXPECT_DOUBLE_EQ(rows[0].gpu_bytes_per_token, 100.0);
  // Paired with full on samples a and b: (20 + 40) / (50 + 100).
  EXPECT_DOUBLE_EQ(rows[1].score_vs_full.mean, 0.4);
  EXPECT_EQ(rows[1].score_vs_full.n, 2);
  EXPECT_EQ(rows[2].score_vs_full.n, 1);  // only sample a
  EXPECT_DOUBLE_EQ(rows[2].score_vs_full.mean, 30.0 / 50.0);
  const std::string md = summary_markdown(rows);
  EXPECT_NE(md.find("| multineedle | 4096 | full | 2 (< 20) (+1 excl.) | 75.0 [50.0, 100.0] | 1.000 [1.000, 1.000] |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("fewer samples than the 20"), std::string::npos) << md;
  EXPECT_EQ(md.find("KL(full"), std::string::npos) << "no fidelity columns without fidelity records";
  EXPECT_EQ(policy_family("yakv,budget=0.1"), "yakv");
  const std::string svg = score_vs_memory_svg(rows);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  // Two families: two polylines; the yakv one goes through both of its policies.
  size_t n_lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++n_lines;
  EXPECT_EQ(n_lines, 2u);
  EXPECT_NE(svg.find("yakv,budget=0.1: 30.0"), std::string::npos);
}

TEST(BenchReport, FidelityColumnsAndPanels) {
  std::vector<json> records;
  for (int i = 0; i < 20; ++i) {
    const std::string id = fmt::format("s{}", i);
    json f = rec("full", 8192, id, 100, 100);
    f["answer_nll"] = 0.5;
    f["answer_token_acc"] = 0.9;
    f["top1_agree_full"] = 1.0;
    f["kl_full"] = 0.0;
    records.push_back(f);
    json y = rec("yakv", 8192, id, i < 10 ? 100 : 0, 10);
    y["answer_nll"] = 0.7;
    y["answer_token_acc"] = 0.8;
    y["top1_agree_full"] = i < 10 ? 0.9 : 0.7;
    y["kl_full"] = 0.05;
    records.push_back(y);
  }
  json fid_only = rec("oracle", 8192, "s0", 0, 50);  // --fidelity only: no score
  fid_only.erase("score");
  fid_only["answer_nll"] = 0.6;
  fid_only["answer_token_acc"] = 0.85;
  fid_only["top1_agree_full"] = 0.95;
  fid_only["kl_full"] = 0.01;
  records.push_back(fid_only);
  const auto rows = summarize(records);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].n_fidelity, 20);
  EXPECT_DOUBLE_EQ(rows[1].top1_agree_full.mean, 80.0);
  EXPECT_LT(rows[1].top1_agree_full.lo, 80.0);
  EXPECT_GT(rows[1].top1_agree_full.hi, 80.0);
  EXPECT_NEAR(rows[1].kl_full.mean, 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(rows[1].score_vs_full.mean, 0.5);
  EXPECT_EQ(rows[2].n, 0);
  EXPECT_EQ(rows[2].n_fidelity, 1);
  const std::string md = summary_markdown(rows);
  EXPECT_NE(md.find("KL(full‖policy)"), std::string::npos);
  EXPECT_NE(md.find("| multineedle | 8192 | yakv | 20 | 50.0 ["), std::string::npos) << md;
  EXPECT_NE(md.find("| 20 | 0.700 [0.700, 0.700] | 80.0 [80.0, 80.0] | 80.0 ["), std::string::npos) << md;
  EXPECT_NE(md.find("| multineedle | 8192 | oracle | 0 | – | – | 1 (< 20) |"), std::string::npos) << md;
  const std::string svg = score_vs_memory_svg(rows);
  EXPECT_NE(svg.find("top-1 agreement with full attention"), std::string::npos);
  EXPECT_NE(svg.find("KL(full"), std::string::npos);
  EXPECT_NE(svg.find("yakv: 80.0 ["), std::string::npos);  // agreement point with its interval
  EXPECT_NE(svg.find("<line"), std::string::npos);          // error bars
}

}  // namespace
}  // namespace kvtier::bench
