#include "kv/key_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <cblas.h>

#include "core/half.h"
#include "core/status.h"
#include "kv/selector.h"
#include "ops/quant/residual_quant.h"

// LAPACK (shipped inside OpenBLAS; Debian installs no lapacke.h for it).
extern "C" void dsyevr_(const char* jobz, const char* range, const char* uplo, const int* n, double* a,
                        const int* lda, const double* vl, const double* vu, const int* il, const int* iu,
                        const double* abstol, int* m, double* w, double* z, const int* ldz, int* isuppz,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info);

namespace kvtier {

std::vector<float> svd_basis_from_gram(std::vector<double>& gram, int width, int rank) {
  KVT_CHECK(rank >= 1 && rank <= width && gram.size() == size_t(width) * width, "key svd: rank {} width {}", rank,
            width);
  // Only the `rank` largest eigenpairs (LAPACK's MRRR, dsyevr): the full
  // decomposition (dsyev) took ~1 s per layer at width 1024.
  int n = width, lda = width, il = width - rank + 1, iu = width, m = 0, info = 0, lwork = -1, liwork = -1;
  const double vl = 0, vu = 0, abstol = 0;
  std::vector<double> w(static_cast<size_t>(width)), z(static_cast<size_t>(width) * rank);
  std::vector<int> isuppz(2 * size_t(rank));
  double wq = 0;
  int iwq = 0;
  // Row-major upper == column-major lower of the same (symmetric) matrix.
  dsyevr_("V", "I", "L", &n, gram.data(), &lda, &vl, &vu, &il, &iu, &abstol, &m, w.data(), z.data(), &lda,
          isuppz.data(), &wq, &lwork, &iwq, &liwork, &info);
  lwork = std::max(1, int(wq));
  liwork = std::max(1, iwq);
  std::vector<double> work(static_cast<size_t>(lwork));
  std::vector<int> iwork(static_cast<size_t>(liwork));
  dsyevr_("V", "I", "L", &n, gram.data(), &lda, &vl, &vu, &il, &iu, &abstol, &m, w.data(), z.data(), &lda,
          isuppz.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
  KVT_CHECK(info == 0 && m == rank, "key svd: LAPACK dsyevr failed (info={}, {} of {} eigenvectors)", info, m, rank);
  // Column-major eigenvectors, ascending eigenvalue: column j is
  // z[j*width .. +width). The largest first.
  std::vector<float> basis(size_t(rank) * width);
  for (int r = 0; r < rank; ++r) {
    const double* ev = z.data() + size_t(rank - 1 - r) * width;
    for (int d = 0; d < width; ++d) basis[size_t(r) * width + d] = float(ev[d]);
  }
  return basis;
}

KeySvd key_svd(const float* k_pre, int64_t n_tok, int width, int rank) {
  KVT_CHECK(rank >= 1 && rank <= width, "key svd: rank {} outside [1, {}]", rank, width);
  KeySvd s;
  s.rank = rank;
  s.width = width;
  s.n_tok = n_tok;
  // Gram matrix in f64 (row blocks converted on the fly): its eigenvectors are
  // the right singular vectors of k_pre, its eigenvalues the squared singular values.
  std::vector<double> gram(size_t(width) * width, 0.0);  // [width, width]
  const int64_t block = 1024;
  std::vector<double> tmp(size_t(block) * width);
  for (int64_t r0 = 0; r0 < n_tok; r0 += block) {
    int64_t nb = std::min(block, n_tok - r0);
    for (int64_t i = 0; i < nb * width; ++i) tmp[i] = k_pre[r0 * width + i];
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, width, int(nb), 1.0, tmp.data(), width,
                1.0, gram.data(), width);
  }
  s.basis = svd_basis_from_gram(gram, width, rank);
  s.proj.resize(size_t(n_tok) * rank);
  // proj = k_pre · basisᵀ   [n_tok, rank]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_tok), rank, width, 1.0f, k_pre,
              width, s.basis.data(), width, 0.0f, s.proj.data(), rank);
  return s;
}

