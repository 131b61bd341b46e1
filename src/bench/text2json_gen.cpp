#include "bench/text2json_gen.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/bench_text.h"
#include "core/status.h"

namespace kvtier::bench {

const std::vector<std::string> k_text2json_domains = {"products", "medical", "organizations", "movies"};

namespace {

using Strings = std::vector<std::string>;

const Strings k_first = {"Laura", "Daniel", "Amara", "Tomasz", "Helena", "Rafael", "Ingrid", "Marcus", "Priya",
                         "Oliver", "Sofia", "Kenji", "Nadia", "Elias", "Fatima", "Gregor", "Yuki", "Matteo",
                         "Claire", "Samuel", "Leila", "Viktor", "Hannah", "Andrei", "Beatriz", "Jonas", "Mei",
                         "Tobias", "Esther", "Omar", "Rosa", "Felix", "Anika", "Lucas", "Irene", "Pavel"};
const Strings k_last = {"Chen", "Okafor", "Lindqvist", "Moreau", "Castellano", "Novak", "Haddad", "Whitfield",
                        "Ishikawa", "Brennan", "Petrov", "Almeida", "Kowalski", "Fischer", "Nakamura", "Osei",
                        "Delacroix", "Ramirez", "Sorensen", "Varga", "Mbeki", "Hartley", "Quinlan", "Rossi",
                        "Tanaka", "Ferreira", "Ekström", "O’Connell", "Duarte", "Kaplan", "Sato", "Baptiste"};
const Strings k_cities = {"Lisbon", "Rotterdam", "Gdańsk", "Porto Alegre", "Osaka", "Calgary", "Tampere",
                          "Valencia", "Leeds", "Brno", "Adelaide", "Montevideo", "Graz", "Kraków", "Nantes",
                          "Bergen", "Tucson", "Halifax", "Cork", "Dundee", "Ljubljana", "Aarhus", "Bilbao"};
const Strings k_countries = {"South Korea", "Germany", "Taiwan", "Sweden", "Japan", "Canada", "Finland",
                             "Portugal", "Vietnam", "Mexico", "Poland", "Denmark"};

std::string person(Rng& r) { return r.pick(k_first) + " " + r.pick(k_last); }

std::string money(Rng& r, int lo, int hi) {
  return "$" + std::to_string(r.range(lo, hi)) + (r.below(2) ? ".99" : ".49");
}

std::string millions(Rng& r) {
  return "$" + std::to_string(r.range(2, 480)) + "." + std::to_string(r.range(1, 9)) + " million";
}

std::string thousands(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

struct Field {
  std::string key;
  std::string description;  // as the instructions ask for it
  std::function<std::string(Rng&)> value;
  Strings sentences;  // "{n}" the entity's name, "{v}" the value
  std::string noise;  // a sentence giving a value of this kind to nothing named
};

struct Domain {
  std::string id;
  std::string singular, plural, about;
  std::function<std::string(Rng&)> name;
  std::function<std::string(const std::string&, Rng&)> near_name;  // a different but similar name
  std::vector<Field> fields;
  Strings intros;   // "{n}"
  Strings chatter;  // sentences with no values, "{n}" allowed
};

std::string near_by_digit(const std::string& name, Rng& r) {
  std::string s = name;
  std::vector<size_t> digits;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] >= '0' && s[i] <= '9') digits.push_back(i);
  if (digits.empty()) return s + " II";
  const size_t at = digits[r.below(digits.size())];
  s[at] = static_cast<char>('0' + (s[at] - '0' + 1 + static_cast<int>(r.below(8))) % 10);
  return s;
}

const std::vector<Domain>& domains() {
  static const std::vector<Domain> d = [] {
    std::vector<Domain> v;
    const Strings brands = {"Veltrix", "Norvane", "Cobaltix", "Auralis", "Kestrel", "Lumora", "Stratos", "Quillon",
                            "Zephyra", "Orbis", "Halcyon", "Tessaro", "Nimbra", "Ferrolux", "Pyxel"};
    const Strings kinds = {"Wireless Earbuds", "Smartwatch", "Espresso Machine", "Robot Vacuum", "Drone",
                           "Portable Speaker", "E-Reader", "Air Purifier", "Action Camera", "Tablet",
                           "Electric Kettle", "Mechanical Keyboard", "Projector", "Fitness Tracker"};
    v.push_back(Domain{
        "products", "product", "products", "product specifications",
        [=](Rng& r) {
          return r.pick(brands) + " " + std::string(1, static_cast<char>('A' + r.below(26))) +
                 std::string(1, static_cast<char>('A' + r.below(26))) + "-" + std::to_string(r.range(100, 990)) +
                 " " + r.pick(kinds);
        },
        near_by_digit,
        {
            {"price", "price", [](Rng& r) { return money(r, 19, 1899); },
             {"The {n} retails for {v}.", "Its list price is {v}.", "Shoppers can pick up the {n} for {v}."},
             "An unnamed refurbished unit was spotted online at {v}, though the seller gave no model number."},
            {"weight", "weight", [](Rng& r) { return std::to_string(r.range(80, 2400)) + " g"; },
             {"The {n} weighs {v}.", "On the scale it comes in at {v}."},
             "A prototype shown behind glass at the fair reportedly weighed {v}."},
            {"battery_life", "battery life", [](Rng& r) { return std::to_string(r.range(4, 72)) + " hours"; },
             {"Its battery lasts {v} on a single charge.", "The {n} is rated for {v} of battery life."},
             "One blogger claimed a battery life of {v} for a device she would not name."},
            {"release_year", "release year", [](Rng& r) { return std::to_string(r.range(2012, 2024)); },
             {"The {n} was released in {v}.", "It first went on sale in {v}."},
             "The trade show itself moved to a larger venue in {v}."},
            {"warranty", "warranty", [](Rng& r) { return std::to_string(r.range(1, 5)) + " years"; },
             {"The {n} ships with a warranty of {v}.", "Buyers get {v} of warranty coverage."},
             "Some retailers offer an extended plan of {v} on selected items."},
            {"country_of_manufacture", "country of manufacture", [](Rng& r) { return r.pick(k_countries); },
             {"The {n} is manufactured in {v}.", "Production of the {n} takes place in {v}."},
             "Several components of the display stands were shipped from {v}."},
        },
        {"The {n} was among the products on the review bench this quarter.",
         "Next on the list is the {n}.", "The {n} drew a small crowd at the launch event."},
        {"Reviewers praised the build quality.", "The packaging is mostly recyclable.",
         "Setup took only a few minutes.", "The companion app received mixed feedback."}});

    const Strings specialties = {"cardiology", "dermatology", "neurology", "pediatrics", "oncology",
                                 "orthopedic surgery", "endocrinology", "ophthalmology", "psychiatry",
                                 "gastroenterology", "rheumatology", "nephrology"};
    const Strings hospital_words = {"St. Aldric", "Riverside", "Northgate", "Mercy Vale", "Harborview",
                                    "Kingsbridge", "Westmoor", "Lakeshore", "Elmhurst", "Saint Brigid"};
    const Strings hospital_kinds = {"Memorial Hospital", "Medical Center", "University Hospital", "General Hospital",
                                    "Clinic"};
    v.push_back(Domain{
        "medical", "medical professional", "medical professionals", "medical professionals",
        [](Rng& r) { return "Dr. " + person(r); },
        [](const std::string& n, Rng& r) {
          // Same first name, a different family name; or the reverse.
          const auto parts = split_on(n, " ");
          if (r.below(2)) return parts[0] + " " + r.pick(k_first) + " " + parts.back();
          return parts[0] + " " + parts[1] + " " + r.pick(k_last);
        },
        {
            {"specialty", "specialty", [=](Rng& r) { return r.pick(specialties); },
             {"{n} specializes in {v}.", "{n} practices {v}.", "Colleagues know {n} for work in {v}."},
             "The conference included a panel on {v} chaired by a visiting speaker."},
            {"hospital", "hospital", [=](Rng& r) { return r.pick(hospital_words) + " " + r.pick(hospital_kinds); },
             {"{n} works at {v}.", "{n} sees patients at {v}.", "{n} joined the staff of {v}."},
             "A new wing was opened last spring at {v}."},
            {"city", "city", [](Rng& r) { return r.pick(k_cities); },
             {"{n} is based in {v}.", "{n} lives and practices in {v}."},
             "The regional health board held its annual meeting in {v}."},
            {"years_of_experience", "years of experience", [](Rng& r) { return std::to_string(r.range(3, 38)); },
             {"{n} has {v} years of clinical experience.", "{n} has been practicing for {v} years."},
             "The hospital's oldest volunteer has helped out for {v} years."},
            {"medical_school", "medical school",
             [](Rng& r) { return "University of " + r.pick(k_cities) + " School of Medicine"; },
             {"{n} graduated from the {v}.", "{n} earned a medical degree at the {v}."},
             "A scholarship fund was announced at the {v}."},
            {"phone", "phone number",
             [](Rng& r) {
               return "(555) " + std::to_string(r.range(200, 989)) + "-" + std::to_string(r.range(1000, 9999));
             },
             {"{n} can be reached at {v}.", "The office of {n} lists the phone number {v}."},
             "The switchboard's after-hours line is {v}."},
        },
        {"{n} is one of the physicians profiled in this directory.", "We also spoke with {n}.",
         "{n} was recommended by several patients."},
        {"Patients describe a calm and attentive manner.", "Appointments are usually booked weeks ahead.",
         "The practice accepts most insurance plans.", "Telehealth visits are available on weekdays."}});

    const Strings org_a = {"Brightwater", "Ironleaf", "Silverline", "Northwind", "Bluecrest", "Redfern", "Oakridge",
                           "Clearpath", "Stonebridge", "Greenhollow", "Suncastle", "Highmark"};
    const Strings org_b = {"Analytics", "Logistics", "Biotech", "Foods", "Robotics", "Energy", "Media", "Textiles",
                           "Software", "Aerospace", "Pharmaceuticals", "Capital"};
    const Strings industries = {"logistics", "renewable energy", "food processing", "biotechnology", "software",
                                "retail banking", "aerospace", "textiles", "media production", "robotics"};
    v.push_back(Domain{
        "organizations", "organization", "organizations", "organizations",
        [=](Rng& r) { return r.pick(org_a) + " " + r.pick(org_b) + (r.below(3) == 0 ? " Group" : ""); },
        [=](const std::string& n, Rng& r) {
          const auto parts = split_on(n, " ");
          // Same first word, another line of business.
          return parts[0] + " " + r.pick(org_b) + (r.below(2) ? " Group" : "");
        },
        {
            {"founded_year", "founding year", [](Rng& r) { return std::to_string(r.range(1890, 2021)); },
             {"{n} was founded in {v}.", "{n} traces its origins to {v}."},
             "The industry association itself was established in {v}."},
            {"headquarters", "headquarters", [](Rng& r) { return r.pick(k_cities); },
             {"{n} is headquartered in {v}.", "The head office of {n} is in {v}."},
             "Delegates gathered for the summit in {v}."},
            {"industry", "industry", [=](Rng& r) { return r.pick(industries); },
             {"{n} operates in {v}.", "{n} is a player in {v}."},
             "Analysts expect consolidation in {v} over the next decade."},
            {"ceo", "chief executive", [](Rng& r) { return person(r); },
             {"{n} is led by chief executive {v}.", "The CEO of {n} is {v}."},
             "The keynote was given by {v}, a former consultant."},
            {"employees", "number of employees", [](Rng& r) { return thousands(r.range(40, 95000)); },
             {"{n} employs {v} people.", "The workforce of {n} numbers {v}."},
             "Across the region, roughly {v} people work in similar firms."},
            {"annual_revenue", "annual revenue", [](Rng& r) { return millions(r); },
             {"{n} reported annual revenue of {v}.", "Last year {n} booked {v} in revenue."},
             "A private competitor is rumored to have made {v} last year."},
        },
        {"{n} is among the companies covered in this survey.", "Consider {n}.",
         "{n} came up repeatedly in our interviews."},
        {"The company has expanded steadily.", "Its annual report was published on time.",
         "Management emphasized long-term planning.", "The board met twice this quarter."}});

    const Strings title_a = {"The Silent", "Echoes of", "A Winter in", "Beneath the", "The Last", "Chasing",
                             "Letters from", "The Glass", "Shadows over", "The Long Road to"};
    const Strings title_b = {"Harbor", "Marrow Street", "Lighthouse", "Orchard", "Frontier", "Tide", "Meridian",
                             "Cathedral", "Archipelago", "Summer"};
    const Strings genres = {"drama", "science fiction", "thriller", "comedy", "documentary", "horror",
                            "animated feature", "romance", "western", "mystery"};
    v.push_back(Domain{
        "movies", "movie", "movies", "movies",
        [=](Rng& r) { return r.pick(title_a) + " " + r.pick(title_b); },
        [](const std::string& n, Rng& r) {
          const Strings sequel = {" II", ": Part Two", " Returns", ": The Beginning", " Redux"};
          return n + r.pick(sequel);
        },
        {
            {"director", "director", [](Rng& r) { return person(r); },
             {"{n} was directed by {v}.", "{v} directed {n}."},
             "The festival jury was chaired by {v} this year."},
            {"release_year", "release year", [](Rng& r) { return std::to_string(r.range(1961, 2024)); },
             {"{n} premiered in {v}.", "{n} came out in {v}."},
             "The festival moved to its current venue in {v}."},
            {"genre", "genre", [=](Rng& r) { return r.pick(genres); },
             {"{n} is a {v}.", "Critics file {n} under {v}."},
             "Interest in {v} has grown among younger audiences."},
            {"runtime", "runtime", [](Rng& r) { return std::to_string(r.range(78, 189)) + " minutes"; },
             {"{n} runs {v}.", "The running time of {n} is {v}."},
             "The restored print of an older classic runs {v}."},
            {"lead_actor", "lead actor", [](Rng& r) { return person(r); },
             {"{n} stars {v} in the lead role.", "The lead in {n} is played by {v}."},
             "An understudy, {v}, attended the premiere."},
            {"box_office", "box office gross", [](Rng& r) { return millions(r); },
             {"{n} grossed {v} at the box office.", "{n} earned {v} in ticket sales."},
             "Local cinemas together sold {v} worth of tickets last year."},
        },
        {"{n} is one of the films discussed in this retrospective.", "Then there is {n}.",
         "{n} screened to a full house."},
        {"The cinematography was widely admired.", "The score was recorded with a small orchestra.",
         "Audiences responded warmly at the premiere.", "The film was shot over a single summer."}});
    return v;
  }();
  return d;
}

std::string fill_in(const std::string& tmpl, const std::string& name, const std::string& value) {
  return replace_all(replace_all(tmpl, "{n}", name), "{v}", value);
}

std::string perturb_value(const std::string& v, Rng& r, const Field& f) {
  std::vector<size_t> digits;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] >= '1' && v[i] <= '9') digits.push_back(i);
  if (digits.empty()) return f.value(r);
  std::string s = v;
  const size_t at = digits[r.below(digits.size())];
  s[at] = static_cast<char>('1' + (s[at] - '1' + 1 + static_cast<int>(r.below(7))) % 9);
  return s;
}

