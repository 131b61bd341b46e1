#include <gtest/gtest.h>

#include "bench/text2json_score.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

const char* k_gold =
    R"([{"name": "Alpha", "price": "$10", "weight": "5"},)"
    R"( {"name": "Beta", "price": "$20", "weight": "6"},)"
    R"( {"name": "Gamma’s", "price": "$30", "weight": "7"},)"
    R"( {"name": "Delta", "price": "it’s", "weight": "8"}])";

double score(const std::string& pred) { return score_text2json(pred, k_gold).score; }

TEST(Text2JsonScore, PerfectPredictionScoresOne) {
  EXPECT_DOUBLE_EQ(score(k_gold), 1.0);
  EXPECT_DOUBLE_EQ(score(std::string("Sure! Here it is:\n```json\n") + k_gold + "\n```"), 1.0);
}

TEST(Text2JsonScore, BracketRules) {
  // No bracket at all.
  auto s = score_text2json(R"({"name": "Alpha", "price": "$10", "weight": "5"})", k_gold);
  EXPECT_EQ(s.score, 0.0);
  EXPECT_FALSE(s.note.empty());
  // Two '['.
  EXPECT_EQ(score(R"([[{"name": "Alpha", "price": "$10", "weight": "5"}])"), 0.0);
  // Two ']' (e.g. a list echoed after the answer).
  EXPECT_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": "5"}] ])"), 0.0);
  // ']' before '['.
  EXPECT_EQ(score(R"(] {"name": "Alpha"} [)"), 0.0);
}

TEST(Text2JsonScore, InvalidJsonScoresZero) {
  EXPECT_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": "5"},])"), 0.0);
  EXPECT_EQ(score(R"([{name: Alpha}])"), 0.0);
}

TEST(Text2JsonScore, OnlyTheBracketedTextIsParsed) {
  // Text around the brackets is ignored, even when it is not JSON.
  EXPECT_DOUBLE_EQ(score(R"(answer: [{"name": "Alpha", "price": "$10", "weight": "5"}] done)"), 1.0 / 4);
}

TEST(Text2JsonScore, NonObjectEntryGrowsUnion) {
  // 'Alpha' matches fully (1), the string entry adds 1 to the union: 1 / 5.
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": "5"}, "Beta"])"), 1.0 / 5);
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": "5"}, 7])"), 1.0 / 5);
}

TEST(Text2JsonScore, EntryWithoutNameGrowsUnion) {
  EXPECT_DOUBLE_EQ(score(R"([{"title": "Alpha", "price": "$10", "weight": "5"}])"), 0.0);
  auto s = score_text2json(R"([{"title": "Alpha"}, {"name": "Beta", "price": "$20", "weight": "6"}])", k_gold);
  EXPECT_EQ(s.union_size, 5);
  EXPECT_DOUBLE_EQ(s.score, 1.0 / 5);
}

TEST(Text2JsonScore, NonStringNameGrowsUnion) {
  auto s = score_text2json(R"([{"name": 12, "price": "$10", "weight": "5"}, {"name": null}])", k_gold);
  EXPECT_EQ(s.union_size, 6);
  EXPECT_DOUBLE_EQ(s.score, 0.0);
}

TEST(Text2JsonScore, UnknownNameGrowsUnion) {
  auto s = score_text2json(
      R"([{"name": "Alpha", "price": "$10", "weight": "5"}, {"name": "Omega", "price": "$1", "weight": "1"}])", k_gold);
  EXPECT_EQ(s.union_size, 5);
  EXPECT_DOUBLE_EQ(s.score, 1.0 / 5);
}

TEST(Text2JsonScore, RepeatedPredictedNameIsFalsePositive) {
  auto s = score_text2json(
      R"([{"name": "Alpha", "price": "$10", "weight": "5"}, {"name": "Alpha", "price": "$10", "weight": "5"}])",
      k_gold);
  EXPECT_EQ(s.union_size, 5);
  EXPECT_DOUBLE_EQ(s.matched, 1.0);
  EXPECT_DOUBLE_EQ(s.score, 1.0 / 5);
}

