#include "bench/value_gen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "bench/bench_text.h"
#include "core/status.h"

namespace kvtier::bench {

using Strings = std::vector<std::string>;

Split parse_split(const std::string& s) {
  if (s == "train") return Split::train;
  if (s == "heldout") return Split::heldout;
  fail("split '{}': expected 'train' or 'heldout'", s);
}

const char* split_name(Split s) { return s == Split::train ? "train" : "heldout"; }

namespace {

// Syllable inventories: onset + nucleus + optional coda. The held-out one
// shares no onset with the train one, so its names look different.
struct Inventory {
  Strings onsets, nuclei, codas;
  Strings first_endings, last_endings, place_suffixes, place_prefixes, country_endings;
};

const Inventory& inventory(Split s) {
  static const Inventory train{
      {"b", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "tr",
       "st", "sh", "ch", "m", "l"},
      {"a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ia", "ou"},
      {"", "", "", "n", "r", "l", "s", "m"},
      {"a", "o", "en", "el", "ia", "ir", "an", "ine"},
      {"son", "ov", "ez", "ini", "berg", "ley", "ard", "ova", "enko", "ado"},
      {"ton", "ville", "burg", "field", "haven", "port", " Falls", " Springs", "more", "dale"},
      {"Port ", "New ", "North ", "Upper "},
      {"ia", "land", "ora", "istan", "avia"}};
  static const Inventory heldout{
      {"c", "w", "y", "q", "th", "ph", "kl", "sv", "zh", "fl", "pl", "gw", "x", "sk"},
      {"ae", "y", "oo", "ea", "io", "au", "u", "i"},
      {"", "", "k", "th", "nd", "rd", "ck", "v"},
      {"ys", "wen", "ild", "oth", "ique", "ux"},
      {"wick", "oglu", "ski", "aux", "quist", "worth", "ides", "escu"},
      {"stad", "abad", "mouth", "ikon", "grad", "holm", "wyn", " Crossing"},
      {"San ", "Lake ", "Fort ", "Old "},
      {"ique", "onia", "ustan", "ycia"}};
  return s == Split::train ? train : heldout;
}

std::string capitalize(std::string w) {
  if (!w.empty()) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
  return w;
}

// Draws happen one statement at a time throughout this file: the order in
// which the operands of + (or a call's arguments) are evaluated is
// unspecified, and the samples must not depend on the compiler.
std::string syllables(Split s, Rng& r, int n) {
  const Inventory& inv = inventory(s);
  std::string w;
  for (int i = 0; i < n; ++i) {
    w += r.pick(inv.onsets);
    w += r.pick(inv.nuclei);
    if (i + 1 == n) w += r.pick(inv.codas);
  }
  return w;
}

const Strings k_months = {"January", "February", "March",     "April",   "May",      "June",
                          "July",    "August",   "September", "October", "November", "December"};


char upper_letter(Rng& r) { return static_cast<char>('A' + r.below(26)); }
char lower_letter(Rng& r) { return static_cast<char>('a' + r.below(26)); }
std::string digits(Rng& r, int n) {
  std::string d;
  for (int i = 0; i < n; ++i) d += static_cast<char>('0' + r.below(10));
  return d;
}

}  // namespace

std::string made_up_word(Split s, Rng& r, int n_syllables) { return capitalize(syllables(s, r, n_syllables)); }

std::string first_name(Split s, Rng& r) {
  std::string w = syllables(s, r, static_cast<int>(r.range(1, 2)));
  return capitalize(w + r.pick(inventory(s).first_endings));
}

std::string last_name(Split s, Rng& r) {
  std::string w = syllables(s, r, static_cast<int>(r.range(1, 2)));
  return capitalize(w + r.pick(inventory(s).last_endings));
}

std::string person(Split s, Rng& r) {
  std::string first = first_name(s, r);
  return first + " " + last_name(s, r);
}

std::string place(Split s, Rng& r) {
  const Inventory& inv = inventory(s);
  std::string root = made_up_word(s, r, static_cast<int>(r.range(1, 2)));
  if (r.below(4) == 0) return r.pick(inv.place_prefixes) + root;
  return root + r.pick(inv.place_suffixes);
}

std::string country(Split s, Rng& r) {
  std::string w = made_up_word(s, r, static_cast<int>(r.range(1, 2)));
  return w + r.pick(inventory(s).country_endings);
}

std::string organisation(Split s, Rng& r) {
  static const Strings train_sector = {"Analytics", "Logistics", "Foods",   "Robotics", "Energy",  "Media",
                                       "Textiles",  "Software",  "Capital", "Biotech",  "Systems", "Labs"};
  static const Strings heldout_sector = {"Dynamics", "Holdings", "Instruments", "Mining",
                                         "Shipping", "Networks", "Materials",   "Ventures"};
  static const Strings train_form = {"", "", " Group", " Inc.", " Ltd."};
  static const Strings heldout_form = {"", " AG", " & Co.", " Partners", " S.A."};
  const bool t = s == Split::train;
  std::string name = made_up_word(s, r, static_cast<int>(r.range(2, 3)));
  name += " " + r.pick(t ? train_sector : heldout_sector);
  return name + r.pick(t ? train_form : heldout_form);
}

std::string brand(Split s, Rng& r) { return made_up_word(s, r, static_cast<int>(r.range(2, 3))); }

std::string model_code(Split s, Rng& r) {
  std::string code{upper_letter(r)};  // a braced list is evaluated in order
  if (s == Split::train) {
    code += upper_letter(r);
    return code + "-" + digits(r, 3);
  }
  code += digits(r, 4);
  return code + lower_letter(r);
}

std::string record_code(Split s, Rng& r) {
  if (s == Split::train) {
    std::string code{upper_letter(r), upper_letter(r)};
    return code + "-" + digits(r, 5);
  }
  std::string code = digits(r, 3) + "/";
  code += std::string{upper_letter(r), upper_letter(r)};
  return code + digits(r, 1);
}

std::string phone(Split s, Rng& r) {
  if (s == Split::train) {
    const int64_t area = r.range(201, 989), exchange = r.range(200, 989);
    return fmt::format("({}) {}-{}", area, exchange, digits(r, 4));
  }
  const int64_t country_code = r.range(30, 98);
  const std::string a = digits(r, 2), b = digits(r, 4), c = digits(r, 4);
  return fmt::format("+{} {} {} {}", country_code, a, b, c);
}

std::string date(Split s, Rng& r, int year_lo, int year_hi) {
  const int64_t y = r.range(year_lo, year_hi), m = r.range(1, 12), d = r.range(1, 28);
  const std::string& month = k_months[static_cast<size_t>(m - 1)];
  const bool first_form = r.below(2) == 1;
  if (s == Split::train)
    return first_form ? fmt::format("{} {}, {}", month, d, y) : fmt::format("{}-{:02d}-{:02d}", y, m, d);
  return first_form ? fmt::format("{} {} {}", d, month, y) : fmt::format("{:02d}.{:02d}.{}", d, m, y);
}

std::string version(Split s, Rng& r) {
  if (s == Split::train) {
    const int64_t major = r.range(0, 12), minor = r.range(0, 30), patch = r.range(0, 20);
    return fmt::format("{}.{}.{}", major, minor, patch);
  }
  const int64_t major = r.range(1, 19), minor = r.range(0, 9), rev = r.range(1, 9);
  return fmt::format("v{}.{}-r{}", major, minor, rev);
}

std::string group_digits(int64_t v, const std::string& sep) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), sep);
  return s;
}

