// Wording of Text2JSON-style samples, varied so that a model learns the task
// rather than one template: the instructions are assembled from
// interchangeable parts (opening, request, answer format, rules, closing,
// where they stand relative to the document), and entity passages are
// written in several document styles. The held-out split has parts and
// styles of its own that training never sees; the answer format itself (a
// JSON list of objects with "name" and the two asked keys) never changes.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "bench/text2json_domains.h"

namespace kvtier::bench {

struct T2jInstruction {
  std::string head;  // before the document (ends with the document's opening label)
  std::string tail;  // after it
};

// Instructions asking for the entities of `d` with fields f1 and f2. With
// the train split, variant 0 of every part is the generator's original wording.
T2jInstruction t2j_instruction(Split s, const T2jDomain& d, const T2jField& f1, const T2jField& f2, Rng& r);

using FieldValues = std::vector<std::pair<const T2jField*, std::string>>;

// Number of passage styles of a split; style in [0, that).
int t2j_n_styles(Split s);

// A passage about one entity giving the listed fields, in a style.
std::string t2j_passage(Split s, int style, const T2jDomain& d, const std::string& name, const FieldValues& fields,
                        Rng& r);

// A record layout made up for one document (train split, with generated
// domains): how the name is marked, how each field's description is written
// and separated from its value, and how fields are joined. None of the
// held-out split's layouts (cards "[name]" with "key = value" lines, table
// rows "| name | ... |", letters).
struct T2jFormat {
  std::string name;       // "{n}" is the entity's name: "## {n}", "<{n}>"
  int description_case;   // 0 as written, 1 capitalized, 2 upper case
  std::string separator;  // between a description and its value: ": ", " -> "
  std::string joiner;     // between fields (and after the name): "\n", "; "
};
T2jFormat t2j_random_format(Rng& r);

// A passage about one entity in a made-up layout.
std::string t2j_record(const T2jFormat& f, const std::string& name, const FieldValues& fields);

// A sentence giving a value of field f's kind to no named entity.
std::string t2j_unattributed(Split s, const T2jDomain& d, const T2jField& f, const std::string& value, Rng& r);

}  // namespace kvtier::bench
