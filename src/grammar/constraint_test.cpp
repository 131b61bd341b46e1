// The token constraint against SmolLM2's real 49K vocabulary: the automaton
// on many valid, invalid and fuzzed strings (fed byte by byte and as the
// tokenizer splits them), compared with an independent oracle (nlohmann's
// parser, validate_json); random walks through the masks whose every
// finished output must parse and validate.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const std::string k_golden = std::string(KVT_SOURCE_DIR) + "/tests/golden/";

const Tokenizer& smollm2() {
  static const auto tok =
      Tokenizer::from_hf(k_golden + "tokenizer_smollm2.json", k_golden + "tokenizer_config_smollm2.json");
  return *tok;
}

GrammarVocab& vocab() {
  static const auto v = GrammarVocab::build(smollm2(), smollm2().n_vocab(), {});
  return *v;
}

// The single-byte token of every byte (byte-level BPE has all 256).
const std::vector<int32_t>& byte_tokens() {
  static const std::vector<int32_t> ids = [] {
    std::vector<int32_t> out(256, -1);
    const Tokenizer& tok = smollm2();
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
      const std::string p = tok.token_to_piece(id);
      if (p.size() == 1 && !tok.is_special(id) && out[uint8_t(p[0])] < 0) out[uint8_t(p[0])] = id;
    }
    return out;
  }();
  return ids;
}

enum class Verdict { rejected, prefix, complete };

// Feeds `ids` to a fresh constraint. With check_masks, at every step the mask
// must agree with accept(): an allowed token is accepted, a forbidden one
// throws; and end of generation is allowed exactly when complete().
Verdict feed(const ConstraintFactory& f, const std::vector<int32_t>& ids, bool check_masks) {
  auto c = f.make();
  std::vector<uint8_t> mask;
  for (int32_t id : ids) {
    if (check_masks) {
      c->allowed(mask);
      if (!mask[size_t(id)]) {
        EXPECT_THROW(c->accept(id), GrammarError) << "token " << id << " masked out but accepted";
        return Verdict::rejected;
      }
      c->accept(id);  // throws (failing the test) if the mask allowed a token accept refuses
    } else {
      try {
        c->accept(id);
      } catch (const GrammarError&) {
        return Verdict::rejected;
      }
    }
  }
  c->allowed(mask);
  for (int32_t end : vocab().end_tokens()) EXPECT_EQ(bool(mask[size_t(end)]), c->complete());
  return c->complete() ? Verdict::complete : Verdict::prefix;
}

Verdict by_bytes(const ConstraintFactory& f, const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char b : s) ids.push_back(byte_tokens()[b]);
  return feed(f, ids, false);
}

Verdict by_tokens(const ConstraintFactory& f, const std::string& s) {
  return feed(f, smollm2().encode(s, false, false), true);
}

// The longest run of JSON whitespace in s.
size_t longest_blank_run(const std::string& s) {
  size_t best = 0, run = 0;
  for (char c : s) {
    run = (c == ' ' || c == '\n' || c == '\t' || c == '\r') ? run + 1 : 0;
    best = std::max(best, run);
  }
  return best;
}

