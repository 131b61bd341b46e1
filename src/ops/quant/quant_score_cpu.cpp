// score(): q·dequant(record) for many records, the hot path of the CPU key
// index. HIGGS scores in its rotated domain (higgs_cpu.cpp); the other
// formats decode a record once into a small f32 buffer and dot it with every
// query (AVX2), so a record is read once however many queries there are.
#include <vector>

#include "ops/quant/higgs_quant.h"
#include "ops/quant/quant_cpu_detail.h"
#include "ops/quant/quant_layout.h"

namespace kvtier {

void score(const QuantSpec& spec, const ScoreParams& p) {
  size_t bpv = bytes_per_vector(spec, p.dim);
  KVT_CHECK(p.n_q >= 1 && p.n_vec >= 0, "score {}: {} queries, {} vectors", to_string(spec), p.n_q, p.n_vec);
  KVT_CHECK(p.code_stride == 0 || p.code_stride >= int64_t(bpv),
            "score {}: record stride {} is shorter than a record ({} bytes)", to_string(spec), p.code_stride, bpv);
  KVT_CHECK(p.score_stride == 0 || p.n_q == 1 || p.score_stride >= p.n_vec,
            "score {}: score stride {} is shorter than the {} records", to_string(spec), p.score_stride, p.n_vec);
  if (spec.kind == QuantKind::higgs) return higgs_score_cpu(spec, p);
  int64_t stride = p.code_stride ? p.code_stride : int64_t(bpv);
  std::vector<float> k(static_cast<size_t>(p.dim));  // [dim] f32, one decoded record
  for (int64_t i = 0; i < p.n_vec; ++i) {
    const uint8_t* rec = p.codes + i * stride;
    dequantize_one_cpu(spec, rec, p.dim, k.data());
    for (int j = 0; j < p.n_q; ++j) p.scores[int64_t(j) * score_stride_of(p) + i] = dot_f32(p.q + int64_t(j) * p.dim, k.data(), p.dim);
  }
}

}  // namespace kvtier
