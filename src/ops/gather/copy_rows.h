// Copies n rows of row_bytes from src[i] to dst[i] (pointer tables; device
// addresses on CUDA, one launch), e.g. a layer's outlier tokens into the
// resident buffer. row_bytes a multiple of 16 on CUDA.
#pragma once
#include <cstdint>

#include "backend/device.h"

namespace kvtier {

void copy_rows(const Exec& x, int64_t n, int64_t row_bytes, const uint8_t* const* src, uint8_t* const* dst);

// Copies n contiguous rows of row_bytes from src to dst + (*pos + i)·dst_stride,
// the position read from device memory (a graph replays it at every step).
void copy_rows_at(const Exec& x, int64_t n, int64_t row_bytes, const void* src, void* dst, int64_t dst_stride,
                  const int64_t* pos);

}  // namespace kvtier