void key_svd_reconstruct(const KeySvd& s, const int64_t* tok, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    KVT_CHECK(tok[i] >= 0 && tok[i] < s.n_tok, "key svd: token {} outside [0, {})", tok[i],
              s.n_tok);
    const float* pr = s.proj.data() + tok[i] * s.rank;
    float* o = out + i * s.width;
    std::fill(o, o + s.width, 0.0f);
    for (int r = 0; r < s.rank; ++r) {
      const float c = pr[r];
      const float* b = s.basis.data() + size_t(r) * s.width;
      for (int d = 0; d < s.width; ++d) o[d] += c * b[d];
    }
  }
}

namespace {
void round_bf16(std::vector<float>& x) {
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
}
}  // namespace

KeyIndex::KeyIndex(const PolicyConfig& p, const KvGeometry& g) : p_(p), g_(g) {
  KVT_CHECK(p.index != IndexKind::none, "key index: dense policy has no index");
  chunk_ = p.index == IndexKind::exact ? 1 : p.chunk;
  unit_ = p.residual ? chunk_ * p.res_m : chunk_;
  const int L = g.n_layer;
  n_chunks_.assign(L, 0);
  pending_.resize(L);
  n_appended_.assign(L, 0);
  mirror_.resize(L);
  if (p.index == IndexKind::landmarks || p.index == IndexKind::shadowkv) {
    if (p.residual) {
      res_codes_.resize(L);
    } else {
      const std::string lm = to_string(resolved_lm_spec(p.lm, g.head_dim));
      for (int l = 0; l < L; ++l) lm_codes_.emplace_back(lm, g.head_dim);
    }
  }
  outliers_.assign(L, std::vector<std::vector<int64_t>>(g.n_kv_head));
  if (p.index == IndexKind::shadowkv) {
    KVT_CHECK(bool(g.apply_rope),
              "kv policy shadowkv: rebuilding keys from the SVD needs the model's RoPE "
              "(KvGeometry::apply_rope is unset)");
    prompt_pre_.resize(L);
    prompt_post_.resize(L);
  }
}

void KeyIndex::append(int layer, const float* k_pre, const float* k, int64_t n_tok) {
  const int64_t width = int64_t(g_.n_kv_head) * g_.head_dim;
  if (p_.index == IndexKind::shadowkv && svd_.empty()) {
    KVT_CHECK(k_pre, "kv shadowkv: append needs pre-RoPE keys (k_pre is null)");
    prompt_pre_[layer].insert(prompt_pre_[layer].end(), k_pre, k_pre + n_tok * width);
    prompt_post_[layer].insert(prompt_post_[layer].end(), k, k + n_tok * width);
  }
  pending_[layer].insert(pending_[layer].end(), k, k + n_tok * width);
  n_appended_[layer] += n_tok;
  index_units(layer);
}

