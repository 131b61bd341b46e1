// Reference (de)quantization of the GGUF tensor formats: one readable loop per
// format, written from the published block layouts (ggml's k-quants
// description). Every format is "value = scale × integer (+ offset)"; the
// formats differ only in how the integers and the per-sub-block scales are
// packed, which is what each function spells out. This file is the
// specification that the fast paths in dequant_cpu.cpp are tested against.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/status.h"
#include "ops/dequant/dequant.h"

namespace kvtier {

namespace {

float h2f(uint16_t h) { return f16_to_f32(h); }

// ---- legacy 32-value blocks -------------------------------------------------
// In all of them byte j of qs holds value j in its low nibble and value j+16 in
// its high nibble.

void dequant_q4_0(const BlockQ4_0* b, float* y) {
  float d = h2f(b->d);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * float((b->qs[j] & 0xF) - 8);
    y[j + kQK / 2] = d * float((b->qs[j] >> 4) - 8);
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y) {
  float d = h2f(b->d), m = h2f(b->m);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * float(b->qs[j] & 0xF) + m;
    y[j + kQK / 2] = d * float(b->qs[j] >> 4) + m;
  }
}

// Q5: the fifth bit of value i is bit i of the little-endian u32 qh.
int q5_value(const uint8_t* qs, const uint8_t* qh_bytes, int i) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  int low = i < kQK / 2 ? (qs[i] & 0xF) : (qs[i - kQK / 2] >> 4);
  int high = (qh >> i) & 1;
  return low | (high << 4);
}

void dequant_q5_0(const BlockQ5_0* b, float* y) {
  float d = h2f(b->d);
  for (int i = 0; i < kQK; ++i) y[i] = d * float(q5_value(b->qs, b->qh, i) - 16);
}

void dequant_q5_1(const BlockQ5_1* b, float* y) {
  float d = h2f(b->d), m = h2f(b->m);
  for (int i = 0; i < kQK; ++i) y[i] = d * float(q5_value(b->qs, b->qh, i)) + m;
}

void dequant_q8_0(const BlockQ8_0* b, float* y) {
  float d = h2f(b->d);
  for (int i = 0; i < kQK; ++i) y[i] = d * float(b->qs[i]);
}

void dequant_q8_1(const BlockQ8_1* b, float* y) {
  float d = h2f(b->d);  // s (= d * sum q) is only used by dot products
  for (int i = 0; i < kQK; ++i) y[i] = d * float(b->qs[i]);
}

// ---- K-quants: 256-value super-blocks ----------------------------------------
// Q2_K, Q3_K and Q6_K pack 2-bit fields: value i lives in half h = i / 128; in
// that half, 2-bit plane j = (i % 128) / 32 is bits 2j..2j+1 of byte
// qs[32 h + i % 32]. Sub-blocks of 16 values each carry their own scale.

void dequant_q2_k(const BlockQ2_K* b, float* y) {
  float d = h2f(b->d), dmin = h2f(b->dmin);
  for (int i = 0; i < kQKK; ++i) {
    int h = i / 128, j = (i % 128) / 32, l = i % 32;
    int q = (b->qs[32 * h + l] >> (2 * j)) & 3;
    uint8_t sc = b->scales[i / 16];  // low nibble scale, high nibble min
    y[i] = d * float(sc & 0xF) * float(q) - dmin * float(sc >> 4);
  }
}

