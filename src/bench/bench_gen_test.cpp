// Generators: determinism by seed, target length, gold that scores 100
// against itself, and the structure each task promises.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "bench/bench_test_util.h"
#include "bench/bench_text.h"
#include "bench/needlebench.h"
#include "bench/ruler.h"
#include "bench/tasks.h"
#include "bench/text2json_gen.h"
#include "bench/text2json_score.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

std::vector<std::string> filler_texts() {
  return bench::filler_texts(5, " talks about ", ", painting and programming languages. ");
}

TEST(Text2JsonGen, DeterministicBySeed) {
  Text2JsonGenOptions o;
  o.target_tokens = 2000;
  o.seed = 7;
  const auto a = make_text2json_sample(o, filler_texts(), count_words);
  const auto b = make_text2json_sample(o, filler_texts(), count_words);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.gold, b.gold);
  o.seed = 8;
  const auto c = make_text2json_sample(o, filler_texts(), count_words);
  EXPECT_NE(a.prompt, c.prompt);
}

TEST(Text2JsonGen, ReachesTargetLengthAndScoresItself) {
  for (int64_t target : {1024, 4096, 16384}) {
    for (int64_t index = 0; index < 4; ++index) {  // the four domains
      Text2JsonGenOptions o;
      o.target_tokens = target;
      o.seed = 3;
      o.index = index;
      const auto s = make_text2json_sample(o, filler_texts(), count_words);
      EXPECT_LE(s.n_tokens, target);
      EXPECT_GE(s.n_tokens, target - std::max<int64_t>(16, target / 100)) << target << " " << index;
      EXPECT_EQ(s.n_tokens, count_words(s.prompt));
      const std::string answer = s.gold["answer"];
      const auto gold = nlohmann::json::parse(answer);
      ASSERT_TRUE(gold.is_array());
      EXPECT_GE(gold.size(), 3u);
      EXPECT_LE(static_cast<int>(gold.size()), text2json_max_targets(target));
      std::set<std::string> names;
      for (const auto& e : gold) {
        ASSERT_EQ(e.size(), 3u);
        names.insert(e["name"].get<std::string>());
        // Every name and value is in the prompt, word for word.
        for (const auto& [k, v] : e.items()) EXPECT_TRUE(contains(s.prompt, v.get<std::string>())) << v;
      }
      EXPECT_EQ(names.size(), gold.size());
      const auto self = score_text2json(answer, answer);
      EXPECT_FALSE(self.excluded);
      EXPECT_DOUBLE_EQ(self.score, 1.0);
      EXPECT_DOUBLE_EQ(text2json_benchmark_score({self}), 100.0);
    }
  }
}

TEST(Text2JsonGen, EntriesAppearInAnswerOrder) {
  Text2JsonGenOptions o;
  o.target_tokens = 4096;
  o.seed = 11;
  o.domain = "medical";  // its near-duplicate names never extend a target's name
  const auto s = make_text2json_sample(o, filler_texts(), count_words);
  size_t last = 0;
  for (const auto& e : nlohmann::json::parse(s.gold["answer"].get<std::string>())) {
    const size_t at = s.prompt.find(e["name"].get<std::string>());
    ASSERT_NE(at, std::string::npos);
    EXPECT_GE(at, last);
    last = at;
  }
}

TEST(Text2JsonGen, RejectsBadOptions) {
  Text2JsonGenOptions o;
  o.domain = "cars";
  EXPECT_THROW(make_text2json_sample(o, filler_texts(), count_words), Error);
  o.domain = "";
  o.target_tokens = 100;
  EXPECT_THROW(make_text2json_sample(o, filler_texts(), count_words), Error);
  EXPECT_THROW(make_text2json_sample(Text2JsonGenOptions{}, {}, count_words), Error);
}

TEST(RulerGen, EachTaskScoresItsOwnAnswer) {
  for (const auto& task : k_ruler_tasks) {
    const auto a = make_ruler_sample(task, filler_texts(), 3000, 5, 0, count_words);
    const auto b = make_ruler_sample(task, filler_texts(), 3000, 5, 0, count_words);
    EXPECT_EQ(a.prompt, b.prompt) << task;
    EXPECT_LE(a.n_tokens, 3000) << task;
    EXPECT_GE(a.n_tokens, 2000) << task;
    std::vector<std::string> outs = a.gold["outputs"];
    ASSERT_FALSE(outs.empty()) << task;
    EXPECT_DOUBLE_EQ(ruler_match_all(join(outs, ", "), outs), 1.0) << task;
    EXPECT_LT(ruler_match_all(outs[0], outs), outs.size() > 1 ? 1.0 : 1.1) << task;
    if (task != "fwe" && task != "cwe") {
      for (const auto& o : outs) EXPECT_TRUE(contains(a.prompt, o)) << task << " " << o;
    }
  }
}

