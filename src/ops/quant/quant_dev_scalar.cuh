// The pieces under quant_dev.cuh, compiled for the device by nvcc and for the
// host by any C++ compiler (the host build is how quant_dev_host_test.cpp
// checks the device algorithms on a machine without a GPU):
//   * IEEE operations that nvcc may not fuse or approximate (__fmul_rn, …):
//     bit-exactness with the CPU quantizer depends on every rounding being the
//     one the CPU does, so no a·b + c below is left to the compiler;
//   * the scalar casts of quant_scalar.h / core/half.h (same bit tricks);
//   * LSB-first bit streams over one record that load and store aligned
//     32-bit words where the address allows, bytes elsewhere: a record may sit
//     at any byte offset (records are packed back to back) and in mapped
//     pinned host memory, where every access is a PCIe transaction, and a
//     store never touches a byte outside the record (neighbouring records
//     are written by other threads).
// Needs IEEE denormals on the device (nvcc's default; not --use_fast_math / -ftz=true).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__CUDACC__)
#define KVT_QD __host__ __device__ inline
#define KVT_QD_INLINE __host__ __device__ __forceinline__
#else
#define KVT_QD inline
#define KVT_QD_INLINE inline
#endif
#if defined(__CUDA_ARCH__)
#define KVT_QD_UNROLL _Pragma("unroll")
#else
#define KVT_QD_UNROLL
#endif