void KeyIndex::index_units(int layer) {
  const int H = g_.n_kv_head, D = g_.head_dim;
  const int64_t width = int64_t(H) * D;
  std::vector<float>& pend = pending_[layer];
  const int64_t n_units = int64_t(pend.size()) / width / unit_;
  if (n_units == 0) return;
  const int64_t n_new_chunks = n_units * unit_ / chunk_;
  // Chunk means: [n_new_chunks, H, D]
  std::vector<float> lm(size_t(n_new_chunks) * width, 0.0f);
  for (int64_t c = 0; c < n_new_chunks; ++c) {
    float* dst = lm.data() + c * width;
    for (int t = 0; t < chunk_; ++t) {
      const float* src = pend.data() + (c * chunk_ + t) * width;
      for (int64_t i = 0; i < width; ++i) dst[i] += src[i];
    }
    for (int64_t i = 0; i < width; ++i) dst[i] /= float(chunk_);
  }
  std::vector<float>& mirror = mirror_[layer];
  const size_t old = mirror.size();
  mirror.resize(old + lm.size());
  float* mir = mirror.data() + old;
  if (p_.index == IndexKind::exact) {
    std::copy(lm.begin(), lm.end(), mir);
  } else if (!p_.residual) {
    lm_codes_[layer].append(lm.data(), n_new_chunks * H);
    lm_codes_[layer].decode(lm_codes_[layer].size() - n_new_chunks * H, n_new_chunks * H, mir);
  } else {
    // Residual landmarks (ops/quant/residual_quant.h): per KV head, m
    // consecutive landmarks share a quantized meta-landmark (their mean) and
    // each keeps a quantized residual against the dequantized meta.
    const int m = p_.res_m;
    ResidualSpec rs;
    rs.meta = resolved_lm_spec(p_.res_meta, D);
    rs.resid = resolved_lm_spec(p_.res, D);
    rs.group = m;
    const size_t meta_b = bytes_per_vector(rs.meta, D), res_b = bytes_per_vector(rs.resid, D);
    std::vector<float> x(size_t(m) * D), rec(size_t(m) * D);  // [m, head_dim]
    std::vector<uint8_t> meta_code(meta_b), res_code(size_t(m) * res_b);
    for (int64_t u = 0; u < n_units; ++u)
      for (int h = 0; h < H; ++h) {
        for (int j = 0; j < m; ++j)
          std::copy_n(lm.data() + (u * m + j) * width + h * D, D, x.data() + j * D);
        quantize_residual(rs, x.data(), m, D, meta_code.data(), res_code.data());
        dequantize_residual(rs, meta_code.data(), res_code.data(), m, D, rec.data());
        res_codes_[layer].insert(res_codes_[layer].end(), meta_code.begin(), meta_code.end());
        res_codes_[layer].insert(res_codes_[layer].end(), res_code.begin(), res_code.end());
        for (int j = 0; j < m; ++j)
          std::copy_n(rec.data() + j * D, D, mir + (u * m + j) * width + h * D);
      }
  }
  n_chunks_[layer] += n_new_chunks;
  pend.erase(pend.begin(), pend.begin() + n_units * unit_ * width);
}

void KeyIndex::finish_prompt() {
  if (p_.index != IndexKind::shadowkv || !svd_.empty()) return;
  const int H = g_.n_kv_head, D = g_.head_dim;
  const int width = H * D;
  const int rank = resolved_rank(p_, width);
  svd_.resize(g_.n_layer);
  for (int l = 0; l < g_.n_layer; ++l) {
    const int64_t n = n_appended_[l];
    svd_[l] = key_svd(prompt_pre_[l].data(), n, width, rank);
    // GPU copy in bf16 as ShadowKV holds it, f32 for exact reference runs.
    if (p_.kv.kind != QuantKind::f32) {
      round_bf16(svd_[l].basis);
      round_bf16(svd_[l].proj);
    }
    // Outlier chunks (ShadowKV): per KV head, the chunks whose keys are least
    // similar to their mean — min over the chunk of cos(key, mean) — lowest first.
    const int64_t n_chunk = n / chunk_;
    const float* post = prompt_post_[l].data();
    for (int h = 0; h < H; ++h) {
      std::vector<std::pair<float, int64_t>> cos_min(n_chunk);
      std::vector<float> mean(D);
      for (int64_t c = 0; c < n_chunk; ++c) {
        std::fill(mean.begin(), mean.end(), 0.0f);
        for (int t = 0; t < chunk_; ++t)
          for (int d = 0; d < D; ++d) mean[d] += post[((c * chunk_ + t) * H + h) * D + d];
        double mn = 0;
        for (int d = 0; d < D; ++d) mn += double(mean[d]) * mean[d];
        float worst = 2.0f;
        for (int t = 0; t < chunk_; ++t) {
          const float* k = post + ((c * chunk_ + t) * H + h) * D;
          double dot = 0, kn = 0;
          for (int d = 0; d < D; ++d) {
            dot += double(k[d]) * mean[d];
            kn += double(k[d]) * k[d];
          }
          double den = std::sqrt(mn * kn);
          worst = std::min(worst, den > 0 ? float(dot / den) : 1.0f);
        }
        cos_min[c] = {worst, c};
      }
      const int64_t n_out = std::min<int64_t>(p_.outliers, n_chunk);
      std::partial_sort(cos_min.begin(), cos_min.begin() + n_out, cos_min.end());
      std::vector<int64_t>& out = outliers_[l][h];
      for (int64_t i = 0; i < n_out; ++i) out.push_back(cos_min[i].second);
      std::sort(out.begin(), out.end());
    }
    std::vector<float>().swap(prompt_pre_[l]);
    std::vector<float>().swap(prompt_post_[l]);
  }
}

