// Fast Walsh–Hadamard transform (in-place butterflies) and its O(n²)
// reference. The butterfly pass for span h pairs x[i] with x[i + h] inside
// blocks of 2h; the final 1/√n makes it orthonormal.
#include "ops/quant/hadamard.h"

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/status.h"

namespace kvtier {

void hadamard_transform(float* x, int n) {
  KVT_CHECK(is_power_of_two(n), "hadamard_transform: size {} is not a power of two", n);
  int h0 = 1;
  if (n >= 8) {  // the butterflies of h = 1, 2, 4 inside each 8 floats: the same sums and differences
    for (int i = 0; i < n; i += 8) {
      __m256 x8 = _mm256_loadu_ps(x + i);
      __m256 y8 = _mm256_permute_ps(x8, 0xB1);  // pairs swapped
      x8 = _mm256_blend_ps(_mm256_add_ps(x8, y8), _mm256_sub_ps(y8, x8), 0xAA);
      y8 = _mm256_permute_ps(x8, 0x4E);  // halves of each 4 swapped
      x8 = _mm256_blend_ps(_mm256_add_ps(x8, y8), _mm256_sub_ps(y8, x8), 0xCC);
      y8 = _mm256_permute2f128_ps(x8, x8, 0x01);  // the 4s swapped
      x8 = _mm256_blend_ps(_mm256_add_ps(x8, y8), _mm256_sub_ps(y8, x8), 0xF0);
      _mm256_storeu_ps(x + i, x8);
    }
    h0 = 8;
  }
  for (int h = h0; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      float* a = x + i;
      float* b = x + i + h;
      for (int j = 0; j < h; ++j) {  // vectorized by the compiler for h >= 8
        float u = a[j], v = b[j];
        a[j] = u + v;
        b[j] = u - v;
      }
    }
  }
  float s = 1.0f / std::sqrt(float(n));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

void hadamard_transform_ref(float* x, int n) {
  KVT_CHECK(is_power_of_two(n), "hadamard_transform_ref: size {} is not a power of two", n);
  std::vector<double> y(size_t(n), 0.0);
  for (int i = 0; i < n; ++i) {
    double acc = 0;
    for (int j = 0; j < n; ++j) acc += (std::popcount(unsigned(i & j)) & 1) ? -x[j] : x[j];
    y[size_t(i)] = acc / std::sqrt(double(n));
  }
  for (int i = 0; i < n; ++i) x[i] = float(y[size_t(i)]);
}

void hadamard_signs(uint64_t seed, int n, float* signs) {
  uint64_t state = seed;
  uint64_t word = 0;
  for (int j = 0; j < n; ++j) {
    if ((j & 63) == 0) {  // splitmix64
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      word = z ^ (z >> 31);
    }
    signs[j] = ((word >> (j & 63)) & 1u) ? -1.0f : 1.0f;
  }
}

}  // namespace kvtier
