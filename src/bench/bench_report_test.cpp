// Resume bookkeeping and the summary/plot of bench records.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
                               rec("yakv", 4096, "a", 20, 10), rec("yakv,budget=0.1", 4096, "a", 30, 20)};
  json excluded = rec("full", 4096, "c", 0, 100);
  excluded["excluded"] = true;
  records.push_back(excluded);
  const auto rows = summarize(records);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].policy, "full");
  EXPECT_EQ(rows[0].n, 2);
  EXPECT_EQ(rows[0].n_excluded, 1);
  EXPECT_DOUBLE_EQ(rows[0].score, 75.0);
  EXPECT_DOUBLE_EQ(rows[0].gpu_bytes_per_token, 100.0);
  const std::string md = summary_markdown(rows);
  EXPECT_NE(md.find("| multineedle | 4096 | full | 2 (+1 excl.) | 75.0 |"), std::string::npos) << md;
  EXPECT_EQ(policy_family("yakv,budget=0.1"), "yakv");
  const std::string svg = score_vs_memory_svg(rows);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  // Two families: two polylines; the yakv one goes through both of its policies.
  size_t n_lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++n_lines;
  EXPECT_EQ(n_lines, 2u);
  EXPECT_NE(svg.find("yakv,budget=0.1: 30.0"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::bench
