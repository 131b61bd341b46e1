// The generators' train and held-out splits: open-ended values, varied
// wording, held-out parts that training never shows, and gold that scores
// 100 against itself in every split.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "bench/bench_text.h"
#include "bench/needle_gen.h"
#include "bench/ruler.h"
#include "bench/tasks.h"
#include "bench/text2json_domains.h"
#include "bench/text2json_gen.h"
#include "bench/text2json_score.h"
#include "bench/value_gen.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

int64_t count_words(const std::string& s) { return static_cast<int64_t>(py_split_ws(s).size()); }

// Six essay-like texts with a vocabulary of a few hundred made-up words (the
// RULER word tasks draw from it).
std::vector<std::string> filler_texts() {
  const char* syl[] = {"ka", "lo", "mer", "tis", "van", "pru", "del", "sor", "nim", "qua", "res", "bol"};
  std::vector<std::string> t;
  for (int e = 0; e < 6; ++e) {
    std::string text;
    for (int i = 0; i < 300; ++i) {
      const int k = e * 300 + i;
      const std::string word = std::string(syl[k % 12]) + syl[(k / 12) % 12] + syl[(k / 144) % 12];
      text += "Essay " + std::to_string(e) + " sentence " + std::to_string(i) + " is about " + word + " and rivers. ";
    }
    t.push_back(text);
  }
  return t;
}

TEST(ValueGen, OpenEndedAndSplitApart) {
  Rng r(1);
  std::set<std::string> train, heldout;
  for (int i = 0; i < 300; ++i) {
    train.insert(person(Split::train, r));
    heldout.insert(person(Split::heldout, r));
  }
  // Names hardly ever repeat: no small pool to memorize.
  EXPECT_GT(train.size(), 290u);
  EXPECT_GT(heldout.size(), 290u);
  for (const auto& n : heldout) EXPECT_EQ(train.count(n), 0u) << n;
  for (const auto& n : train) {
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(n[0]))) << n;
    EXPECT_NE(n.find(' '), std::string::npos) << n;
  }
  // Formats differ by split.
  EXPECT_NE(date(Split::train, r, 2000, 2000).find("2000"), std::string::npos);
  EXPECT_NE(money(Split::train, r, 1000, 1000).find("$1,000"), std::string::npos);
  EXPECT_EQ(money(Split::heldout, r, 1000, 1000).find('$'), std::string::npos);
  EXPECT_EQ(group_digits(1234567, ","), "1,234,567");
  EXPECT_EQ(parse_split("heldout"), Split::heldout);
  EXPECT_THROW(parse_split("test"), Error);
  const std::string name = "Dravenford";
  const std::string near = near_variant(name, r);
  EXPECT_NE(near, name);
  EXPECT_EQ(near.size(), name.size());
}

TEST(Text2JsonSplits, DomainsAndDeterminism) {
  EXPECT_EQ(t2j_domains(Split::train).size(), 10u);
  EXPECT_EQ(t2j_domains(Split::heldout).size(), 5u);
  std::set<std::string> train_ids;
  for (const auto& d : t2j_domains(Split::train)) train_ids.insert(d.id);
  for (const auto& d : t2j_domains(Split::heldout)) EXPECT_EQ(train_ids.count(d.id), 0u) << d.id;
  for (const auto& d : t2j_domains(Split::train)) EXPECT_EQ(d.fields.size(), 6u) << d.id;
  for (const auto& d : t2j_domains(Split::heldout)) EXPECT_EQ(d.fields.size(), 6u) << d.id;
  // Default: the four official domains by index; "all": every domain of the split.
  Text2JsonGenOptions o;
  o.target_tokens = 1500;
  std::set<std::string> seen, seen_all;
  for (int64_t i = 0; i < 10; ++i) {
    o.index = i;
    o.domain = "";
    const auto s = make_text2json_sample(o, filler_texts(), count_words);
    seen.insert(split_on(s.id, "-")[1]);
    o.domain = "all";
    seen_all.insert(split_on(make_text2json_sample(o, filler_texts(), count_words).id, "-")[1]);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"products", "medical", "organizations", "movies"}));
  EXPECT_EQ(seen_all.size(), 10u);
  o.domain = "";
  o.index = 3;
  o.split = Split::heldout;
  const auto a = make_text2json_sample(o, filler_texts(), count_words);
  const auto b = make_text2json_sample(o, filler_texts(), count_words);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_NE(a.id.find("-heldout"), std::string::npos);
  o.domain = "hotels";
  o.split = Split::train;  // a held-out domain can be asked for by name
  EXPECT_NO_THROW(make_text2json_sample(o, filler_texts(), count_words));
  o.domain = "cars";
  EXPECT_THROW(make_text2json_sample(o, filler_texts(), count_words), Error);
}

TEST(Text2JsonSplits, GoldIsCopyableAndScoresItself) {
  for (Split split : {Split::train, Split::heldout}) {
    std::set<std::string> names;
    int64_t n_names = 0;
    for (int64_t index = 0; index < 20; ++index) {
      Text2JsonGenOptions o;
      o.target_tokens = 3000;
      o.seed = 5;
      o.index = index;
      o.split = split;
      o.domain = split == Split::train ? "all" : "";
      const auto s = make_text2json_sample(o, filler_texts(), count_words);
      EXPECT_LE(s.n_tokens, 3000);
      const std::string answer = s.gold["answer"];
      const auto gold = nlohmann::ordered_json::parse(answer);  // the answer's key order
      ASSERT_GE(gold.size(), 3u) << s.id;
      for (const auto& e : gold) {
        ASSERT_EQ(e.size(), 3u);
        EXPECT_EQ(e.begin().key(), "name");
        names.insert(e["name"].get<std::string>());
        ++n_names;
        for (const auto& [k, v] : e.items()) EXPECT_TRUE(contains(s.prompt, v.get<std::string>())) << s.id << " " << v;
      }
      // The instructions name the three keys.
      for (const auto& [k, v] : gold[0].items()) EXPECT_TRUE(contains(s.prompt, "\"" + k + "\"")) << s.id << " " << k;
      const auto self = score_text2json(answer, answer);
      EXPECT_FALSE(self.excluded) << s.id;
      EXPECT_DOUBLE_EQ(self.score, 1.0) << s.id;
    }
    EXPECT_GT(double(names.size()), 0.95 * double(n_names)) << split_name(split);
  }
}

