// The vector quantizers of SPEC "Quantizers (definitions)" behind one small
// API: a QuantSpec parsed from a short string, the exact storage size of one
// quantized vector, quantize / dequantize, and a scoring entry that computes
// q·dequant(code_i) for many vectors without materializing them (the hot path
// of the key index).
//
// A "vector" is `dim` consecutive f32 values (a head's key, a landmark, or a
// whole layer's K row for the host store). Each quantized vector is one
// self-contained record of bytes_per_vector(spec, dim) bytes; records of
// consecutive vectors are packed back to back. Record layouts:
//
//   f32         dim × f32
//   bf16        dim × bf16
//   fp8         dim × E4M3 (finite-only "fn" variant, max 448, RNE, saturating)
//   fp8s        dim × E4M3 of x/scale, then scale = amax/448 as f32 (4 bytes)
//   nvfp4       dim/2 bytes of E2M1 pairs (element 2i in the low nibble), then
//               dim/16 E4M3 block scales; the FP32 per-tensor scale is NOT in the
//               record: it is QuantSpec::tensor_scale, held once by the owner of
//               the tensor (nvfp4_tensor_constant_bytes() = 4 bytes per tensor).
//   uniform     per group of g values: ceil(g*b/8) bytes of b-bit codes
//               (LSB-first bit stream, each group starts on a byte), all groups'
//               codes first; then per group bf16 min and bf16 step (4 bytes).
//               x̂ = min + code·step, code ∈ [0, 2^b − 1]; int1 is min/max.
//   1bit        the uniform layout with b = 1, but the two levels are the
//               means of the values below / at-or-above the group mean (the
//               MSE-optimal two-level quantizer of that split: for Gaussian
//               data error 0.36σ² instead of min/max's ≈ 3σ²); x̂ = nearer level.
//   higgs       per Hadamard group of G values: ceil((G/d)·ceil(log2 n)/8) bytes
//               of grid indices (LSB-first bit stream, each group on a byte),
//               all groups' codes first; then per group the bf16 scale
//               ‖x_g‖/√G (2 bytes).
//
// Spec-string grammar (parse_quant_spec; case-sensitive, no spaces):
//   spec    := base (":" option)*
//   base    := "f32" | "bf16" | "fp8" | "fp8s" | "nvfp4"
//            | "int" B            (B in 1..8: uniform B-bit min/max)
//            | "1bit"             (two-level: means below/above the group mean)
//            | "higgs" BITS       (BITS in 4, 3, 2, 1, 0.5 → EDEN2-256, EDEN2-64,
//                                  EDEN4-256, EDEN8-256, EDEN8-16)
//            | "higgs"            (grid then given by the EDEN option)
//   option  := "g" N              (group size; uniform: values per min/step,
//                                  higgs: Hadamard group, a power of two)
//            | "EDEN" D "-" N     (higgs grid: D-dim, N points; shipped grids
//                                  are embedded, others are made by Lloyd)
//            | "U" N              (higgs grid: N uniform levels per coordinate,
//                                  d = 1, N in 2, 4, 8, 16; scored with an
//                                  int8 query, see below)
//            | "rs" | "rs" SEED   (higgs: random ±1 signs before the Hadamard,
//                                  fixed seed; default seed 0x5eed)
// Examples: "bf16", "fp8", "fp8s", "nvfp4", "int4", "int2:g64", "1bit",
// "higgs2", "higgs4:g128", "higgs:EDEN4-256:g128", "higgs2:g128:rs", "higgs:U4:g128".
//
// HIGGS with a U<N> grid: each rotated coordinate on N evenly spaced levels
// (2c − (N − 1))·h, c = 0 .. N − 1, h half of the MSE-optimal uniform step
// for N(0, 1) (higgs_uniform_grid). Its score() is defined in integers, so
// that every device computes the same value: per group, the rotated query
// q' is rounded to int8 (q8 = rint(q'·(127/amax)), amax = max |q'|), and
//   q·x̂ ≈ (σ · h·amax/127) · (2 Σ q8·c − (N − 1) Σ q8)
// (qdev::uniform_query, qdev::uniform_group_score). The int8 rounding moves
// a score by about 0.3 % of |q|·|x| at most; quantize/dequantize are HIGGS's.
// Group 0 (the default) means "the whole vector": for uniform g = dim; for
// higgs G = the largest power of two dividing dim (dim itself when it is one).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvtier {

enum class QuantKind { f32, bf16, fp8, fp8_scaled, nvfp4, uniform, binary, higgs };

