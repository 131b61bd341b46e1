// The domains of the Text2JSON-style generator: entities of one kind, each
// described by six fields whose values come from the open-ended generators
// of value_gen.h. The train split holds the four official Text2JSON domains
// (product specifications, medical professionals, organizations, movies)
// first, then six more for training; the held-out split has five domains of
// its own, never trained on.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "bench/compose.h"
#include "bench/value_gen.h"

namespace kvtier::bench {

struct T2jField {
  std::string key;          // JSON key in the answer
  std::string description;  // how the text and the instructions name it
  std::function<std::string(Split, Rng&)> value;
  // Domain-specific sentences ("{n}": the entity, "{v}": the value), used
  // with the train split's prose; the held-out split writes its own.
  std::vector<std::string> sentences;
};

struct T2jDomain {
  std::string id;
  std::string singular, plural, about;  // "movie", "movies", "films and their makers"
  std::function<std::string(Split, Rng&)> name;
  std::vector<std::string> intros;   // "{n}"
  std::vector<std::string> chatter;  // sentences with no value
  std::vector<T2jField> fields;      // six
};

// Every domain of a split, official ones first in the train split.
const std::vector<T2jDomain>& t2j_domains(Split s);
inline constexpr size_t k_t2j_official_domains = 4;

// A domain made up for one sample (train split): an entity kind from a list
// or a made-up word, a name shape, and six fields drawn from a pool of
// attributes whose JSON key is the description in snake case or a short
// alias, one of them sometimes a made-up attribute. A model trained on these
// has to take the kind, the fields and the keys from the instructions rather
// than from a memorized domain. It never uses a held-out domain's kind or
// one of their (key, description) pairs.
inline constexpr const char* k_t2j_generated = "generated";
T2jDomain t2j_generated_domain(Rng& r);

}  // namespace kvtier::bench
