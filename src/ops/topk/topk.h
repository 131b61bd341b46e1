// Top-k per row (a row = one (sequence, KV head) of index scores): the k
// largest scores, ties broken towards the lower token, returned as token
// indices in ascending order (so that gathers read host memory in order and
// consecutive steps' selections merge cheaply).
#pragma once
#include <cstdint>

namespace kvtier {

// Scores compare by their f32 bit pattern mapped to a total order
// (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN).
uint32_t topk_order_key(float x);

// scores: [n_rows, n] f32
// out:    [n_rows, min(k, n)] int32 = tok_offset + position, ascending
void topk_ref(const float* scores, int64_t n_rows, int64_t n, int k, int64_t tok_offset, int32_t* out);

}  // namespace kvtier
