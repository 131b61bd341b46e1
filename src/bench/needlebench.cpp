#include "bench/needlebench.h"

#include <set>

#include "bench/bench_text.h"
#include "bench/jsonl.h"
#include "core/status.h"

namespace kvtier::bench {

NeedleBenchData load_needlebench(const std::string& dir) {
  NeedleBenchData d;
  const std::string essays_path = dir + "/PaulGrahamEssays.jsonl";
  const auto essays = read_jsonl(essays_path);
  for (size_t i = 0; i < essays.size(); ++i)
    d.essays.push_back(get_string_field(essays[i].value, "text", essays_path + ":" + std::to_string(essays[i].line)));
  KVT_CHECK(!d.essays.empty(), "{}: no essays", essays_path);
  const std::string needles_path = dir + "/needles.jsonl";
  const auto needles = read_jsonl(needles_path);
  for (size_t i = 0; i < needles.size(); ++i) {
    const std::string where = needles_path + ":" + std::to_string(needles[i].line);
    const auto& rec = needles[i].value;
    Needle n;
    n.needle = get_string_field(rec, "needle", where);
    n.retrieval_question = get_string_field(rec, "retrieval_question", where);
    n.arg1 = get_string_field(rec, "arg1", where);
    n.arg2 = get_string_field(rec, "arg2", where);
    n.language = get_string_field(rec, "language", where);
    d.needles.push_back(std::move(n));
  }
  return d;
}

std::vector<Needle> unique_needles(const std::vector<Needle>& all, const std::string& language, size_t n) {
  std::set<std::string> seen1, seen2;
  std::set<std::pair<std::string, std::string>> seen_pair;
  std::vector<Needle> out;
  for (const Needle& e : all) {
    if (e.language != language) continue;
    if (seen1.count(e.arg1) || seen2.count(e.arg2) || seen_pair.count({e.arg1, e.arg2})) continue;
    seen1.insert(e.arg1);
    seen2.insert(e.arg2);
    seen_pair.insert({e.arg1, e.arg2});
    out.push_back(e);
    if (out.size() == n) break;
  }
  KVT_CHECK(out.size() == n, "needles.jsonl has only {} unique {} needles, {} needed", out.size(), language, n);
  return out;
}

namespace {

// The answer format a needle's question asks for ("The ruler of the Orion star
// system is________").
std::string answer_format(const Needle& n) {
  const auto quoted = split_on(n.retrieval_question, "'");
  KVT_CHECK(quoted.size() >= 2, "needle retrieval_question without a quoted answer format: {}",
            n.retrieval_question);
  return split_on(quoted[1], ".")[0];
}

}  // namespace

std::string multineedle_question(const std::vector<Needle>& needles) {
  std::vector<std::string> questions, formats;
  for (const Needle& n : needles) {
    const size_t q = n.retrieval_question.find('?');
    KVT_CHECK(q != std::string::npos, "needle retrieval_question without '?': {}", n.retrieval_question);
    questions.push_back(n.retrieval_question.substr(0, q) + "?");
    formats.push_back(answer_format(n));
  }
  // NeedleBench joins with the ideographic comma in English too.
  return join(questions, "\xE3\x80\x81") + "Please answer in the format of '" + join(formats, "\xE3\x80\x81") + "'";
}

BenchSample make_multineedle_sample(const NeedleBenchData& data, int64_t target_tokens, uint64_t seed,
                                    int64_t index, const CountTokens& count_tokens) {
  constexpr size_t k_n_needles = 11;  // depths 0, 10, ..., 100 %
  Rng rng(sample_seed(seed, static_cast<uint64_t>(index), "multineedle"));
  std::vector<Needle> needles = unique_needles(data.needles, "English", k_n_needles);
  rng.shuffle(needles);
  std::vector<size_t> essay_order(data.essays.size());
  for (size_t i = 0; i < essay_order.size(); ++i) essay_order[i] = i;
  rng.shuffle(essay_order);

  ComposeRequest req;
  req.head =
      "This is a test of long-text capability. You need to first read the long document below, and then "
      "answer the final questions one by one based on the information in the document.\n"
      "The content of the long document is as follows\n\n<Document>\n";
  req.tail = "\n</Document>\n\nBased on the information in the document, now please answer: " +
             multineedle_question(needles) + "\n";
  nlohmann::json keywords = nlohmann::json::array(), depths = nlohmann::json::array();
  for (size_t i = 0; i < needles.size(); ++i) {
    const int depth = static_cast<int>(i * 10);
    req.items.push_back({depth / 100.0, "\n" + needles[i].needle + "\n"});
    keywords.push_back(needles[i].arg2);
    depths.push_back(depth);
  }
  size_t essay = 0, sentence = 0;
  std::vector<std::string> sentences = split_sentences(data.essays[essay_order[0]]);
  req.next_filler = [&]() -> std::string {
    while (sentence >= sentences.size()) {
      essay = (essay + 1) % essay_order.size();
      sentences = split_sentences(data.essays[essay_order[essay]]);
      sentence = 0;
    }
    return sentences[sentence++];
  };
  req.target_tokens = target_tokens;
  Composed c = compose(req, count_tokens);

  BenchSample s;
  s.task = "multineedle";
  s.id = "multineedle-" + std::to_string(target_tokens) + "-" + std::to_string(index);
  s.prompt = std::move(c.text);
  s.n_tokens = c.n_tokens;
  s.gold = {{"keywords", keywords}, {"depths", depths}};
  std::vector<std::string> answers;  // the asked format, blanks filled, in question order
  for (const Needle& n : needles) answers.push_back(replace_all(answer_format(n), "________", n.arg2));
  s.reference = join(answers, "\xE3\x80\x81");
  return s;
}

double score_multineedle(std::string_view prediction, const std::vector<std::string>& keywords) {
  if (keywords.empty()) return 0.0;
  size_t n_found = 0;
  for (const auto& k : keywords) n_found += contains(prediction, k) ? 1 : 0;
  return static_cast<double>(n_found) / static_cast<double>(keywords.size());
}

}  // namespace kvtier::bench
