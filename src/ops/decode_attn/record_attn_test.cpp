// decode_attn_records' contract on the CPU: which stores it takes, and the
// rotated-domain identities its CUDA kernel is built on, checked against the
// specification (records decoded by the CPU quantizer).
#include "ops/decode_attn/record_attn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/half.h"
#include "core/status.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

RecordFormat format_of(const char* spec, int dim) {
  const QuantSpec s = parse_quant_spec(spec);
  return RecordFormat{s, dim, int64_t(bytes_per_vector(s, dim))};
}

TEST(RecordAttn, TakesOneGroupOfByteCodesPerHead) {
  EXPECT_TRUE(record_attn_supported(format_of("higgs4:g128", 128), 128, 32, 8));
  EXPECT_TRUE(record_attn_supported(format_of("higgs4:g64:rs", 64), 64, 8, 1));
  EXPECT_FALSE(record_attn_supported(format_of("higgs4:g64", 128), 128, 32,
                                     8));  // two groups
  EXPECT_FALSE(record_attn_supported(format_of("higgs3:g128", 128), 128, 32,
                                     8));  // 6-bit codes
  EXPECT_FALSE(record_attn_supported(format_of("higgs4:g128", 128), 128, 64,
                                     4));  // GQA 16
  EXPECT_FALSE(record_attn_supported(format_of("bf16", 128), 128, 32, 8));
  EXPECT_FALSE(record_attn_supported(format_of("higgs4:g128", 128), 256, 32,
                                     8));  // a record per half head
  EXPECT_THROW(
      {
        RecordAttnParams p;
        p.fmt = format_of("fp8", 128);
        p.attn.head_dim = 128;
        p.attn.n_head = p.attn.n_kv_head = 1;
        decode_attn_records(Device(DeviceKind::cpu).exec(), p, nullptr, nullptr, nullptr, nullptr, nullptr);
      },
      Error);
}

// f64 Walsh–Hadamard transform, natural order, unnormalized.
void fwht(std::vector<double>& v) {
  for (size_t h = 1; h < v.size(); h *= 2)
    for (size_t i = 0; i < v.size(); i += 2 * h)
      for (size_t j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

// The kernel's formulation, in f64 on one row: the rotated query against the
// raw grid points, scaled per token by σ_k; the output accumulated from σ_v·g
// and rotated back. It equals the reference over decoded records.
TEST(RecordAttn, RotatedDomainEqualsTheDecodedRecords) {
  for (const char* spec_text : {"higgs4:g128", "higgs4:g128:rs", "higgs4:g64:rs"}) {
    SCOPED_TRACE(spec_text);
    const QuantSpec spec = parse_quant_spec(spec_text);
    const int D = spec.group, n_tok = 50;
    const RecordFormat fmt{spec, D, int64_t(bytes_per_vector(spec, D))};
    const int64_t entry = (2 * fmt.bytes + 15) / 16 * 16;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint8_t> store(size_t(n_tok * entry), 0);
    std::vector<float> x(static_cast<size_t>(D)), q(static_cast<size_t>(D));
    for (int t = 0; t < n_tok; ++t)
      for (int kv = 0; kv < 2; ++kv) {
        for (float& v : x) v = 2.f * nd(rng);
        quantize(spec, x.data(), 1, D, store.data() + t * entry + kv * fmt.bytes);
      }
    for (float& v : q) v = nd(rng);
    std::vector<int32_t> sel(static_cast<size_t>(n_tok));
    for (int t = 0; t < n_tok; ++t) sel[size_t(t)] = t % 9 == 2 ? -1 : (t * 7) % n_tok;
    RecordAttnParams p;
    p.attn.n_seq = p.attn.n_head = p.attn.n_kv_head = 1;
    p.attn.head_dim = D;
    p.attn.scale = 0.3f;
    p.attn.idx_stride = p.attn.n_tok_fixed = p.attn.n_tok_max = n_tok;
    p.fmt = fmt;
    p.entry_bytes = p.tok_bytes = entry;
    const uint8_t* host = store.data();
    std::vector<float> out(static_cast<size_t>(D)), lse(1);
    decode_attn_records(Device(DeviceKind::cpu).exec(), p, q.data(), &host, sel.data(), out.data(), lse.data());

    const HiggsGrid grid = higgs_grid(spec.grid_dim, spec.grid_size);
    std::vector<float> signs(static_cast<size_t>(D), 1.f);
    if (spec.random_signs) hadamard_signs(spec.sign_seed, D, signs.data());
    const double c = 1.0 / std::sqrt(double(D));
    std::vector<double> qr(static_cast<size_t>(D));
    for (int d = 0; d < D; ++d) qr[size_t(d)] = double(q[size_t(d)]) * signs[size_t(d)];
    fwht(qr);
    auto sigma = [&](const uint8_t* rec) {
      uint16_t b;
      std::memcpy(&b, rec + D / 2, 2);
      return double(bf16_to_f32(b));
    };
    std::vector<double> s;
    for (int t : sel) {
      if (t < 0) continue;
      const uint8_t* rec = store.data() + t * entry;
      double dot = 0;
      for (int i = 0; i < D / 2; ++i)
        for (int k = 0; k < 2; ++k) dot += qr[size_t(2 * i + k)] * grid.points[size_t(rec[i]) * 2 + k];
      s.push_back(c * sigma(rec) * dot * p.attn.scale);
    }
    double m = -INFINITY, l = 0;
    for (double v : s) m = std::max(m, v);
    std::vector<double> o(static_cast<size_t>(D), 0.0);
    size_t n = 0;
    for (int t : sel) {
      if (t < 0) continue;
      const uint8_t* rec = store.data() + t * entry + fmt.bytes;
      const double w = std::exp(s[n++] - m);
      l += w;
      for (int i = 0; i < D / 2; ++i)
        for (int k = 0; k < 2; ++k) o[size_t(2 * i + k)] += w * sigma(rec) * grid.points[size_t(rec[i]) * 2 + k];
    }
    fwht(o);
    for (int d = 0; d < D; ++d)
      EXPECT_NEAR(out[size_t(d)], c * o[size_t(d)] / l * signs[size_t(d)], 1e-5 * (1 + std::abs(out[size_t(d)]))) << d;
    EXPECT_NEAR(lse[0], m + std::log(l), 1e-5);
  }
}

}  // namespace
}  // namespace kvtier
