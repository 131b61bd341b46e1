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

// One job's running state; scratch as scratch_floats() lays it out.
struct RowState {
  float *ktile, *qs, *acc, *p, *m_run, *l_run;
  int64_t e = 0;  // next entry of the job's list
};

template <class S, int kE>
RowState row_begin(const RowJob& j) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int D = j.head_dim, G = j.n_qh;
  RowState st;
  st.ktile = j.scratch;                      // [kTile, D] widened keys
  st.qs = st.ktile + int64_t(kTile) * D;     // [G, D] q · scale (· 2^8 for FP8)
  st.acc = st.qs + int64_t(G) * D;           // [G, D] unnormalized output
  st.p = st.acc + int64_t(G) * D;            // [G, kTile] scores, then probabilities
  st.m_run = st.p + int64_t(G) * kTile;      // [G]
  st.l_run = st.m_run + G;                   // [G]
  const V qscale = S::set1(kE == 1 ? j.scale * 256.f : j.scale);
  for (int64_t i = 0; i < int64_t(G) * D; i += W) {
    S::store(st.qs + i, S::mul(S::load(j.q + i), qscale));
    S::store(st.acc + i, S::zero());
  }
  for (int h = 0; h < G; ++h) {
    st.m_run[h] = kNegInf;
    st.l_run[h] = 0.f;
  }
  return st;
}

// The job's next tile of up to kTile slots; false when none is left.
template <class S, int kE>
bool row_tile(const RowJob& j, RowState& st) {
  using V = typename S::V;
  constexpr int W = S::W;
  constexpr int64_t eb = elt_bytes<kE>();
  const int D = j.head_dim, G = j.n_qh;
  const uint8_t* krow[kTile];
  const uint8_t* vrow[kTile];
  int nt = 0;
  for (; st.e < j.n_tok && nt < kTile; ++st.e) {
    const int64_t slot = j.idx ? j.idx[st.e] : st.e;
    if (slot < 0) continue;
    krow[nt] = j.k + slot * j.tok_stride;
    vrow[nt] = j.v + slot * j.tok_stride;
    ++nt;
  }
  if (nt == 0) return false;
  float* ktile = st.ktile;
  float* p = st.p;
  const int nt8 = (nt + 7) & ~7;
  // 1. keys → f32 tile (rows past nt zero, their scores masked below)
  for (int i = 0; i < nt; ++i)
    for (int c = 0; c < D; c += W) S::store(ktile + i * D + c, load_elt<S, kE>(krow[i] + c * eb));
  for (int i = nt; i < nt8; ++i)
    for (int c = 0; c < D; c += W) S::store(ktile + i * D + c, S::zero());
  for (int h = 0; h < G; ++h) {
    // 2. scores
    const float* qh = st.qs + int64_t(h) * D;
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
    const float m_new = max_f(st.m_run[h], S::hmax(mv));
    const float alpha = S::first(S::exp(S::set1(st.m_run[h] - m_new)));
    const V mvec = S::set1(m_new);
    V sv = S::zero();
    for (int i = 0; i < kTile; i += W) {
      const V pe = S::exp(S::sub(S::load(ph + i), mvec));
      S::store(ph + i, pe);
      sv = S::add(sv, pe);
    }
    st.l_run[h] = st.l_run[h] * alpha + S::hsum(sv);
    if (alpha != 1.f) {
      const V av = S::set1(alpha);
      float* ah = st.acc + int64_t(h) * D;
      for (int c = 0; c < D; c += W) S::store(ah + c, S::mul(S::load(ah + c), av));
    }
    st.m_run[h] = m_new;
  }
  // 4. values
  accumulate_values_any<S, kE>(st.acc, p, vrow, nt, G, D);
  return true;
}

template <class S, int kE>
void row_end(const RowJob& j, const RowState& st) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int D = j.head_dim, G = j.n_qh;
  for (int h = 0; h < G; ++h) {
    const bool any = st.l_run[h] > 0.f;
    const V inv = S::set1(any ? (kE == 1 ? 256.f : 1.f) / st.l_run[h] : 0.f);
    for (int c = 0; c < D; c += W)
      S::store(j.out + int64_t(h) * D + c, S::mul(S::load(st.acc + int64_t(h) * D + c), inv));
    j.max[h] = any ? st.m_run[h] : kNegInf;
    j.sum[h] = st.l_run[h];
  }
}

// The jobs tile by tile in turn: the KV heads of a token range are read
// together, so one core streams whole token rows (a head's slice of a row is
// a strided read that runs at a third of the bandwidth). Each job computes
// exactly what it computes alone.
template <class S, int kE>
void row_kernel(const RowJob* jobs, int n_jobs) {
  RowState st[kMaxRowJobs];
  for (int i = 0; i < n_jobs; ++i) st[i] = row_begin<S, kE>(jobs[i]);
  for (bool more = true; more;) {
    more = false;
    for (int i = 0; i < n_jobs; ++i) more |= row_tile<S, kE>(jobs[i], st[i]);
  }
  for (int i = 0; i < n_jobs; ++i) row_end<S, kE>(jobs[i], st[i]);
}

template <class S>
void exp_array(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(y + i, S::exp(S::load(x + i)));
  for (; i < n; ++i) y[i] = S::first(S::exp(S::set1(x[i])));
}
