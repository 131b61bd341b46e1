// CUDA kv_write (contracts in kv_write.h): bf16 inputs and device / mapped
// pinned pointers; every kernel is enqueued on x's stream, no host sync.
#pragma once
#include "ops/kv_append/kv_write.h"

namespace kvtier::cuda {

void resident_write(const Exec& x, const ResidentWriteParams& p, const void* k, const void* v, const int64_t* pos0,
                    uint8_t* const* rows);
void host_write(const Exec& x, const HostWriteParams& p, const void* k, const void* k_pre, const void* v,
                const int64_t* pos0, uint8_t* const* host, uint8_t* const* kplane, const int64_t* key_first);
void index_write(const Exec& x, const IndexWriteParams& p, const void* k, const int64_t* pos0, uint8_t* const* plane0,
                 uint8_t* const* plane1, uint8_t* const* resident, float* const* stats);
void round_rows(const Exec& x, const RecordFormat& fmt, void* rows, int64_t n, int64_t stride, const int64_t* pos);
// max |x| over n bf16 values into *amax (device f32, atomically max-ed; start it at 0).
void amax_bf16(const Exec& x, const void* v, int64_t n, float* amax);

}  // namespace kvtier::cuda
