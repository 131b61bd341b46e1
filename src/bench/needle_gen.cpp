#include "bench/needle_gen.h"

#include <algorithm>
#include <functional>
#include <set>

#include "bench/bench_text.h"
#include "bench/needlebench.h"
#include "core/status.h"

namespace kvtier::bench {

namespace {

using Strings = std::vector<std::string>;

// A fact template: {x} the subject drawn by `subject`, {v} the answer drawn by `value`.
struct FactKind {
  std::string fact;      // "The ruler of the {x} star system is {v}."
  std::string question;  // "Who is the ruler of the {x} star system?"
  std::string format;    // "The ruler of the {x} star system is ________"
  std::function<std::string(Split, Rng&)> subject, value;
};

std::string item(Split s, Rng& r) {
  static const Strings things = {"Crown", "Lantern", "Compass", "Chalice", "Mirror", "Sword", "Harp", "Atlas"};
  std::string name = "the " + r.pick(things) + " of ";  // one draw per statement
  return name + made_up_word(s, r, 2);
}

const std::vector<FactKind>& kinds(Split s) {
  const auto place_ = [](Split sp, Rng& r) { return place(sp, r); };
  const auto word_ = [](Split sp, Rng& r) { return made_up_word(sp, r, 2); };
  const auto person_ = [](Split sp, Rng& r) { return person(sp, r); };
  const auto code_ = [](Split sp, Rng& r) { return record_code(sp, r); };
  const auto year_ = [](Split, Rng& r) { return std::to_string(r.range(1100, 2099)); };
  static const std::vector<FactKind> train = {
      {"The ruler of the {x} star system is {v}.", "Who is the ruler of the {x} star system?",
       "The ruler of the {x} star system is ________", word_, person_},
      {"The legendary item hidden on {x} Island is {v}.", "What legendary item is hidden on {x} Island?",
       "The legendary item hidden on {x} Island is ________", word_, item},
      {"The first band to play in {x} was the {v} Band.", "Which band was the first to perform in {x}?",
       "The first band to perform in {x} was the ________", place_, word_},
      {"The password of the {x} archive is {v}.", "What is the password of the {x} archive?",
       "The password of the {x} archive is ________", word_, code_},
      {"The {x} expedition was led by {v}.", "Who led the {x} expedition?", "The {x} expedition was led by ________",
       word_, person_},
      {"The lighthouse of {x} was built in {v}.", "In which year was the lighthouse of {x} built?",
       "The lighthouse of {x} was built in ________", place_, year_},
      {"The treasurer of the {x} guild is {v}.", "Who is the treasurer of the {x} guild?",
       "The treasurer of the {x} guild is ________", word_, person_},
      {"The flagship of the {x} fleet is the {v}.", "What is the flagship of the {x} fleet?",
       "The flagship of the {x} fleet is the ________", word_, word_}};
  static const std::vector<FactKind> heldout = {
      {"The oldest tree in {x} is called {v}.", "What is the oldest tree in {x} called?",
       "The oldest tree in {x} is called ________", place_, word_},
      {"{v} won the {x} chess open.", "Who won the {x} chess open?", "The {x} chess open was won by ________", place_,
       person_},
      {"The vault beneath {x} opens with the code {v}.", "Which code opens the vault beneath {x}?",
       "The vault beneath {x} opens with the code ________", place_, code_},
      {"The comet {x} was first seen from {v}.", "From where was the comet {x} first seen?",
       "The comet {x} was first seen from ________", word_, place_},
      {"The {x} choir is conducted by {v}.", "Who conducts the {x} choir?", "The {x} choir is conducted by ________",
       place_, person_}};
  return s == Split::train ? train : heldout;
}

struct Wording {
  Strings head, tail_intro;  // the instructions before the document; what precedes the questions
  std::string doc_open, doc_close;
};

// Variant 0 of the train split is NeedleBench's wording.
const std::vector<Wording>& wordings(Split s) {
  static const std::vector<Wording> train = {
      {{"This is a test of long-text capability. You need to first read the long document below, and then answer "
        "the final questions one by one based on the information in the document.\nThe content of the long "
        "document is as follows\n\n"},
       {"\n\nBased on the information in the document, now please answer: "},
       "<Document>\n",
       "\n</Document>"},
      {{"Read the document below carefully. Afterwards you will be asked several questions about facts stated in "
        "it.\n\n",
        "Several unusual facts are hidden in the following text. Find them and answer the questions at the end.\n\n"},
       {"\n\nAnswer the following questions using only the document: ", "\n\nQuestions: "},
       "<Document>\n",
       "\n</Document>"},
      {{"Below is a long text with a few facts scattered through it.\n\n"},
       {"\n\nUsing the text above, answer: ", "\n\nNow answer every question below: "},
       "=== TEXT ===\n",
       "\n=== END ==="}};
  static const std::vector<Wording> heldout = {
      {{"The passage that follows is long; somewhere inside it are a handful of odd statements. After it comes a "
        "list of questions.\n\n"},
       {"\n\nReply to each of these, relying on the passage alone: "},
       "[begin]\n",
       "\n[end]"}};
  return s == Split::train ? train : heldout;
}

}  // namespace

BenchSample make_generated_needle_sample(const Strings& essays, int64_t target_tokens, uint64_t seed, int64_t index,
                                         Split split, const CountTokens& count_tokens) {
  KVT_CHECK(!essays.empty(), "generated needles: no haystack texts");
  Rng r(sample_seed(seed, static_cast<uint64_t>(index),
                    split == Split::train ? "multineedle-gen" : "multineedle-gen/heldout"));
  const int n_needles = split == Split::train ? static_cast<int>(r.range(5, 11)) : 11;
  std::set<std::string> used;
  auto fresh = [&](const std::function<std::string()>& make) {
    for (int attempt = 0; attempt < 200; ++attempt) {
      std::string v = make();
      if (used.insert(v).second) return v;
    }
    fail("generated needles: could not draw a new value");
  };
  std::vector<Needle> needles;
  for (int i = 0; i < n_needles; ++i) {
    const FactKind& k = r.pick(kinds(split));
    const std::string x = fresh([&] { return k.subject(split, r); });
    const std::string v = fresh([&] { return k.value(split, r); });
    auto put = [&](const std::string& t) { return replace_all(replace_all(t, "{x}", x), "{v}", v); };
    Needle n;
    n.needle = put(k.fact);
    if (!n.needle.empty() && n.needle[0] >= 'a' && n.needle[0] <= 'z') n.needle[0] = char(n.needle[0] - 'a' + 'A');
    n.retrieval_question = put(k.question) + " Please answer in the format '" + put(k.format) + ".'";
    n.arg1 = x;
    n.arg2 = v;
    n.language = "English";
    needles.push_back(std::move(n));
  }
  const auto& ws = wordings(split);
  const size_t wi = split == Split::train && r.below(4) == 0 ? 0 : r.below(ws.size());
  const Wording& w = ws[wi];
  ComposeRequest req;
  req.head = r.pick(w.head) + w.doc_open;
  // The questions: NeedleBench's block (questions joined by '、', one format
  // string), or numbered lines with an answer per line.
  std::string questions, reference;
  const bool numbered = !(split == Split::train && wi == 0) && r.below(2);
  Strings answers;
  for (const Needle& n : needles) {
    const size_t q = n.retrieval_question.find('?');
    const size_t f0 = n.retrieval_question.find('\'') + 1;
    const std::string format = n.retrieval_question.substr(f0, n.retrieval_question.rfind('.') - f0);
    answers.push_back(replace_all(format, "________", n.arg2));
    if (numbered) questions += "\n" + std::to_string(answers.size()) + ". " + n.retrieval_question.substr(0, q + 1);
  }
  if (numbered) {
    questions += "\nAnswer with one line per question, in order, each a full sentence.";
    reference = join(answers, "\n");
  } else {
    questions = multineedle_question(needles);
    reference = join(answers, "\xE3\x80\x81");
  }
  req.tail = w.doc_close + r.pick(w.tail_intro) + questions + "\n";
  // Depths: evenly spread from 0 to 100 % (jittered in training).
  nlohmann::json keywords = nlohmann::json::array(), depths = nlohmann::json::array();
  std::vector<size_t> order(needles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  r.shuffle(order);  // which needle goes how deep; the questions keep their order
  for (size_t i = 0; i < needles.size(); ++i) {
    double depth = needles.size() > 1 ? double(i) / double(needles.size() - 1) : 0.5;
    if (split == Split::train) depth = std::clamp(depth + (r.uniform() - 0.5) * 0.08, 0.0, 1.0);
    req.items.push_back({depth, "\n" + needles[order[i]].needle + "\n"});
    depths.push_back(static_cast<int>(depth * 100 + 0.5));
  }
  for (const Needle& n : needles) keywords.push_back(n.arg2);
  std::vector<const std::string*> texts;
  for (size_t i = split == Split::train ? 0 : 1; i < essays.size(); i += 2) texts.push_back(&essays[i]);
  if (texts.empty())
    for (const auto& t : essays) texts.push_back(&t);
  size_t at = r.below(texts.size()), sentence = 0;
  Strings sentences = split_sentences(*texts[at]);
  req.next_filler = [&]() -> std::string {
    while (sentence >= sentences.size()) {
      at = (at + 1) % texts.size();
      sentences = split_sentences(*texts[at]);
      sentence = 0;
    }
    return sentences[sentence++];
  };
  req.target_tokens = target_tokens;
  Composed c = compose(req, count_tokens);

  BenchSample s;
  s.task = "multineedle";
  s.id = "multineedle-gen-" + std::to_string(target_tokens) + "-s" + std::to_string(seed) + "-" +
         std::to_string(index) + (split == Split::heldout ? "-heldout" : "");
  s.prompt = std::move(c.text);
  s.n_tokens = c.n_tokens;
  s.gold = {{"keywords", keywords}, {"depths", depths}};
  s.reference = reference;
  return s;
}

}  // namespace kvtier::bench
