#include "bench/text2json_style.h"

#include <cctype>

#include "bench/bench_text.h"

namespace kvtier::bench {

namespace {

using Strings = std::vector<std::string>;

// Placeholders: {about} {one} {many} {f1} {f2} {keys} {example}.
struct Parts {
  Strings opening, request, format, copy, exclusion, order, ending, tail, label_open, label_close;
};

const Parts& parts(Split s) {
  static const Parts train{
      {"Below is a long text. Some passages in it describe {about}.\n",
       "Read the document that follows; parts of it are about {about}.\n",
       "The text below mixes unrelated prose with passages on {about}.\n",
       "You will be given a long document. Among other things it mentions {about}.\n",
       "Here is a document to process. It contains information on {about}, scattered among other material.\n"},
      {"Your task: find every {one} for which the text gives both its {f1} and its {f2}, and return them as a JSON "
       "list.",
       "Extract each {one} whose {f1} and {f2} are both stated in the text.",
       "Collect all {many} for which both the {f1} and the {f2} are mentioned.",
       "Identify every {one} in the document that has both a {f1} and a {f2} given."},
      {" Each element must be an object with exactly three string fields: {keys}.",
       " Answer with a JSON array; each item is an object whose keys are {keys}, all values strings.",
       " Output format: a JSON list of objects, one per {one}, with the string fields {keys}.",
       " Write the result as JSON: a list in which every entry has the keys {keys} (strings)."},
      {" Copy names and values exactly as they are written in the text.",
       " Use the exact spelling of the text for names and values.",
       " Values must be copied verbatim from the document."},
      {" Leave out {many} whose {f1} and {f2} are not given, and values that are not attributed to a named {one}.",
       " Skip {many} that lack either field, and ignore values not tied to a named {one}.",
       " Do not include a {one} unless both fields are stated for it."},
      {" List the {many} in the order in which they appear.", " Keep the order of first appearance in the text.",
       " Order the entries as they occur in the document."},
      {" Output only the JSON list.", " Reply with the JSON and nothing else.", " Do not add any explanation."},
      {"\n\nNow return the JSON list of {many} with the fields {keys}.", "\n\nReturn the JSON now.",
       "\n\nRemember: a JSON list of objects with {keys}, one per {one} that has both fields.", ""},
      {"\n\nText:\n", "\n\nDocument:\n", "\n\n---\n", "\n\n<document>\n"},
      {"", "", "\n---", "\n</document>"}};
  static const Parts heldout{
      {"What follows is an excerpt from a larger collection; it includes remarks on {about}.\n",
       "Consider the material below, in which {about} come up now and then.\n",
       "Attached is a lengthy file. Some of its entries concern {about}.\n"},
      {"Please pull out all {many} for which the {f1} as well as the {f2} can be found.",
       "Your job is to locate each {one} that comes with both a {f1} and a {f2}."},
      {" Give the answer as a list in JSON notation, where each object carries the string-valued keys {keys} and no "
       "others.",
       " Respond with JSON only, shaped like [{example}, ...].",
       " The expected output is an array of JSON objects ({keys}), values as strings."},
      {" Reproduce every name and value character for character.",
       " Do not paraphrase or normalize anything you copy."},
      {" A {one} missing one of the two fields must not appear.",
       " Values that float free of any named {one} do not count."},
      {" Preserve document order.", " Sequence the objects by where they are first mentioned."},
      {" Nothing but the JSON, please.", " Produce no commentary."},
      {"\n\nYour JSON answer:", "\n\nNow write the array."},
      {"\n\nMaterial:\n", "\n\n=== FILE START ===\n"},
      {"", "\n=== FILE END ==="}};
  return s == Split::train ? train : heldout;
}

std::string fill(std::string t, const T2jDomain& d, const T2jField& f1, const T2jField& f2) {
  const std::string keys = "\"name\", \"" + f1.key + "\" and \"" + f2.key + "\"";
  const std::string example = "{\"name\": \"...\", \"" + f1.key + "\": \"...\", \"" + f2.key + "\": \"...\"}";
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"{about}", d.about}, {"{one}", d.singular}, {"{many}", d.plural}, {"{f1}", f1.description},
           {"{f2}", f2.description}, {"{keys}", keys}, {"{example}", example}})
    t = replace_all(t, k, v);
  return t;
}

std::string capitalized(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

// A template filled in, its first letter capitalized unless a value starts
// it (values are copied into answers verbatim).
std::string put(const std::string& tmpl, const std::string& name, const std::string& desc, const std::string& value) {
  const std::string s = replace_all(replace_all(replace_all(tmpl, "{n}", name), "{d}", desc), "{v}", value);
  return tmpl.rfind("{v}", 0) == 0 ? s : capitalized(s);
}

// Sentences naming a field by its description: {n} entity, {d} description, {v} value.
const Strings& generic_sentences(Split s) {
  static const Strings train = {"The {d} of {n} is {v}.", "{n} has a {d} of {v}.", "For {n}, the {d} is {v}.",
                                "Records list {v} as the {d} of {n}.", "{n} lists its {d} as {v}."};
  static const Strings heldout = {"{v} — that is the {d} on file for {n}.", "As for {n}, its {d} stands at {v}.",
                                  "One finds {v} given as the {d} of {n}.", "{n} (with {d} {v}) is noted as well."};
  return s == Split::train ? train : heldout;
}

}  // namespace