bool is_blank(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Oracle of json_object mode: a JSON text whose value is an object, with
// blank runs of at most 20 characters (the grammar's bound) and none before
// or after the value (the output is the value itself).
bool oracle_object(const std::string& s) {
  if (!json::accept(s)) return false;
  if (!json::parse(s).is_object()) return false;
  if (is_blank(s.front()) || is_blank(s.back())) return false;
  return longest_blank_run(s) <= 20;
}

TEST(JsonObjectConstraint, HandWrittenCases) {
  auto f = vocab().json_object();
  const std::pair<const char*, Verdict> cases[] = {
      {R"({})", Verdict::complete},
      {R"({"a": 1})", Verdict::complete},
      {"{\n  \"a\": [1, 2.5e-3, -0, true, false, null, \"x\\n\\u00e9\"],\n  \"b\": {\"c\": {}}\n}", Verdict::complete},
      {R"({"a":1,"b":[{},[]]})", Verdict::complete},
      {R"({"é😀": "ü"})", Verdict::complete},
      {R"({"a": 1)", Verdict::prefix},
      {R"({"a)", Verdict::prefix},
      {R"({)", Verdict::prefix},
      {"", Verdict::prefix},
      {R"([1])", Verdict::rejected},
      {R"("a")", Verdict::rejected},
      {R"(1)", Verdict::rejected},
      {R"({"a": 01})", Verdict::rejected},
      {R"({"a": 1.})", Verdict::rejected},
      {R"({"a": .5})", Verdict::rejected},
      {R"({"a": +1})", Verdict::rejected},
      {R"({"a": tru)", Verdict::prefix},
      {R"({"a": tru})", Verdict::rejected},
      {R"({"a": True})", Verdict::rejected},
      {R"({'a': 1})", Verdict::rejected},
      {R"({"a": 1,})", Verdict::rejected},
      {R"({"a" 1})", Verdict::rejected},
      {R"({a: 1})", Verdict::rejected},
      {"{\"a\": \"x\ty\"}", Verdict::rejected},  // a raw control character inside a string
      {R"({"a": "\x"})", Verdict::rejected},
      {R"({} {})", Verdict::rejected},
      {R"({}})", Verdict::rejected},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_EQ(int(by_bytes(*f, text)), int(expected)) << "bytes: " << text;
    EXPECT_EQ(int(by_tokens(*f, text)), int(expected)) << "tokens: " << text;
  }
}

// Random JSON values, written with random blanks.
struct JsonFuzzer {
  std::mt19937_64 rng;
  explicit JsonFuzzer(uint64_t seed) : rng(seed) {}
  int pick(int n) { return int(rng() % uint64_t(n)); }
  std::string blank() {
    static const char* const blanks[] = {"", "", "", " ", "\n", "  ", "\n  ", "\t"};
    return blanks[pick(8)];
  }
  std::string string_lit() {
    static const char* const parts[] = {"a", "key", " ", "é", "\\n", "\\\"", "\\\\", "\\u0041", "😀", "1", "{", "]"};
    std::string s = "\"";
    for (int i = pick(4); i > 0; --i) s += parts[pick(12)];
    return s + "\"";
  }
  std::string number() {
    static const char* const nums[] = {"0", "-1", "42", "3.25", "-0.5", "1e3", "2E-2", "12345678901234567890", "6.0"};
    return nums[pick(9)];
  }
  std::string value(int depth) {
    const int kind = depth > 3 ? pick(4) : pick(6);
    switch (kind) {
      case 0: return string_lit();
      case 1: return number();
      case 2: return pick(3) == 0 ? "null" : pick(2) ? "true" : "false";
      case 3: return string_lit();
      case 4: {
        std::string s = "[" + blank();
        for (int i = 0, n = pick(4); i < n; ++i) s += (i ? "," + blank() : "") + value(depth + 1) + blank();
        return s + "]";
      }
      default: return object(depth + 1);
    }
  }
  std::string object(int depth) {
    std::string s = "{" + blank();
    for (int i = 0, n = pick(4); i < n; ++i)
      s += (i ? "," + blank() : "") + string_lit() + blank() + ":" + blank() + value(depth + 1) + blank();
    return s + "}";
  }
  // 1-3 random edits from JSON's alphabet.
  std::string mutate(std::string s) {
    static const std::string alphabet = "{}[]\":,0123456789.eE+-truefalsn \n\\ax";
    for (int i = pick(3) + 1; i > 0; --i) {
      const size_t at = s.empty() ? 0 : size_t(pick(int(s.size())));
      const char c = alphabet[size_t(pick(int(alphabet.size())))];
      switch (pick(3)) {
        case 0: s.insert(at, 1, c); break;
        case 1: if (!s.empty()) s.erase(at, 1); break;
        default: if (!s.empty()) s[at] = c; break;
      }
    }
    return s;
  }
};

// Invalid UTF-8 never comes out of the mutations (ASCII only), and lone
// surrogate escapes, which nlohmann rejects and JSON's grammar allows, never
// appear; on everything else the automaton and the parser must agree.
TEST(JsonObjectConstraint, AgreesWithAParserOnFuzzedStrings) {
  auto f = vocab().json_object();
  JsonFuzzer fz(7);
  int n_valid = 0, n_invalid = 0;
  for (int i = 0; i < 500; ++i) {
    std::string s = fz.object(0);
    if (i % 2) s = fz.mutate(s);
    const bool expected = oracle_object(s);
    (expected ? n_valid : n_invalid) += 1;
    EXPECT_EQ(by_bytes(*f, s) == Verdict::complete, expected) << "bytes: " << s;
    if (i % 4 == 0) EXPECT_EQ(by_tokens(*f, s) == Verdict::complete, expected) << "tokens: " << s;
  }
  // Both sides of the comparison are exercised.
  EXPECT_GT(n_valid, 200);
  EXPECT_GT(n_invalid, 100);
}

// Values of `schema` in canonical form (properties in schema order, some
// optional ones left out): the automaton must accept each one.
struct SchemaInstances {
  std::mt19937_64 rng;
  const ojson& root;
  SchemaInstances(uint64_t seed, const ojson& r) : rng(seed), root(r) {}
  int pick(int n) { return int(rng() % uint64_t(n)); }

  ojson make(const ojson& s, int depth) {
    if (s.contains("$ref")) {
      const std::string ref = s.at("$ref");
      return make(ref == "#" ? root : root.at(ojson::json_pointer(ref.substr(1))), depth + 1);
    }
    if (s.contains("const")) return s.at("const");
    if (s.contains("enum")) return s.at("enum")[size_t(pick(int(s.at("enum").size())))];
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) return make(s.at(k)[size_t(pick(int(s.at(k).size())))], depth + 1);
    std::string type = "object";
    if (s.contains("type"))
      type = s.at("type").is_array() ? s.at("type")[size_t(pick(int(s.at("type").size())))].get<std::string>()
                                     : s.at("type").get<std::string>();
    if (type == "null") return nullptr;
    if (type == "boolean") return pick(2) == 1;
    if (type == "integer") {
      const int64_t lo = s.value("minimum", int64_t(-50)), hi = s.value("maximum", int64_t(1000));
      return lo + int64_t(rng() % uint64_t(hi - lo + 1));
    }
    if (type == "number") {  // multiples of 1/8 inside the bounds
      const double lo = s.contains("minimum") ? s.at("minimum").get<double>()
                        : s.contains("exclusiveMinimum") ? s.at("exclusiveMinimum").get<double>() + 0.125 : -125.0;
      const double hi = s.contains("maximum") ? s.at("maximum").get<double>()
                        : s.contains("exclusiveMaximum") ? s.at("exclusiveMaximum").get<double>() - 0.125 : 125.0;
      return std::ceil(lo * 8) / 8 + double(pick(int((hi - lo) * 8) + 1)) / 8.0;
    }
    if (type == "string") {
      // With a length bound the engine writes printable ASCII without escapes
      // (xgrammar_vocab.cpp); without one, anything.
      const bool bounded = s.contains("minLength") || s.contains("maxLength");
      const size_t lo = s.value("minLength", size_t(0)), hi = s.value("maxLength", lo + 6);
      static const char* const any[] = {"a", "b", " ", "é", "\"", "\\", "😀", "\n"};
      static const char* const ascii[] = {"a", "Z", " ", "~", "#", "[", "]", "!"};
      std::string out;
      for (size_t i = 0, n = lo + size_t(pick(int(hi - lo + 1))); i < n; ++i) out += bounded ? ascii[pick(8)] : any[pick(8)];
      return out;
    }
    if (type == "array") {
      const int lo = s.value("minItems", 0), hi = s.value("maxItems", lo + 3);
      ojson out = ojson::array();
      if (depth > 6) return out;
      for (int i = 0, n = lo + pick(hi - lo + 1); i < n; ++i) out.push_back(make(s.value("items", ojson::object()), depth + 1));
      return out;
    }
    ojson out = ojson::object();
    const ojson req = s.value("required", ojson::array());
    const ojson props = s.value("properties", ojson::object());
    for (const auto& [key, sub] : props.items()) {
      const bool required = std::find(req.begin(), req.end(), key) != req.end();
      if (required || (depth < 6 && pick(2))) out[key] = make(sub, depth + 1);
    }
    return out;
  }
};

