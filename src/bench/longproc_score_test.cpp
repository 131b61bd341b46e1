#include <gtest/gtest.h>

#include "bench/longproc_score.h"

namespace kvtier::bench {
namespace {

const char* k_gold = "name\tcity\nThe Beatles\tLiverpool\nABBA\tStockholm\nQueen\tLondon";

TEST(LongProcScore, ExtractsTheTsvBlock) {
  EXPECT_EQ(extract_tsv_block("intro\n```tsv\na\tb\n```\nbye"), "a\tb");
  // Greedy: up to the last fence.
  EXPECT_EQ(extract_tsv_block("```tsv\na\n```\nmid\n```"), "a\n```\nmid");
  // Unclosed: everything after the opening fence.
  EXPECT_EQ(extract_tsv_block("x ```tsv\na\tb\n"), "a\tb");
  // No fence: the whole output.
  EXPECT_EQ(extract_tsv_block("  a\tb \n"), "a\tb");
}

TEST(LongProcScore, NormalizesCells) {
  EXPECT_EQ(normalize_tsv_cell("The Beatles"), "beatles");
  EXPECT_EQ(normalize_tsv_cell("  A  Tale of Two   Cities! "), "taleoftwocities");
  EXPECT_EQ(normalize_tsv_cell("$1,299.00"), "129900");
  EXPECT_EQ(normalize_tsv_cell("N/A"), "na");
  // Articles only as whole words.
  EXPECT_EQ(normalize_tsv_cell("theatre an answer"), "theatreanswer");
  // Punctuation goes first, so "a-b" is one word.
  EXPECT_EQ(normalize_tsv_cell("a-b"), "ab");
  // Unicode lower case and spaces.
  EXPECT_EQ(normalize_tsv_cell("ÉCOLE\xC2\xA0Zürich"), "écolezürich");
}

TEST(LongProcScore, ParsesLikePythonCsv) {
  auto r = parse_tsv_records({"a\tb", "\"x\ty\"\tz", "", "c\t"});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[1], (std::vector<std::string>{"x\ty", "z"}));
  EXPECT_TRUE((*r)[2].empty());  // an empty line is the record []
  EXPECT_EQ((*r)[3], (std::vector<std::string>{"c", ""}));
  // Doubled quotes inside quotes; a quote inside an unquoted field is literal.
  r = parse_tsv_records({"\"say \"\"hi\"\"\"\tx\"y"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ((*r)[0], (std::vector<std::string>{"say \"hi\"", "x\"y"}));
  // A quoted field continues over the line break (without the newline).
  r = parse_tsv_records({"\"ab", "cd\"\te"});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0], (std::vector<std::string>{"abcd", "e"}));
  // A carriage return in the middle of an unquoted field is an error; at the end it is not.
  EXPECT_FALSE(parse_tsv_records({"a\rb"}).has_value());
  EXPECT_TRUE(parse_tsv_records({"a\tb\r"}).has_value());
}

TEST(LongProcScore, PerfectAndPartial) {
  auto s = score_html_to_tsv(std::string("```tsv\n") + k_gold + "\n```", k_gold);
  EXPECT_TRUE(s.extracted);
  EXPECT_DOUBLE_EQ(s.f1, 1.0);
  // Rows in another order, different case and punctuation still match.
  s = score_html_to_tsv("name\tcity\nqueen\tLONDON.\nbeatles\tLiverpool", k_gold);
  EXPECT_DOUBLE_EQ(s.precision, 1.0);
  EXPECT_DOUBLE_EQ(s.recall, 2.0 / 3);
  EXPECT_DOUBLE_EQ(s.f1, 2 * (2.0 / 3) / (1 + 2.0 / 3));
  // A wrong row lowers precision; the header is not compared.
  s = score_html_to_tsv("band\ttown\nABBA\tStockholm\nABBA\tOslo\nQueen\tLondon", k_gold);
  EXPECT_DOUBLE_EQ(s.precision, 2.0 / 3);
  EXPECT_DOUBLE_EQ(s.recall, 2.0 / 3);
}

TEST(LongProcScore, RowWidthRules) {
  // An incomplete last row is dropped (a trailing remark).
  auto s = score_html_to_tsv("name\tcity\nABBA\tStockholm\nThat is all.", k_gold);
  EXPECT_DOUBLE_EQ(s.precision, 1.0);
  EXPECT_DOUBLE_EQ(s.recall, 1.0 / 3);
  // An incomplete row elsewhere becomes an N/A row that matches nothing.
  s = score_html_to_tsv("name\tcity\nABBA\nQueen\tLondon", k_gold);
  EXPECT_DOUBLE_EQ(s.precision, 0.5);
  // A different number of columns scores 0 and counts as not extracted.
  s = score_html_to_tsv("name\tcity\tyear\nABBA\tStockholm\t1972", k_gold);
  EXPECT_FALSE(s.extracted);
  EXPECT_EQ(s.f1, 0.0);
  // Header only: nothing to score.
  s = score_html_to_tsv("name\tcity", k_gold);
  EXPECT_FALSE(s.extracted);
  // A repeated column name makes the evaluator fail.
  s = score_html_to_tsv("name\tname\nABBA\tStockholm\nQueen\tLondon", k_gold);
  EXPECT_FALSE(s.extracted);
}

TEST(LongProcScore, EmptyPredictionScoresZero) {
  auto s = score_html_to_tsv("", k_gold);
  EXPECT_FALSE(s.extracted);
  EXPECT_EQ(s.f1, 0.0);
  EXPECT_FALSE(s.error.empty());
}

}  // namespace
}  // namespace kvtier::bench
