#include "bench/ruler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "bench/bench_text.h"
#include "core/status.h"

namespace kvtier::bench {

const std::vector<std::string> k_ruler_tasks = {"niah_single", "niah_multikey", "niah_multivalue",
                                                "niah_multiquery", "vt", "cwe", "fwe"};

bool is_ruler_task(const std::string& task) {
  return std::find(k_ruler_tasks.begin(), k_ruler_tasks.end(), task) != k_ruler_tasks.end();
}

namespace {

using Strings = std::vector<std::string>;

// Distinct lower-case alphabetic words of 4-10 letters, in first-seen order.
Strings vocabulary(const Strings& texts) {
  Strings out;
  std::set<std::string> seen;
  for (const auto& t : texts) {
    std::string w;
    for (size_t i = 0; i <= t.size(); ++i) {
      const char c = i < t.size() ? t[i] : ' ';
      if (c >= 'a' && c <= 'z') {
        w += c;
        continue;
      }
      if (!(c >= 'A' && c <= 'Z') && w.size() >= 4 && w.size() <= 10 && seen.insert(w).second) out.push_back(w);
      if (c >= 'A' && c <= 'Z') {  // skip capitalized words: names are poor keys
        while (i < t.size() && std::isalpha(static_cast<unsigned char>(t[i]))) ++i;
      }
      w.clear();
    }
  }
  return out;
}

Strings distinct_words(Rng& r, const Strings& vocab, size_t n) {
  KVT_CHECK(vocab.size() >= n * 2, "RULER generator: vocabulary of {} words is too small for {}", vocab.size(), n);
  std::set<size_t> picked;
  Strings out;
  while (out.size() < n) {
    const size_t i = r.below(vocab.size());
    if (picked.insert(i).second) out.push_back(vocab[i]);
  }
  return out;
}

std::function<std::string()> essay_filler(const Strings& essays, Rng& r, size_t* at, size_t* sentence,
                                          Strings* sentences) {
  *at = r.below(essays.size());
  *sentence = 0;
  *sentences = split_sentences(essays[*at]);
  return [&essays, at, sentence, sentences]() -> std::string {
    while (*sentence >= sentences->size()) {
      *at = (*at + 1) % essays.size();
      *sentences = split_sentences(essays[*at]);
      *sentence = 0;
    }
    return (*sentences)[(*sentence)++];
  };
}

// Largest size in [lo, hi] whose prompt fits the target (prompt length grows with size).
template <class Build>
Composed fit_size(int64_t lo, int64_t hi, int64_t target, const CountTokens& count, Build build) {
  Composed best;
  best.text = build(lo);
  best.n_tokens = count(best.text);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    Composed c;
    c.text = build(mid);
    c.n_tokens = count(c.text);
    if (c.n_tokens <= target) {
      best = std::move(c);
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return best;
}

// Prompt templates of a task family. Placeholders: {type} (NIAH value
// kind), {key}, {value}, {query}, {n} (count), {a} {b} (VT variables).
struct Templates {
  std::string head, needle, tail, prefix;
};

// Index 0: RULER's own wording; then the train paraphrases; then the held-out ones.
struct Family {
  std::vector<Templates> ruler_and_train, heldout;
};

const Family& templates(const std::string& family) {
  static const Family niah{
      {{"Some special magic {type} are hidden within the following text. Make sure to memorize it. I will quiz you "
        "about the {type} afterwards.\n",
        " One of the special magic {type} for {key} is: {value}. ",
        "\nWhat are all the special magic {type} for {query} mentioned in the provided text?",
        " The special magic {type} for {query} mentioned in the provided text are"},
       {"A few secret {type} are buried in the text below, each tied to a key. Remember them; questions follow.\n",
        " The secret {type} for {key} include {value}. ", "\nList every secret {type} tied to {query}.",
        " The secret {type} tied to {query} are"},
       {"Read the text and keep track of the hidden {type} attached to special keys.\n",
        " Hidden entry, key {key}: {value}. ", "\nWhich hidden {type} are attached to {query}?",
        " The hidden {type} attached to {query} are"}},
      {{"This document carries labelled {type} among ordinary prose. Keep an eye out for them.\n",
        " (Label {key} holds {value}.) ", "\nReport the {type} held by label {query}.",
        " Label {query} holds these {type}:"},
       {"Within the pages below, certain keys have been assigned {type}. You will need them later.\n",
        " Assigned to {key}: {value}. ", "\nWhat has been assigned to {query}?", " Assigned to {query}:"}}};
  static const Family vt{
      {{"Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n", " VAR {a} = {b}.",
        "\nQuestion: Find all variables that are assigned the value {value} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are assgined the "
        "value {value}, they are: "},
       {"Track the variable assignments in the text below.\n\n", " VAR {a} = {b}.",
        "\nQuestion: Which variables end up holding the value {value}?",
        " Answer: The {n} variables holding {value} are: "}},
      {{"The noise below hides a chain of assignments between variables.\n\n", " set {a} to {b}.",
        "\nQuestion: Name each variable whose value is ultimately {value}.", " Answer: Those variables are: "}}};
  static const Family cwe{
      {{"Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n",
        "", "\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:"},
       {"Count the words in the numbered list below; a few of them repeat far more than the rest.\n", "",
        "\nQuestion: Which 10 words occur most frequently?", " Answer: The 10 most frequent words are:"}},
      {{"Here is a long enumeration of words, some of them recurring.\n", "",
        "\nQuestion: Give the ten words with the highest counts.", " Answer: The ten words with the highest counts:"}}};
  static const Family fwe{
      {{"Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. ",
        "",
        "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
        "frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:"},
       {"The coded text below repeats some words more often than others. ", "",
        "\nQuestion: Ignoring the dots '....', which three coded words appear most often?",
        " Answer: The three most common coded words are:"}},
      {{"Tally the made-up words in this stream. ", "",
        "\nQuestion: Disregard the '....' markers. Which three made-up words occur the most?",
        " Answer: The top three are:"}}};
  if (family == "niah") return niah;
  if (family == "vt") return vt;
  if (family == "cwe") return cwe;
  return fwe;
}

// RULER's own templates, a train paraphrase (RULER's among them) or a held-out one.
const Templates& pick_templates(const std::string& family, std::optional<Split> wording, Rng& r) {
  const Family& f = templates(family);
  if (!wording) return f.ruler_and_train[0];
  return *wording == Split::train ? r.pick(f.ruler_and_train) : r.pick(f.heldout);
}

std::string fill_templates(std::string t, const std::vector<std::pair<std::string, std::string>>& values) {
  for (const auto& [k, v] : values) t = replace_all(t, k, v);
  return t;
}

}  // namespace

BenchSample make_ruler_sample(const std::string& task, const Strings& essays, int64_t target_tokens, uint64_t seed,
                              int64_t index, const CountTokens& count_tokens, std::optional<Split> wording) {
  KVT_CHECK(is_ruler_task(task), "unknown RULER task '{}'", task);
  KVT_CHECK(!essays.empty(), "RULER generator: no haystack texts");
  const std::string salt = wording ? std::string("/") + split_name(*wording) : "";
  Rng r(sample_seed(seed, static_cast<uint64_t>(index), "ruler/" + task + salt));
  BenchSample s;
  s.task = task;
  s.id = task + "-" + std::to_string(target_tokens) + "-s" + std::to_string(seed) + "-" + std::to_string(index) +
         (wording ? std::string("-") + split_name(*wording) : "");
  // The train and held-out splits use the even and odd essays.
  Strings half;
  if (wording)
    for (size_t i = *wording == Split::train ? 0 : 1; i < essays.size(); i += 2) half.push_back(essays[i]);
  const Strings& texts = half.empty() ? essays : half;
  const bool heldout = wording == Split::heldout;
  Strings outputs;
  std::string metric = "all";
  Composed c;

  if (task.rfind("niah", 0) == 0) {
    const Strings vocab = vocabulary(texts);
    const size_t n_keys = task == "niah_single" || task == "niah_multivalue" ? 1 : 4;
    const size_t n_values = task == "niah_multivalue" ? 4 : 1;
    const Strings words = distinct_words(r, vocab, 2 * n_keys);
    Strings keys;
    for (size_t i = 0; i < n_keys; ++i) keys.push_back(words[2 * i] + "-" + words[2 * i + 1]);
    struct NeedleKV {
      std::string key, value;
    };
    std::vector<NeedleKV> needles;
    std::set<std::string> used_values;
    for (size_t k = 0; k < n_keys; ++k) {
      for (size_t v = 0; v < n_values; ++v) {
        std::string x;  // RULER's 7-digit numbers; held out: codes
        do x = heldout ? record_code(Split::heldout, r) : std::to_string(r.range(1000000, 9999999));
        while (!used_values.insert(x).second);
        needles.push_back({keys[k], x});
      }
    }
    // Which keys are asked: the first (single, multikey: the others distract), all (multiquery).
    Strings asked = {keys[0]};
    if (task == "niah_multiquery") asked = keys;
    for (const auto& n : needles)
      if (std::find(asked.begin(), asked.end(), n.key) != asked.end()) outputs.push_back(n.value);
    std::string query = asked[0];
    if (asked.size() > 1) {
      Strings head(asked.begin(), asked.end() - 1);
      query = join(head, ", ") + ", and " + asked.back();
    }
    const std::string type = heldout ? "codes" : "numbers";
    const Templates& t = pick_templates("niah", wording, r);
    ComposeRequest req;
    req.head = fill_templates(t.head, {{"{type}", type}});
    req.tail = fill_templates(t.tail, {{"{type}", type}, {"{query}", query}});
    r.shuffle(needles);
    for (const auto& n : needles)
      req.items.push_back({r.uniform(), fill_templates(t.needle, {{"{type}", type}, {"{key}", n.key}, {"{value}", n.value}})});
    std::stable_sort(req.items.begin(), req.items.end(),
                     [](const PlacedItem& a, const PlacedItem& b) { return a.depth < b.depth; });
    size_t at = 0, sentence = 0;
    Strings sentences;
    req.next_filler = essay_filler(texts, r, &at, &sentence, &sentences);
    req.target_tokens = target_tokens;
    c = compose(req, count_tokens);
    s.answer_prefix = fill_templates(t.prefix, {{"{type}", type}, {"{query}", query}});
  } else if (task == "vt") {
    constexpr int k_n_hops = 4;
    std::set<std::string> names;
    while (names.size() < k_n_hops + 1) {
      std::string v;
      for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + r.below(26));
      names.insert(v);
    }
    Strings vars(names.begin(), names.end());
    r.shuffle(vars);
    const std::string value = std::to_string(r.range(10000, 99999));
    const Templates& t = pick_templates("vt", wording, r);
    ComposeRequest req;
    req.head = t.head;
    req.tail = fill_templates(t.tail, {{"{value}", value}});
    std::vector<double> depths(vars.size());
    for (auto& d : depths) d = r.uniform();
    std::sort(depths.begin(), depths.end());
    for (size_t i = 0; i < vars.size(); ++i) {
      const std::string rhs = i == 0 ? value : (heldout ? "" : "VAR ") + vars[i - 1];
      req.items.push_back({depths[i], fill_templates(t.needle, {{"{a}", vars[i]}, {"{b}", rhs}})});
    }
    // RULER's noise haystack.
    req.next_filler = [] { return std::string("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "); };
    req.target_tokens = target_tokens;
    c = compose(req, count_tokens);
    outputs = vars;
    s.answer_prefix = fill_templates(t.prefix, {{"{n}", std::to_string(vars.size())}, {"{value}", value}});
  } else if (task == "cwe") {
    constexpr int k_n_common = 10;
    // RULER repeats the common words 30 times and the others 3 times; short
    // prompts get fewer repetitions so that the common words still fit.
    const int freq_common = static_cast<int>(std::clamp<int64_t>(target_tokens / 400, 6, 30));
    constexpr int k_freq_rare = 3;
    const Strings vocab = vocabulary(texts);
    const Strings common = distinct_words(r, vocab, k_n_common);
    std::set<std::string> common_set(common.begin(), common.end());
    Strings rare_pool;
    for (const auto& w : vocab)
      if (!common_set.count(w)) rare_pool.push_back(w);
    r.shuffle(rare_pool);
    const uint64_t order_seed = r.next();
    const Templates& t = pick_templates("cwe", wording, r);
    auto build = [&](int64_t n_rare) {
      Strings words;
      for (const auto& w : common)
        for (int k = 0; k < freq_common; ++k) words.push_back(w);
      for (int64_t i = 0; i < n_rare; ++i)
        for (int k = 0; k < k_freq_rare; ++k) words.push_back(rare_pool[static_cast<size_t>(i)]);
      Rng o(order_seed);
      o.shuffle(words);
      std::string text = t.head;
      for (size_t i = 0; i < words.size(); ++i) text += std::to_string(i + 1) + ". " + words[i] + " ";
      return text + t.tail;
    };
    c = fit_size(0, static_cast<int64_t>(rare_pool.size()), target_tokens, count_tokens, build);
    outputs = common;
    s.answer_prefix = t.prefix;
  } else {  // fwe
    constexpr int k_vocab = 200;
    Strings coded;
    std::set<std::string> seen;
    while (coded.size() < k_vocab) {
      std::string w;
      for (int i = 0; i < 6; ++i) w += static_cast<char>('a' + r.below(26));
      if (seen.insert(w).second) coded.push_back(w);
    }
    const uint64_t order_seed = r.next();
    const Templates& t = pick_templates("fwe", wording, r);
    // Zipf (alpha 2) frequencies, made exact so that the top three never tie.
    auto build = [&](int64_t n_words) {
      double h = 0;
      for (int k = 1; k <= k_vocab; ++k) h += 1.0 / (k * k);
      Strings words;
      for (int k = 1; k <= k_vocab; ++k) {
        const int64_t n = std::max<int64_t>(1, std::llround(static_cast<double>(n_words) / (k * k) / h));
        for (int64_t i = 0; i < n; ++i) words.push_back(coded[static_cast<size_t>(k - 1)]);
      }
      Rng o(order_seed);
      o.shuffle(words);
      std::string text = t.head;
      for (size_t i = 0; i < words.size(); ++i) text += words[i] + (i % 20 == 19 ? " .... " : " ");
      return text + t.tail;
    };
    c = fit_size(60, target_tokens, target_tokens, count_tokens, build);
    outputs = {coded[0], coded[1], coded[2]};
    s.answer_prefix = t.prefix;
  }
  s.prompt = std::move(c.text);
  s.n_tokens = c.n_tokens;
  s.gold = {{"outputs", outputs}, {"metric", metric}};
  // Every output, in RULER's comma-separated style (vt: space-separated).
  s.reference = task == "vt" ? join(outputs, " ") : " " + join(outputs, ", ") + ".";
  return s;
}

std::string ruler_postprocess(std::string_view prediction) {
  std::string s = py_strip(prediction);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  return py_strip(s);
}

double ruler_match_all(std::string_view prediction, const Strings& refs) {
  if (refs.empty()) return 0.0;
  const std::string pred = py_lower(ruler_postprocess(prediction));
  size_t n = 0;
  for (const auto& ref : refs) n += contains(pred, py_lower(ref)) ? 1 : 0;
  return static_cast<double>(n) / static_cast<double>(refs.size());
}

double ruler_match_part(std::string_view prediction, const Strings& refs) {
  const std::string pred = py_lower(ruler_postprocess(prediction));
  for (const auto& ref : refs)
    if (contains(pred, py_lower(ref))) return 1.0;
  return 0.0;
}

}  // namespace kvtier::bench
