// Appending a layer's new tokens to the offload tiers on the GPU: the CUDA
// half of TieredKvStore::append for the policies that decode natively on the
// GPU (gpu/gpu_tiered_kv.h). Two writers, each with a reference built on the
// CPU store's own quantizer (quant_format.h), so that a GPU index or host
// entry holds the records the CPU store would hold:
//  * index_append: each key (post-RoPE, one KV head, head_dim 128) quantized
//    as a "higgs2:g128" landmark (optionally with random signs) into the
//    planar GPU index of index_score.h — row h = KV head at h·row_stride,
//    token t's 32 code bytes at + 32·t, its bf16 scale at + scale_offset + 2·t.
//  * entry_append: per (token, KV head) one host entry K|V of head_dim
//    elements each, FP8-E4M3 (spec "fp8": RNE, saturating at ±448) or bf16,
//    at dst + t·tok_stride + h·row_stride.
//  * record_append: HIGGS host K/V records over the layer's whole KV width
//    (SPEC yakv's host K/V: EDEN2-256, Hadamard group = the largest power of
//    two dividing the width, or the spec's group ≥ 128). With a group larger
//    than a head: per token one entry, the K record, the V record, zeros up
//    to a multiple of 16 bytes. With group 128 (one group per head) the same
//    bytes are laid out per (token, KV head) instead, so that a head's gather
//    reads only its own group: K codes, V codes (64 bytes each), K scale,
//    V scale, zeros to 144 bytes. record_dequant (ops/record_dequant) reads
//    either back.
#pragma once
#include <cstdint>
#include <string>

#include "ops/decode_attn/decode_attn.h"

// The layout arithmetic below runs on the host and in the kernels.
#ifdef __CUDACC__
#define KVT_HOST_DEVICE __host__ __device__
#else
#define KVT_HOST_DEVICE
#endif

namespace kvtier {

struct IndexAppendParams {
  int n_kv_head = 0;
  int64_t n_tok = 0;         // new tokens
  int64_t pos0 = 0;          // token id of the first one
  int64_t row_stride = 0;    // bytes between KV-head rows of the index
  int64_t scale_offset = 0;  // bytes from a row's start to its scales plane
};

// Whether `spec` is a landmark spec index_append writes: HIGGS EDEN4-256 with
// a Hadamard group of 128 (or 0 = the whole head) for head_dim 128.
bool index_append_supports(const std::string& spec, int head_dim);

// k: [n_tok, n_kv_head, 128] f32; index: rows as above (bytes outside the
// new tokens' records are left alone).
void index_append_ref(const std::string& spec, const IndexAppendParams& p, const float* k, uint8_t* index);

struct EntryAppendParams {
  int n_kv_head = 0;
  int head_dim = 128;
  int64_t n_tok = 0;
  int64_t pos0 = 0;
  KvElt elt = KvElt::fp8;
  int64_t tok_stride = 0;  // bytes between tokens' entries
  int64_t row_stride = 0;  // bytes between KV heads' entries of a token
};

// Bytes of one entry K|V.
inline int64_t kv_entry_bytes(KvElt elt, int head_dim) { return 2 * int64_t(head_dim) * (elt == KvElt::fp8 ? 1 : 2); }

// k, v: [n_tok, n_kv_head, head_dim] f32 (bf16 values for elt bf16)
void entry_append_ref(const EntryAppendParams& p, const float* k, const float* v, uint8_t* dst);

// The byte layout of those entries (quant_format.h's HIGGS record).
struct HiggsRecordLayout {
  int width = 0;             // values per record (n_kv_head · head_dim)
  int group = 0;             // Hadamard group G (≥ 128, a power of two dividing width)
  int n_group = 0;
  int64_t code_bytes = 0;    // per group: G / 2 (one 8-bit EDEN2-256 code per 2 values)
  int64_t meta_offset = 0;   // the groups' bf16 scales, after all codes
  int64_t record_bytes = 0;
  bool per_head = false;     // group 128: entries per (token, KV head)
  int64_t entry_bytes = 0;   // per token (2 · record_bytes), or per head (2 · 66); rounded up to 16
  int64_t tok_bytes = 0;     // host bytes per token: entry_bytes, or n_group · entry_bytes
  bool random_signs = false;
  uint64_t sign_seed = 0;
  // Offsets from a token's first entry of group g's codes / scale of K (w = 0) or V (w = 1).
  KVT_HOST_DEVICE int64_t code_offset(int g, int w) const {
    return per_head ? g * entry_bytes + w * code_bytes : w * record_bytes + g * code_bytes;
  }
  KVT_HOST_DEVICE int64_t scale_offset(int g, int w) const {
    return per_head ? g * entry_bytes + 2 * code_bytes + 2 * w : w * record_bytes + meta_offset + 2 * g;
  }
};

// "" when record_append / record_dequant handle host spec `spec` for a layer
// of n_kv_head heads of head_dim, else why not.
std::string higgs_record_unsupported(const std::string& spec, int n_kv_head, int head_dim);
HiggsRecordLayout higgs_record_layout(const std::string& spec, int width);

// k, v: [n_tok, width] f32; token pos0 + t's entries at dst + (pos0 + t)·tok_stride.
void record_append_ref(const std::string& spec, int width, int64_t n_tok, int64_t pos0, int64_t tok_stride,
                       const float* k, const float* v, uint8_t* dst);

}  // namespace kvtier
