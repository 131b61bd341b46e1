// Fast HIGGS: FWHT instead of the O(G²) matrix, an AVX2 nearest-point search
// (argmax_c u·c − ‖c‖²/2 over 8 grid points per instruction; for 2-D grids
// over the few points of u's cell, higgs_cells.h), and scoring in
// the rotated domain: the Hadamard is orthonormal, so
//   q · x̂ = Σ_g σ_g · (H(s ⊙ q_g)) · grid[code_g],
// and with many records per query the inner products q'_p · grid_c are
// tabulated once (LUT [n_sub, n]) so a record costs one lookup per sub-vector.
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/higgs_quant.h"
#include "ops/quant/quant_dev_higgs.cuh"
#include "ops/quant/quant_cpu_detail.h"
#include "ops/quant/quant_layout.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {
using namespace quant_layout;

// Nearest grid point to u [d]: the largest u·c − ‖c‖²/2, lowest index on ties.
int nearest_point_fast(const HiggsGrid& grid, const float* u) {
  const int n = grid.size, d = grid.dim;
  if (!grid.cells.empty()) {  // d = 2: the few points of u's cell (higgs_cells.h), the device's search
    DevFormat f;
    f.grid_dim = 2, f.grid_size = n;
    f.grid = grid.points.data(), f.half_norm2 = grid.half_norm2.data(), f.cells = grid.cells.data();
    const int c = qdev::nearest_in_cell(f, u);
    if (c >= 0) return c;
  }
  if (n % 8 != 0) {
    int best = 0;
    float best_s = -INFINITY;
    for (int c = 0; c < n; ++c) {
      float s = -grid.half_norm2[size_t(c)];
      // One FMA per coordinate, in order, like the AVX2 loop below (left to the
      // compiler, gcc fuses some and not others once it vectorizes over k).
      for (int k = 0; k < d; ++k) s = std::fma(u[k], grid.points_t[size_t(k) * n + c], s);
      if (s > best_s) best_s = s, best = c;
    }
    return best;
  }
  __m256 best_s = _mm256_set1_ps(-INFINITY);
  __m256i best_i = _mm256_setzero_si256();
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  for (int c = 0; c < n; c += 8) {
    __m256 s = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(grid.half_norm2.data() + c));
    for (int k = 0; k < d; ++k)
      s = _mm256_fmadd_ps(_mm256_set1_ps(u[k]), _mm256_loadu_ps(grid.points_t.data() + size_t(k) * n + c), s);
    __m256 gt = _mm256_cmp_ps(s, best_s, _CMP_GT_OQ);  // strict: earlier index wins ties
    best_s = _mm256_blendv_ps(best_s, s, gt);
    best_i = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_i), _mm256_castsi256_ps(idx), gt));
    idx = _mm256_add_epi32(idx, eight);
  }
  alignas(32) float s8[8];
  alignas(32) int32_t i8[8];
  _mm256_store_ps(s8, best_s);
  _mm256_store_si256(reinterpret_cast<__m256i*>(i8), best_i);
  int best = i8[0];
  float bs = s8[0];
  for (int l = 1; l < 8; ++l)
    if (s8[l] > bs || (s8[l] == bs && i8[l] < best)) bs = s8[l], best = i8[l];
  return best;
}

// The group's signs [G] f32 (all 1 without random signs). The fetch path
// decodes one record per call, so the last vector built is kept per thread.
const std::vector<float>& sign_vector(const QuantSpec& s, int G) {
  thread_local struct {
    bool random = false;
    uint64_t seed = 0;
    std::vector<float> signs;
  } last;
  if (last.signs.size() != size_t(G) || last.random != s.random_signs ||
      (s.random_signs && last.seed != uint64_t(s.sign_seed))) {
    last.signs.assign(size_t(G), 1.0f);
    if (s.random_signs) hadamard_signs(s.sign_seed, G, last.signs.data());
    last.random = s.random_signs;
    last.seed = uint64_t(s.sign_seed);
  }
  return last.signs;
}

// higgs_grid's table (a lookup under a lock), remembered per thread.
const HiggsGrid& grid_of(const QuantSpec& s) {
  thread_local const HiggsGrid* last = nullptr;
  thread_local bool last_uniform = false;
  if (!last || last->dim != s.grid_dim || last->size != s.grid_size || last_uniform != s.uniform_levels)
    last = &higgs_grid_of(s), last_uniform = s.uniform_levels;
  return *last;
}