void KeyIndex::score(int layer, const float* q, float scale, int64_t n_chunk, float* out,
                     const std::vector<std::vector<int64_t>>* only) const {
  const int H = g_.n_kv_head, D = g_.head_dim, QH = g_.n_head;
  const int group = QH / H;
  KVT_CHECK(n_chunk <= n_chunks_[layer], "key index: {} chunks asked, {} indexed", n_chunk,
            n_chunks_[layer]);
  const float* mir = mirror_[layer].data();  // [n_chunk, n_kv_head, head_dim] f32
  std::vector<float> raw(size_t(QH) * n_chunk);  // [n_head, n_chunk]
  // One GEMV per query head against its KV head's landmark rows (stride
  // n_kv_head * D): a GEMM with 1-2 query rows would pack all the rows first.
  // U<n> landmarks score in integers from their codes (quant_format.h), as
  // the decode step's score_rows does; the others are the mirror's dot products.
  const bool integer = !lm_codes_.empty() && lm_codes_[size_t(layer)].spec().uniform_levels;
  for (int h = 0; h < QH && n_chunk > 0; ++h) {
    float* r = raw.data() + size_t(h) * n_chunk;
    if (integer) {
      const CodedRows& rows = lm_codes_[size_t(layer)];
      ScoreParams sp;
      sp.q = q + size_t(h) * D;
      sp.codes = rows.row(h / group);
      sp.code_stride = int64_t(H) * int64_t(rows.row_bytes());
      sp.n_vec = n_chunk;
      sp.dim = D;
      sp.scores = r;
      kvtier::score(rows.spec(), sp);
      for (int64_t c = 0; c < n_chunk; ++c) r[c] *= scale;
    } else {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(n_chunk), D, scale, mir + size_t(h / group) * D, H * D,
                  q + size_t(h) * D, 1, 0.0f, r, 1);
    }
  }
  if (only) {
    std::vector<uint8_t> in(static_cast<size_t>(n_chunk));
    for (int h = 0; h < QH; ++h) {
      if (h % group == 0) {
        std::fill(in.begin(), in.end(), 0);
        for (int64_t c : (*only)[size_t(h / group)])
          if (c < n_chunk) in[size_t(c)] = 1;
      }
      for (int64_t c = 0; c < n_chunk; ++c)
        if (!in[size_t(c)]) raw[size_t(h) * n_chunk + c] = -std::numeric_limits<float>::infinity();
    }
  }
  aggregate_gqa(p_.gqa, QH, H, n_chunk, raw.data(), out);
}

void KeyIndex::reconstruct_keys(int layer, const int64_t* tok, int64_t n, float* out) const {
  key_svd_reconstruct(svd_[layer], tok, n, out);
  g_.apply_rope(out, tok, n);
}

int64_t KeyIndex::gpu_bytes() const {
  int64_t b = 0;
  for (const CodedRows& c : lm_codes_) b += c.bytes();
  for (const auto& c : res_codes_) b += int64_t(c.size());
  if (p_.index == IndexKind::exact)
    for (const auto& m : mirror_) b += int64_t(m.size()) * 2;  // exact keys, bf16 on the GPU
  for (const KeySvd& s : svd_) b += int64_t(s.basis.size() + s.proj.size()) * 2;
  return b;
}

}  // namespace kvtier