T2jInstruction t2j_instruction(Split s, const T2jDomain& d, const T2jField& f1, const T2jField& f2, Rng& r) {
  const Parts& p = parts(s);
  // The train split's first sample of every ten keeps the original wording throughout.
  const bool original = s == Split::train && r.below(10) == 0;
  auto pick = [&](const Strings& v) -> const std::string& { return original ? v[0] : r.pick(v); };
  std::string opening = pick(p.opening), request = pick(p.request), format = pick(p.format), copy = pick(p.copy),
              exclusion = pick(p.exclusion), order = pick(p.order), ending = pick(p.ending), tail = pick(p.tail);
  const size_t label = original ? 0 : r.below(p.label_open.size());
  // Rules in varying order (request first, ending last).
  Strings rules = {format, copy, exclusion, order};
  if (!original) r.shuffle(rules);
  const std::string body = request + join(rules, "") + ending;
  T2jInstruction ins;
  // Where the instructions stand: before the document (with a closing
  // reminder), or after it with only the opening before.
  if (original || r.below(3) != 0) {
    ins.head = fill(opening + body + p.label_open[label], d, f1, f2);
    ins.tail = fill(p.label_close[label] + tail, d, f1, f2);
  } else {
    ins.head = fill(opening + p.label_open[label], d, f1, f2);
    ins.tail = fill(p.label_close[label] + "\n\n" + body, d, f1, f2);
  }
  return ins;
}

int t2j_n_styles(Split) { return 4; }

std::string t2j_passage(Split s, int style, const T2jDomain& d, const std::string& name, const FieldValues& fields,
                        Rng& r) {
  const bool train = s == Split::train;
  Strings lines;
  switch (style) {
    case 0: {  // prose: an introduction, the field sentences and some chatter
      for (const auto& [f, v] : fields) {
        const bool own = train && !f->sentences.empty() && r.below(2);
        lines.push_back(own ? put(r.pick(f->sentences), name, f->description, v)
                            : put(r.pick(generic_sentences(s)), name, f->description, v));
      }
      // One draw per statement: a call's arguments are evaluated in no fixed order.
      const auto at = static_cast<std::ptrdiff_t>(r.below(lines.size() + 1));
      lines.insert(lines.begin() + at, r.pick(d.chatter));
      return put(r.pick(d.intros), name, "", "") + " " + join(lines, " ");
    }
    case 1:  // train: a bulleted entry; held out: a card with key = value lines
      for (const auto& [f, v] : fields)
        lines.push_back(train ? "- " + capitalized(f->description) + ": " + v : f->description + " = " + v);
      return (train ? name + "\n" : "[" + name + "]\n") + join(lines, "\n");
    case 2:  // train: a one-line record; held out: a table row
      for (const auto& [f, v] : fields) lines.push_back(f->description + ": " + v);
      return train ? name + " — " + join(lines, "; ") + "." : "| " + name + " | " + join(lines, " | ") + " |";
    default:  // train: an interview; held out: a letter
      if (train) {
        for (const auto& [f, v] : fields)
          lines.push_back("Q: What is the " + f->description + " of " + name + "?\nA: " + v + ".");
        return "From our interview notes about " + name + ":\n" + join(lines, "\n");
      }
      for (const auto& [f, v] : fields) lines.push_back("its " + f->description + " is " + v);
      return "Dear editor, a short note regarding " + name + ": " + join(lines, ", and ") + ". " + r.pick(d.chatter) +
             " With regards, a reader.";
  }
}

T2jFormat t2j_random_format(Rng& r) {
  static const Strings names = {"{n}", "{n}:", "## {n}", "** {n} **", "<{n}>", "Entry - {n}", "({n})", "{n} /",
                                ">> {n}", "{n} ::"};
  static const Strings separators = {": ", " - ", " -> ", " => ", " := ", "\t", " ... ", ": ", " is "};
  static const Strings joiners = {"\n", "; ", ", ", " / ", " ~ ", "\n  ", "\n* ", "\n- ", " + "};
  T2jFormat f;
  f.name = r.pick(names);
  f.description_case = static_cast<int>(r.below(3));
  f.separator = r.pick(separators);
  f.joiner = r.pick(joiners);
  return f;
}

std::string t2j_record(const T2jFormat& f, const std::string& name, const FieldValues& fields) {
  Strings lines;
  for (const auto& [field, v] : fields) {
    std::string d = field->description;
    if (f.description_case == 1) d = capitalized(d);
    if (f.description_case == 2)
      for (char& c : d) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    lines.push_back(d + f.separator + v);
  }
  // The joiner follows the name too, unless the name is marked and the fields stay on its line.
  const bool after_name = f.joiner.find('\n') != std::string::npos || f.name == "{n}";
  return replace_all(f.name, "{n}", name) + (after_name ? f.joiner : " ") + join(lines, f.joiner);
}

std::string t2j_unattributed(Split s, const T2jDomain& d, const T2jField& f, const std::string& value, Rng& r) {
  static const Strings train = {"An unnamed {one} was listed with a {d} of {v}, though no name was given.",
                                "A {d} of {v} was mentioned by one reader without saying which {one} it belonged to.",
                                "Some sources quote {v} as a typical {d}."};
  static const Strings heldout = {"Somewhere a {d} of {v} was reported, source unknown.",
                                  "{v} was floated as a {d}, but for which {one} nobody said."};
  return put(replace_all(r.pick(s == Split::train ? train : heldout), "{one}", d.singular), "", f.description, value);
}

}  // namespace kvtier::bench