TEST(Text2JsonScore, MissingFieldCostsHalf) {
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10"}])"), 0.5 / 4);
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha"}])"), 0.0 / 4);
}

TEST(Text2JsonScore, NullFieldCostsHalf) {
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": null, "weight": "5"}])"), 0.5 / 4);
}

TEST(Text2JsonScore, DifferingFieldCostsQuarter) {
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$11", "weight": "5"}])"), 0.75 / 4);
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "10", "weight": "50"}])"), 0.5 / 4);
  // Case and spacing matter: exact comparison.
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10 ", "weight": "5"}])"), 0.75 / 4);
  // A missing field and a wrong one: 1 - 0.5 - 0.25.
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$9"}])"), 0.25 / 4);
}

TEST(Text2JsonScore, ExtraFieldsAreIgnored) {
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": "5", "color": "red"}])"), 1.0 / 4);
}

TEST(Text2JsonScore, ApostropheNormalization) {
  // Gold has ’ in a name and a value; the prediction may use ' (and vice versa).
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Gamma's", "price": "$30", "weight": "7"}])"), 1.0 / 4);
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Gamma’s", "price": "$30", "weight": "7"}])"), 1.0 / 4);
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Delta", "price": "it's", "weight": "8"}])"), 1.0 / 4);
  // Other quote marks are not normalized.
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Gamma‘s", "price": "$30", "weight": "7"}])"), 0.0);
}

TEST(Text2JsonScore, IntegersComparedAsStrings) {
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": 5}])"), 1.0 / 4);
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": 6}])"), 0.75 / 4);
  // A float is not an integer: it never equals the gold string.
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": "$10", "weight": 5.0}])"), 0.75 / 4);
  // Nor is a boolean.
  EXPECT_DOUBLE_EQ(score(R"([{"name": "Alpha", "price": true, "weight": "5"}])"), 0.75 / 4);
}

TEST(Text2JsonScore, DuplicateGoldNamesExcludeTheSample) {
  const char* gold = R"([{"name": "A", "x": "1", "y": "2"}, {"name": "A", "x": "3", "y": "4"}])";
  auto s = score_text2json(R"([{"name": "A", "x": "1", "y": "2"}])", gold);
  EXPECT_TRUE(s.excluded);
  // Names equal after the apostrophe fix are duplicates too.
  const char* gold2 = R"([{"name": "O’Neil", "x": "1", "y": "2"}, {"name": "O'Neil", "x": "3", "y": "4"}])";
  EXPECT_TRUE(score_text2json("[]", gold2).excluded);
  // Excluded samples are left out of the benchmark mean.
  std::vector<Text2JsonScore> all = {s, score_text2json(k_gold, k_gold), score_text2json("[]", k_gold)};
  EXPECT_DOUBLE_EQ(text2json_benchmark_score(all), 50.0);
}

TEST(Text2JsonScore, UnionGrowth) {
  // 2 matched (Alpha perfect, Beta with a wrong weight), 3 unknown: (1 + 0.75) / (4 + 3).
  auto s = score_text2json(R"([{"name": "Alpha", "price": "$10", "weight": "5"},
                                {"name": "X"}, {"name": "Y"},
                                {"name": "Beta", "price": "$20", "weight": "9"},
                                {"name": "Alpha", "price": "$10", "weight": "5"}])",
                           k_gold);
  EXPECT_EQ(s.union_size, 7);
  EXPECT_DOUBLE_EQ(s.score, 1.75 / 7);
}

TEST(Text2JsonScore, EmptyListScoresZero) { EXPECT_DOUBLE_EQ(score("[]"), 0.0); }

TEST(Text2JsonScore, MalformedGoldThrows) {
  EXPECT_THROW(score_text2json("[]", "not json"), Error);
  EXPECT_THROW(score_text2json("[]", R"({"name": "A"})"), Error);
  EXPECT_THROW(score_text2json("[]", R"([{"name": "A", "x": "1"}])"), Error);
  EXPECT_THROW(score_text2json("[]", R"([{"name": "A", "x": 1, "y": "2"}])"), Error);
  EXPECT_THROW(score_text2json("[]", "[]"), Error);
}

}  // namespace
}  // namespace kvtier::bench
