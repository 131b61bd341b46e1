// Residual landmarks (SPEC "Policies"): a meta-landmark per group of M
// consecutive vectors (their mean) quantized with spec `meta`, plus each
// vector's residual x_i − metâ_{i/M} quantized with spec `resid`. The
// residual is taken against the *dequantized* meta, so the meta's error is
// corrected by the residual instead of added to it. A last partial group
// (n_vec % M) has its own mean over the vectors it holds.
#pragma once
#include <cstdint>

#include "ops/quant/quant_format.h"

namespace kvtier {

struct ResidualSpec {
  QuantSpec meta;   // e.g. higgs4:g128
  QuantSpec resid;  // e.g. 1bit or higgs1:g128
  int group = 8;    // M: vectors per meta-landmark
};

// Exact bytes per vector: bytes_per_vector(resid) + bytes_per_vector(meta)/M
// (a fraction when M does not divide it; a partial last group costs a whole meta).
double residual_bytes_per_vector(const ResidualSpec& spec, int dim);
inline int64_t residual_n_meta(const ResidualSpec& spec, int64_t n_vec) {
  return (n_vec + spec.group - 1) / spec.group;
}

// x:         [n_vec, dim] f32
// meta_out:  [residual_n_meta(n_vec), bytes_per_vector(meta, dim)] bytes
// resid_out: [n_vec, bytes_per_vector(resid, dim)] bytes
void quantize_residual(const ResidualSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* meta_out,
                       uint8_t* resid_out);
// out: [n_vec, dim] f32 = metâ_{i/M} + resid̂_i
void dequantize_residual(const ResidualSpec& spec, const uint8_t* meta, const uint8_t* resid, int64_t n_vec,
                         int dim, float* out);
// scores[j, i] = q_j · (metâ_{i/M} + resid̂_i); q: [n_q, dim] f32, scores: [n_q, n_vec] f32.
void score_residual(const ResidualSpec& spec, const float* q, int n_q, const uint8_t* meta, const uint8_t* resid,
                    int64_t n_vec, int dim, float* scores);

}  // namespace kvtier
