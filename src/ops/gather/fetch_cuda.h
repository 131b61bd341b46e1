// CUDA fetch_rows (contract in fetch.h): the slot cache.
#pragma once
#include "ops/gather/fetch.h"

namespace kvtier::cuda {

int64_t fetch_scratch_bytes(const FetchParams& p);
void fetch_rows(const Exec& x, const FetchParams& p, const int32_t* sel, const FetchRows& r, FetchView* view);
void fetch_fill(const Exec& x, const FetchParams& p, const FetchRows& r, const int64_t* fill_n, int64_t max_fill);

}  // namespace kvtier::cuda
