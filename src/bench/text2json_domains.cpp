#include "bench/text2json_domains.h"

#include <fmt/format.h>

#include <cctype>
#include <set>

#include "bench/bench_text.h"

namespace kvtier::bench {

namespace {

using Strings = std::vector<std::string>;
using Gen = std::function<std::string(Split, Rng&)>;

Gen years(int lo, int hi) {
  return [=](Split, Rng& r) { return std::to_string(r.range(lo, hi)); };
}
Gen count(int64_t lo, int64_t hi) {
  return [=](Split s, Rng& r) { return grouped(s, r, lo, hi); };
}
Gen with_unit(int64_t lo, int64_t hi, const std::string& unit) {
  return [=](Split s, Rng& r) { return grouped(s, r, lo, hi) + " " + unit; };
}
Gen dates(int lo, int hi) {
  return [=](Split s, Rng& r) { return date(s, r, lo, hi); };
}
Gen pick2(Strings a, Strings b) {
  return [=](Split, Rng& r) { return combine(r, a, b); };
}
const Gen k_person = [](Split s, Rng& r) { return person(s, r); };
const Gen k_place = [](Split s, Rng& r) { return place(s, r); };
const Gen k_org = [](Split s, Rng& r) { return organisation(s, r); };
const Gen k_phone = [](Split s, Rng& r) { return phone(s, r); };
const Gen k_code = [](Split s, Rng& r) { return record_code(s, r); };
const Gen k_millions = [](Split s, Rng& r) { return millions(s, r); };

std::vector<T2jDomain> official() {
  std::vector<T2jDomain> v;
  const Strings kinds = {"Wireless Earbuds", "Smartwatch", "Espresso Machine", "Robot Vacuum", "Drone",
                         "Portable Speaker", "E-Reader", "Air Purifier", "Action Camera", "Tablet",
                         "Electric Kettle", "Mechanical Keyboard", "Projector", "Fitness Tracker"};
  v.push_back(T2jDomain{
      "products", "product", "products", "product specifications",
      [=](Split s, Rng& r) {
        std::string name = brand(s, r) + " ";  // one draw per statement: + does not order its operands
        name += model_code(s, r) + " ";
        return name + r.pick(kinds);
      },
      {"The {n} was among the products on the review bench this quarter.", "Next on the list is the {n}.",
       "The {n} drew a small crowd at the launch event."},
      {"Reviewers praised the build quality.", "The packaging is mostly recyclable.", "Setup took only a few minutes.",
       "The companion app received mixed feedback."},
      {{"price", "price", [](Split s, Rng& r) { return money(s, r, 19, 2899); },
        {"The {n} retails for {v}.", "Its list price is {v}.", "Shoppers can pick up the {n} for {v}."}},
       {"weight", "weight", with_unit(60, 4800, "g"), {"The {n} weighs {v}.", "On the scale it comes in at {v}."}},
       {"battery_life", "battery life", with_unit(3, 96, "hours"),
        {"Its battery lasts {v} on a single charge.", "The {n} is rated for {v} of battery life."}},
       {"release_date", "release date", dates(2009, 2025),
        {"The {n} was released on {v}.", "It first went on sale on {v}."}},
       {"warranty", "warranty", with_unit(1, 7, "years"),
        {"The {n} ships with a warranty of {v}.", "Buyers get {v} of warranty coverage."}},
       {"country_of_manufacture", "country of manufacture", [](Split s, Rng& r) { return country(s, r); },
        {"The {n} is manufactured in {v}.", "Production of the {n} takes place in {v}."}}}});

  const Strings sub = {"pediatric", "geriatric", "interventional", "sports", "sleep", "transplant", "nuclear",
                       "reproductive", "tropical", "occupational", "emergency", "molecular"};
  const Strings base = {"cardiology", "dermatology", "neurology", "oncology", "endocrinology", "ophthalmology",
                        "psychiatry", "gastroenterology", "rheumatology", "nephrology", "radiology", "pulmonology"};
  const Strings hospital_kinds = {"Memorial Hospital", "Medical Center", "University Hospital", "General Hospital",
                                  "Clinic", "Children's Hospital"};
  v.push_back(T2jDomain{
      "medical", "medical professional", "medical professionals", "medical professionals",
      [](Split s, Rng& r) { return "Dr. " + person(s, r); },
      {"{n} is one of the physicians profiled in this directory.", "We also spoke with {n}.",
       "{n} was recommended by several patients."},
      {"Patients describe a calm and attentive manner.", "Appointments are usually booked weeks ahead.",
       "The practice accepts most insurance plans.", "Telehealth visits are available on weekdays."},
      {{"specialty", "specialty", pick2(sub, base),
        {"{n} specializes in {v}.", "{n} practices {v}.", "Colleagues know {n} for work in {v}."}},
       {"hospital", "hospital", [=](Split s, Rng& r) {
         std::string name = place(s, r) + " ";
         return name + r.pick(hospital_kinds);
       },
        {"{n} works at {v}.", "{n} sees patients at {v}.", "{n} joined the staff of {v}."}},
       {"city", "city", k_place, {"{n} is based in {v}.", "{n} lives and practices in {v}."}},
       {"years_of_experience", "years of experience", years(2, 45),
        {"{n} has {v} years of clinical experience.", "{n} has been practicing for {v} years."}},
       {"medical_school", "medical school",
        [](Split s, Rng& r) { return "University of " + place(s, r) + " School of Medicine"; },
        {"{n} graduated from the {v}.", "{n} earned a medical degree at the {v}."}},
       {"phone", "phone number", k_phone,
        {"{n} can be reached at {v}.", "The office of {n} lists the phone number {v}."}}}});

  const Strings ind_a = {"industrial", "marine", "consumer", "precision", "agricultural", "medical", "urban",
                         "specialty", "digital", "renewable", "cold-chain", "satellite"};
  const Strings ind_b = {"robotics", "logistics", "food processing", "biotechnology", "software", "banking",
                         "aerospace", "textiles", "media production", "energy storage", "chemicals", "insurance"};
  v.push_back(T2jDomain{
      "organizations", "organization", "organizations", "organizations",
      [](Split s, Rng& r) { return organisation(s, r); },
      {"{n} is among the companies covered in this survey.", "Consider {n}.",
       "{n} came up repeatedly in our interviews."},
      {"The company has expanded steadily.", "Its annual report was published on time.",
       "Management emphasized long-term planning.", "The board met twice this quarter."},
      {{"founded_year", "founding year", years(1850, 2023),
        {"{n} was founded in {v}.", "{n} traces its origins to {v}."}},
       {"headquarters", "headquarters", k_place, {"{n} is headquartered in {v}.", "The head office of {n} is in {v}."}},
       {"industry", "industry", pick2(ind_a, ind_b), {"{n} operates in {v}.", "{n} is a player in {v}."}},
       {"ceo", "chief executive", k_person, {"{n} is led by chief executive {v}.", "The CEO of {n} is {v}."}},
       {"employees", "number of employees", count(12, 240000),
        {"{n} employs {v} people.", "The workforce of {n} numbers {v}."}},
       {"annual_revenue", "annual revenue", k_millions,
        {"{n} reported annual revenue of {v}.", "Last year {n} booked {v} in revenue."}}}});

  const Strings mood = {"psychological", "neo-noir", "romantic", "slapstick", "historical", "dystopian", "musical",
                        "coming-of-age", "supernatural", "political", "heist", "survival"};
  const Strings genre = {"drama", "thriller", "comedy", "documentary", "horror", "western", "mystery", "romance",
                         "fantasy", "satire", "adventure", "melodrama"};
  const Strings title_a = {"The Silent", "Echoes of", "A Winter in", "Beneath", "The Last Days of", "Chasing",
                           "Letters from", "The Glass", "Shadows over", "The Long Road to", "Return to", "Nights in"};
  v.push_back(T2jDomain{
      "movies", "movie", "movies", "movies",
      [=](Split s, Rng& r) {
        std::string title = r.pick(title_a) + " ";
        return title + place(s, r);
      },
      {"{n} is one of the films discussed in this retrospective.", "Then there is {n}.", "{n} screened to a full house."},
      {"The cinematography was widely admired.", "The score was recorded with a small orchestra.",
       "Audiences responded warmly at the premiere.", "The film was shot over a single summer."},
      {{"director", "director", k_person, {"{n} was directed by {v}.", "{v} directed {n}."}},
       {"release_year", "release year", years(1931, 2025), {"{n} premiered in {v}.", "{n} came out in {v}."}},
       {"genre", "genre", pick2(mood, genre), {"{n} is a {v}.", "Critics file {n} under {v}."}},
       {"runtime", "runtime", with_unit(61, 231, "minutes"), {"{n} runs {v}.", "The running time of {n} is {v}."}},
       {"lead_actor", "lead actor", k_person,
        {"{n} stars {v} in the lead role.", "The lead in {n} is played by {v}."}},
       {"box_office", "box office gross", k_millions,
        {"{n} grossed {v} at the box office.", "{n} earned {v} in ticket sales."}}}});
  return v;
}

// Domains seen only in training: generic sentences (text2json_style) carry
// their fields, plus a sentence or two of their own.
std::vector<T2jDomain> train_extra() {
  std::vector<T2jDomain> v;
  const Strings book_words = {"Garden", "River", "Winter", "Lantern", "Orchard", "Harbor", "Archive", "Mirror"};
  v.push_back(T2jDomain{
      "books", "book", "books", "books and their publication details",
      [=](Split s, Rng& r) {
        std::string title = "The " + r.pick(book_words) + " of ";
        return title + place(s, r);
      },
      {"Among this season's titles is {n}.", "{n} turned up on several reading lists.", "Readers kept asking about {n}."},
      {"The cover art was redesigned for the paperback.", "Book clubs picked it up quickly.",
       "The translation rights sold within weeks."},
      {{"author", "author", k_person, {"{n} was written by {v}.", "{v} is the author of {n}."}},
       {"publisher", "publisher", k_org, {"{n} is published by {v}."}},
       {"publication_year", "publication year", years(1890, 2025), {"{n} first appeared in {v}."}},
       {"pages", "page count", count(64, 1400), {"{n} runs to {v} pages."}},
       {"isbn", "catalogue number", k_code, {"{n} is catalogued under {v}."}},
       {"price", "cover price", [](Split s, Rng& r) { return money(s, r, 5, 120); }, {"{n} sells for {v}."}}}});
  const Strings cuisine_a = {"coastal", "smoky", "modern", "rustic", "street-food", "farmhouse"};
  const Strings cuisine_b = {"grill", "bistro", "noodle bar", "tavern", "bakery", "kitchen"};
  v.push_back(T2jDomain{
      "restaurants", "restaurant", "restaurants", "restaurants",
      [=](Split s, Rng& r) {
        std::string name = made_up_word(s, r, 2) + " ";
        return name + r.pick(cuisine_b);
      },
      {"Our critic also visited {n}.", "{n} is a newer name on the local scene.", "Locals recommend {n}."},
      {"The dining room was full on a Tuesday night.", "Service was quick and friendly.",
       "The dessert menu changes weekly."},
      {{"head_chef", "head chef", k_person, {"The kitchen of {n} is run by {v}."}},
       {"city", "city", k_place, {"{n} is located in {v}."}},
       {"opening_date", "opening date", dates(1980, 2025), {"{n} opened its doors on {v}."}},
       {"seats", "seating capacity", count(12, 480), {"{n} seats {v} guests."}},
       {"phone", "reservation number", k_phone, {"Tables at {n} can be booked on {v}."}},
       {"style", "style of cooking", pick2(cuisine_a, cuisine_b), {"{n} serves {v} fare."}}}});
  const Strings ship_kinds = {"Star", "Spirit", "Queen", "Wind", "Pride", "Dawn"};
  v.push_back(T2jDomain{
      "ships", "ship", "ships", "ships and their records",
      [=](Split s, Rng& r) {
        std::string name = "MV " + made_up_word(s, r, 2) + " ";
        return name + r.pick(ship_kinds);
      },
      {"The registry also lists the {n}.", "Next comes the {n}.", "The {n} was spotted in the harbour last month."},
      {"The hull was repainted during the last refit.", "Her crew praised the new galley.",
       "Port inspections found nothing of note."},
      {{"captain", "captain", k_person, {"The {n} is commanded by {v}."}},
       {"home_port", "home port", k_place, {"The {n} is registered in {v}."}},
       {"launch_year", "launch year", years(1950, 2024), {"The {n} was launched in {v}."}},
       {"tonnage", "gross tonnage", with_unit(300, 180000, "tonnes"), {"The {n} measures {v}."}},
       {"hull_number", "hull number", k_code, {"The hull number of the {n} is {v}."}},
       {"crew", "crew size", count(4, 1800), {"The {n} sails with a crew of {v}."}}}});
  v.push_back(T2jDomain{
      "software", "software package", "software packages", "open-source software packages",
      [](Split s, Rng& r) { return r.below(2) ? made_up_word(s, r, 2) : made_up_word(s, r, 1) + "DB"; },
      {"The survey also covered {n}.", "{n} is a popular choice among developers.", "Consider {n} as well."},
      {"Its documentation was rewritten last year.", "The community is small but active.",
       "Continuous integration runs on every commit."},
      {{"maintainer", "lead maintainer", k_person, {"{n} is maintained by {v}."}},
       {"latest_version", "latest version", [](Split s, Rng& r) { return version(s, r); },
        {"The current release of {n} is {v}."}},
       {"first_release", "first release date", dates(1995, 2025), {"{n} was first released on {v}."}},
       {"contributors", "number of contributors", count(1, 9000), {"{n} has had {v} contributors."}},
       {"downloads", "monthly downloads", count(100, 90000000), {"{n} is downloaded {v} times a month."}},
       {"organisation", "sponsoring organisation", k_org, {"{n} is sponsored by {v}."}}}});
  const Strings sports = {"sprinter", "rower", "goalkeeper", "fencer", "climber", "cyclist"};
  v.push_back(T2jDomain{
      "athletes", "athlete", "athletes", "athletes",
      [](Split s, Rng& r) { return person(s, r); },
      {"{n} is one of the athletes profiled here.", "We caught up with {n} after training.",
       "{n} has been in good form this season."},
      {"The team trains twice a day in season.", "Fans packed the stands.", "The new stadium opened last spring."},
      {{"coach", "coach", k_person, {"{n} is coached by {v}."}},
       {"hometown", "hometown", k_place, {"{n} grew up in {v}."}},
       {"birth_date", "date of birth", dates(1970, 2008), {"{n} was born on {v}."}},
       {"club", "club", k_org, {"{n} competes for {v}."}},
       {"height", "height", [](Split, Rng& r) { return fmt::format("1.{} m", r.range(50, 99)); },
        {"{n} stands {v} tall."}},
       {"discipline", "discipline", pick2({"indoor", "endurance", "junior", "freestyle", "open-water", "track"},
                                          sports),
        {"{n} is known as a {v}."}}}});
  v.push_back(T2jDomain{
      "grants", "research grant", "research grants", "research grants",
      [](Split s, Rng& r) {
        std::string name = "Project " + made_up_word(s, r, 2) + " ";
        return name + std::to_string(r.range(2, 99));
      },
      {"The funding round also included {n}.", "{n} was among the proposals approved.", "One example is {n}."},
      {"Reviewers scored the proposals in two rounds.", "Results will be published openly.",
       "The committee met in the autumn."},
      {{"principal_investigator", "principal investigator", k_person, {"{n} is led by {v}."}},
       {"institution", "host institution", k_org, {"{n} is hosted by {v}."}},
       {"amount", "award amount", [](Split s, Rng& r) { return money(s, r, 5000, 4900000); },
        {"{n} received {v}."}},
       {"start_date", "start date", dates(2000, 2026), {"{n} begins on {v}."}},
       {"grant_id", "grant identifier", k_code, {"{n} is filed as {v}."}},
       {"duration", "duration", with_unit(3, 72, "months"), {"{n} is planned to last {v}."}}}});
  return v;
}

std::vector<T2jDomain> heldout() {
  std::vector<T2jDomain> v;
  v.push_back(T2jDomain{
      "hotels", "hotel", "hotels", "places to stay",
      [](Split s, Rng& r) { return "Hotel " + made_up_word(s, r, 2); },
      {"The guide also reviews {n}.", "Travellers often mention {n}.", "A stay at {n} rounded off the trip."},
      {"Breakfast is served until ten.", "The lobby was recently renovated.", "Parking is limited."},
      {{"manager", "general manager", k_person, {}},
       {"city", "location", k_place, {}},
       {"rooms", "number of rooms", count(6, 1400), {}},
       {"opening_year", "year of opening", years(1880, 2025), {}},
       {"phone", "front desk number", k_phone, {}},
       {"nightly_rate", "nightly rate", [](Split s, Rng& r) { return money(s, r, 40, 2400); }, {}}}});
  v.push_back(T2jDomain{
      "aircraft", "aircraft", "aircraft", "individual aircraft in a fleet register",
      [](Split s, Rng& r) {
        std::string name = made_up_word(s, r, 2) + " ";
        return name + model_code(s, r);
      },
      {"The register also includes the {n}.", "Another entry is the {n}.", "The {n} was inspected this spring."},
      {"The hangar was cold that morning.", "Maintenance logs are kept on paper.", "The runway was resurfaced."},
      {{"registration", "registration mark", k_code, {}},
       {"operator", "operator", k_org, {}},
       {"first_flight", "first flight", dates(1960, 2025), {}},
       {"seats", "seat count", count(2, 520), {}},
       {"base", "home base", k_place, {}},
       {"flight_hours", "flight hours", count(10, 98000), {}}}});
  v.push_back(T2jDomain{
      "universities", "university", "universities", "institutions of higher education",
      [](Split s, Rng& r) { return "University of " + place(s, r); },
      {"The report also covers the {n}.", "The {n} features here too.", "Consider the {n}."},
      {"Its library opens around the clock.", "Student housing is scarce.", "Tuition rose slightly."},
      {{"rector", "rector", k_person, {}},
       {"founded", "foundation date", dates(1400, 2020), {}},
       {"students", "enrolment", count(300, 120000), {}},
       {"endowment", "endowment", k_millions, {}},
       {"campus", "main campus", k_place, {}},
       {"registry_code", "registry code", k_code, {}}}});
  v.push_back(T2jDomain{
      "albums", "album", "albums", "recorded music releases",
      [](Split s, Rng& r) {
        std::string name = made_up_word(s, r, 2) + " ";
        return name + made_up_word(s, r, 2);
      },
      {"Also in rotation: {n}.", "The critics' list includes {n}.", "Then came {n}."},
      {"The vinyl pressing sold out.", "The tour was extended twice.", "The cover photo was shot at dawn."},
      {{"artist", "performing artist", k_person, {}},
       {"label", "record label", k_org, {}},
       {"release_date", "release date", dates(1955, 2025), {}},
       {"tracks", "track count", count(3, 40), {}},
       {"producer", "producer", k_person, {}},
       {"catalogue_number", "catalogue number", k_code, {}}}});
  v.push_back(T2jDomain{
      "patents", "patent", "patents", "patents and their filings",
      [](Split s, Rng& r) {
        std::string name = made_up_word(s, r, 2) + "-";
        return name + made_up_word(s, r, 1) + " Method";
      },
      {"The docket also contains {n}.", "Another filing concerns {n}.", "Counsel flagged {n}."},
      {"Prior art searches took months.", "The examiner requested amendments.", "Fees were paid on time."},
      {{"inventor", "inventor", k_person, {}},
       {"assignee", "assignee", k_org, {}},
       {"filing_date", "filing date", dates(1980, 2026), {}},
       {"patent_number", "patent number", k_code, {}},
       {"claims", "number of claims", count(1, 240), {}},
       {"examiner", "examiner", k_person, {}}}});
  return v;
}

// An attribute a generated domain can describe its entities by: how the
// text names it, short JSON keys it may go by instead of the description in
// snake case, and a value generator with ranges drawn per domain.
struct Attribute {
  std::string description;
  Strings aliases;
  std::function<Gen(Rng&)> make;
};

std::function<Gen(Rng&)> fixed(Gen g) {
  return [g](Rng&) { return g; };
}
std::function<Gen(Rng&)> any_count(int64_t lo, int64_t hi) {  // a range inside [lo, hi], drawn per domain
  return [=](Rng& r) {
    const int64_t a = r.range(lo, hi);
    return count(a, r.range(a, hi));
  };
}
std::function<Gen(Rng&)> any_measure(int64_t lo, int64_t hi, const std::string& unit) {
  return [=](Rng& r) {
    const int64_t a = r.range(lo, hi);
    return with_unit(a, r.range(a, hi), unit);
  };
}
std::function<Gen(Rng&)> any_year(int lo, int hi) {
  return [=](Rng& r) {
    const int a = static_cast<int>(r.range(lo, hi - 10));
    return years(a, static_cast<int>(r.range(a + 10, hi)));
  };
}
std::function<Gen(Rng&)> any_date(int lo, int hi) {
  return [=](Rng& r) {
    const int a = static_cast<int>(r.range(lo, hi - 5));
    return dates(a, static_cast<int>(r.range(a + 5, hi)));
  };
}
std::function<Gen(Rng&)> any_money(int64_t lo, int64_t hi) {
  return [=](Rng& r) {
    const int64_t a = r.range(lo, hi);
    const int64_t b = r.range(a, hi);
    return Gen([=](Split s, Rng& q) { return money(s, q, a, b); });
  };
}

// The pool. None of the held-out domains' (key, description) pairs, and no
// attribute of theirs by its held-out description.
const std::vector<Attribute>& attributes() {
  static const std::vector<Attribute> v = {
      {"founder", {}, fixed(k_person)},
      {"curator", {}, fixed(k_person)},
      {"chief engineer", {"engineer"}, fixed(k_person)},
      {"keeper", {}, fixed(k_person)},
      {"owner", {}, fixed(k_person)},
      {"conductor", {}, fixed(k_person)},
      {"head ranger", {"ranger"}, fixed(k_person)},
      {"designer", {}, fixed(k_person)},
      {"architect", {}, fixed(k_person)},
      {"lead scientist", {"scientist"}, fixed(k_person)},
      {"caretaker", {}, fixed(k_person)},
      {"patron", {}, fixed(k_person)},
      {"chairperson", {"chair"}, fixed(k_person)},
      {"contact person", {"contact"}, fixed(k_person)},
      {"discoverer", {}, fixed(k_person)},
      {"town", {}, fixed(k_place)},
      {"region", {}, fixed(k_place)},
      {"nearest town", {"near_town"}, fixed(k_place)},
      {"district", {}, fixed(k_place)},
      {"place of origin", {"origin"}, fixed(k_place)},
      {"country", {}, fixed([](Split s, Rng& r) { return country(s, r); })},
      {"sponsor", {}, fixed(k_org)},
      {"builder", {}, fixed(k_org)},
      {"manufacturer", {"maker"}, fixed(k_org)},
      {"parent body", {"parent"}, fixed(k_org)},
      {"insurer", {}, fixed(k_org)},
      {"inauguration date", {"inaugurated"}, any_date(1900, 2025)},
      {"last inspection", {"inspected"}, any_date(1990, 2026)},
      {"discovery date", {"discovered"}, any_date(1700, 2025)},
      {"completion date", {"completed"}, any_date(1850, 2026)},
      {"renovation date", {"renovated"}, any_date(1950, 2026)},
      {"year built", {"built"}, any_year(1600, 2025)},
      {"year of discovery", {"discovery_year"}, any_year(1500, 2025)},
      {"restoration year", {"restored"}, any_year(1900, 2025)},
      {"capacity", {}, any_count(5, 90000)},
      {"annual visitors", {"visitors"}, any_count(100, 9000000)},
      {"staff size", {"staff"}, any_count(2, 12000)},
      {"member count", {"members"}, any_count(3, 500000)},
      {"number of units", {"units"}, any_count(1, 5000)},
      {"number of floors", {"floors"}, any_count(1, 120)},
      {"recorded sightings", {"sightings"}, any_count(1, 40000)},
      {"height", {}, any_measure(2, 900, "m")},
      {"length", {}, any_measure(1, 4000, "km")},
      {"depth", {}, any_measure(1, 3000, "m")},
      {"area", {}, any_measure(1, 90000, "hectares")},
      {"power output", {"output"}, any_measure(1, 4000, "MW")},
      {"mass", {}, any_measure(1, 500000, "tonnes")},
      {"volume", {}, any_measure(10, 900000, "litres")},
      {"range", {}, any_measure(5, 20000, "km")},
      {"top speed", {"speed"}, any_measure(5, 1200, "km/h")},
      {"elevation", {}, any_measure(0, 8800, "m")},
      {"diameter", {}, any_measure(1, 9000, "cm")},
      {"budget", {}, any_money(1000, 90000000)},
      {"ticket price", {"price"}, any_money(1, 400)},
      {"annual cost", {"cost"}, any_money(100, 9000000)},
      {"entry fee", {"fee"}, any_money(1, 120)},
      {"valuation", {}, fixed(k_millions)},
      {"annual turnover", {"turnover"}, fixed(k_millions)},
      {"contact number", {"phone"}, fixed(k_phone)},
      {"booking line", {"booking_phone"}, fixed(k_phone)},
      {"hotline", {}, fixed(k_phone)},
      {"reference code", {"reference"}, fixed(k_code)},
      {"serial number", {"serial"}, fixed(k_code)},
      {"inventory code", {}, fixed(k_code)},
      {"licence number", {"licence"}, fixed(k_code)},
      {"firmware version", {"firmware"}, fixed([](Split s, Rng& r) { return version(s, r); })},
      {"category", {},
       fixed(pick2({"northern", "coastal", "upland", "urban", "historic", "modern", "experimental", "seasonal",
                    "inland", "remote"},
                   {"heritage", "research", "community", "commercial", "private", "public", "protected",
                    "industrial", "touring", "training"}))},
      {"condition", {"state"},
       fixed(pick2({"fully", "partly", "recently", "formerly", "provisionally", "largely"},
                   {"restored", "active", "closed", "listed", "operational", "dormant", "rebuilt"}))},
  };
  return v;
}

// Kinds of entity (singular, plural): none of the held-out domains' kinds.
const std::vector<std::pair<std::string, std::string>>& kinds() {
  static const std::vector<std::pair<std::string, std::string>> v = {
      {"lighthouse", "lighthouses"}, {"observatory", "observatories"}, {"vineyard", "vineyards"},
      {"bridge", "bridges"}, {"festival", "festivals"}, {"brewery", "breweries"}, {"satellite", "satellites"},
      {"reservoir", "reservoirs"}, {"mine", "mines"}, {"museum", "museums"}, {"theatre", "theatres"},
      {"orchestra", "orchestras"}, {"expedition", "expeditions"}, {"racehorse", "racehorses"},
      {"locomotive", "locomotives"}, {"telescope", "telescopes"}, {"glacier", "glaciers"}, {"volcano", "volcanoes"},
      {"island", "islands"}, {"nature reserve", "nature reserves"}, {"castle", "castles"},
      {"monastery", "monasteries"}, {"canal", "canals"}, {"tunnel", "tunnels"}, {"dam", "dams"},
      {"stadium", "stadiums"}, {"choir", "choirs"}, {"podcast", "podcasts"}, {"magazine", "magazines"},
      {"farm", "farms"}, {"factory", "factories"}, {"laboratory", "laboratories"}, {"zoo", "zoos"},
      {"aquarium", "aquariums"}, {"botanical garden", "botanical gardens"}, {"wind farm", "wind farms"},
      {"power station", "power stations"}, {"radio station", "radio stations"}, {"comet", "comets"},
      {"river", "rivers"}, {"mountain", "mountains"}, {"cave", "caves"}, {"lake", "lakes"}, {"statue", "statues"},
      {"robot", "robots"}, {"ferry route", "ferry routes"}, {"board game", "board games"},
      {"typeface", "typefaces"}, {"violin", "violins"}, {"clock tower", "clock towers"},
      {"data centre", "data centres"}, {"railway station", "railway stations"}, {"art gallery", "art galleries"},
      {"ski resort", "ski resorts"}, {"marathon", "marathons"}, {"chess club", "chess clubs"},
      {"space probe", "space probes"}};
  return v;
}

std::string snake(const std::string& s) {
  std::string k;
  for (char c : s) k += (c == ' ' || c == '-') ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return k;
}

}  // namespace

const std::vector<T2jDomain>& t2j_domains(Split s) {
  static const std::vector<T2jDomain> train = [] {
    std::vector<T2jDomain> v = official();
    for (auto& d : train_extra()) v.push_back(std::move(d));
    return v;
  }();
  static const std::vector<T2jDomain> held = heldout();
  return s == Split::train ? train : held;
}

}  // namespace kvtier::bench

