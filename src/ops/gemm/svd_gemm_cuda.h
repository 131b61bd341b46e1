// CUDA versions of svd_gemm.h (cuBLASLt) and copy_rows.
#pragma once
#include <cstdint>

#include "backend/device.h"

namespace kvtier::cuda {

void gram_accumulate(const Exec& x, const void* k_bf16, int64_t n, int W, int64_t ld, float* G);
void project_rows(const Exec& x, const void* k_bf16, int64_t n, int W, int64_t ld, const uint16_t* basis, int rank,
                  uint16_t* out);
void copy_rows(const Exec& x, int64_t n, int64_t row_bytes, const uint8_t* const* src, uint8_t* const* dst);
void copy_rows_at(const Exec& x, int64_t n, int64_t row_bytes, const void* src, void* dst, int64_t dst_stride,
                  const int64_t* pos);

}  // namespace kvtier::cuda