std::string grouped(Split s, Rng& r, int64_t lo, int64_t hi) {
  const int64_t v = r.range(lo, hi);
  if (s == Split::train) return group_digits(v, ",");
  return r.below(2) ? group_digits(v, " ") : std::to_string(v);
}

std::string money(Split s, Rng& r, int64_t lo, int64_t hi) {
  const int64_t v = r.range(lo, hi);
  if (s == Split::train) {
    static const Strings cents = {".99", ".49", ".00", ".95"};
    return fmt::format("${}{}", group_digits(v, ","), r.pick(cents));
  }
  switch (r.below(3)) {
    case 0: return fmt::format("€{}", group_digits(v, " "));
    case 1: return fmt::format("USD {}.{:02d}", v, r.range(0, 99));
    default: return fmt::format("£{}", group_digits(v, ","));
  }
}

std::string millions(Split s, Rng& r) {
  const int64_t whole = r.range(2, 980), tenth = r.range(0, 9);
  if (s == Split::train) return fmt::format("${}.{} million", whole, tenth);
  return r.below(2) ? fmt::format("£{}.{}m", whole, tenth) : fmt::format("€{}.{} million", whole, tenth);
}

std::string decimal_with_unit(Rng& r, int lo, int hi, const std::string& unit) {
  const int64_t whole = r.range(lo, hi), tenth = r.range(0, 9);
  return fmt::format("{}.{} {}", whole, tenth, unit);
}

std::string combine(Rng& r, const Strings& first, const Strings& second) {
  std::string a = r.pick(first);
  return a + " " + r.pick(second);
}

std::string near_variant(const std::string& name, Rng& r) {
  // Change one lower-case vowel of the name into another; names of the
  // generators above always have one.
  static const std::string vowels = "aeiou";
  std::vector<size_t> at;
  for (size_t i = 0; i < name.size(); ++i)
    if (vowels.find(name[i]) != std::string::npos) at.push_back(i);
  if (at.empty()) return name + " II";
  std::string s = name;
  const size_t i = at[r.below(at.size())];
  const size_t v = vowels.find(s[i]);
  s[i] = vowels[(v + 1 + r.below(vowels.size() - 1)) % vowels.size()];
  return s;
}

}  // namespace kvtier::bench
