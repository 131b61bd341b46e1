// Policy prefill=stream through the engine on the project's long-context
// model (CPU): the prompt's attention reads each layer's K/V decoded from the
// host tier. With an f32 host tier the logits are the dense prefill's, bit
// for bit, and a prompt prefilled in chunks of 128 gives the logits of the
// same prompt in one chunk (as close as full attention's own chunked and
// one-shot logits); quantized tiers read values the closer the more bits; a
// generation after a streamed prefill reports the policy it ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string kModel = std::string(KVT_SOURCE_DIR) + "/models/kvtier-longctx-19m";

std::vector<int32_t> prompt_ids(int n, int n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = 12345;
  for (int32_t& v : t) {
    x = x * 1664525u + 1013904223u;
    v = int32_t(16 + (x >> 8) % uint32_t(n_vocab - 16));
  }
  return t;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(StreamedPrefill, EngineLogitsFollowTheHostTier) {
  EngineOptions o;
  o.model_path = kModel;
  o.prefill_chunk = 128;
  auto chunked = Engine::load(o);
  o.prefill_chunk = 1024;
  auto one_shot = Engine::load(o);
  const std::vector<int32_t> ids = prompt_ids(700, chunked->config().n_vocab);
  // f32 host tier: the streamed prefill reads exactly the values the dense copy holds.
  const auto dense_f32 = chunked->logits(ids, "yakv,kv=f32,prefill=dense");
  const auto stream_f32 = chunked->logits(ids, "yakv,kv=f32,prefill=stream");
  ASSERT_EQ(dense_f32.size(), stream_f32.size());
  EXPECT_EQ(max_abs_diff(dense_f32, stream_f32), 0.f);
  // Chunked or in one piece: the same to f32 rounding (as dense attention's own chunking).
  const auto stream_o = one_shot->logits(ids, "yakv,kv=f32,prefill=stream");
  const auto full_c = chunked->logits(ids, "full,kv=f32");
  const auto full_o = one_shot->logits(ids, "full,kv=f32");
  const float chunking_noise = max_abs_diff(full_c, full_o);
  EXPECT_LE(max_abs_diff(stream_f32, stream_o), std::max(1e-5f, 2 * chunking_noise));
  // Quantized host tiers: the prompt's attention reads their values, the
  // closer to the exact ones the more bits (rel-L2 of the logits).
  auto rel = [&](const std::vector<float>& a) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i)
      num += double(a[i] - dense_f32[i]) * (a[i] - dense_f32[i]), den += double(dense_f32[i]) * dense_f32[i];
    return std::sqrt(num / den);
  };
  const double e_bf16 = rel(chunked->logits(ids, "yakv,kv=bf16,prefill=stream"));
  const double e_fp8 = rel(chunked->logits(ids, "yakv,kv=fp8,prefill=stream"));
  const double e_higgs4 = rel(chunked->logits(ids, "yakv,prefill=stream"));
  std::printf("[streamed prefill] logits rel-L2 against the exact copy: bf16 %.3e, fp8 %.3e, higgs4 %.3e\n", e_bf16,
              e_fp8, e_higgs4);
  EXPECT_GT(e_bf16, 0.0);
  EXPECT_LT(e_bf16, e_fp8);
  EXPECT_LT(e_fp8, e_higgs4);
  EXPECT_LT(e_higgs4, 0.25);
  // Generation after a streamed prefill.
  SamplingParams greedy;
  greedy.max_new_tokens = 8;
  greedy.ignore_eos = true;
  const GenerationResult r = chunked->generate(ids, greedy, "yakv,prefill=stream");
  EXPECT_EQ(r.tokens.size(), 8u);
  EXPECT_NE(r.kv_policy.find("prefill=stream"), std::string::npos) << r.kv_policy;
  const GenerationResult d = chunked->generate(ids, greedy, "yakv,kv=f32,prefill=dense");
  const GenerationResult s = chunked->generate(ids, greedy, "yakv,kv=f32,prefill=stream");
  EXPECT_EQ(d.tokens, s.tokens);
}

}  // namespace
}  // namespace kvtier