// All codes of one group, LSB-first stream of `bits`-bit fields. out: [n_code].
void unpack_codes(const uint8_t* p, int n_code, int bits, uint16_t* out) {
  if (bits == 8) {
    for (int i = 0; i < n_code; ++i) out[i] = p[i];
    return;
  }
  const uint32_t mask = (1u << bits) - 1;
  uint64_t acc = 0;
  int n_acc = 0;
  for (int i = 0; i < n_code; ++i) {
    while (n_acc < bits) acc |= uint64_t(*p++) << n_acc, n_acc += 8;
    out[i] = uint16_t(uint32_t(acc) & mask);
    acc >>= bits;
    n_acc -= bits;
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void higgs_quantize_cpu(const QuantSpec& s, const float* x, int64_t n_vec, int dim, uint8_t* out) {
  size_t bpv = bytes_per_vector(s, dim);
  Grouped l = grouped_layout(s, dim);
  const HiggsGrid& grid = grid_of(s);
  const int d = s.grid_dim, G = l.group;
  const std::vector<float>& signs = sign_vector(s, G);
  std::vector<float> u(static_cast<size_t>(G));  // [G] f32
  for (int64_t v = 0; v < n_vec; ++v) {
    uint8_t* rec = out + size_t(v) * bpv;
    for (int g = 0; g < l.n_group; ++g) {
      const float* xg = x + v * dim + int64_t(g) * G;
      double norm2 = 0;
      for (int i = 0; i < G; ++i) norm2 += double(xg[i]) * xg[i];
      KVT_CHECK(std::isfinite(norm2), "quantize {}: non-finite value in vector {}", to_string(s), v);
      uint16_t sigma_h = f32_to_bf16(float(std::sqrt(norm2 / G)));
      float sigma = bf16_to_f32(sigma_h);
      KVT_CHECK(std::isfinite(sigma), "quantize {}: group {} of vector {} has norm {} beyond bf16",
                to_string(s), g, v, std::sqrt(norm2));
      for (int i = 0; i < G; ++i) u[size_t(i)] = signs[size_t(i)] * xg[i];
      hadamard_transform(u.data(), G);
      float inv = sigma > 0 ? 1.0f / sigma : 0.0f;
      for (int i = 0; i < G; ++i) u[size_t(i)] *= inv;
      uint8_t* codes = rec + size_t(g) * l.code_bytes;
      if (l.bits == 8) {
        for (int p = 0; p < l.n_code; ++p) codes[p] = uint8_t(nearest_point_fast(grid, u.data() + p * d));
      } else {
        std::memset(codes, 0, l.code_bytes);
        for (int p = 0; p < l.n_code; ++p)
          put_bits(codes, int64_t(p) * l.bits, uint32_t(nearest_point_fast(grid, u.data() + p * d)), l.bits);
      }
      store_u16(rec + l.meta_offset + 2 * size_t(g), sigma_h);
    }
  }
}

namespace {

// y[p·d + k] = σ · grid[code_p][k] for a group's byte codes. D: the grid's
// dimension (0: d at run time).
template <int D>
void decode_byte_codes(const uint8_t* cg, int n_code, const float* points, float sigma, float* y, int d = D) {
  const int dd = D ? D : d;
  for (int p = 0; p < n_code; ++p) {
    const float* pt = points + size_t(cg[p]) * dd;
    for (int k = 0; k < dd; ++k) y[p * dd + k] = sigma * pt[k];
  }
}

}  // namespace

void higgs_dequantize_cpu(const QuantSpec& s, const uint8_t* in, int64_t n_vec, int dim, float* out) {
  size_t bpv = bytes_per_vector(s, dim);
  Grouped l = grouped_layout(s, dim);
  const HiggsGrid& grid = grid_of(s);
  const int d = s.grid_dim, G = l.group;
  const std::vector<float>& signs = sign_vector(s, G);
  // A code per byte (EDEN*-256) indexes the grid straight from the record.
  const bool byte_codes = l.bits == 8 && grid.size == 256;
  std::vector<uint16_t> code(byte_codes ? 0 : static_cast<size_t>(l.n_code));
  for (int64_t v = 0; v < n_vec; ++v) {
    const uint8_t* rec = in + size_t(v) * bpv;
    for (int g = 0; g < l.n_group; ++g) {
      float sigma = bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)));
      float* y = out + v * dim + int64_t(g) * G;  // rotated group, then transformed in place
      if (byte_codes) {
        const uint8_t* cg = rec + size_t(g) * l.code_bytes;
        switch (d) {  // the grid's dimension fixed for the usual grids (EDEN2-256, EDEN4-256)
          case 2: decode_byte_codes<2>(cg, l.n_code, grid.points.data(), sigma, y); break;
          case 4: decode_byte_codes<4>(cg, l.n_code, grid.points.data(), sigma, y); break;
          default: decode_byte_codes<0>(cg, l.n_code, grid.points.data(), sigma, y, d);
        }
      } else {
        unpack_codes(rec + size_t(g) * l.code_bytes, l.n_code, l.bits, code.data());
        for (int p = 0; p < l.n_code; ++p) {
          uint32_t c = code[size_t(p)];
          KVT_CHECK(c < uint32_t(grid.size), "dequantize {}: code {} >= grid size {} in vector {}",
                    to_string(s), c, grid.size, v);
          for (int k = 0; k < d; ++k) y[p * d + k] = sigma * grid.points[size_t(c) * d + k];
        }
      }
      hadamard_transform(y, G);
      if (s.random_signs)
        for (int i = 0; i < G; ++i) y[i] *= signs[size_t(i)];
    }
  }
}

namespace {

// Σ over a group's codes of lut[sp, code] (4 lanes): even codes in a0, odd
// in a1, in order, then a0 + a1. NC: the codes per group (0: l.n_code).
template <int NC>
inline __m128 group_sum4(const uint8_t* cg, const float* lg, int n_code) {
  const int nc = NC ? NC : n_code;
  __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
  int sp = 0;
#pragma GCC unroll 16
  for (; sp + 2 <= nc; sp += 2) {
    a0 = _mm_add_ps(a0, _mm_loadu_ps(lg + (size_t(sp) * 256 + cg[sp]) * 4));
    a1 = _mm_add_ps(a1, _mm_loadu_ps(lg + (size_t(sp + 1) * 256 + cg[sp + 1]) * 4));
  }
  for (; sp < nc; ++sp) a0 = _mm_add_ps(a0, _mm_loadu_ps(lg + (size_t(sp) * 256 + cg[sp]) * 4));
  return _mm_add_ps(a0, a1);
}

// The records' scores over the table: Σ_g σ_g · group_sum4, four records per
// iteration for independent chains of loads and adds.
template <int NC>
void score_records_lut4(const Grouped& l, const float* lut, int n_q, const uint8_t* codes, int64_t stride,
                        int64_t n_vec, float* scores, int64_t score_stride) {
  const size_t group_lut = size_t(l.n_code) * 256 * 4;
  auto sigma = [&](const uint8_t* r, int g) {
    return _mm_set1_ps(bf16_to_f32(load_u16(r + l.meta_offset + 2 * size_t(g))));
  };
  auto store = [&](int64_t i, __m128 total) {
    alignas(16) float t4[4];
    _mm_store_ps(t4, total);
    for (int j = 0; j < n_q; ++j) scores[int64_t(j) * score_stride + i] = t4[j];
  };
  int64_t i = 0;
  for (; i + 4 <= n_vec; i += 4) {
    const uint8_t* r0 = codes + i * stride;
    const uint8_t *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
    __m128 t0 = _mm_setzero_ps(), t1 = _mm_setzero_ps(), t2 = _mm_setzero_ps(), t3 = _mm_setzero_ps();
    for (int g = 0; g < l.n_group; ++g) {
      const float* lg = lut + size_t(g) * group_lut;
      const size_t at = size_t(g) * l.code_bytes;
      t0 = _mm_fmadd_ps(sigma(r0, g), group_sum4<NC>(r0 + at, lg, l.n_code), t0);
      t1 = _mm_fmadd_ps(sigma(r1, g), group_sum4<NC>(r1 + at, lg, l.n_code), t1);
      t2 = _mm_fmadd_ps(sigma(r2, g), group_sum4<NC>(r2 + at, lg, l.n_code), t2);
      t3 = _mm_fmadd_ps(sigma(r3, g), group_sum4<NC>(r3 + at, lg, l.n_code), t3);
    }
    store(i, t0);
    store(i + 1, t1);
    store(i + 2, t2);
    store(i + 3, t3);
  }
  for (; i < n_vec; ++i) {
    const uint8_t* r0 = codes + i * stride;
    __m128 t0 = _mm_setzero_ps();
    for (int g = 0; g < l.n_group; ++g)
      t0 = _mm_fmadd_ps(sigma(r0, g), group_sum4<NC>(r0 + size_t(g) * l.code_bytes, lut + size_t(g) * group_lut, l.n_code),
                        t0);
    store(i, t0);
  }
}

// 2–4 queries (a GQA group) over byte codes of a 256-point grid: the table
// as [n_sub, 256, 4] f32, built straight from the grid (query j in lane j),
// so that one 16-byte load per stored code serves every query.
void higgs_score_group4(const Grouped& l, const HiggsGrid& grid, const float* qr, int n_q, int dim,
                        const uint8_t* codes, int64_t stride, int64_t n_vec, float* scores,
                        int64_t score_stride) {
  const int d = grid.dim, n_sub = dim / d;
  std::vector<float> qt(size_t(dim) * 4, 0.f);  // [dim, 4] the queries' values at each rotated coordinate
  for (int i = 0; i < dim; ++i)
    for (int j = 0; j < n_q; ++j) qt[size_t(i) * 4 + j] = qr[size_t(j) * dim + i];
  std::vector<float> lut4(size_t(n_sub) * 256 * 4);  // [n_sub, 256, 4] f32
  for (int sp = 0; sp < n_sub; ++sp)
    for (int c = 0; c < 256; ++c) {
      const float* pt = grid.points.data() + size_t(c) * d;
      __m128 acc = _mm_setzero_ps();
      for (int k = 0; k < d; ++k) acc = _mm_fmadd_ps(_mm_loadu_ps(qt.data() + size_t(sp * d + k) * 4), _mm_set1_ps(pt[k]), acc);
      _mm_storeu_ps(lut4.data() + (size_t(sp) * 256 + c) * 4, acc);
    }
  const float* lut = lut4.data();
  switch (l.n_code) {  // the common groups unrolled: 64 or 128 dims of 4-dim codes
    case 16: return score_records_lut4<16>(l, lut, n_q, codes, stride, n_vec, scores, score_stride);
    case 32: return score_records_lut4<32>(l, lut, n_q, codes, stride, n_vec, scores, score_stride);
    default: return score_records_lut4<0>(l, lut, n_q, codes, stride, n_vec, scores, score_stride);
  }
}

// Σ over a group's code bytes of their table entries (4 queries' sums),
// in two independent chains; CB > 0 fixes the byte count (unrolled).
template <int CB>
__m128i u4_byte_sums4(const uint8_t* cg, const int32_t* lg, int n_bytes) {
  const int nb = CB > 0 ? CB : n_bytes;
  __m128i a0 = _mm_setzero_si128(), a1 = _mm_setzero_si128();
  int b = 0;
#pragma GCC unroll 16
  for (; b + 2 <= nb; b += 2) {
    a0 = _mm_add_epi32(a0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(lg + (b * 256 + cg[b]) * 4)));
    a1 = _mm_add_epi32(a1, _mm_loadu_si128(reinterpret_cast<const __m128i*>(lg + ((b + 1) * 256 + cg[b + 1]) * 4)));
  }
  if (b < nb) a0 = _mm_add_epi32(a0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(lg + (b * 256 + cg[b]) * 4)));
  return _mm_add_epi32(a0, a1);
}

// A U<n> grid's scores (quant_format.h): per query and group the int8
// query (qdev::uniform_query), then per record integer sums. With 2-bit
// codes a table of Σ q8·c per code byte position and byte value turns a
// group into one lookup per byte (integer sums: any order gives the same).
void uniform_score_cpu(const QuantSpec& s, const Grouped& l, const float* qr, const ScoreParams& p, int64_t stride) {
  const int dim = p.dim, n = s.grid_size, G = l.group;
  const float h = higgs_uniform_half_step(n);
  const int64_t n_qg = int64_t(p.n_q) * l.n_group;
  std::vector<qdev::UniformQuery> uq(static_cast<size_t>(n_qg));
  std::vector<int32_t> q8(size_t(p.n_q) * dim), sums(static_cast<size_t>(n_qg));
  for (int64_t jg = 0; jg < n_qg; ++jg) {
    const float* qg = qr + jg * G;
    float amax = 0;
    for (int i = 0; i < G; ++i) amax = std::max(amax, std::abs(qg[i]));
    uq[size_t(jg)] = qdev::uniform_query(amax, h);
    int32_t sum = 0;
    for (int i = 0; i < G; ++i) sum += q8[size_t(jg * G + i)] = qdev::uniform_q8(qg[i], uq[size_t(jg)]);
    sums[size_t(jg)] = sum;
  }
  const bool bytes = l.bits == 2 && l.n_code % 4 == 0;
  if (bytes && p.n_q <= 4) {
    // [group, code byte, 256, 4]: a byte's Σ q8·c for each query side by
    // side (query j in lane j), so one 16-byte load per stored byte serves
    // the whole GQA group, as higgs_score_group4's table does.
    const int64_t n_pos = int64_t(l.n_group) * l.code_bytes;
    std::vector<int32_t> lut4(size_t(n_pos) * 256 * 4, 0);
    for (int j = 0; j < p.n_q; ++j)
      for (int g = 0; g < l.n_group; ++g)
        for (int b = 0; b < int(l.code_bytes); ++b) {
          const int32_t* qb = q8.data() + (int64_t(j) * l.n_group + g) * G + 4 * b;
          int32_t* e = lut4.data() + (int64_t(g) * l.code_bytes + b) * 256 * 4 + j;
          for (int v = 0; v < 256; ++v)
            e[4 * v] = qb[0] * (v & 3) + qb[1] * ((v >> 2) & 3) + qb[2] * ((v >> 4) & 3) + qb[3] * ((v >> 6) & 3);
        }
    // Per group the queries' factors and (n − 1)·Σ q8 side by side: a score
    // is (σ·factor)·float(2·dot − (n − 1)·sum), the same IEEE operations as
    // qdev::uniform_group_score, four queries at once.
    std::vector<float> factor4(size_t(l.n_group) * 4, 0.f);
    std::vector<int32_t> nsum4(size_t(l.n_group) * 4, 0);
    for (int j = 0; j < p.n_q; ++j)
      for (int g = 0; g < l.n_group; ++g) {
        const size_t jg = size_t(j) * l.n_group + g;
        factor4[size_t(g) * 4 + j] = uq[jg].factor;
        nsum4[size_t(g) * 4 + j] = (n - 1) * sums[jg];
      }
    for (int64_t i = 0; i < p.n_vec; ++i) {
      const uint8_t* rec = p.codes + i * stride;
      __m128 total = _mm_setzero_ps();
      for (int g = 0; g < l.n_group; ++g) {
        const uint8_t* cg = rec + size_t(g) * l.code_bytes;
        const int32_t* lg = lut4.data() + int64_t(g) * l.code_bytes * 256 * 4;
        const __m128i dot = l.code_bytes == 32 ? u4_byte_sums4<32>(cg, lg, 32) : u4_byte_sums4<0>(cg, lg, int(l.code_bytes));
        const __m128i in = _mm_sub_epi32(_mm_slli_epi32(dot, 1),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(nsum4.data() + size_t(g) * 4)));
        const __m128 sf = _mm_mul_ps(_mm_set1_ps(bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)))),
                                     _mm_loadu_ps(factor4.data() + size_t(g) * 4));
        total = _mm_add_ps(total, _mm_mul_ps(sf, _mm_cvtepi32_ps(in)));
      }
      alignas(16) float t4[4];
      _mm_store_ps(t4, total);
      for (int j = 0; j < p.n_q; ++j) p.scores[int64_t(j) * score_stride_of(p) + i] = t4[j];
    }
    return;
  }
  std::vector<int32_t> lut;  // [n_q · n_group][code_bytes][256]: Σ q8·c over a byte's 4 codes
  if (bytes) {
    lut.resize(size_t(n_qg * l.code_bytes) * 256);
    for (int64_t jg = 0; jg < n_qg; ++jg)
      for (int b = 0; b < int(l.code_bytes); ++b)
        for (int v = 0; v < 256; ++v) {
          int32_t a = 0;
          for (int k = 0; k < 4; ++k) a += q8[size_t(jg * G + 4 * b + k)] * ((v >> (2 * k)) & 3);
          lut[(size_t(jg * l.code_bytes) + b) * 256 + v] = a;
        }
  }
  std::vector<uint16_t> code(static_cast<size_t>(G));
  for (int64_t i = 0; i < p.n_vec; ++i) {
    const uint8_t* rec = p.codes + i * stride;
    for (int j = 0; j < p.n_q; ++j) {
      float total = 0;
      for (int g = 0; g < l.n_group; ++g) {
        const int64_t jg = int64_t(j) * l.n_group + g;
        const uint8_t* cg = rec + size_t(g) * l.code_bytes;
        int32_t dot = 0;
        if (bytes) {
          const int32_t* lg = lut.data() + size_t(jg * l.code_bytes) * 256;
          for (int b = 0; b < int(l.code_bytes); ++b) dot += lg[b * 256 + cg[b]];
        } else {
          unpack_codes(cg, l.n_code, l.bits, code.data());
          for (int k = 0; k < G; ++k) dot += q8[size_t(jg * G + k)] * int32_t(code[size_t(k)]);
        }
        const float sigma = bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)));
        total = qdev::f_add(total, qdev::uniform_group_score(sigma, uq[size_t(jg)], dot, sums[size_t(jg)], n));
      }
      p.scores[int64_t(j) * score_stride_of(p) + i] = total;
    }
  }
}

}  // namespace

void higgs_score_cpu(const QuantSpec& s, const ScoreParams& p) {
  const int dim = p.dim;
  int64_t stride = p.code_stride ? p.code_stride : int64_t(bytes_per_vector(s, dim));
  Grouped l = grouped_layout(s, dim);
  const HiggsGrid& grid = grid_of(s);
  const int d = s.grid_dim, G = l.group, n = grid.size;
  const int n_sub = dim / d;  // sub-vectors per record
  const std::vector<float>& signs = sign_vector(s, G);

  // q' = H(s ⊙ q) per group, for every query: [n_q, dim] f32
  std::vector<float> qr(size_t(p.n_q) * dim);
  for (int j = 0; j < p.n_q; ++j)
    for (int g = 0; g < l.n_group; ++g) {
      float* qg = qr.data() + size_t(j) * dim + size_t(g) * G;
      const float* src = p.q + int64_t(j) * dim + int64_t(g) * G;
      for (int i = 0; i < G; ++i) qg[i] = signs[size_t(i)] * src[i];
      hadamard_transform(qg, G);
    }

  if (s.uniform_levels) return uniform_score_cpu(s, l, qr.data(), p, stride);
  std::vector<uint16_t> code(static_cast<size_t>(n_sub));  // [n_sub] the record's grid indices
  // Tabulating costs n_sub·n·d per query; a record then costs n_sub lookups
  // instead of n_sub·d multiply-adds.
  const int64_t lut_size = int64_t(p.n_q) * n_sub * n;
  const bool use_lut = p.n_vec * d >= 2 * int64_t(n) && lut_size <= (int64_t(1) << 23);
  if (use_lut && l.bits == 8 && n == 256 && p.n_q >= 2 && p.n_q <= 4)
    return higgs_score_group4(l, grid, qr.data(), p.n_q, dim, p.codes, stride, p.n_vec, p.scores,
                              score_stride_of(p));
  if (use_lut) {
    std::vector<float> lut(static_cast<size_t>(lut_size));  // [n_q, n_sub, n] f32
    for (int j = 0; j < p.n_q; ++j)
      for (int sp = 0; sp < n_sub; ++sp) {
        const float* qs = qr.data() + size_t(j) * dim + size_t(sp) * d;
        float* row = lut.data() + (size_t(j) * n_sub + sp) * n;
        for (int c = 0; c < n; ++c) row[c] = 0.0f;
        for (int k = 0; k < d; ++k) {
          const float qk = qs[k];
          const float* pk = grid.points_t.data() + size_t(k) * n;
          for (int c = 0; c < n; ++c) row[c] += qk * pk[c];
        }
      }
    if (l.bits == 8 && n == 256) {  // a code per byte (EDEN*-256): index the table with the stored bytes
      for (int64_t i = 0; i < p.n_vec; ++i) {
        const uint8_t* rec = p.codes + i * stride;
        for (int j = 0; j < p.n_q; ++j) {
          const float* lj = lut.data() + size_t(j) * n_sub * n;
          float total = 0;
          for (int g = 0; g < l.n_group; ++g) {
            const float sigma = bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)));
            const uint8_t* cg = rec + size_t(g) * l.code_bytes;
            const float* lg = lj + size_t(g) * l.n_code * 256;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            int sp = 0;
            for (; sp + 4 <= l.n_code; sp += 4) {
              a0 += lg[size_t(sp) * 256 + cg[sp]];
              a1 += lg[size_t(sp + 1) * 256 + cg[sp + 1]];
              a2 += lg[size_t(sp + 2) * 256 + cg[sp + 2]];
              a3 += lg[size_t(sp + 3) * 256 + cg[sp + 3]];
            }
            for (; sp < l.n_code; ++sp) a0 += lg[size_t(sp) * 256 + cg[sp]];
            total += sigma * ((a0 + a1) + (a2 + a3));
          }
          p.scores[int64_t(j) * score_stride_of(p) + i] = total;
        }
      }
      return;
    }
    for (int64_t i = 0; i < p.n_vec; ++i) {
      const uint8_t* rec = p.codes + i * stride;
      for (int g = 0; g < l.n_group; ++g)
        unpack_codes(rec + size_t(g) * l.code_bytes, l.n_code, l.bits, code.data() + size_t(g) * l.n_code);
      if (!is_power_of_two(n))  // only then can a stored index exceed the table
        for (int sp = 0; sp < n_sub; ++sp)
          KVT_CHECK(code[size_t(sp)] < n, "score {}: code {} >= grid size {} in vector {}", to_string(s),
                    code[size_t(sp)], n, i);
      for (int j = 0; j < p.n_q; ++j) {
        const float* lj = lut.data() + size_t(j) * n_sub * n;
        float total = 0;
        for (int g = 0; g < l.n_group; ++g) {
          float sigma = bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)));
          const uint16_t* cg = code.data() + size_t(g) * l.n_code;
          const float* lg = lj + size_t(g) * l.n_code * n;
          float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          int sp = 0;
          for (; sp + 4 <= l.n_code; sp += 4) {
            a0 += lg[size_t(sp) * n + cg[sp]];
            a1 += lg[size_t(sp + 1) * n + cg[sp + 1]];
            a2 += lg[size_t(sp + 2) * n + cg[sp + 2]];
            a3 += lg[size_t(sp + 3) * n + cg[sp + 3]];
          }
          for (; sp < l.n_code; ++sp) a0 += lg[size_t(sp) * n + cg[sp]];
          total += sigma * ((a0 + a1) + (a2 + a3));
        }
        p.scores[int64_t(j) * score_stride_of(p) + i] = total;
      }
    }
    return;
  }
  // Few records: rebuild each in the rotated domain and dot with q'.
  std::vector<float> y(static_cast<size_t>(dim));  // [dim] f32, σ·grid[code] per group
  for (int64_t i = 0; i < p.n_vec; ++i) {
    const uint8_t* rec = p.codes + i * stride;
    for (int g = 0; g < l.n_group; ++g) {
      float sigma = bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)));
      unpack_codes(rec + size_t(g) * l.code_bytes, l.n_code, l.bits, code.data());
      for (int sp = 0; sp < l.n_code; ++sp) {
        uint32_t c = code[size_t(sp)];
        KVT_CHECK(c < uint32_t(n), "score {}: code {} >= grid size {} in vector {}", to_string(s), c, n, i);
        for (int k = 0; k < d; ++k) y[size_t(g) * G + size_t(sp) * d + k] = sigma * grid.points[size_t(c) * d + k];
      }
    }
    for (int j = 0; j < p.n_q; ++j) p.scores[int64_t(j) * score_stride_of(p) + i] = dot_f32(qr.data() + size_t(j) * dim, y.data(), dim);
  }
}

}  // namespace kvtier