const char* const k_schemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}, "admin": {"type": "boolean"}},
        "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["x", "y", 3, null]},
        "minItems": 1, "maxItems": 3}, "score": {"type": ["number", "null"]}, "note": {"type": "string"},
        "ratio": {"type": "number", "minimum": -2.5, "exclusiveMaximum": 10}}, "required": ["tags", "score"],
        "additionalProperties": false})",
    R"({"type": "array", "items": {"$ref": "#/$defs/P"}, "maxItems": 3,
        "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"const": "k"}},
        "required": ["x", "y"], "additionalProperties": false}}})",
    R"({"type": "object", "properties": {"v": {"type": "integer", "minimum": -5, "maximum": 5},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["v", "next"], "additionalProperties": false})",
    R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "object", "properties": {"k": {"type": "boolean"}},
        "required": ["k"], "additionalProperties": false}]})",
};

// Every canonical value is accepted; no string the automaton accepts as
// complete is invalid (canonical values, their mutations, fuzzed JSON).
TEST(JsonSchemaConstraint, SoundAndCompleteOnCanonicalValues) {
  for (const char* text : k_schemas) {
    const ojson schema = ojson::parse(text);
    const json plain = json::parse(text);
    auto f = vocab().json_schema(text);
    SchemaInstances gen(11, schema);
    JsonFuzzer fz(13);
    int n_accepted = 0, n_checked = 0;
    for (int i = 0; i < 120; ++i) {
      const ojson value = gen.make(schema, 0);
      const std::string canon = i % 2 ? value.dump() : value.dump(2);
      ASSERT_EQ(validate_json(plain, json::parse(canon)), "") << "generator bug: " << canon;
      EXPECT_EQ(by_bytes(*f, canon), Verdict::complete) << text << "\n  value: " << canon;
      if (i % 8 == 0) EXPECT_EQ(by_tokens(*f, canon), Verdict::complete) << canon;
      for (const std::string& s : {fz.mutate(canon), fz.mutate(canon), fz.value(0)}) {
        if (by_bytes(*f, s) != Verdict::complete) continue;
        ++n_accepted;
        ASSERT_TRUE(json::accept(s)) << text << "\n  accepted non-JSON: " << s;
        EXPECT_EQ(validate_json(plain, json::parse(s)), "") << text << "\n  accepted an invalid value: " << s;
      }
      ++n_checked;
    }
    EXPECT_EQ(n_checked, 120);
    // Some mutations keep the value valid (blanks, digits): the soundness check was not vacuous.
    EXPECT_GT(n_accepted, 0) << text;
  }
}