struct QuantSpec {
  QuantKind kind = QuantKind::bf16;
  int bits = 16;          // uniform: code bits 1..8; binary: 1 (others: informational)
  int group = 0;          // uniform/binary: values per group; higgs: Hadamard group G; 0 = whole vector
  int grid_dim = 0;       // higgs: d, the sub-vector dimension of the grid
  int grid_size = 0;      // higgs: n, the number of grid points
  bool uniform_levels = false;    // higgs: the grid is U<grid_size> (grid_dim 1), scored in integers
  bool random_signs = false;      // higgs: ±1 signs (seeded) before the Hadamard
  uint64_t sign_seed = 0x5eed;    // higgs: the fixed seed of those signs
  float tensor_scale = 1.0f;      // nvfp4: the per-tensor FP32 scale (runtime, not in to_string)
};

// Throws kvtier::Error naming the string and what was expected.
QuantSpec parse_quant_spec(const std::string& text);
inline QuantSpec bf16_spec() { return QuantSpec{}; }
// Same format (tensor_scale aside).
bool same_format(const QuantSpec& a, const QuantSpec& b);
// Canonical string; parse_quant_spec(to_string(s)) == s (tensor_scale aside).
std::string to_string(const QuantSpec& spec);
// Average bits per value of one vector of `dim` values, scales included.
double bits_per_value(const QuantSpec& spec, int dim);

// U<n> grids: half of the MSE-optimal uniform step for N(0, 1) with n levels
// (Max, 1960: 1.596, 0.9957, 0.5860, 0.3352 for 2, 4, 8, 16), rounded to 8
// significant bits so that every level is exact in fp16 and f32. Throws for
// other n. (Defined with the grids, higgs_grid.cpp.)
float higgs_uniform_half_step(int n);

// Exact bytes of one quantized vector of `dim` values (see the layouts above).
// Throws kvtier::Error when `dim` does not fit the spec (nvfp4: dim % 16,
// uniform/1bit: dim % g, higgs: dim % G, G % d, G a power of two).
size_t bytes_per_vector(const QuantSpec& spec, int dim);
// Bytes held once per tensor outside the records (nvfp4: its FP32 scale; else 0).
size_t tensor_constant_bytes(const QuantSpec& spec);
// The group actually used for `dim` (uniform/higgs; 0 resolved; dim otherwise).
int resolved_group(const QuantSpec& spec, int dim);
// Throws unless `dim` fits the spec (bytes_per_vector calls it).
void validate(const QuantSpec& spec, int dim);

// NVFP4's standard per-tensor scale: amax/(448·6), so that the largest block
// scale is E4M3's maximum (1 when x is all zero). x: [n] f32.
float nvfp4_tensor_scale(const float* x, int64_t n);

// x:   [n_vec, dim] f32
// out: [n_vec, bytes_per_vector(spec, dim)] bytes
void quantize(const QuantSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* out);
// in:  [n_vec, bytes_per_vector(spec, dim)] bytes
// out: [n_vec, dim] f32
void dequantize(const QuantSpec& spec, const uint8_t* in, int64_t n_vec, int dim, float* out);

// scores[j, i] = q_j · dequant(record_i), f32 accumulation.
struct ScoreParams {
  const float* q = nullptr;        // [n_q, dim] f32
  int n_q = 1;
  const uint8_t* codes = nullptr;  // n_vec records, code_stride bytes apart
  int64_t n_vec = 0;
  int64_t code_stride = 0;         // 0: bytes_per_vector(spec, dim) (packed)
  int dim = 0;
  float* scores = nullptr;         // [n_q, n_vec] f32, score_stride apart
  int64_t score_stride = 0;        // 0: n_vec
};
inline int64_t score_stride_of(const ScoreParams& p) { return p.score_stride ? p.score_stride : p.n_vec; }
void score(const QuantSpec& spec, const ScoreParams& params);
// One query over packed records: scores [n_vec] f32.
void score(const QuantSpec& spec, const float* q, const uint8_t* codes, int64_t n_vec, int dim,
           float* scores);

// The readable references (quant_ref.cpp, higgs_ref.cpp) that the fast paths
// above are tested against. Same contracts.
void quantize_ref(const QuantSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* out);
void dequantize_ref(const QuantSpec& spec, const uint8_t* in, int64_t n_vec, int dim, float* out);
void score_ref(const QuantSpec& spec, const ScoreParams& params);

}  // namespace kvtier
