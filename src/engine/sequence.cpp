// Sequence: one generation's state machine (prefill in chunks, then one token
// per step, streaming text with UTF-8 and stop-string hold-back), and the
// decode step that Engine::step_batch runs for several sequences at once.
#include "kvtier/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "backend/stage_clock.h"
#include "core/half.h"
#include "core/status.h"
#include "engine/engine_detail.h"
#include "engine/logprobs.h"
#include "ops/matmul/matmul.h"

namespace kvtier {

using namespace engine_detail;

namespace {

// Prefill chunk when every prompt position's logits are kept (prompt logprobs).
constexpr int kPromptLogprobChunk = 64;
// Prompt tokens per forward pass: scoring the prompt needs every position's
// logits, so smaller chunks bound that buffer ([chunk, n_vocab] f32).
int prompt_chunk(const Sequence::State& s) {
  return s.sampling.n_prompt_logprobs >= 0 ? std::min(s.engine->options.prefill_chunk, kPromptLogprobChunk)
                                           : s.engine->options.prefill_chunk;
}
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Length of the longest prefix of `s` that ends on a complete UTF-8 sequence.
size_t utf8_complete_prefix(const std::string& s, size_t from) {
  size_t n = s.size();
  size_t i = n;
  // Walk back over at most 3 continuation bytes to the last lead byte.
  for (int back = 0; back < 4 && i > from; ++back) {
    const unsigned char ch = static_cast<unsigned char>(s[i - 1]);
    if ((ch & 0xC0) != 0x80) {
      size_t need = ch < 0x80 ? 1 : (ch >> 5) == 0x6 ? 2 : (ch >> 4) == 0xE ? 3 : (ch >> 3) == 0x1E ? 4 : 1;
      return (n - (i - 1) >= need) ? n : i - 1;
    }
    --i;
  }
  return n;
}

bool is_end_of_generation(const Engine::Impl& e, int32_t tok) {
  if (e.tokenizer && e.tokenizer->is_eog(tok)) return true;
  return std::find(e.extra_eos.begin(), e.extra_eos.end(), tok) != e.extra_eos.end();
}

// Structured generation: the logits of tokens the constraint forbids become
// -inf, so greedy and sampled decoding alike pick an allowed token. False
// when no token is allowed (the constraint is at a dead end).
bool mask_logits(Sequence::State& s, int n_vocab) {
  s.constraint->allowed(s.allowed);
  bool any = false;
  for (int t = 0; t < n_vocab; ++t) {
    if (s.allowed[size_t(t)]) any = true;
    else s.logits[size_t(t)] = -INFINITY;
  }
  return any;
}

}  // namespace

namespace engine_detail {

KvMemory kv_memory(const Sequence::State& s) { return s.kv ? s.kv->memory() : s.result.kv_memory; }

}  // namespace engine_detail

// ---- Sequence -------------------------------------------------------------

Sequence::Sequence(std::unique_ptr<State> s) : s_(std::move(s)) {}
Sequence::~Sequence() = default;

bool Sequence::finished() const { return s_->finished; }
bool Sequence::prompt_done() const { return s_->prefilled; }
int64_t Sequence::next_prompt_tokens() const {
  const State& s = *s_;
  if (s.prefilled || s.finished) return 0;
  const int64_t left = int64_t(s.prompt.size()) - s.n_prefilled;
  if (!s.engine->options.prefill_chunk_per_step) return left;
  return std::min<int64_t>(left, prompt_chunk(s));
}
const GenerationResult& Sequence::result() const { return s_->result; }
KvCache& Sequence::cache() {
  KVT_CHECK(s_->kv, "the sequence was cancelled and its KV cache freed");
  return *s_->kv;
}

KvMemory Sequence::kv_memory() const { return kvtier::kv_memory(*s_); }

void Sequence::fill_prompt_kv_random(int64_t n_tokens, uint64_t seed) {
  State& s = *s_;
  KVT_CHECK(!s.prefilled && s.n_prefilled == 0, "random prompt K/V: the prompt has started");
  KVT_CHECK(n_tokens >= 0 && n_tokens < int64_t(s.prompt.size()),
            "random prompt K/V: {} tokens of a {}-token prompt (at least one must run through the model)", n_tokens,
            s.prompt.size());
  const KvGeometry g = s.engine->model->kv_geometry();
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim;
  const Device& dev = s.engine->device();
  const Exec& x = dev.exec();
  const bool gpu = x.cuda();
  constexpr int64_t kBlock = 4096;
  constexpr int kBlocks = 4;
  const int64_t rows = std::min(kBlock, std::max<int64_t>(1, n_tokens));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<Buffer> blocks;  // [kBlocks][3]: pre-RoPE keys, keys, values, [rows][W] activations
  for (int b = 0; b < kBlocks * 3; ++b) {
    std::vector<float> f(size_t(rows * W));
    for (float& v : f) v = d(rng);
    Buffer buf = dev.alloc(f.size() * (gpu ? 2 : 4));
    if (gpu) {
      std::vector<uint16_t> h(f.size());
      for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_bf16(f[i]);
      copy(x, buf.data(), h.data(), h.size() * 2);
      sync(x);
    } else {
      copy(x, buf.data(), f.data(), f.size() * 4);
    }
    blocks.push_back(std::move(buf));
  }
  for (int64_t t0 = 0; t0 < n_tokens; t0 += rows) {
    const int n = int(std::min(rows, n_tokens - t0));
    const size_t b = size_t(t0 / rows % kBlocks) * 3;
    for (int l = 0; l < g.n_layer; ++l)
      s.kv->append(l, blocks[b].data(), blocks[b + 1].data(), blocks[b + 2].data(), W, n);
  }
  sync(x);
  s.n_prefilled = n_tokens;
}

void Sequence::set_prefill_progress(std::function<void(int64_t, int64_t)> on_progress) {
  s_->on_prefill_progress = std::move(on_progress);
}

void Sequence::cancel() {
  if (s_->finished) return;
  s_->finished = true;
  s_->result.finish_reason = "cancelled";
  s_->result.kv_memory = kvtier::kv_memory(*s_);
  s_->result.kv_stats = s_->kv ? s_->kv->stats() : KvStats{};
  s_->kv.reset();  // free the KV memory now, not when the handle goes
  s_->gpu.reset();
}

bool Sequence::step(std::string* piece) {
  State& s = *s_;
  if (piece) piece->clear();
  if (s.finished) return false;
  const Model& model = *s.engine->model;
  const int n_vocab = int(model.config().n_vocab);
  auto t0 = Clock::now();
  if (!s.prefilled) {
    const bool score_prompt = s.sampling.n_prompt_logprobs >= 0;
    const int chunk = prompt_chunk(s);
    const int64_t n = int64_t(s.prompt.size());
    std::vector<float> rows;  // [chunk, n_vocab] when scoring the prompt
    if (score_prompt) rows.resize(size_t(chunk) * size_t(n_vocab));
    for (int64_t i = s.n_prefilled; i < n; i += chunk) {
      const int n_tok = int(std::min<int64_t>(chunk, n - i));
      const bool last = i + n_tok == n;
      if (score_prompt) {
        forward(*s.engine, s.gpu.get(), s.scratch, &s.prompt[size_t(i)], n_tok, i, *s.kv, n_tok, rows.data());
        // Row j predicts prompt[i + j + 1]; the prompt's last row, the first new token.
        for (int j = 0; j < n_tok; ++j) {
          const float* row = rows.data() + size_t(j) * size_t(n_vocab);
          if (i + j + 1 < n)
            s.result.prompt_logprobs.push_back(
                token_logprob(row, n_vocab, s.prompt[size_t(i + j + 1)], s.sampling.n_prompt_logprobs));
          else
            std::copy(row, row + n_vocab, s.logits.begin());
        }
      } else {
        forward(*s.engine, s.gpu.get(), s.scratch, &s.prompt[size_t(i)], n_tok, i, *s.kv, last ? 1 : 0,
                s.logits.data());
      }
      s.n_prefilled = i + n_tok;
      if (s.on_prefill_progress) s.on_prefill_progress(i + n_tok, n);
      if (!last && s.engine->options.prefill_chunk_per_step) {
        s.result.prefill_seconds += seconds_since(t0);
        return true;  // the next call runs the next chunk
      }
    }
    s.n_past = n;
    // Freeing the prompt's working buffers and setting up the decode caches:
    // part of the time to the first token, timed as a prefill stage.
    const Exec& x = s.engine->device().exec();
    stage(x, "prefill_finish");
    s.kv->start_decode();
    stage_stop(x);
    s.prefilled = true;
    s.result.prefill_seconds += seconds_since(t0);
    t0 = Clock::now();
    if (s.sampling.max_new_tokens == 0) {  // only the prompt was to be scored
      s.finished = true;
      s.result.finish_reason = "length";
      s.result.kv_memory = kvtier::kv_memory(s);
      return true;
    }
  } else {
    forward(*s.engine, s.gpu.get(), s.scratch, &s.last_token, 1, s.n_past, *s.kv, 1, s.logits.data());
    s.n_past += 1;
  }
  return take_token(s, piece, t0);
}

namespace engine_detail {

// After a forward pass left the next token's logits in s.logits: samples it,
// applies the stop rules and hands out the text that is complete. t0: when
// this step began (decode time).
bool take_token(Sequence::State& s, std::string* piece, Clock::time_point t0) {
  const int n_vocab = int(s.engine->model->config().n_vocab);
  auto finish = [&](const char* reason) {
    s.finished = true;
    s.result.finish_reason = reason;
  };
  // Log-probabilities are the raw logits' (as vLLM reports), not the masked ones.
  if (s.constraint && s.sampling.n_logprobs >= 0) s.raw_logits = s.logits;
  const bool allowed = !s.constraint || mask_logits(s, n_vocab);
  const int32_t tok = s.greedy_token >= 0 ? s.greedy_token : s.sampler->sample(s.logits.data(), n_vocab);
  s.greedy_token = -1;
  s.last_token = tok;
  // A constrained value ends at an end token even with ignore_eos: nothing else may follow it.
  if (!allowed || (is_end_of_generation(*s.engine, tok) && (!s.sampling.ignore_eos || s.constraint))) {
    finish("stop");
  } else {
    if (s.constraint) s.constraint->accept(tok);
    s.result.tokens.push_back(tok);
    if (s.sampling.n_logprobs >= 0)
      s.result.logprobs.push_back(token_logprob((s.constraint ? s.raw_logits : s.logits).data(), n_vocab, tok,
                                                s.sampling.n_logprobs));
    if (s.engine->tokenizer) s.text += s.engine->tokenizer->token_to_piece(tok);
    // Stop strings: search the region that the new bytes could complete.
    for (const auto& st : s.sampling.stop) {
      if (st.empty()) continue;
      const size_t from = s.n_emitted > st.size() ? s.n_emitted - st.size() : 0;
      const size_t at = s.text.find(st, from);
      if (at != std::string::npos) {
        s.text.resize(at);
        finish("stop");
        break;
      }
    }
    if (!s.finished && s.constraint && s.constraint->must_end()) finish("stop");
    if (!s.finished && int64_t(s.result.tokens.size()) >= s.sampling.max_new_tokens) finish("length");
    if (!s.finished && s.n_past + 1 >= s.engine->max_context) finish("length");
  }

  // Text that can be handed out: everything when finished; otherwise hold back
  // an incomplete UTF-8 character and any suffix that may begin a stop string.
  size_t end = s.text.size();
  if (!s.finished) {
    end = utf8_complete_prefix(s.text, s.n_emitted);
    for (const auto& st : s.sampling.stop) {
      for (size_t k = std::min(st.size() - 1, end - s.n_emitted); k > 0; --k) {
        if (s.text.compare(end - k, k, st, 0, k) == 0) {
          end -= k;
          break;
        }
      }
    }
  }
  if (end > s.n_emitted) {
    if (piece) piece->assign(s.text, s.n_emitted, end - s.n_emitted);
    s.n_emitted = end;
  }
  s.result.decode_seconds += seconds_since(t0);
  if (s.finished) {
    s.result.text = s.text;
    s.result.kv_memory = kvtier::kv_memory(s);
    s.result.kv_stats = s.kv->stats();
  }
  return true;
}

// One decode step of sequences past their prompt, in one forward pass
// (Model::forward_decode, or GpuModel::forward_decode on CUDA); each one's
// logits land in its s.logits. On CUDA a sequence whose next token is the
// argmax of the raw logits (greedy, no constraint, no log-probabilities)
// gets the GPU's argmax in s.greedy_token instead, and no logits copied.
void decode_together(Engine::Impl& e, const std::vector<Sequence::State*>& seqs) {
  const int n = int(seqs.size());
  const size_t n_vocab = size_t(e.model->config().n_vocab);
  std::vector<int32_t> tokens(size_t(n), 0);
  std::vector<int64_t> pos(size_t(n), 0);
  std::vector<KvCache*> kvs(size_t(n), nullptr);
  for (int i = 0; i < n; ++i) {
    tokens[size_t(i)] = seqs[size_t(i)]->last_token;
    pos[size_t(i)] = seqs[size_t(i)]->n_past;
    kvs[size_t(i)] = seqs[size_t(i)]->kv.get();
  }
  std::vector<uint8_t> want(size_t(n), 1);
  std::vector<int32_t> greedy(size_t(n), -1);
  for (int i = 0; i < n && e.gpu; ++i) {
    const Sequence::State& s = *seqs[size_t(i)];
    want[size_t(i)] = !s.sampler->greedy() || s.constraint || s.sampling.n_logprobs >= 0;
  }
  std::lock_guard lk(e.batch_mu);
  if (!e.gpu && e.batch_scratch.capacity < n) e.batch_scratch = e.model->make_scratch(int(matmul_decode_max_tokens()));
  e.batch_logits.resize(size_t(n) * n_vocab);
  const Exec& x = e.device().exec();
  stage(x, "model");
  if (e.gpu)
    e.gpu->forward_decode(tokens.data(), pos.data(), kvs.data(), n, e.batch_logits.data(), greedy.data(), want.data());
  else e.model->forward_decode(tokens.data(), pos.data(), kvs.data(), n, e.batch_scratch, e.batch_logits.data());
  stage_stop(x);
  for (int i = 0; i < n; ++i) {
    Sequence::State& s = *seqs[size_t(i)];
    if (want[size_t(i)]) {
      const float* row = e.batch_logits.data() + size_t(i) * n_vocab;
      std::copy(row, row + n_vocab, s.logits.begin());
    } else {
      s.greedy_token = greedy[size_t(i)];
    }
    s.n_past += 1;
  }
}

}  // namespace engine_detail

const GenerationResult& Sequence::run(const std::function<bool(const std::string&)>& on_piece) {
  std::string piece;
  while (step(&piece)) {
    if (!piece.empty() && on_piece && !on_piece(piece)) {
      cancel();
      break;
    }
  }
  return s_->result;
}

}  // namespace kvtier