// Random walks: each step picks an allowed token (biased towards tokens with
// structural characters so that strings and numbers end), until only the end
// is left or end is chosen. Every finished output parses and validates.
TEST(JsonSchemaConstraint, RandomWalksThroughTheMasksGiveValidValues) {
  const Tokenizer& tok = smollm2();
  std::vector<uint8_t> structural(size_t(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    structural[size_t(id)] = tok.token_to_piece(id).find_first_of("\"}],:") != std::string::npos;
  std::mt19937_64 rng(5);
  for (const char* text : k_schemas) {
    const json schema = json::parse(text);
    auto f = vocab().json_schema(text);
    int n_finished = 0;
    const int n_walks = 12;
    for (int walk = 0; walk < n_walks; ++walk) {
      auto c = f->make();
      std::vector<uint8_t> mask;
      std::string out;
      for (int step = 0; step < 1000; ++step) {
        if (c->must_end()) break;
        if (c->complete() && rng() % 2 == 0) break;
        c->allowed(mask);
        std::vector<int32_t> all, preferred;
        for (int32_t id = 0; id < int32_t(mask.size()); ++id) {
          if (!mask[size_t(id)] || tok.is_eog(id)) continue;
          all.push_back(id);
          if (structural[size_t(id)]) preferred.push_back(id);
        }
        ASSERT_FALSE(all.empty()) << "dead end after: " << out;
        const auto& from = (!preferred.empty() && rng() % 3 != 0) ? preferred : all;
        const int32_t id = from[rng() % from.size()];
        c->accept(id);
        out += tok.token_to_piece(id);
      }
      if (!c->complete()) continue;
      ++n_finished;
      ASSERT_TRUE(json::accept(out)) << text << "\n  walk gave non-JSON: " << out;
      EXPECT_EQ(validate_json(schema, json::parse(out)), "") << text << "\n  walk gave: " << out;
    }
    EXPECT_GE(n_finished, n_walks / 3) << text;
  }
}

// String lengths are characters; the engine under xgrammar counts bytes, so
// minLength strings are generated in printable ASCII. Never a short string
// of wide characters.
TEST(JsonSchemaConstraint, StringLengthsAreSoundForWideCharacters) {
  auto min3 = vocab().json_schema(R"({"type": "string", "minLength": 3, "maxLength": 5})");
  EXPECT_EQ(by_bytes(*min3, "\"abc\""), Verdict::complete);
  EXPECT_EQ(by_bytes(*min3, "\"a~ #]\""), Verdict::complete);
  EXPECT_NE(by_bytes(*min3, "\"ab\""), Verdict::complete);
  EXPECT_NE(by_bytes(*min3, "\"éé\""), Verdict::complete);  // 4 bytes, 2 characters
  EXPECT_NE(by_bytes(*min3, "\"abcdef\""), Verdict::complete);
  auto max3 = vocab().json_schema(R"({"type": "string", "maxLength": 3})");
  EXPECT_EQ(by_bytes(*max3, "\"é\""), Verdict::complete);
  EXPECT_NE(by_bytes(*max3, "\"abcd\""), Verdict::complete);
  // Inside const/enum values the same text is data, not a schema: left alone
  // (xgrammar writes constants compactly).
  auto c = vocab().json_schema(R"({"const": {"type": "string", "minLength": 1}})");
  EXPECT_EQ(by_bytes(*c, R"({"type":"string","minLength":1})"), Verdict::complete);
}

TEST(JsonSchemaConstraint, BadSchemasGiveClearErrors) {
  auto message = [](const std::string& schema) -> std::string {
    try {
      vocab().json_schema(schema);
    } catch (const GrammarError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("{\"type\": ").find("schema: not valid JSON"), std::string::npos);
  EXPECT_NE(message(R"({"type": "integer", "multipleOf": 3})").find("schema: keyword 'multipleOf'"), std::string::npos);
  EXPECT_NE(message(R"({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})")
                .find("schema.properties.a.$ref: '#/nowhere' does not name a schema"),
            std::string::npos);
}

TEST(JsonSchemaConstraint, MustEndOnlyWhenNothingButTheEndCanFollow) {
  auto f = vocab().json_schema(R"({"type": "integer"})");
  auto c = f->make();
  for (int32_t id : smollm2().encode("12", false, false)) c->accept(id);
  EXPECT_TRUE(c->complete());
  EXPECT_FALSE(c->must_end());  // "123" is an integer too
  auto g = vocab().json_schema(R"({"type": "object", "properties": {"a": {"type": "boolean"}},
      "required": ["a"], "additionalProperties": false})");
  auto d = g->make();
  for (int32_t id : smollm2().encode(R"({"a": true})", false, false)) d->accept(id);
  EXPECT_TRUE(d->complete());
  EXPECT_TRUE(d->must_end());
}

}  // namespace
}  // namespace kvtier
