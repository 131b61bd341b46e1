#include "bench/text2json_gen.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "bench/bench_text.h"
#include "bench/text2json_domains.h"
#include "bench/text2json_style.h"
#include "core/status.h"

namespace kvtier::bench {

namespace {

using Strings = std::vector<std::string>;

// A near-duplicate of a value: one digit changed, or else a fresh value of the field.
std::string perturb_value(const std::string& v, Split s, Rng& r, const T2jField& f) {
  std::vector<size_t> digits;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] >= '1' && v[i] <= '9') digits.push_back(i);
  if (digits.empty()) return f.value(s, r);
  std::string out = v;
  const size_t at = digits[r.below(digits.size())];
  out[at] = static_cast<char>('1' + (out[at] - '1' + 1 + static_cast<int>(r.below(8))) % 9);
  return out;
}

const T2jDomain& find_domain(const Text2JsonGenOptions& o, Rng& r) {
  const auto& own = t2j_domains(o.split);
  if (o.domain.empty() || o.domain == "all") {
    const size_t n = o.domain.empty() && o.split == Split::train ? k_t2j_official_domains : own.size();
    return own[static_cast<size_t>(o.index) % n];
  }
  for (Split s : {o.split, o.split == Split::train ? Split::heldout : Split::train})
    for (const auto& d : t2j_domains(s))
      if (d.id == o.domain) return d;
  Strings ids = text2json_domain_ids(Split::train);
  for (auto& id : text2json_domain_ids(Split::heldout)) ids.push_back(id);
  (void)r;
  fail("text2json generator: unknown domain '{}' (all, {}, {})", o.domain, k_t2j_generated, join(ids, ", "));
}

}  // namespace

std::vector<std::string> text2json_domain_ids(Split s) {
  std::vector<std::string> ids;
  for (const auto& d : t2j_domains(s)) ids.push_back(d.id);
  return ids;
}

int text2json_max_targets(int64_t target_tokens) {
  return static_cast<int>(std::clamp<int64_t>(target_tokens / 200, 3, 20));
}

