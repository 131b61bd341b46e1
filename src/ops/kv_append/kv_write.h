// Writing a batch's new tokens into a tiered KV cache, one layer at a time:
// the resident tokens (sinks + ring), the host tier (every token's K and V in
// the policy's format) and the key index (landmark records of the units the
// append completes). One contract for both devices: on the CPU the inputs
// are f32 and the stores plain memory (this file's _cpu.cpp is the
// specification, built on the CPU quantizer of ops/quant); on CUDA the inputs
// are bf16 on the device and the host tier is pinned memory written through
// its mapped address. The CUDA records equal the CPU's bit for bit except at
// exact nearest-point ties of a HIGGS grid.
//
// Batch: n_seq sequences each append n_new tokens at positions
// [pos0[s], pos0[s] + n_new); input token i of sequence s is row
// s·n_new + i of k, v, k_pre ([rows, n_kv_head, head_dim], in_tok_stride
// elements apart). Per-(sequence, KV head) stores are given by row pointer
// arrays (row r = s·n_kv_head + h), so sequences of any length share a launch.
#pragma once
#include <cstdint>

#include "backend/device.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/quant/quant_format.h"

namespace kvtier {

// Device-side description of one quant_format record (built by the caller
// from a QuantSpec; grid/signs are device pointers on CUDA, host on the CPU).
struct RecordFormat {
  QuantSpec spec;
  int dim = 0;               // values per record
  int64_t bytes = 0;         // bytes_per_vector(spec, dim)
  const float* grid = nullptr;   // higgs: [grid_size, grid_dim] f32
  const float* signs = nullptr;  // higgs with random signs: [group] ±1 f32
  const float* half_norm2 = nullptr;  // higgs, optional: [grid_size] ‖c‖²/2 (speeds the device quantizer)
  const uint32_t* cells = nullptr;    // higgs with d = 2, optional: HiggsGrid::cells (higgs_cells.h), device memory
};

// ---- resident tokens: slots [0, sink) hold tokens [0, sink); slot sink + t % ring
// holds token t while it is among the last `ring` tokens. A slot is K then V,
// head_dim elements each, of `elt` (bf16, or f32 for exact CPU runs).
struct ResidentWriteParams {
  int n_seq = 0, n_new = 0, n_kv_head = 0, head_dim = 0;
  int sink = 0, ring = 0;
  int64_t in_tok_stride = 0;  // elements
  KvElt elt = KvElt::bf16;
};
// rows: [n_seq·n_kv_head] slot arrays; pos0: [n_seq] int64
void resident_write(const Exec& x, const ResidentWriteParams& p, const void* k, const void* v, const int64_t* pos0,
                    uint8_t* const* rows);
void resident_write_cpu(const ResidentWriteParams& p, const float* k, const float* v, const int64_t* pos0,
                        uint8_t* const* rows);

// ---- host tier: per token one entry per KV head (K record ‖ V record over
// head_dim, entry_bytes apart), or one layer-wide entry (records over the
// layer's KV width), or V only (values_only: shadowkv; generated tokens'
// keys go to a second plane: token t ≥ key_first[s] at
// kplane[s] + (t − key_first[s])·tok_bytes, same per-head layout).
struct HostWriteParams {
  int n_seq = 0, n_new = 0, n_kv_head = 0, head_dim = 0;
  bool layer_wide = false, values_only = false, keys_prerope = false;
  RecordFormat fmt;           // spec, dim = head_dim (layer_wide: n_kv_head·head_dim)
  int64_t entry_bytes = 0;    // K ‖ V (values_only: V), 16-byte padded
  int64_t tok_bytes = 0;      // per token
  int64_t in_tok_stride = 0;  // elements
  float k_scale = 1.f, v_scale = 1.f;  // nvfp4 per-tensor scales
  const float* seq_scales = nullptr;   // [n_seq][2] (k, v) per sequence, overriding k_scale/v_scale
};
// host: [n_seq] bases; kplane, key_first: [n_seq] (values_only; key_first[s] < 0: no keys yet)
void host_write(const Exec& x, const HostWriteParams& p, const void* k, const void* k_pre, const void* v,
                const int64_t* pos0, uint8_t* const* host, uint8_t* const* kplane, const int64_t* key_first);
void host_write_cpu(const HostWriteParams& p, const float* k, const float* k_pre, const float* v, const int64_t* pos0,
                    uint8_t* const* host, uint8_t* const* kplane, const int64_t* key_first);

// ---- key index: when an append completes units of `unit` tokens, each
// unit's chunk means (chunk tokens each; unit = chunk, or chunk·m for
// residual landmarks) are quantized into the row's records. Keys of a unit
// that precede the append are read from the resident ring (ring ≥ unit − 1).
enum class IndexRecLayout { planar_higgs2, records, residual };
struct IndexWriteParams {
  int n_seq = 0, n_new = 0, n_kv_head = 0, head_dim = 0;
  IndexRecLayout layout = IndexRecLayout::records;
  int chunk = 1, unit = 1;
  RecordFormat fmt;   // records; residual: the residual format
  RecordFormat meta;  // residual: the meta-landmark format (mean of unit/chunk landmarks)
  int sink = 0, ring = 0;     // the resident layout (ResidentWriteParams)
  KvElt res_elt = KvElt::bf16;
  int64_t in_tok_stride = 0;  // elements
  bool cos_stats = false;     // shadowkv: per chunk min over its keys of cos(key, chunk mean) → stats
  const float* seq_scales = nullptr;  // [n_seq] nvfp4 landmarks: each sequence's per-tensor scale
};
// plane0: records [n_chunk][fmt.bytes] | planar codes [n][32] | residual records [n_chunk][fmt.bytes]
// plane1: planar scales [n] bf16 | residual meta records [n_unit][meta.bytes] | unused
// resident: [rows] (read for keys before pos0); stats: [rows] f32 per chunk, or null
void index_write(const Exec& x, const IndexWriteParams& p, const void* k, const int64_t* pos0, uint8_t* const* plane0,
                 uint8_t* const* plane1, uint8_t* const* resident, float* const* stats);
void index_write_cpu(const IndexWriteParams& p, const float* k, const int64_t* pos0, uint8_t* const* plane0,
                     uint8_t* const* plane1, uint8_t* const* resident, float* const* stats);

// Rounds n rows of fmt.dim activations in place through fmt (quantize then
// dequantize: what a cache in that format would give back). CPU f32, CUDA bf16.
// Rows start at rows + (*pos)·stride when pos (device memory) is given.
void round_rows(const Exec& x, const RecordFormat& fmt, void* rows, int64_t n, int64_t stride,
                const int64_t* pos = nullptr);

// NVFP4's standard per-tensor scale of n activations (nvfp4_tensor_scale:
// amax/(448·6), 1 when all zero). Synchronizes on CUDA (a prefill-time call).
float nvfp4_scale_of(const Exec& x, const void* data, int64_t n);

}  // namespace kvtier
