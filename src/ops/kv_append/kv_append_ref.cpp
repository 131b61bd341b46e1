#include <cstring>
#include <vector>

#include "core/status.h"
#include "ops/kv_append/kv_append.h"
#include "ops/quant/quant_format.h"

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

}  // namespace kvtier
