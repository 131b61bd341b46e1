// The orthonormal Walsh–Hadamard transform used by HIGGS: x ← H_n x / √n with
// H_n[i][j] = (-1)^popcount(i & j) (Sylvester order), n a power of two. The
// matrix is symmetric and orthonormal, so the transform is its own inverse.
#pragma once
#include <cstdint>

namespace kvtier {

inline bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// x: [n] f32, in place; O(n log n) butterflies. Throws unless n is a power of two.
void hadamard_transform(float* x, int n);

// The definition: y = H_n x / √n by the O(n²) matrix product, f64 accumulation.
// x: [n] f32, in place.
void hadamard_transform_ref(float* x, int n);

// ±1 signs applied before the transform when random_signs is on: bit j of a
// splitmix64 stream seeded by `seed`. signs: [n] f32.
void hadamard_signs(uint64_t seed, int n, float* signs);

}  // namespace kvtier