// Q3_K: 16 six-bit scales packed in 12 bytes: the low 4 bits of scale s are the
// low (s < 8) or high (s >= 8) nibble of byte s % 8; its top 2 bits are bits
// 2(s/4)..2(s/4)+1 of byte 8 + s % 4. Stored with a +32 bias.
int q3_k_scale(const uint8_t* sc, int s) {
  int low = s < 8 ? (sc[s] & 0xF) : (sc[s - 8] >> 4);
  int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

void dequant_q3_k(const BlockQ3_K* b, float* y) {
  float d = h2f(b->d);
  for (int i = 0; i < kQKK; ++i) {
    int h = i / 128, j = (i % 128) / 32, l = i % 32;
    int q = (b->qs[32 * h + l] >> (2 * j)) & 3;
    // hmask bit (4h + j) of byte l is the third bit; when it is clear the
    // value is q - 4, i.e. the stored integer is q + 4*hbit - 4 in [-4, 3].
    int hbit = (b->hmask[l] >> (4 * h + j)) & 1;
    y[i] = d * float(q3_k_scale(b->scales, i / 16)) * float(q - (hbit ? 0 : 4));
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each,
// packed in 12 bytes: for s < 4, scale = sc[s] & 63, min = sc[s + 4] & 63; for
// s >= 4 the low 4 bits come from the nibbles of sc[s + 4] and the top 2 bits
// from the spare top bits of sc[s - 4] (scale) and sc[s] (min).
void k4_scale_min(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// Q4_K/Q5_K nibbles: value i is in 64-value chunk c = i / 64; the first 32 of the
// chunk are the low nibbles of qs[32 c .. 32 c + 32), the next 32 the high nibbles.
int k4_nibble(const uint8_t* qs, int i) {
  int c = i / 64, r = i % 64;
  uint8_t byte = qs[32 * c + r % 32];
  return r < 32 ? (byte & 0xF) : (byte >> 4);
}

void dequant_q4_k(const BlockQ4_K* b, float* y) {
  float d = h2f(b->d), dmin = h2f(b->dmin);
  for (int i = 0; i < kQKK; ++i) {
    int sc, mn;
    k4_scale_min(b->scales, i / 32, &sc, &mn);
    y[i] = d * float(sc) * float(k4_nibble(b->qs, i)) - dmin * float(mn);
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y) {
  float d = h2f(b->d), dmin = h2f(b->dmin);
  for (int i = 0; i < kQKK; ++i) {
    int sc, mn;
    k4_scale_min(b->scales, i / 32, &sc, &mn);
    // the fifth bit of value i is bit (i / 32) of qh[i % 32]
    int q = k4_nibble(b->qs, i) | (((b->qh[i % 32] >> (i / 32)) & 1) << 4);
    y[i] = d * float(sc) * float(q) - dmin * float(mn);
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y) {
  float d = h2f(b->d);
  for (int i = 0; i < kQKK; ++i) {
    int h = i / 128, j = (i % 128) / 32, l = i % 32;
    // low 4 bits: planes 0/1 are the low nibbles of ql[64h + l] / ql[64h + 32 + l],
    // planes 2/3 their high nibbles; high 2 bits: bits 2j..2j+1 of qh[32h + l].
    uint8_t lo_byte = b->ql[64 * h + 32 * (j & 1) + l];
    int lo = j < 2 ? (lo_byte & 0xF) : (lo_byte >> 4);
    int hi = (b->qh[32 * h + l] >> (2 * j)) & 3;
    int q = (lo | (hi << 4)) - 32;
    y[i] = d * float(b->scales[i / 16]) * float(q);
  }
}

void dequant_q8_k(const BlockQ8_K* b, float* y) {
  for (int i = 0; i < kQKK; ++i) y[i] = b->d * float(b->qs[i]);
}

template <class Block>
void for_blocks(const void* src, float* dst, int64_t n, int block_values,
                void (*fn)(const Block*, float*)) {
  const Block* b = static_cast<const Block*>(src);
  for (int64_t k = 0; k < n / block_values; ++k) fn(b + k, dst + k * block_values);
}

// ---- quantizers ----------------------------------------------------------------

void quantize_q8_0(const float* x, BlockQ8_0* b) {
  float amax = 0;
  for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
  float d = amax / 127.0f;
  float id = d > 0 ? 1.0f / d : 0.0f;
  b->d = f32_to_f16(d);
  for (int i = 0; i < kQK; ++i) b->qs[i] = int8_t(std::lround(x[i] * id));
}

void quantize_q8_1(const float* x, BlockQ8_1* b) {
  float amax = 0;
  for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
  float d = amax / 127.0f;
  float id = d > 0 ? 1.0f / d : 0.0f;
  int sum = 0;
  for (int i = 0; i < kQK; ++i) {
    b->qs[i] = int8_t(std::lround(x[i] * id));
    sum += b->qs[i];
  }
  b->d = f32_to_f16(d);
  b->s = f32_to_f16(d * float(sum));
}

void quantize_q4_0(const float* x, BlockQ4_0* b) {
  // Scale by the signed extreme so that it maps exactly to -8, using all 16
  // levels on the side where the largest magnitude is.
  float amax = 0, extreme = 0;
  for (int i = 0; i < kQK; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      extreme = x[i];
    }
  float d = extreme / -8.0f;
  float id = d != 0 ? 1.0f / d : 0.0f;
  b->d = f32_to_f16(d);
  for (int j = 0; j < kQK / 2; ++j) {
    int q0 = std::clamp(int(std::floor(x[j] * id + 8.5f)), 0, 15);
    int q1 = std::clamp(int(std::floor(x[j + kQK / 2] * id + 8.5f)), 0, 15);
    b->qs[j] = uint8_t(q0 | (q1 << 4));
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* b) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < kQK; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  float d = (hi - lo) / 15.0f;
  float id = d != 0 ? 1.0f / d : 0.0f;
  b->d = f32_to_f16(d);
  b->m = f32_to_f16(lo);
  for (int j = 0; j < kQK / 2; ++j) {
    int q0 = std::clamp(int(std::floor((x[j] - lo) * id + 0.5f)), 0, 15);
    int q1 = std::clamp(int(std::floor((x[j + kQK / 2] - lo) * id + 0.5f)), 0, 15);
    b->qs[j] = uint8_t(q0 | (q1 << 4));
  }
}

void check_row(GgmlType type, int64_t n, const char* what) {
  GgmlTypeTraits tr;
  if (!ggml_type_traits(uint32_t(type), &tr))
    fail("{}: unknown ggml type id {}", what, uint32_t(type));
  KVT_CHECK(n >= 0 && n % tr.block_size == 0,
            "{}: row of {} values is not a multiple of the {} block size {}", what, n, tr.name,
            tr.block_size);
}

}  // namespace

bool dequant_supported(GgmlType type) {
  GgmlTypeTraits tr;
  return ggml_type_traits(uint32_t(type), &tr);
}

void dequantize_row_ref(GgmlType type, const void* src, float* dst, int64_t n) {
  check_row(type, n, "dequantize_row");
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    }
    case GgmlType::BF16: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case GgmlType::Q4_0: for_blocks<BlockQ4_0>(src, dst, n, kQK, dequant_q4_0); return;
    case GgmlType::Q4_1: for_blocks<BlockQ4_1>(src, dst, n, kQK, dequant_q4_1); return;
    case GgmlType::Q5_0: for_blocks<BlockQ5_0>(src, dst, n, kQK, dequant_q5_0); return;
    case GgmlType::Q5_1: for_blocks<BlockQ5_1>(src, dst, n, kQK, dequant_q5_1); return;
    case GgmlType::Q8_0: for_blocks<BlockQ8_0>(src, dst, n, kQK, dequant_q8_0); return;
    case GgmlType::Q8_1: for_blocks<BlockQ8_1>(src, dst, n, kQK, dequant_q8_1); return;
    case GgmlType::Q2_K: for_blocks<BlockQ2_K>(src, dst, n, kQKK, dequant_q2_k); return;
    case GgmlType::Q3_K: for_blocks<BlockQ3_K>(src, dst, n, kQKK, dequant_q3_k); return;
    case GgmlType::Q4_K: for_blocks<BlockQ4_K>(src, dst, n, kQKK, dequant_q4_k); return;
    case GgmlType::Q5_K: for_blocks<BlockQ5_K>(src, dst, n, kQKK, dequant_q5_k); return;
    case GgmlType::Q6_K: for_blocks<BlockQ6_K>(src, dst, n, kQKK, dequant_q6_k); return;
    case GgmlType::Q8_K: for_blocks<BlockQ8_K>(src, dst, n, kQKK, dequant_q8_k); return;
  }
  fail("dequantize_row: unsupported type {}", ggml_type_name(type));
}

void quantize_row_ref(GgmlType type, const float* src, void* dst, int64_t n) {
  check_row(type, n, "quantize_row");
  uint8_t* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q4_0:
      for (int64_t k = 0; k < n / kQK; ++k)
        quantize_q4_0(src + k * kQK, reinterpret_cast<BlockQ4_0*>(out) + k);
      return;
    case GgmlType::Q4_1:
      for (int64_t k = 0; k < n / kQK; ++k)
        quantize_q4_1(src + k * kQK, reinterpret_cast<BlockQ4_1*>(out) + k);
      return;
    case GgmlType::Q8_0:
      for (int64_t k = 0; k < n / kQK; ++k)
        quantize_q8_0(src + k * kQK, reinterpret_cast<BlockQ8_0*>(out) + k);
      return;
    case GgmlType::Q8_1:
      for (int64_t k = 0; k < n / kQK; ++k)
        quantize_q8_1(src + k * kQK, reinterpret_cast<BlockQ8_1*>(out) + k);
      return;
    default: break;
  }
  fail("quantize_row: no quantizer for type {} (supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q8_1)",
       ggml_type_name(type));
}

}  // namespace kvtier