TEST(Text2JsonSplits, HeldOutWordingNeverAppearsInTraining) {
  // Phrases that only the held-out split writes (instructions, styles,
  // unattributed values), and ones only the train split writes.
  const std::vector<std::string> heldout_only = {"Please pull out all", "Your job is to locate", "=== FILE START",
                                                 "Dear editor", "on file for", "Material:", "floated as"};
  const std::vector<std::string> train_only = {"Below is a long text", "Read the document that follows",
                                               "Extract each", "Q: What is the", "\nText:\n"};
  std::set<std::string> heldout_seen, train_seen;
  for (int64_t index = 0; index < 40; ++index) {
    for (Split split : {Split::train, Split::heldout}) {
      Text2JsonGenOptions o;
      o.target_tokens = 1200;
      o.index = index;
      o.split = split;
      const auto s = make_text2json_sample(o, filler_texts(), count_words);
      for (const auto& p : heldout_only) {
        if (split == Split::train) {
          EXPECT_FALSE(contains(s.prompt, p)) << p << " in " << s.id;
        } else if (contains(s.prompt, p)) {
          heldout_seen.insert(p);
        }
      }
      for (const auto& p : train_only) {
        if (split == Split::heldout) {
          EXPECT_FALSE(contains(s.prompt, p)) << p << " in " << s.id;
        } else if (contains(s.prompt, p)) {
          train_seen.insert(p);
        }
      }
    }
  }
  // Over 40 samples each split shows most of its own phrases.
  EXPECT_GE(heldout_seen.size(), 5u);
  EXPECT_GE(train_seen.size(), 4u);
}

TEST(TaskNames, SplitSuffix) {
  EXPECT_FALSE(parse_task_name("text2json-gen").split.has_value());
  EXPECT_EQ(parse_task_name("text2json-gen:heldout").split, Split::heldout);
  EXPECT_EQ(parse_task_name("niah_single:train").base, "niah_single");
  EXPECT_EQ(score_family("multineedle-gen:heldout"), "multineedle");
  EXPECT_EQ(score_family("vt:train"), "ruler");
  EXPECT_THROW(parse_task_name("multineedle:heldout"), Error);
  EXPECT_THROW(parse_task_name("longproc-0.5k:train"), Error);
  EXPECT_THROW(parse_task_name("text2json-gen:test"), Error);
}

TEST(RulerWording, BenchmarkFormIsRulersAndSplitsParaphrase) {
  for (const auto& task : k_ruler_tasks) {
    const auto ruler = make_ruler_sample(task, filler_texts(), 2500, 2, 0, count_words);
    std::set<std::string> heads;
    for (int64_t i = 0; i < 12; ++i) {
      for (Split split : {Split::train, Split::heldout}) {
        const auto s = make_ruler_sample(task, filler_texts(), 2500, 2, i, count_words, split);
        std::vector<std::string> outs = s.gold["outputs"];
        EXPECT_DOUBLE_EQ(ruler_match_all(s.reference, outs), 1.0) << s.id;
        EXPECT_LE(s.n_tokens, 2500) << s.id;
        if (split == Split::heldout) {
          EXPECT_NE(s.prompt.substr(0, 30), ruler.prompt.substr(0, 30)) << s.id;
        } else {
          heads.insert(s.answer_prefix.substr(0, 20));
        }
      }
    }
    EXPECT_GE(heads.size(), 2u) << task << ": the train split should vary the wording";
  }
  const auto h = make_ruler_sample("niah_single", filler_texts(), 2500, 2, 0, count_words, Split::heldout);
  EXPECT_EQ(h.prompt.find("special magic"), std::string::npos);
  EXPECT_EQ(std::string(h.gold["outputs"][0]).find_first_not_of("0123456789"), 3u) << "held-out values are codes";
}

TEST(GeneratedNeedles, ScoreAndSplits) {
  for (Split split : {Split::train, Split::heldout}) {
    for (int64_t i = 0; i < 6; ++i) {
      const auto s = make_generated_needle_sample(filler_texts(), 3000, 4, i, split, count_words);
      const auto t = make_generated_needle_sample(filler_texts(), 3000, 4, i, split, count_words);
      EXPECT_EQ(s.prompt, t.prompt);
      std::vector<std::string> kw = s.gold["keywords"];
      EXPECT_GE(kw.size(), 5u);
      EXPECT_LE(kw.size(), 11u);
      for (const auto& k : kw) EXPECT_TRUE(contains(s.prompt, k)) << s.id << " " << k;
      const auto full = score_prediction("multineedle", s.reference, s.gold);
      EXPECT_DOUBLE_EQ(full.score, 1.0) << s.id << ": " << s.reference;
      EXPECT_LE(s.n_tokens, 3000);
      if (split == Split::heldout) {
        EXPECT_EQ(kw.size(), 11u);
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::bench
