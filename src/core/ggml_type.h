// Tensor element types of the GGUF format (values are the on-disk type ids)
// and their block layout. Block structs mirror the published GGUF layouts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvtier {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

constexpr int kQK = 32;    // values per block of the legacy quants
constexpr int kQKK = 256;  // values per super-block of the K-quants

#pragma pack(push, 1)
struct BlockQ4_0 {  // x = d * (q - 8)
  uint16_t d;       // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {  // x = d * q + m
  uint16_t d, m;    // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {  // x = d * q
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ8_1 {  // x = d * q; s = d * sum(q) (used by the q4_1 dot product)
  uint16_t d, s;
  int8_t qs[kQK];
};
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

struct GgmlTypeTraits {
  std::string_view name;
  int block_size;      // values per block
  size_t block_bytes;  // bytes per block
};

// Traits of a known type; returns false for unknown ids.
inline bool ggml_type_traits(uint32_t id, GgmlTypeTraits* out) {
  switch (GgmlType(id)) {
    case GgmlType::F32: *out = {"F32", 1, 4}; return true;
    case GgmlType::F16: *out = {"F16", 1, 2}; return true;
    case GgmlType::BF16: *out = {"BF16", 1, 2}; return true;
    case GgmlType::Q4_0: *out = {"Q4_0", kQK, sizeof(BlockQ4_0)}; return true;
    case GgmlType::Q4_1: *out = {"Q4_1", kQK, sizeof(BlockQ4_1)}; return true;
    case GgmlType::Q5_0: *out = {"Q5_0", kQK, sizeof(BlockQ5_0)}; return true;
    case GgmlType::Q5_1: *out = {"Q5_1", kQK, sizeof(BlockQ5_1)}; return true;
    case GgmlType::Q8_0: *out = {"Q8_0", kQK, sizeof(BlockQ8_0)}; return true;
    case GgmlType::Q8_1: *out = {"Q8_1", kQK, sizeof(BlockQ8_1)}; return true;
    case GgmlType::Q2_K: *out = {"Q2_K", kQKK, sizeof(BlockQ2_K)}; return true;
    case GgmlType::Q3_K: *out = {"Q3_K", kQKK, sizeof(BlockQ3_K)}; return true;
    case GgmlType::Q4_K: *out = {"Q4_K", kQKK, sizeof(BlockQ4_K)}; return true;
    case GgmlType::Q5_K: *out = {"Q5_K", kQKK, sizeof(BlockQ5_K)}; return true;
    case GgmlType::Q6_K: *out = {"Q6_K", kQKK, sizeof(BlockQ6_K)}; return true;
    case GgmlType::Q8_K: *out = {"Q8_K", kQKK, sizeof(BlockQ8_K)}; return true;
  }
  return false;
}

inline std::string_view ggml_type_name(GgmlType t) {
  GgmlTypeTraits tr;
  return ggml_type_traits(uint32_t(t), &tr) ? tr.name : std::string_view("unknown");
}

// Bytes of one row of n values; n must be a multiple of the block size.
inline size_t ggml_row_bytes(GgmlType t, int64_t n) {
  GgmlTypeTraits tr;
  ggml_type_traits(uint32_t(t), &tr);
  return size_t(n / tr.block_size) * tr.block_bytes;
}

}  // namespace kvtier
