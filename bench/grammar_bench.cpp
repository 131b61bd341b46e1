// Speed of structured generation's token masks (src/grammar): building the
// vocabulary, compiling a schema, and the per-token cost a decode step pays
// (fill the mask of allowed tokens + advance), for SmolLM2's 49K vocabulary
// and a 128K one (Llama 3's size: SmolLM2's tokens plus 79K concatenations of
// two of them, since no Llama 3 tokenizer is available here).
//
//   cmake --build build --target grammar_bench && build/bench/grammar_bench
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>
#include <sstream>

#include "grammar/constraint.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {
namespace {

const std::string k_golden = std::string(KVT_SOURCE_DIR) + "/tests/golden/";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// args: 0 → 49K (SmolLM2), 1 → 128K.
const Tokenizer& tokenizer(int which) {
  static std::unique_ptr<Tokenizer> toks[2];
  if (!toks[which]) {
    std::string text = read(k_golden + "tokenizer_smollm2.json");
    if (which == 1) {
      nlohmann::json j = nlohmann::json::parse(text);
      auto& vocab = j["model"]["vocab"];
      std::vector<std::string> keys;
      int64_t next = 0;
      for (const auto& [k, v] : vocab.items()) {
        keys.push_back(k);
        next = std::max<int64_t>(next, v.get<int64_t>() + 1);
      }
      for (const auto& t : j["added_tokens"]) next = std::max<int64_t>(next, t["id"].get<int64_t>() + 1);
      std::mt19937_64 rng(1);
      while (next < 128256) {
        const std::string k = keys[rng() % keys.size()] + keys[rng() % keys.size()];
        if (!vocab.contains(k)) vocab[k] = next++;
      }
      text = j.dump();
    }
    toks[which] = Tokenizer::from_hf_text(text, read(k_golden + "tokenizer_config_smollm2.json"));
  }
  return *toks[which];
}

GrammarVocab& vocab(int which) {
  static std::shared_ptr<GrammarVocab> v[2];
  if (!v[which]) v[which] = GrammarVocab::build(tokenizer(which), tokenizer(which).n_vocab(), {});
  return *v[which];
}

const char* const k_schema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string"}, "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": false})";

const char* const k_value =
    R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["admin", "user"],)"
    R"( "address": {"city": "London, St James's Square", "zip": "SW1Y 4JU"}})";

void BM_vocab_build(benchmark::State& state) {
  const Tokenizer& tok = tokenizer(int(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(GrammarVocab::build(tok, tok.n_vocab(), {}));
  state.counters["n_vocab"] = double(tok.n_vocab());
}
BENCHMARK(BM_vocab_build)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_compile_schema(benchmark::State& state) {
  GrammarVocab& v = vocab(int(state.range(0)));
  int n = 0;
  for (auto _ : state) {
    // A new title each time: compiled grammars are cached by schema text.
    nlohmann::ordered_json s = nlohmann::ordered_json::parse(k_schema);
    s["title"] = "run " + std::to_string(n++);
    benchmark::DoNotOptimize(v.json_schema(s.dump()));
  }
}
BENCHMARK(BM_compile_schema)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(5);

// The decode-step cost: mask + advance, per token of a typical value.
// args: vocabulary, mode (0: json_schema, 1: json_object).
void BM_mask_per_token(benchmark::State& state) {
  const int which = int(state.range(0));
  GrammarVocab& v = vocab(which);
  auto f = state.range(1) == 0 ? v.json_schema(k_schema) : v.json_object();
  const std::vector<int32_t> ids = tokenizer(which).encode(k_value, false, false);
  std::vector<uint8_t> mask;
  int64_t n_tokens = 0;
  for (auto _ : state) {
    auto c = f->make();
    for (int32_t id : ids) {
      c->allowed(mask);
      if (!mask[size_t(id)]) state.SkipWithError("the value's token is not allowed");
      c->accept(id);
    }
    n_tokens += int64_t(ids.size());
  }
  state.counters["ms_per_token"] =
      benchmark::Counter(double(n_tokens) * 1e-3, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = double(ids.size());
}
BENCHMARK(BM_mask_per_token)->Args({0, 0})->Args({0, 1})->Args({1, 0})->Args({1, 1})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvtier
