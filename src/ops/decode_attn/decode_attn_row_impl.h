// The decode-attention row kernel, written once over a SIMD traits struct S
// (S::W f32 lanes) and instantiated by each ISA's translation unit
// (decode_attn_avx2.cpp, decode_attn_avx512.cpp). Those TUs include this file
// INSIDE an anonymous namespace, after <immintrin.h> and
// decode_attn_kernels.h, so every function here has internal linkage and
// carries only its own TU's target flags (no inline code is shared between
// ISAs: the linker can never pick an AVX-512 copy for the AVX2 path).
//
// Per tile of kTile slots (flash-decoding's online softmax):
//   1. widen the tile's keys to f32 in L1 (once, shared by the group's heads);
//   2. scores of every head: 8 tokens at a time, one accumulator per token,
//      reduced across lanes together;
//   3. new running max, rescale the accumulators, p = exp(s - max);
//   4. acc[h] += p[h][t] · V[t], V widened in registers once per token and
//      shared by up to 8 heads.
// FP8 (E4M3) is widened through f16 (sign | magnitude << 7 is the same value
// × 2^-8, subnormals included), the 2^8 folded into the query scale for K and
// into the final normalization for V. The E4M3 NaN code reads as 480.
//
// S provides: V, W, zero, set1, load, store, add, sub, mul, fma, max,
// first (lane 0), hmax, hsum, exp, reduce8 (8 vectors → their 8 lane sums),
// load_bf16 / load_fp8 (W elements → f32).

constexpr float kNegInf = -__builtin_inff();

// Element kinds: kE 0 bf16, 1 FP8-E4M3, 2 f32.
template <int kE>
constexpr int64_t elt_bytes() {
  return kE == 1 ? 1 : kE == 2 ? 4 : 2;
}

template <class S, int kE>
inline typename S::V load_elt(const uint8_t* p) {
  if constexpr (kE == 1) return S::load_fp8(p);
  else if constexpr (kE == 2) return S::load(reinterpret_cast<const float*>(p));
  else return S::load_bf16(p);
}

inline float max_f(float a, float b) { return a > b ? a : b; }

// acc[j] (j < NH) += p[j][t] · V[t] over the tile's nt tokens. acc: [NH, D]
// (row stride D), p: [NH, kTile].
template <class S, int kE, int NH>
void accumulate_values(float* acc, const float* p, const uint8_t* const* vrow, int nt, int D) {
  using V = typename S::V;
  constexpr int64_t eb = elt_bytes<kE>();
  for (int c = 0; c < D; c += S::W) {
    V a[NH];
    for (int j = 0; j < NH; ++j) a[j] = S::load(acc + j * D + c);
    for (int i = 0; i < nt; ++i) {
      const V v = load_elt<S, kE>(vrow[i] + c * eb);
      for (int j = 0; j < NH; ++j) a[j] = S::fma(S::set1(p[j * kTile + i]), v, a[j]);
    }
    for (int j = 0; j < NH; ++j) S::store(acc + j * D + c, a[j]);
  }
}

template <class S, int kE>
void accumulate_values_any(float* acc, const float* p, const uint8_t* const* vrow, int nt, int G, int D) {
  for (int h0 = 0; h0 < G; h0 += 8) {
    float* a = acc + int64_t(h0) * D;
    const float* ph = p + int64_t(h0) * kTile;
    switch (G - h0 < 8 ? G - h0 : 8) {
      case 1: accumulate_values<S, kE, 1>(a, ph, vrow, nt, D); break;
      case 2: accumulate_values<S, kE, 2>(a, ph, vrow, nt, D); break;
      case 3: accumulate_values<S, kE, 3>(a, ph, vrow, nt, D); break;
      case 4: accumulate_values<S, kE, 4>(a, ph, vrow, nt, D); break;
      case 5: accumulate_values<S, kE, 5>(a, ph, vrow, nt, D); break;
      case 6: accumulate_values<S, kE, 6>(a, ph, vrow, nt, D); break;
      case 7: accumulate_values<S, kE, 7>(a, ph, vrow, nt, D); break;
      default: accumulate_values<S, kE, 8>(a, ph, vrow, nt, D); break;
    }
  }
}

template <class S, int kE>
void row_kernel(const RowJob& j) {
  using V = typename S::V;
  constexpr int W = S::W;
  constexpr bool kFp8 = kE == 1;
  constexpr int64_t eb = elt_bytes<kE>();
  const int D = j.head_dim, G = j.n_qh;
  float* ktile = j.scratch;                 // [kTile, D] widened keys
  float* qs = ktile + int64_t(kTile) * D;   // [G, D] q · scale (· 2^8 for FP8)
  float* acc = qs + int64_t(G) * D;         // [G, D] unnormalized output
  float* p = acc + int64_t(G) * D;          // [G, kTile] scores, then probabilities
  float* m_run = p + int64_t(G) * kTile;    // [G]
  float* l_run = m_run + G;                 // [G]
  const V qscale = S::set1(kFp8 ? j.scale * 256.f : j.scale);
  for (int64_t i = 0; i < int64_t(G) * D; i += W) {
    S::store(qs + i, S::mul(S::load(j.q + i), qscale));
    S::store(acc + i, S::zero());
  }
  for (int h = 0; h < G; ++h) {
    m_run[h] = kNegInf;
    l_run[h] = 0.f;
  }
  const uint8_t* krow[kTile];
  const uint8_t* vrow[kTile];
  int64_t e = 0;
  while (e < j.n_tok) {
    int nt = 0;
    for (; e < j.n_tok && nt < kTile; ++e) {
      const int64_t slot = j.idx ? j.idx[e] : e;
      if (slot < 0) continue;
      krow[nt] = j.k + slot * j.tok_stride;
      vrow[nt] = j.v + slot * j.tok_stride;
      ++nt;
    }
    if (nt == 0) break;
    const int nt8 = (nt + 7) & ~7;
    // 1. keys → f32 tile (rows past nt zero, their scores masked below)
    for (int i = 0; i < nt; ++i)
      for (int c = 0; c < D; c += W) S::store(ktile + i * D + c, load_elt<S, kE>(krow[i] + c * eb));
    for (int i = nt; i < nt8; ++i)
      for (int c = 0; c < D; c += W) S::store(ktile + i * D + c, S::zero());
    for (int h = 0; h < G; ++h) {
      // 2. scores
      const float* qh = qs + int64_t(h) * D;
      float* ph = p + int64_t(h) * kTile;
      for (int t0 = 0; t0 < nt8; t0 += 8) {
        V a[8];
        for (int i = 0; i < 8; ++i) a[i] = S::zero();
        const float* kt = ktile + int64_t(t0) * D;
        for (int c = 0; c < D; c += W) {
          const V qv = S::load(qh + c);
          for (int i = 0; i < 8; ++i) a[i] = S::fma(qv, S::load(kt + i * D + c), a[i]);
        }
        S::reduce8(a, ph + t0);
      }
      for (int i = nt; i < kTile; ++i) ph[i] = kNegInf;
      // 3. online softmax
      V mv = S::load(ph);
      for (int i = W; i < kTile; i += W) mv = S::max(mv, S::load(ph + i));
      const float m_new = max_f(m_run[h], S::hmax(mv));
      const float alpha = S::first(S::exp(S::set1(m_run[h] - m_new)));
      const V mvec = S::set1(m_new);
      V sv = S::zero();
      for (int i = 0; i < kTile; i += W) {
        const V pe = S::exp(S::sub(S::load(ph + i), mvec));
        S::store(ph + i, pe);
        sv = S::add(sv, pe);
      }
      l_run[h] = l_run[h] * alpha + S::hsum(sv);
      if (alpha != 1.f) {
        const V av = S::set1(alpha);
        float* ah = acc + int64_t(h) * D;
        for (int c = 0; c < D; c += W) S::store(ah + c, S::mul(S::load(ah + c), av));
      }
      m_run[h] = m_new;
    }
    // 4. values
    accumulate_values_any<S, kE>(acc, p, vrow, nt, G, D);
  }
  for (int h = 0; h < G; ++h) {
    const bool any = l_run[h] > 0.f;
    const V inv = S::set1(any ? (kFp8 ? 256.f : 1.f) / l_run[h] : 0.f);
    for (int c = 0; c < D; c += W)
      S::store(j.out + int64_t(h) * D + c, S::mul(S::load(acc + int64_t(h) * D + c), inv));
    j.max[h] = any ? m_run[h] : kNegInf;
    j.sum[h] = l_run[h];
  }
}

template <class S>
void exp_array(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(y + i, S::exp(S::load(x + i)));
  for (; i < n; ++i) y[i] = S::first(S::exp(S::set1(x[i])));
}
