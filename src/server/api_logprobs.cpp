#include "server/api_logprobs.h"

namespace kvtier::server {

using nlohmann::json;

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string piece = tok.token_to_piece(lp.token);
    json top = json::array();
    for (const auto& [id, v] : lp.top) {
      const std::string p = tok.token_to_piece(id);
      top.push_back({{"token", p}, {"logprob", v}, {"bytes", bytes_of(p)}});
    }
    content.push_back({{"token", piece}, {"logprob", lp.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

void CompletionLogprobs::add_unscored(int32_t token, const Tokenizer& tok) {
  const std::string piece = tok.token_to_piece(token);
  tokens.push_back(piece);
  token_logprobs.push_back(nullptr);
  top_logprobs.push_back(nullptr);
  text_offset.push_back(offset);
  offset += int64_t(piece.size());
}

void CompletionLogprobs::add(const TokenLogprob& lp, const Tokenizer& tok) {
  const std::string piece = tok.token_to_piece(lp.token);
  tokens.push_back(piece);
  token_logprobs.push_back(lp.logprob);
  json top = json::object();
  for (const auto& [id, v] : lp.top) {
    const std::string p = tok.token_to_piece(id);
    if (!top.contains(p)) top[p] = v;  // two ids may share a piece: keep the likelier
  }
  top_logprobs.push_back(top);
  text_offset.push_back(offset);
  offset += int64_t(piece.size());
}

json CompletionLogprobs::to_json() const {
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
              {"text_offset", text_offset}};
}

}  // namespace kvtier::server
