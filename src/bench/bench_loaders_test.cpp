// Loaders: malformed input is reported with the file and line; the real data
// files in data/ load.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/jsonl.h"
#include "bench/longproc.h"
#include "bench/needlebench.h"
#include "bench/tasks.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("kvt_bench_" + name);
  std::ofstream(path) << text;
  return path.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BenchLoaders, JsonlErrorsNameTheLine) {
  const auto path = temp_file("bad.jsonl", "{\"a\": 1}\n\n{\"a\": \n");
  const std::string msg = error_of([&] { read_jsonl(path); });
  EXPECT_NE(msg.find(path + ":3:"), std::string::npos) << msg;
  const auto path2 = temp_file("arr.jsonl", "{\"a\": 1}\n[1, 2]\n");
  EXPECT_NE(error_of([&] { read_jsonl(path2); }).find(":2: expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of([&] { read_jsonl("/nonexistent/x.jsonl"); }).find("/nonexistent/x.jsonl"), std::string::npos);
}

TEST(BenchLoaders, Text2JsonOfficialFormat) {
  const auto good = temp_file("t2j.jsonl",
                              "{\"problem\": \"Extract...\", \"answer\": \"[{\\\"name\\\": \\\"A\\\", \\\"x\\\": \\\"1\\\", "
                              "\\\"y\\\": \\\"2\\\"}]\"}\n");
  const auto samples = load_text2json_file(good);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].id, "text2json-1");
  EXPECT_EQ(samples[0].prompt, "Extract...");
  const auto missing = temp_file("t2j_missing.jsonl", "\n{\"problem\": \"p\"}\n");
  std::string msg = error_of([&] { load_text2json_file(missing); });
  EXPECT_NE(msg.find(missing + ":2: missing field 'answer'"), std::string::npos) << msg;
  const auto not_list = temp_file("t2j_nolist.jsonl", "{\"problem\": \"p\", \"answer\": \"{}\"}\n");
  msg = error_of([&] { load_text2json_file(not_list); });
  EXPECT_NE(msg.find(":1: field 'answer' must hold a JSON list"), std::string::npos) << msg;
  const auto wrong_type = temp_file("t2j_type.jsonl", "{\"problem\": 5, \"answer\": \"[]\"}\n");
  msg = error_of([&] { load_text2json_file(wrong_type); });
  EXPECT_NE(msg.find(":1: field 'problem' must be a string"), std::string::npos) << msg;
}

TEST(BenchLoaders, NeedleBenchMalformedLine) {
  const auto dir = std::filesystem::temp_directory_path() / "kvt_bench_nb";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "PaulGrahamEssays.jsonl") << "{\"title\": \"a\", \"text\": \"Hello.\"}\n";
  std::ofstream(dir / "needles.jsonl") << "{\"needle\": \"n\", \"retrieval_question\": \"q?\", \"arg1\": \"a\", "
                                          "\"arg2\": \"b\", \"language\": \"English\"}\n{\"needle\": 3}\n";
  const std::string msg = error_of([&] { load_needlebench(dir.string()); });
  EXPECT_NE(msg.find("needles.jsonl:2: field 'needle' must be a string"), std::string::npos) << msg;
}

TEST(BenchLoaders, LongProcMalformedFile) {
  const auto dir = std::filesystem::temp_directory_path() / "kvt_bench_lp";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "html_to_tsv_0.5k.json") << "[\n{\"task_id\": \"x\"},\n oops\n]";
  std::string msg = error_of([&] { load_longproc_tasks(dir.string(), "0.5k"); });
  EXPECT_NE(msg.find("html_to_tsv_0.5k.json:3:"), std::string::npos) << msg;
  std::ofstream(dir / "html_to_tsv_2k.json") << "[{\"task_id\": \"x\"}]";
  msg = error_of([&] { load_longproc_tasks(dir.string(), "2k"); });
  EXPECT_NE(msg.find("task 0: missing field 'html_path'"), std::string::npos) << msg;
}

TEST(BenchLoaders, YamlBlockScalarAndFormat) {
  const std::string yaml = "OTHER: |\n  x\nUSER_PROMPT: |-\n  Line {a}\n\n    indented {{b}}\n  end\n\nNEXT: 1\n";
  EXPECT_EQ(yaml_block_scalar(yaml, "USER_PROMPT", "p.yaml"), "Line {a}\n\n  indented {{b}}\nend");
  EXPECT_EQ(yaml_block_scalar(yaml, "OTHER", "p.yaml"), "x\n");
  EXPECT_NE(error_of([&] { yaml_block_scalar(yaml, "MISSING", "p.yaml"); }).find("p.yaml: no top-level key"),
            std::string::npos);
  EXPECT_NE(error_of([&] { yaml_block_scalar("K: plain\n", "K", "p.yaml"); }).find("p.yaml:1:"), std::string::npos);
  EXPECT_EQ(py_format("Line {a}\n{{b}}", {{"a", "A"}}), "Line A\n{b}");
  EXPECT_THROW(py_format("{zzz}", {{"a", "A"}}), Error);
}

TEST(BenchLoaders, GoldFromRecords) {
  EXPECT_EQ(gold_from_record("multineedle", {{"answer", "A*B C#0*10"}}, "x")["keywords"],
            nlohmann::json({"A", "B C"}));
  EXPECT_THROW(gold_from_record("multineedle", {{"answer", "no depths"}}, "x"), Error);
  EXPECT_THROW(gold_from_record("text2json", {{"prediction", "p"}}, "x"), Error);
  EXPECT_EQ(gold_from_record("longproc", {{"gt", "a\tb"}}, "x")["gt"], "a\tb");
}

std::string data_root() { return std::string(KVT_SOURCE_DIR) + "/data"; }

TEST(BenchLoaders, RealLongProcData) {
  const auto samples = make_samples("longproc-0.5k", 0, 3, 0, TaskSource{data_root(), "", {}});
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].id, "W309_0.5k_1");
  EXPECT_NE(samples[0].prompt.find("```html\n<"), std::string::npos);
  EXPECT_NE(samples[0].prompt.find("separated from each other by a tab \"\\t\""), std::string::npos);
  EXPECT_NE(samples[0].prompt.find("```tsv\ncountry\tbilling_currency\n{Your TSV output}\n```"), std::string::npos);
  // The gold scores 100 against itself.
  const auto gt = samples[0].gold["gt"].get<std::string>();
  const auto s = score_prediction("longproc", "```tsv\n" + gt + "\n```", samples[0].gold);
  EXPECT_DOUBLE_EQ(s.score, 1.0);
  // Every task's gold parses and scores 100 against itself.
  for (const char* task : {"longproc-0.5k", "longproc-2k"}) {
    const auto all = make_samples(task, 0, 1000, 0, TaskSource{data_root(), "", {}});
    EXPECT_EQ(all.size(), std::string(task) == "longproc-2k" ? 189u : 100u);
    for (const auto& x : all)
      EXPECT_DOUBLE_EQ(score_prediction("longproc", x.gold["gt"].get<std::string>(), x.gold).score, 1.0) << x.id;
  }
}

TEST(BenchLoaders, XzFilesReadTransparently) {
  const auto dir = std::filesystem::temp_directory_path() / "kvt_xz_test";
  std::filesystem::create_directories(dir);
  const std::string plain = (dir / "a.jsonl").string();
  std::filesystem::remove(plain);
  // `printf '{"a": 1}\n' | xz -9 | od -An -tx1`: the reader must decompress it.
  const unsigned char xz[] = {0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00, 0x00, 0x04, 0xe6, 0xd6, 0xb4, 0x46, 0x02, 0x00,
                              0x21, 0x01, 0x1c, 0x00, 0x00, 0x00, 0x10, 0xcf, 0x58, 0xcc, 0x01, 0x00, 0x08, 0x7b,
                              0x22, 0x61, 0x22, 0x3a, 0x20, 0x31, 0x7d, 0x0a, 0x00, 0x00, 0x00, 0x00, 0xfc, 0xe5,
                              0x7e, 0xac, 0x82, 0x4c, 0x59, 0x40, 0x00, 0x01, 0x21, 0x09, 0x6c, 0x18, 0xc5, 0xd5,
                              0x1f, 0xb6, 0xf3, 0x7d, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04, 0x59, 0x5a};
  std::ofstream(plain + ".xz", std::ios::binary).write(reinterpret_cast<const char*>(xz), sizeof(xz));
  EXPECT_EQ(read_text_file(plain), "{\"a\": 1}\n");
  EXPECT_EQ(read_text_file(plain + ".xz"), "{\"a\": 1}\n");
  const auto recs = read_jsonl(plain);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].value["a"], 1);
  // A corrupt .xz names the file.
  std::ofstream(plain + ".xz", std::ios::binary) << "not xz";
  EXPECT_NE(error_of([&] { read_text_file(plain); }).find("a.jsonl.xz"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::bench
