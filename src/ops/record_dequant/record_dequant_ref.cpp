#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/quant/quant_format.h"
#include "ops/record_dequant/record_dequant.h"

namespace kvtier {

void record_dequant_ref(const std::string& spec, const HiggsRecordLayout& L, const RecordDequantParams& p,
                        const uint8_t* src, const int32_t* idx, uint8_t* dst) {
  const QuantSpec s = parse_quant_spec(spec);
  KVT_CHECK(L.width == p.n_kv_head * 128, "record_dequant: width {} for {} heads of 128", L.width, p.n_kv_head);
  std::vector<float> x(static_cast<size_t>(L.width));
  for (int r = 0; r < p.n_rows; ++r)
    for (int j = 0; j < p.k; ++j) {
      const int32_t slot = idx[int64_t(r) * p.k + j];
      if (slot < 0) continue;
      const uint8_t* e = src + r * p.src_row_stride + slot * L.entry_bytes;
      uint16_t* out = reinterpret_cast<uint16_t*>(dst + r * p.dst_row_stride + int64_t(slot) * 4 * 128);
      const int h = r % p.n_kv_head;
      for (int kv = 0; kv < 2; ++kv) {
        dequantize(s, e + kv * L.record_bytes, 1, L.width, x.data());
        for (int d = 0; d < 128; ++d) out[kv * 128 + d] = f32_to_bf16(x[size_t(h * 128 + d)]);
      }
    }
}

}  // namespace kvtier