// A passage about one entity: an intro, its fields and a little chatter.
std::string passage(const Domain& d, const std::string& name, const std::vector<const Field*>& fields, Rng& r) {
  std::string p = fill_in(r.pick(d.intros), name, "") + " ";
  std::vector<std::string> parts;
  for (const Field* f : fields) parts.push_back(fill_in(r.pick(f->sentences), name, f->value(r)));
  // Chatter goes between or after the field sentences.
  parts.insert(parts.begin() + static_cast<std::ptrdiff_t>(r.below(parts.size() + 1)), r.pick(d.chatter));
  return p + join(parts, " ");
}

}  // namespace

int text2json_max_targets(int64_t target_tokens) {
  return static_cast<int>(std::clamp<int64_t>(target_tokens / 200, 3, 20));
}

BenchSample make_text2json_sample(const Text2JsonGenOptions& o, const std::vector<std::string>& filler_texts,
                                  const CountTokens& count_tokens) {
  KVT_CHECK(!filler_texts.empty(), "text2json generator: no filler texts");
  KVT_CHECK(o.target_tokens >= 512, "text2json generator: target length {} is below 512 tokens", o.target_tokens);
  Rng r(sample_seed(o.seed, static_cast<uint64_t>(o.index), "text2json"));
  size_t domain_index = static_cast<size_t>(o.index) % domains().size();
  if (!o.domain.empty()) {
    auto it = std::find(k_text2json_domains.begin(), k_text2json_domains.end(), o.domain);
    KVT_CHECK(it != k_text2json_domains.end(), "text2json generator: unknown domain '{}' (products, medical, "
              "organizations, movies)", o.domain);
    domain_index = static_cast<size_t>(it - k_text2json_domains.begin());
  }
  const Domain& d = domains()[domain_index];
  const int max_targets = text2json_max_targets(o.target_tokens);
  const int n_targets = o.n_targets > 0 ? o.n_targets : static_cast<int>(r.range(3, max_targets));
  KVT_CHECK(n_targets >= 1 && n_targets <= 20, "text2json generator: {} targets (1-20 allowed)", n_targets);

  // Two asked fields; the other four describe the distractors.
  std::vector<size_t> field_order(d.fields.size());
  for (size_t i = 0; i < field_order.size(); ++i) field_order[i] = i;
  r.shuffle(field_order);
  const Field& f1 = d.fields[field_order[0]];
  const Field& f2 = d.fields[field_order[1]];
  std::vector<const Field*> other_fields;
  for (size_t i = 2; i < field_order.size(); ++i) other_fields.push_back(&d.fields[field_order[i]]);

  std::set<std::string> used;
  auto fresh_name = [&](const std::function<std::string()>& make) {
    for (int attempt = 0; attempt < 200; ++attempt) {
      std::string n = make();
      if (used.insert(n).second) return n;
    }
    fail("text2json generator: could not draw a new {} name", d.singular);
  };

  struct Item {
    std::string text;
    bool target = false;
    nlohmann::ordered_json entry;  // name first, as the official answers are
  };
  std::vector<Item> items;
  for (int i = 0; i < n_targets; ++i) {
    const std::string name = fresh_name([&] { return d.name(r); });
    Rng vr(r.next());
    const std::string v1 = f1.value(vr), v2 = f2.value(vr);
    std::string p = fill_in(r.pick(d.intros), name, "") + " ";
    Strings parts = {fill_in(r.pick(f1.sentences), name, v1), fill_in(r.pick(f2.sentences), name, v2)};
    if (r.below(2)) std::swap(parts[0], parts[1]);
    parts.insert(parts.begin() + static_cast<std::ptrdiff_t>(r.below(3)), r.pick(d.chatter));
    items.push_back({p + join(parts, " "), true, {{"name", name}, {f1.key, v1}, {f2.key, v2}}});
  }
  const int n_distractors = static_cast<int>(r.range((n_targets + 1) / 2, n_targets));
  std::vector<std::string> target_names;
  for (const auto& it : items) target_names.push_back(it.entry["name"]);
  for (int i = 0; i < n_distractors; ++i) {
    const int kind = static_cast<int>(r.below(4));
    std::vector<const Field*> fields = other_fields;
    r.shuffle(fields);
    fields.resize(2);
    if (kind == 0) {  // another entity of the domain, without the asked fields
      items.push_back({passage(d, fresh_name([&] { return d.name(r); }), fields, r)});
    } else if (kind == 1) {  // a near-duplicate of a target's name, without the asked fields
      const std::string base = r.pick(target_names);
      items.push_back({passage(d, fresh_name([&] { return d.near_name(base, r); }), fields, r)});
    } else if (kind == 2) {  // a near-duplicate of a target's value, attributed to nothing named
      const Item& t = items[r.below(static_cast<uint64_t>(n_targets))];
      const Field& f = r.below(2) ? f1 : f2;
      const std::string v = perturb_value(t.entry[f.key].get<std::string>(), r, f);
      items.push_back({fill_in(f.noise, "", v) + " " + r.pick(d.chatter)});
    } else {  // an entity of another domain, with its own fields
      const Domain& od = domains()[(domain_index + 1 + r.below(domains().size() - 1)) % domains().size()];
      std::vector<const Field*> of;
      for (const auto& f : od.fields) of.push_back(&f);
      r.shuffle(of);
      of.resize(2);
      items.push_back({passage(od, fresh_name([&] { return od.name(r); }), of, r)});
    }
  }
  r.shuffle(items);
  std::vector<double> depths(items.size());
  for (auto& x : depths) x = r.uniform();
  std::sort(depths.begin(), depths.end());

  ComposeRequest req;
  const std::string fields_quoted = "\"name\", \"" + f1.key + "\" and \"" + f2.key + "\"";
  req.head = "Below is a long text. Some passages in it describe " + d.about + ".\n"
             "Your task: find every " + d.singular + " for which the text gives both its " + f1.description +
             " and its " + f2.description + ", and return them as a JSON list. Each element must be an object "
             "with exactly three string fields: " + fields_quoted + ". Copy names and values exactly as they are "
             "written in the text. Leave out " + d.plural + " whose " + f1.description + " and " + f2.description +
             " are not given, and values that are not attributed to a named " + d.singular + ". List the " +
             d.plural + " in the order in which they appear. Output only the JSON list.\n\nText:\n";
  req.tail = "\n\nNow return the JSON list of " + d.plural + " with the fields " + fields_quoted + ".";
  nlohmann::ordered_json answer = nlohmann::ordered_json::array();
  for (size_t i = 0; i < items.size(); ++i) {
    req.items.push_back({depths[i], "\n\n" + items[i].text + "\n\n"});
    if (items[i].target) answer.push_back(items[i].entry);
  }
  size_t text_at = r.below(filler_texts.size()), sentence = 0;
  Strings sentences = split_sentences(filler_texts[text_at]);
  req.next_filler = [&]() -> std::string {
    while (sentence >= sentences.size()) {
      text_at = (text_at + 1) % filler_texts.size();
      sentences = split_sentences(filler_texts[text_at]);
      sentence = 0;
    }
    return sentences[sentence++];
  };
  req.target_tokens = o.target_tokens;
  Composed c = compose(req, count_tokens);

  BenchSample s;
  s.task = "text2json";
  s.id = "t2j-" + d.id + "-" + std::to_string(o.target_tokens) + "-s" + std::to_string(o.seed) + "-" +
         std::to_string(o.index);
  s.prompt = std::move(c.text);
  s.n_tokens = c.n_tokens;
  s.gold = {{"answer", answer.dump()}};
  s.reference = answer.dump();
  return s;
}

}  // namespace kvtier::bench
