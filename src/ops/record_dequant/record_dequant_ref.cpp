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
        // Back to the CPU store's record: every group from a per-head entry
        // (only the head's group is there: the others decode as zeros).
        std::vector<uint8_t> rec(size_t(L.record_bytes), 0);
        for (int g = 0; g < L.n_group; ++g) {
          if (L.per_head && g != h) continue;
          const int eg = L.per_head ? 0 : g;
          std::memcpy(rec.data() + g * L.code_bytes, e + L.code_offset(eg, kv), size_t(L.code_bytes));
          std::memcpy(rec.data() + L.meta_offset + 2 * g, e + L.scale_offset(eg, kv), 2);
        }
        dequantize(s, rec.data(), 1, L.width, x.data());
        for (int d = 0; d < 128; ++d) out[kv * 128 + d] = f32_to_bf16(x[size_t(h * 128 + d)]);
      }
    }
}

}  // namespace kvtier
