// CUDA fetch_rows, fetch_fill and fetch_dense (contracts in fetch.h).
#pragma once
#include "ops/gather/fetch.h"

namespace kvtier::cuda {

int64_t fetch_scratch_bytes(const FetchParams& p);
void fetch_rows(const Exec& x, const FetchParams& p, const int32_t* sel, const FetchRows& r, FetchView* view);
void fetch_fill(const Exec& x, const FetchParams& p, const FetchRows& r, const int64_t* fill_n, int64_t max_fill);
void fetch_dense(const Exec& x, const FetchParams& p, const FetchRows& r, int64_t t0, int64_t t1, void* k_out,
                 void* v_out);

}  // namespace kvtier::cuda
