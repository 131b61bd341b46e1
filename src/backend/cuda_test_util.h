// Shared pieces of the `cuda`-labelled tests: skip without a GPU, device
// buffers from host vectors, error norms.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "core/half.h"

// CI machines have nvcc but no GPU: the tests compile there and skip here.
#define KVT_REQUIRE_GPU()                                                          \
  do {                                                                             \
    if (::kvtier::cuda_device_count() == 0)                                        \
      GTEST_SKIP() << "no CUDA device (" << ::kvtier::cuda_device_summary() << ")"; \
  } while (0)

namespace kvtier::cuda::testing {

template <class T>
DeviceBuffer to_device(const std::vector<T>& h) {
  DeviceBuffer d(h.size() * sizeof(T));
  if (!h.empty()) KVT_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::vector<T> to_host(const DeviceBuffer& d, size_t n) {
  std::vector<T> h(n);
  KVT_CUDA_CHECK(cudaDeviceSynchronize());
  if (n) KVT_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
// Poison a device buffer so that unwritten outputs show (0xff.. is NaN in f32/bf16).
inline void poison(DeviceBuffer& d) { KVT_CUDA_CHECK(cudaMemset(d.data(), 0xff, d.bytes())); }

// Random bf16 values (as raw bits) and their f32 values.
inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(u(rng));
  return v;
}
inline std::vector<float> bf16_to_f32_vec(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_f32(v[i]);
  return f;
}

// ‖a − b‖ / ‖b‖; infinity when any value of a is not finite.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}

}  // namespace kvtier::cuda::testing
