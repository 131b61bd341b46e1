#include <cstring>
#include <vector>

#include "core/status.h"
#include "ops/kv_append/kv_append.h"
#include "ops/quant/quant_format.h"
#include "ops/quant/quant_layout.h"

namespace kvtier {

bool index_append_supports(const std::string& spec, int head_dim) {
  if (head_dim != 128) return false;
  const QuantSpec s = parse_quant_spec(spec);
  return s.kind == QuantKind::higgs && s.grid_dim == 4 && s.grid_size == 256 && (s.group == 0 || s.group == 128);
}

void index_append_ref(const std::string& spec, const IndexAppendParams& p, const float* k, uint8_t* index) {
  KVT_CHECK(index_append_supports(spec, 128), "index_append: landmark spec '{}' is not higgs2 with group 128", spec);
  const QuantSpec s = parse_quant_spec(spec);
  KVT_CHECK(bytes_per_vector(s, 128) == 34, "index_append: '{}' records are not 34 bytes", spec);
  uint8_t rec[34];
  for (int64_t t = 0; t < p.n_tok; ++t)
    for (int h = 0; h < p.n_kv_head; ++h) {
      quantize(s, k + (t * p.n_kv_head + h) * 128, 1, 128, rec);
      uint8_t* row = index + int64_t(h) * p.row_stride;
      std::memcpy(row + 32 * (p.pos0 + t), rec, 32);
      std::memcpy(row + p.scale_offset + 2 * (p.pos0 + t), rec + 32, 2);
    }
}

void entry_append_ref(const EntryAppendParams& p, const float* k, const float* v, uint8_t* dst) {
  const QuantSpec s = parse_quant_spec(p.elt == KvElt::fp8 ? "fp8" : "bf16");
  const int D = p.head_dim;
  const int64_t half = kv_entry_bytes(p.elt, D) / 2;
  for (int64_t t = 0; t < p.n_tok; ++t)
    for (int h = 0; h < p.n_kv_head; ++h) {
      uint8_t* e = dst + (p.pos0 + t) * p.tok_stride + int64_t(h) * p.row_stride;
      quantize(s, k + (t * p.n_kv_head + h) * D, 1, D, e);
      quantize(s, v + (t * p.n_kv_head + h) * D, 1, D, e + half);
    }
}

std::string higgs_record_unsupported(const std::string& spec, int n_kv_head, int head_dim) {
  const QuantSpec s = parse_quant_spec(spec);
  if (s.kind != QuantKind::higgs || s.grid_dim != 2 || s.grid_size != 256)
    return "the GPU decodes HIGGS host records of the EDEN2-256 grid (higgs4) only";
  if (head_dim != 128) return "HIGGS host records need head_dim 128 on the GPU";
  const int width = n_kv_head * head_dim;
  const int g = resolved_group(s, width);
  if (g < 128 || g > 8192 || width % g != 0)
    return "a HIGGS host group of " + std::to_string(g) + " (the GPU needs 128 ≤ G ≤ 8192 dividing the KV width)";
  return "";
}

HiggsRecordLayout higgs_record_layout(const std::string& spec, int width) {
  const QuantSpec s = parse_quant_spec(spec);
  KVT_CHECK(higgs_record_unsupported(spec, width / 128, 128).empty() && width % 128 == 0,
            "HIGGS host records: '{}' over {} values: {}", spec, width, higgs_record_unsupported(spec, width / 128, 128));
  const quant_layout::Grouped g = quant_layout::grouped_layout(s, width);
  HiggsRecordLayout L;
  L.width = width;
  L.group = g.group;
  L.n_group = g.n_group;
  L.code_bytes = int64_t(g.code_bytes);
  L.meta_offset = int64_t(g.meta_offset);
  L.record_bytes = int64_t(bytes_per_vector(s, width));
  L.per_head = L.group == 128;
  L.entry_bytes = L.per_head ? (2 * (L.code_bytes + 2) + 15) / 16 * 16 : (2 * L.record_bytes + 15) / 16 * 16;
  L.tok_bytes = L.per_head ? L.n_group * L.entry_bytes : L.entry_bytes;
  L.random_signs = s.random_signs;
  L.sign_seed = s.sign_seed;
  KVT_CHECK(L.code_bytes == L.group / 2 && L.record_bytes == L.meta_offset + 2 * L.n_group,
            "HIGGS host records: unexpected layout of '{}'", spec);
  return L;
}

void record_append_ref(const std::string& spec, int width, int64_t n_tok, int64_t pos0, int64_t tok_stride,
                       const float* k, const float* v, uint8_t* dst) {
  const HiggsRecordLayout L = higgs_record_layout(spec, width);
  const QuantSpec s = parse_quant_spec(spec);
  std::vector<uint8_t> rec(size_t(2 * L.record_bytes));  // the CPU store's K and V records
  for (int64_t t = 0; t < n_tok; ++t) {
    uint8_t* e = dst + (pos0 + t) * tok_stride;
    quantize(s, k + t * width, 1, width, rec.data());
    quantize(s, v + t * width, 1, width, rec.data() + L.record_bytes);
    std::memset(e, 0, size_t(L.tok_bytes));
    for (int w = 0; w < 2; ++w)
      for (int g = 0; g < L.n_group; ++g) {
        std::memcpy(e + L.code_offset(g, w), rec.data() + w * L.record_bytes + g * L.code_bytes, size_t(L.code_bytes));
        std::memcpy(e + L.scale_offset(g, w), rec.data() + w * L.record_bytes + L.meta_offset + 2 * g, 2);
      }
  }
}

}  // namespace kvtier