TEST(RulerGen, NeedleCounts) {
  const auto mk = make_ruler_sample("niah_multikey", filler_texts(), 2000, 1, 0, count_words);
  EXPECT_EQ(count_substr(mk.prompt, "One of the special magic numbers for"), 4u);
  EXPECT_EQ(mk.gold["outputs"].size(), 1u);
  const auto mv = make_ruler_sample("niah_multivalue", filler_texts(), 2000, 1, 0, count_words);
  EXPECT_EQ(mv.gold["outputs"].size(), 4u);
  const auto mq = make_ruler_sample("niah_multiquery", filler_texts(), 2000, 1, 0, count_words);
  EXPECT_EQ(mq.gold["outputs"].size(), 4u);
  const auto vt = make_ruler_sample("vt", filler_texts(), 2000, 1, 0, count_words);
  EXPECT_EQ(count_substr(vt.prompt, " VAR "), 5u + 4u);  // 5 assignments, 4 of them from a variable
}

TEST(RulerScore, StringMatchMetrics) {
  const std::vector<std::string> refs = {"1234567", "Apple"};
  EXPECT_DOUBLE_EQ(ruler_match_all("the numbers are 1234567 and apple.", refs), 1.0);
  EXPECT_DOUBLE_EQ(ruler_match_all("1234567 only", refs), 0.5);
  EXPECT_DOUBLE_EQ(ruler_match_all("nothing", refs), 0.0);
  EXPECT_DOUBLE_EQ(ruler_match_part("APPLE!", refs), 1.0);
  EXPECT_DOUBLE_EQ(ruler_match_part("pear", refs), 0.0);
  // Control characters become line breaks: "12345\t67" does not contain "1234567".
  EXPECT_DOUBLE_EQ(ruler_match_all("12345\x01" "67", {"1234567"}), 0.0);
  EXPECT_EQ(ruler_postprocess("  a\tb\x02 "), "a\nb");
}

TEST(MultiNeedleScore, KeywordRecall) {
  const std::vector<std::string> kw = {"Virtual Rocket Band", "Aurora", "Zeta"};
  EXPECT_DOUBLE_EQ(score_multineedle("The band was the Virtual Rocket Band, and Aurora.", kw), 2.0 / 3);
  // Exact, case-sensitive substring, as NeedleBench checks.
  EXPECT_DOUBLE_EQ(score_multineedle("virtual rocket band aurora zeta", kw), 0.0);
  EXPECT_DOUBLE_EQ(score_multineedle("Zeta Aurora Virtual Rocket Band", kw), 1.0);
}

std::string data_root() { return std::string(KVT_SOURCE_DIR) + "/data"; }

TEST(MultiNeedleGen, BuildsFromTheRealData) {
  const auto data = load_needlebench(data_root() + "/needlebench");
  EXPECT_EQ(data.essays.size(), 147u);
  const auto needles = unique_needles(data.needles, "English", 11);
  ASSERT_EQ(needles.size(), 11u);
  EXPECT_EQ(needles[0].arg2, "Virtual Rocket Band");
  const std::string q = multineedle_question({needles[0]});
  EXPECT_EQ(q, "Which band was the first to perform on the Moon?Please answer in the format of "
               "'The first band to perform on the the Moon was________'");
  const auto s = make_multineedle_sample(data, 4000, 1, 0, count_words);
  const auto s2 = make_multineedle_sample(data, 4000, 1, 0, count_words);
  EXPECT_EQ(s.prompt, s2.prompt);
  EXPECT_LE(s.n_tokens, 4000);
  EXPECT_GE(s.n_tokens, 3900);
  std::vector<std::string> kw = s.gold["keywords"];
  ASSERT_EQ(kw.size(), 11u);
  for (const auto& n : needles) EXPECT_TRUE(contains(s.prompt, "\n" + n.needle + "\n")) << n.needle;
  EXPECT_DOUBLE_EQ(score_multineedle(join(kw, "; "), kw), 1.0);
  // The needle at depth 0 comes first, the one at 100 % last.
  const auto first = std::find_if(needles.begin(), needles.end(), [&](const Needle& n) { return n.arg2 == kw[0]; });
  const auto last = std::find_if(needles.begin(), needles.end(), [&](const Needle& n) { return n.arg2 == kw[10]; });
  EXPECT_LT(s.prompt.find(first->needle), s.prompt.find(last->needle));
  EXPECT_GT(s.prompt.find("</Document>"), s.prompt.find(last->needle));
}

// The reference answer of every generated task scores 100 (it is what the
// model writes after answer_prefix), and a truncated one does not.
TEST(ReferenceAnswer, ScoresFullMarksForEveryTask) {
  const TaskSource source{data_root(), "", count_words};
  for (const std::string task :
       {"text2json-gen", "text2json-gen:heldout", "multineedle", "multineedle-gen", "multineedle-gen:heldout",
        "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "niah_multikey:train",
        "niah_multiquery:heldout", "vt:heldout", "cwe:train", "fwe:heldout", "longproc-0.5k"}) {
    const auto samples = make_samples(task, 3000, 4, 11, source);
    ASSERT_FALSE(samples.empty()) << task;
    for (const auto& s : samples) {
      ASSERT_FALSE(s.reference.empty()) << s.id;
      const auto full = score_prediction(score_family(task), s.reference, s.gold);
      EXPECT_DOUBLE_EQ(full.score, 1.0) << s.id << ": " << s.reference;
      const auto half = score_prediction(score_family(task), s.reference.substr(0, s.reference.size() / 2), s.gold);
      EXPECT_LT(half.score, 1.0) << s.id << ": " << s.reference;
    }
  }
}

}  // namespace
}  // namespace kvtier::bench
