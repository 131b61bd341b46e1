// Token-level constraints for structured generation: at each decode step,
// which tokens keep the output a valid prefix of a language (a JSON value, a
// value of a JSON Schema, a tool call), and whether the output is complete.
//
// The languages are compiled by xgrammar (third_party/, fetched from its PyPI
// source distribution): a JSON Schema becomes a grammar whose per-token masks
// are precomputed against the vocabulary where they do not depend on the
// parser's stack, the rest walked over a trie of the token bytes at run time.
// GrammarVocab holds that vocabulary (built once per tokenizer), a
// ConstraintFactory one compiled language (once per request, shared by its
// sequences), a TokenConstraint the parser state of one sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kvtier {

class Tokenizer;

// A schema or response_format the engine cannot honour: malformed, or using
// a keyword that would change the language and is not supported. The message
// names the JSON path (e.g. "schema.properties.age: ...") so that the server
// can answer 400 with it.
class GrammarError : public Error {
 public:
  using Error::Error;
};

// The state of one constrained generation.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // mask[t] = 1 when token t may come next, else 0; mask is resized to the
  // vocabulary size (the model's n_vocab). End-of-generation tokens are
  // allowed exactly when complete().
  virtual void allowed(std::vector<uint8_t>& mask) = 0;
  // Advances over `token`; throws GrammarError when the token is not allowed.
  virtual void accept(int32_t token) = 0;
  // The output so far is a complete value (end of generation is allowed).
  virtual bool complete() const = 0;
  // Complete, and nothing but end of generation can follow: the generation
  // can stop without another forward pass.
  virtual bool must_end() = 0;
};

// One compiled language; makes a fresh TokenConstraint per sequence.
class ConstraintFactory {
 public:
  virtual ~ConstraintFactory() = default;
  virtual std::unique_ptr<TokenConstraint> make() const = 0;
  // What the constraint is, for messages and logs ("json_object", "json_schema 'name'", "tool call").
  virtual const std::string& describe() const = 0;
};

// The vocabulary as the grammar engine sees it: the bytes of every token,
// with control tokens excluded and the end-of-generation tokens as its stop
// tokens. Building it sorts the vocabulary (≈ 0.2 s for 49K tokens), so a
// server builds it once. Thread-safe: compiling may run on several threads.
class GrammarVocab {
 public:
  // n_vocab: the model's vocabulary size (≥ the tokenizer's; the extra ids
  // are never allowed). end_tokens: ids that end a generation.
  static std::shared_ptr<GrammarVocab> build(const Tokenizer& tokenizer, int32_t n_vocab,
                                             const std::vector<int32_t>& end_tokens);
  virtual ~GrammarVocab() = default;
  virtual int32_t n_vocab() const = 0;
  virtual const std::vector<int32_t>& end_tokens() const = 0;

  // Any JSON object (OpenAI's json_object mode).
  virtual std::shared_ptr<ConstraintFactory> json_object() = 0;
  // A value of the JSON Schema `schema_json` (checked by check_json_schema
  // first: unsupported keywords are refused, annotations ignored).
  virtual std::shared_ptr<ConstraintFactory> json_schema(std::string_view schema_json,
                                                         const std::string& name = "") = 0;
  // `prefix` + a value of the schema + `suffix` (a tool call inside its
  // template's markers).
  virtual std::shared_ptr<ConstraintFactory> wrapped_json_schema(std::string_view schema_json,
                                                                 const std::string& prefix,
                                                                 const std::string& suffix,
                                                                 const std::string& description) = 0;
};

}  // namespace kvtier
