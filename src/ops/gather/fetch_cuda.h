// CUDA fetch_rows (contract in fetch.h): the slot cache.
#pragma once
#include "ops/gather/fetch.h"

namespace kvtier::cuda {

int64_t fetch_scratch_bytes(const FetchParams& p);
void fetch_rows(const Exec& x, const FetchParams& p, const int32_t* sel, const FetchRows& r, FetchView* view);

}  // namespace kvtier::cuda
