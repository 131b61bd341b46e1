// What fetch_cuda.cu (the slot assignment and the entry points) and
// fetch_read_cuda.cu (the misses read from the host and decoded) share.
// Included by .cu files only.
#pragma once
#include <cstdint>

#include "ops/gather/fetch.h"

namespace kvtier::cuda::fetch_detail {

struct Scratch {
  int2* miss_list;      // [rows, kmax] (token, slot)
  int32_t* miss_count;  // [rows]
  uint8_t* miss;        // [rows, kmax]
  uint8_t* stage;       // [rows, kmax, stage_span] records read from the host (null: raw)
  int64_t stage_span;
  bool by_token = false;  // fetch_dense by copy: [kmax][tok_bytes], the host tier's layout
};

// Passes 2 and 3 over the listed misses, for fetch_rows, fetch_fill and
// fetch_dense (fetch_read_cuda.cu).
void read_misses(const Exec& x, const FetchParams& p, const FetchRows& r, const Scratch& sc, int64_t rows);

}  // namespace kvtier::cuda::fetch_detail