BenchSample make_text2json_sample(const Text2JsonGenOptions& o, const std::vector<std::string>& filler_texts,
                                  const CountTokens& count_tokens) {
  KVT_CHECK(!filler_texts.empty(), "text2json generator: no filler texts");
  KVT_CHECK(o.target_tokens >= 512, "text2json generator: target length {} is below 512 tokens", o.target_tokens);
  const Split split = o.split;
  Rng r(sample_seed(o.seed, static_cast<uint64_t>(o.index),
                    split == Split::train ? "text2json" : "text2json/heldout"));
  T2jDomain generated;
  if (o.domain == k_t2j_generated) {
    KVT_CHECK(split == Split::train, "text2json generator: the '{}' domain belongs to the train split",
              k_t2j_generated);
    generated = t2j_generated_domain(r);
  }
  const T2jDomain& d = o.domain == k_t2j_generated ? generated : find_domain(o, r);
  const int max_targets = text2json_max_targets(o.target_tokens);
  const int n_targets = o.n_targets > 0 ? o.n_targets : static_cast<int>(r.range(3, max_targets));
  KVT_CHECK(n_targets >= 1 && n_targets <= 20, "text2json generator: {} targets (1-20 allowed)", n_targets);

  // Two asked fields; the other four describe the distractors.
  std::vector<const T2jField*> fields;
  for (const auto& f : d.fields) fields.push_back(&f);
  r.shuffle(fields);
  const T2jField& f1 = *fields[0];
  const T2jField& f2 = *fields[1];
  const std::vector<const T2jField*> other_fields(fields.begin() + 2, fields.end());

  // One main style for the document, or a style per passage.
  const int n_styles = t2j_n_styles(split);
  const int main_style = r.below(2) ? static_cast<int>(r.below(static_cast<uint64_t>(n_styles))) : -1;
  auto style = [&] { return main_style >= 0 ? main_style : static_cast<int>(r.below(static_cast<uint64_t>(n_styles))); };

  std::set<std::string> used;
  auto fresh_name = [&](const std::function<std::string()>& make) {
    for (int attempt = 0; attempt < 200; ++attempt) {
      std::string n = make();
      if (used.insert(n).second) return n;
    }
    fail("text2json generator: could not draw a new {} name", d.singular);
  };
  // A made-up domain gets a made-up record layout for the whole document half of the time.
  std::optional<T2jFormat> format;
  if (o.domain == k_t2j_generated && r.below(2)) format = t2j_random_format(r);
  auto passage = [&](const T2jDomain& dom, const std::string& name, const FieldValues& fv) {
    return format ? t2j_record(*format, name, fv) : t2j_passage(split, style(), dom, name, fv, r);
  };
  auto describe = [&](const T2jDomain& dom, const std::string& name, std::vector<const T2jField*> fs) {
    FieldValues fv;
    for (const T2jField* f : fs) fv.emplace_back(f, f->value(split, r));
    return passage(dom, name, fv);
  };

  struct Item {
    std::string text;
    bool target = false;
    nlohmann::ordered_json entry;  // name first, as the official answers are
  };
  std::vector<Item> items;
  for (int i = 0; i < n_targets; ++i) {
    const std::string name = fresh_name([&] { return d.name(split, r); });
    const std::string v1 = f1.value(split, r), v2 = f2.value(split, r);
    FieldValues fv = {{&f1, v1}, {&f2, v2}};
    if (r.below(2)) std::swap(fv[0], fv[1]);
    items.push_back({passage(d, name, fv), true, {{"name", name}, {f1.key, v1}, {f2.key, v2}}});
  }
  const int n_distractors = static_cast<int>(r.range((n_targets + 1) / 2, n_targets));
  std::vector<std::string> target_names;
  for (const auto& it : items) target_names.push_back(it.entry["name"]);
  const auto& all_domains = t2j_domains(split);
  for (int i = 0; i < n_distractors; ++i) {
    std::vector<const T2jField*> fs = other_fields;
    r.shuffle(fs);
    fs.resize(2);
    switch (r.below(5)) {
      case 0:  // another entity of the domain, without the asked fields
        items.push_back({describe(d, fresh_name([&] { return d.name(split, r); }), fs)});
        break;
      case 1: {  // a near-duplicate of a target's name, without the asked fields
        const std::string base = r.pick(target_names);
        items.push_back({describe(d, fresh_name([&] { return near_variant(base, r); }), fs)});
        break;
      }
      case 2: {  // a near-duplicate of a target's value, attributed to nothing named
        const Item& t = items[r.below(static_cast<uint64_t>(n_targets))];
        const T2jField& f = r.below(2) ? f1 : f2;
        const std::string v = perturb_value(t.entry[f.key].get<std::string>(), split, r, f);
        std::string text = t2j_unattributed(split, d, f, v, r) + " ";  // one draw per statement
        items.push_back({text + r.pick(d.chatter)});
        break;
      }
      case 3: {  // an entity of the domain with only one of the asked fields
        fs[0] = r.below(2) ? &f1 : &f2;
        items.push_back({describe(d, fresh_name([&] { return d.name(split, r); }), fs)});
        break;
      }
      default: {  // an entity of another domain, with its own fields
        const T2jDomain* od = &all_domains[r.below(all_domains.size())];
        if (od->id == d.id) od = &all_domains[(static_cast<size_t>(od - all_domains.data()) + 1) % all_domains.size()];
        std::vector<const T2jField*> of;
        for (const auto& f : od->fields) of.push_back(&f);
        r.shuffle(of);
        of.resize(2);
        items.push_back({describe(*od, fresh_name([&] { return od->name(split, r); }), of)});
      }
    }
  }
  r.shuffle(items);
  std::vector<double> depths(items.size());
  for (auto& x : depths) x = r.uniform();
  std::sort(depths.begin(), depths.end());

  const T2jInstruction ins = t2j_instruction(split, d, f1, f2, r);
  ComposeRequest req;
  req.head = ins.head;
  req.tail = ins.tail;
  nlohmann::ordered_json answer = nlohmann::ordered_json::array();
  for (size_t i = 0; i < items.size(); ++i) {
    req.items.push_back({depths[i], "\n\n" + items[i].text + "\n\n"});
    if (items[i].target) answer.push_back(items[i].entry);
  }
  // Filler essays: even indices for training, odd ones held out.
  std::vector<const std::string*> texts;
  for (size_t i = split == Split::train ? 0 : 1; i < filler_texts.size(); i += 2) texts.push_back(&filler_texts[i]);
  if (texts.empty())
    for (const auto& t : filler_texts) texts.push_back(&t);
  size_t text_at = r.below(texts.size()), sentence = 0;
  Strings sentences = split_sentences(*texts[text_at]);
  req.next_filler = [&]() -> std::string {
    while (sentence >= sentences.size()) {
      text_at = (text_at + 1) % texts.size();
      sentences = split_sentences(*texts[text_at]);
      sentence = 0;
    }
    return sentences[sentence++];
  };
  req.target_tokens = o.target_tokens;
  Composed c = compose(req, count_tokens);

  BenchSample s;
  s.task = "text2json";
  s.id = "t2j-" + d.id + "-" + std::to_string(o.target_tokens) + "-s" + std::to_string(o.seed) + "-" +
         std::to_string(o.index) + (split == Split::heldout ? "-heldout" : "");
  s.prompt = std::move(c.text);
  s.n_tokens = c.n_tokens;
  s.gold = {{"answer", answer.dump()}};
  s.reference = answer.dump();
  return s;
}

}  // namespace kvtier::bench