namespace kvtier::qdev {

// ---- IEEE operations, one rounding each (never fused by the compiler).
KVT_QD_INLINE float f_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVT_QD_INLINE float f_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KVT_QD_INLINE float f_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVT_QD_INLINE float f_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// a·b + c with one rounding.
KVT_QD_INLINE float f_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
// Round to the nearest integer, ties to even (std::nearbyint in the default mode).
KVT_QD_INLINE float f_rint(float a) {
#ifdef __CUDA_ARCH__
  return rintf(a);
#else
  return std::nearbyint(a);
#endif
}
KVT_QD_INLINE double d_add(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KVT_QD_INLINE double d_mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KVT_QD_INLINE double d_div(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
KVT_QD_INLINE double d_sqrt(double a) {
#ifdef __CUDA_ARCH__
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
KVT_QD_INLINE float d_to_f(double a) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(a);
#else
  return float(a);
#endif
}
// A broken precondition the host launcher should have refused.
KVT_QD_INLINE void fail() {
#ifdef __CUDA_ARCH__
  __trap();
#else
  std::abort();
#endif
}

KVT_QD_INLINE uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVT_QD_INLINE float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- scalar casts (core/half.h, quant_layout.h, quant_scalar.h)
KVT_QD_INLINE float bf16_f32(uint32_t h) { return bits_f32(h << 16); }
KVT_QD_INLINE uint32_t f32_bf16(float f) {  // RNE; NaN stays a quiet NaN
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
KVT_QD_INLINE uint32_t bf16_round_down(float f) {
  uint32_t u = f32_bits(f), h = u >> 16;
  if ((u & 0xffffu) != 0 && (u >> 31)) ++h;
  return h & 0xffffu;
}
KVT_QD_INLINE uint32_t bf16_round_up(float f) {
  uint32_t u = f32_bits(f), h = u >> 16;
  if ((u & 0xffffu) != 0 && !(u >> 31)) ++h;
  return h & 0xffffu;
}

// E4M3 "fn": bias 7, subnormals m·2^-9, S.1111.111 NaN (as e4m3_to_f32: a
// positive quiet NaN for both signs).
KVT_QD_INLINE float e4m3_f32(uint32_t c) {
  const uint32_t exp = (c >> 3) & 15u, man = c & 7u, sign = (c & 0x80u) << 24;
  if (exp == 15u && man == 7u) return bits_f32(0x7fc00000u);
  if (exp == 0u) return bits_f32(sign | f32_bits(float(man) * (1.0f / 512.0f)));  // exact
  return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}
// f32 → E4M3, RNE, saturating to ±448; quant_scalar.h's f32_to_e4m3.
KVT_QD_INLINE uint32_t f32_e4m3(float f) {
  const uint32_t u = f32_bits(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;
  if (a >= 0x43e00000u) return sign | 0x7eu;
  if (a < 0x3c800000u) {                      // < 2^-6: subnormal grid m·2^-9
    const float v = f_mul(bits_f32(a), 512.0f);  // exact
    uint32_t m = uint32_t(v);
    const float r = f_sub(v, float(m));          // exact
    if (r > 0.5f || (r == 0.5f && (m & 1u))) ++m;
    return sign | m;
  }
  uint32_t code = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  if (code > 0x7eu) code = 0x7eu;
  return sign | code;
}
// E2M1 code (bit 3 the sign) → f32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
KVT_QD_INLINE float e2m1_f32(uint32_t c) {
  const uint32_t m = c & 7u, e = m >> 1;
  const uint32_t mag = m == 0u ? 0u : m == 1u ? 0x3f000000u : ((e + 126u) << 23) | ((m & 1u) << 22);
  return bits_f32(((c & 8u) << 28) | mag);
}
// f32 → E2M1, RNE at the midpoints, saturating to ±6; NaN → ±0.
KVT_QD_INLINE uint32_t f32_e2m1(float f) {
  const uint32_t sign = (f32_bits(f) >> 31) ? 8u : 0u;
  const float a = bits_f32(f32_bits(f) & 0x7fffffffu);
  uint32_t c;
  if (!(a > 0.25f)) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}

// ---- record bit streams
KVT_QD_INLINE bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }
KVT_QD_INLINE uint32_t load_word(const uint8_t* p) {  // p 4-byte aligned
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
KVT_QD_INLINE void store_word(uint8_t* p, uint32_t v) {  // p 4-byte aligned
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, 4);
#endif
}

// Fields of up to 32 bits, LSB first, from [p, end); never reads past end.
struct BitReader {
  const uint8_t* p;
  const uint8_t* end;
  uint64_t acc = 0;
  int n = 0;  // valid bits in acc
  KVT_QD_INLINE BitReader(const uint8_t* at, const uint8_t* stop) : p(at), end(stop) {}
  KVT_QD_INLINE uint32_t get(int bits) {
    while (n < bits) {
      if (aligned4(p) && end - p >= 4) {
        acc |= uint64_t(load_word(p)) << n;
        p += 4;
        n += 32;
      } else {
        acc |= uint64_t(*p++) << n;
        n += 8;
      }
    }
    const uint32_t v = uint32_t(acc & ((uint64_t(1) << bits) - 1));
    acc >>= bits;
    n -= bits;
    return v;
  }
  // Skips the rest of the current byte (each group's codes start on a byte).
  KVT_QD_INLINE void next_byte() {
    const int r = n & 7;
    acc >>= r;
    n -= r;
  }
};

// Fields of up to 32 bits, LSB first, from p on; finish() writes the tail.
struct BitWriter {
  uint8_t* p;
  uint64_t acc = 0;
  int n = 0;  // pending bits in acc (the bits above are zero)
  KVT_QD_INLINE explicit BitWriter(uint8_t* at) : p(at) {}
  KVT_QD_INLINE void put(uint32_t v, int bits) {  // v < 2^bits
    acc |= uint64_t(v) << n;
    n += bits;
    while (n >= 32) emit();
  }
  // Zero-pads to the next byte (the next group's codes start on a byte).
  KVT_QD_INLINE void next_byte() { n = (n + 7) & ~7; }
  KVT_QD_INLINE void finish() {
    next_byte();
    while (n >= 32) emit();
    while (n > 0) {
      *p++ = uint8_t(acc);
      acc >>= 8;
      n -= 8;
    }
  }

 private:
  KVT_QD_INLINE void emit() {
    if (aligned4(p)) {
      store_word(p, uint32_t(acc));
      p += 4;
      acc >>= 32;
      n -= 32;
    } else {
      *p++ = uint8_t(acc);
      acc >>= 8;
      n -= 8;
    }
  }
};

}  // namespace kvtier::qdev
