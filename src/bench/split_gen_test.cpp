// The generators' train and held-out splits: open-ended values, varied
// wording, held-out parts that training never shows, and gold that scores
// 100 against itself in every split.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "bench/bench_test_util.h"
#include "bench/bench_text.h"
#include "bench/needle_gen.h"
#include "bench/ruler.h"
#include "bench/tasks.h"
#include "bench/text2json_domains.h"
#include "bench/text2json_gen.h"
#include "bench/text2json_score.h"
#include "bench/text2json_style.h"
#include "bench/value_gen.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

std::vector<std::string> filler_texts() { return bench::filler_texts(6, " is about ", " and rivers. "); }

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
      o.domain = split == Split::heldout ? "" : index % 2 ? k_t2j_generated : "all";
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

TEST(Text2JsonSplits, GeneratedDomainsVaryAndStayApartFromTheHeldOutOnes) {
  std::set<std::string> held_kinds;
  std::set<std::pair<std::string, std::string>> held_fields;
  for (const auto& d : t2j_domains(Split::heldout)) {
    held_kinds.insert(d.singular);
    for (const auto& f : d.fields) held_fields.insert({f.key, f.description});
  }
  std::set<std::string> kinds, key_pairs;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Rng r(seed);
    const T2jDomain d = t2j_generated_domain(r);
    EXPECT_EQ(d.id, k_t2j_generated);
    ASSERT_EQ(d.fields.size(), 6u);
    EXPECT_EQ(held_kinds.count(d.singular), 0u) << d.singular;
    std::set<std::string> keys, descriptions;
    for (const auto& f : d.fields) {
      EXPECT_EQ(held_fields.count({f.key, f.description}), 0u) << f.key;
      EXPECT_NE(f.key, "name");
      EXPECT_EQ(f.key.find(' '), std::string::npos) << f.key;
      keys.insert(f.key);
      descriptions.insert(f.description);
      Rng v(seed);
      EXPECT_FALSE(f.value(Split::train, v).empty()) << f.key;
    }
    EXPECT_EQ(keys.size(), 6u);
    EXPECT_EQ(descriptions.size(), 6u);
    kinds.insert(d.singular);
    key_pairs.insert(d.fields[0].key + "/" + d.fields[1].key);
    Rng n(seed);
    EXPECT_FALSE(d.name(Split::train, n).empty());
  }
  EXPECT_GT(kinds.size(), 35u);  // some made up, most from the list
  EXPECT_GT(key_pairs.size(), 55u);
  // A sample of a generated domain: the same for the same seed and index, asks
  // for its own keys, and only in the train split.
  Text2JsonGenOptions o;
  o.target_tokens = 2000;
  o.domain = k_t2j_generated;
  o.index = 4;
  const auto a = make_text2json_sample(o, filler_texts(), count_words);
  EXPECT_EQ(a.prompt, make_text2json_sample(o, filler_texts(), count_words).prompt);
  EXPECT_EQ(split_on(a.id, "-")[1], "generated");
  o.index = 5;
  EXPECT_NE(a.prompt, make_text2json_sample(o, filler_texts(), count_words).prompt);
  o.split = Split::heldout;
  EXPECT_THROW(make_text2json_sample(o, filler_texts(), count_words), Error);
}

TEST(Text2JsonSplits, MadeUpRecordLayoutsHoldTheValuesAndAreNotTheHeldOutOnes) {
  const T2jDomain& d = t2j_domains(Split::train)[0];
  const FieldValues fv = {{&d.fields[0], "$12.50"}, {&d.fields[1], "340 g"}};
  std::set<std::string> layouts;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng r(seed);
    const T2jFormat f = t2j_random_format(r);
    const std::string rec = t2j_record(f, "Quorrel KT-482", fv);
    layouts.insert(replace_all(rec, "Quorrel KT-482", "N"));
    EXPECT_EQ(rec.find("Quorrel KT-482"), rec.find_first_not_of("#*<(>E-ntry ")) << rec;
    size_t at = 0;
    for (const auto& [field, v] : fv) {  // the fields in order, each value after its description
      const size_t desc = py_lower(rec).find(py_lower(field->description), at);
      ASSERT_NE(desc, std::string::npos) << rec;
      at = rec.find(v, desc);
      ASSERT_NE(at, std::string::npos) << rec;
    }
    // Not a held-out card ("[name]", "key = value") or table row ("| name | ... |").
    EXPECT_FALSE(contains(rec, "[Quorrel KT-482]") || contains(rec, " = ") || contains(rec, "| ")) << rec;
  }
  EXPECT_GT(layouts.size(), 100u);
  // Samples of generated domains use them in about half of the documents, and nothing else does.
  int with_layout = 0;
  for (int64_t index = 0; index < 20; ++index) {
    Text2JsonGenOptions o;
    o.target_tokens = 1500;
    o.index = index;
    o.domain = k_t2j_generated;
    const auto s = make_text2json_sample(o, filler_texts(), count_words);
    with_layout += !contains(s.prompt, "The entry for") && !contains(s.prompt, "Next comes") &&
                   !contains(s.prompt, "From our interview notes") && !contains(s.prompt, "described here") &&
                   !contains(s.prompt, "in this collection is") && !contains(s.prompt, "also appears in the survey");
  }
  EXPECT_GE(with_layout, 4);
  EXPECT_LE(with_layout, 16);
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
