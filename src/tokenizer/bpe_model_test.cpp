// BpeModel (heap-based merging with a cache) against a plain reference of
// GPT-2's bpe(): repeatedly merge the lowest-ranked adjacent pair, leftmost
// first, on strings. Plus the byte-level map and UTF-8 helpers.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <algorithm>

#include "core/status.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"

namespace kvtier {
namespace {

TEST(ByteLevel, MapIsABijectionOntoPrintableCodepoints) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_level::byte_to_codepoint(uint8_t(b));
    EXPECT_TRUE(seen.insert(cp).second);
    EXPECT_EQ(byte_level::codepoint_to_byte(cp), b);
    EXPECT_TRUE(cp > 32 && cp != 127 && cp < 0x144);
  }
  EXPECT_EQ(byte_level::byte_to_codepoint(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(byte_level::byte_to_codepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_level::byte_to_codepoint('A'), uint32_t('A'));
  EXPECT_EQ(byte_level::codepoint_to_byte(0x4E2D), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_EQ(byte_level::decode(byte_level::encode(all)), all);
}

TEST(ByteLevel, Utf8ValidationAndSanitize) {
  EXPECT_TRUE(byte_level::is_valid_utf8("h\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  EXPECT_FALSE(byte_level::is_valid_utf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(byte_level::is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(byte_level::is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(byte_level::is_valid_utf8("\xE4\xB8"));          // truncated
  EXPECT_EQ(byte_level::sanitize_utf8("a\xFF" "b\xE4\xB8"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(byte_level::trim_unicode_space(" \t\xE3\x80\x80x y\n\xC2\xA0"), "x y");
  EXPECT_EQ(byte_level::trim_unicode_space("   "), "");
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
};

// The first 8000 tokens of the SmolLM2 fixture and their merges.
const Vocab& fixture_vocab() {
  static const Vocab v = [] {
    std::ifstream f(std::string(KVT_SOURCE_DIR) + "/tests/golden/tokenizer_qwen2style_8k.json");
    const auto j = nlohmann::json::parse(f);
    Vocab out;
    const auto& vocab = j.at("model").at("vocab");
    out.tokens.resize(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) out.tokens.at(it.value().get<size_t>()) = it.key();
    for (const auto& m : j.at("model").at("merges")) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      out.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    }
    return out;
  }();
  return v;
}

std::vector<int32_t> reference_bpe(const Vocab& v, const std::string& raw) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t i = 0; i < v.merges.size(); ++i) rank.emplace(v.merges[i], i);
  std::vector<std::string> syms;
  for (unsigned char b : raw) {
    const std::string sym = byte_level::encode(std::string(1, char(b)));
    // HF drops a byte without a token before merging.
    if (std::find(v.tokens.begin(), v.tokens.end(), sym) != v.tokens.end()) syms.push_back(sym);
  }
  while (syms.size() > 1) {
    size_t best = SIZE_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const auto it = rank.find({syms[i], syms[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == SIZE_MAX) break;
    syms[at] += syms[at + 1];
    syms.erase(syms.begin() + at + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& s : syms) {
    const auto it = std::find(v.tokens.begin(), v.tokens.end(), s);
    ids.push_back(int32_t(it - v.tokens.begin()));
  }
  return ids;
}

TEST(BpeModel, MatchesReferenceOnWordsAndRandomBytes) {
  const Vocab& v = fixture_vocab();
  BpeModel bpe(v.tokens, v.merges, false, BpeModel::MissingByte::drop, "fixture");
  std::vector<std::string> words = {"hello", " world", " the", "Supercalifragilistic", "aaaaaaaaaaaaaaaa",
                                    "    ", "\xE4\xBD\xA0\xE5\xA5\xBD", " internationalization", "1234"};
  std::mt19937 rng(7);
  const std::string alphabet = "etaoin shrdlu";
  for (int i = 0; i < 300; ++i) {
    std::string w;
    const int len = 1 + int(rng() % 24);
    for (int k = 0; k < len; ++k) w += (i % 3 == 0) ? char(rng() % 256) : alphabet[rng() % alphabet.size()];
    words.push_back(w);
  }
  for (const std::string& w : words) {
    std::vector<int32_t> got;
    bpe.encode_piece(w, got);
    EXPECT_EQ(got, reference_bpe(v, w)) << "piece of " << w.size() << " bytes";
    std::vector<int32_t> again;  // second call is served by the cache
    bpe.encode_piece(w, again);
    EXPECT_EQ(again, got);
  }
}

TEST(BpeModel, RejectsMergesOutsideTheVocabulary) {
  const Vocab& v = fixture_vocab();
  auto merges = v.merges;
  merges.emplace_back("zzz_not", "a_token");
  try {
    BpeModel bpe(v.tokens, merges, false, BpeModel::MissingByte::drop, "fixture");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zzz_not"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtier
