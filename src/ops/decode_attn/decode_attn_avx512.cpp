// Decode-attention row kernel, AVX-512 F/BW/VL (16 f32 lanes). Compiled with
// its own target flags (src/ops/CMakeLists.txt); called only where
// cpu_supports(CpuPath::avx512). Built a second time over SIMDe's portable
// AVX-512 (KVT_EMULATE_AVX512) so that machines without AVX-512 test it too.
#include <cstdint>

#include "ops/cpu_isa_emulation.h"
#include "ops/decode_attn/decode_attn_kernels.h"

namespace kvtier::attn_kernels {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static float first(V v) { return _mm_cvtss_f32(_mm512_castps512_ps128(v)); }
  static __m256 halves_max(V v) {
    return _mm256_max_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static __m256 halves_sum(V v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static float hmax(V v) {
    const __m256 h = halves_max(v);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static float hsum(V v) {
    const __m256 h = halves_sum(v);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  // out[i] = sum of the lanes of a[i], i < 8: fold each to 8 lanes, then the
  // AVX2 transpose-add tree.
  static void reduce8(const V* a, float* out) {
    __m256 h[8];
    for (int i = 0; i < 8; ++i) h[i] = halves_sum(a[i]);
    const __m256 t0 = _mm256_hadd_ps(h[0], h[1]), t1 = _mm256_hadd_ps(h[2], h[3]);
    const __m256 t2 = _mm256_hadd_ps(h[4], h[5]), t3 = _mm256_hadd_ps(h[6], h[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                        _mm256_permute2f128_ps(u0, u1, 0x31)));
  }
  static V load_bf16(const uint8_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // E4M3 → f16 bits (sign | magnitude << 7) → f32: the value × 2^-8.
  static V load_fp8(const uint8_t* p) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
    const __m256i sgn = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    return _mm512_cvtph_ps(_mm256_or_si256(mag, sgn));
  }
  // e^x as in the AVX2 kernel (Cephes expf), 16 lanes.
  static V exp(V x) {
    const __mmask16 zero_mask = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.33654f));
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mask_blend_ps(zero_mask, _mm512_mul_ps(y, _mm512_castsi512_ps(n)), _mm512_setzero_ps());
  }
};

#include "ops/decode_attn/decode_attn_row_impl.h"

}  // namespace

void KVT_AVX512_NAME(row_avx512)(const RowJob* jobs, int n_jobs) {
  if (jobs[0].f32) row_kernel<Avx512, 2>(jobs, n_jobs);
  else if (jobs[0].fp8) row_kernel<Avx512, 1>(jobs, n_jobs);
  else row_kernel<Avx512, 0>(jobs, n_jobs);
}

void KVT_AVX512_NAME(exp_avx512)(const float* x, int64_t n, float* y) { exp_array<Avx512>(x, n, y); }

}  // namespace kvtier::attn_kernels
