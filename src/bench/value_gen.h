// Open-ended value generators for the synthetic tasks: random but plausible
// person, place, organisation and brand names built from syllables, numbers,
// dates, money, codes and phone numbers. A model cannot guess such values from
// a memorized pool; it has to copy them from the document. Each generator has
// a train and a held-out variant (other syllables, suffixes and formats), so
// that evaluation can use value shapes that training never showed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/compose.h"

namespace kvtier::bench {

enum class Split { train, heldout };

// "train" or "heldout"; anything else is an error naming the valid values.
Split parse_split(const std::string& s);
const char* split_name(Split s);

// A capitalized word of n_syllables syllables of the split's inventory.
std::string made_up_word(Split s, Rng& r, int n_syllables);

std::string first_name(Split s, Rng& r);
std::string last_name(Split s, Rng& r);
std::string person(Split s, Rng& r);          // "First Last"
std::string place(Split s, Rng& r);           // a town: "Dravenford", "Port Elsamir"
std::string country(Split s, Rng& r);         // "Veltoria"
std::string organisation(Split s, Rng& r);    // "Morvani Logistics Group"
std::string brand(Split s, Rng& r);           // "Quorrel"
std::string model_code(Split s, Rng& r);      // "KT-482" / "Q4410s"
std::string record_code(Split s, Rng& r);     // "RX-20417" / "204/QV7"
std::string phone(Split s, Rng& r);           // "(381) 555-0192" / "+44 20 7946 0123"
std::string date(Split s, Rng& r, int year_lo, int year_hi);  // "March 4, 2011" / "4 March 2011"
std::string version(Split s, Rng& r);         // "4.12.3" / "v7.0-r2"

// An integer in [lo, hi], thousands grouped as the split writes them
// (train "12,345"; held out "12 345" or plain).
std::string grouped(Split s, Rng& r, int64_t lo, int64_t hi);
std::string group_digits(int64_t v, const std::string& sep);
std::string money(Split s, Rng& r, int64_t lo, int64_t hi);  // "$1,249.99" / "€1 249" / "USD 1249.50"
std::string millions(Split s, Rng& r);                       // "$12.3 million" / "£4.7m"
// A decimal with one digit after the point, in [lo, hi], then the unit.
std::string decimal_with_unit(Rng& r, int lo, int hi, const std::string& unit);

// Two words drawn from two lists (e.g. "pediatric" "cardiology"): categorical
// values with too many combinations to guess.
std::string combine(Rng& r, const std::vector<std::string>& first, const std::vector<std::string>& second);

// A variant of a made-up name that differs in one syllable or letter: a
// near-duplicate distractor. Falls back to appending " II".
std::string near_variant(const std::string& name, Rng& r);

}  // namespace kvtier::bench