namespace kvtier::bench {

T2jDomain t2j_generated_domain(Rng& r) {
  T2jDomain d;
  d.id = k_t2j_generated;
  // One draw per statement: a call's arguments are evaluated in no fixed order.
  if (r.below(10) < 3) {  // a kind the model cannot know: it has to read the instructions
    d.singular = py_lower(made_up_word(Split::train, r, static_cast<int>(r.range(2, 3))));
    d.plural = d.singular + "s";
  } else {
    const auto& k = r.pick(kinds());
    d.singular = k.first;
    d.plural = k.second;
  }
  const Strings abouts = {d.plural, d.plural + " and their particulars", "a number of " + d.plural,
                          "various " + d.plural};
  d.about = r.pick(abouts);
  std::string kind_word;  // "Botanical Garden"
  for (const auto& w : py_split_ws(d.singular)) {
    if (!kind_word.empty()) kind_word += ' ';
    kind_word += static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
    kind_word += w.substr(1);
  }
  switch (r.below(5)) {
    case 0: d.name = [kind_word](Split s, Rng& q) { return place(s, q) + " " + kind_word; }; break;
    case 1: d.name = [kind_word](Split s, Rng& q) { return "The " + made_up_word(s, q, 2) + " " + kind_word; }; break;
    case 2:
      d.name = [](Split s, Rng& q) {
        std::string n = brand(s, q) + " ";
        return n + model_code(s, q);
      };
      break;
    case 3: d.name = k_person; break;
    default: d.name = k_org;
  }
  d.intros = {"{n} is one of the " + d.plural + " described here.", "Next comes {n}.",
              "The entry for {n} reads as follows.", "Among the " + d.plural + " in this collection is {n}.",
              "{n} also appears in the survey."};
  d.chatter = {"Little else is recorded about it.", "Opinions about it vary.",
               "The entry was last revised some years ago.", "A photograph accompanies the original entry.",
               "Local accounts differ on the finer details."};
  // Six attributes with distinct keys and descriptions; sometimes one made up.
  std::vector<size_t> order(attributes().size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  r.shuffle(order);
  std::set<std::string> keys, descriptions;
  if (r.below(10) < 3) {
    const Strings suffixes = {"index", "score", "grade", "rating", "level", "number"};
    std::string desc = py_lower(made_up_word(Split::train, r, 2)) + " ";
    desc += r.pick(suffixes);
    const bool code = desc.ends_with("number") || desc.ends_with("grade");
    Gen g = code ? k_code : count(1, r.range(20, 9999));
    keys.insert(snake(desc));
    descriptions.insert(desc);
    d.fields.push_back({snake(desc), desc, g, {}});
  }
  for (size_t i : order) {
    if (d.fields.size() == 6) break;
    const Attribute& a = attributes()[i];
    std::string key = snake(a.description);
    if (!a.aliases.empty() && r.below(3) == 0) key = r.pick(a.aliases);
    if (keys.count(key) || descriptions.count(a.description) || key == "name") continue;
    keys.insert(key);
    descriptions.insert(a.description);
    d.fields.push_back({key, a.description, a.make(r), {}});
  }
  return d;
}

}  // namespace kvtier::bench
