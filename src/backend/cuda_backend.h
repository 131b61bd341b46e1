// CUDA backend basics: error checking through kvtier::Error, owning device and
// pinned host buffers, streams, events and copy statistics. Only code built
// with nvcc / linked into kvt_cuda includes this header.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/status.h"

namespace kvtier::cuda {

// Throws kvtier::Error "<what> at <file>:<line>: <cuda error name>: <text>".
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

inline void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) throw_cuda_error(err, what, file, line);
}

}  // namespace kvtier::cuda

#define KVT_CUDA_CHECK(expr) ::kvtier::cuda::check((expr), #expr, __FILE__, __LINE__)
// After a <<<>>> launch: configuration errors show at once, faults later.
#define KVT_CUDA_LAUNCH_CHECK(name) \
  ::kvtier::cuda::check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

namespace kvtier::cuda {

// cudaMalloc'd bytes, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T = void>
  T* data() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory, mapped into the device address space
// (cudaHostAllocMapped | cudaHostAllocPortable) so that kernels can read it
// through device_ptr() (zero-copy) and copy engines can DMA from it.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : host_(std::exchange(o.host_, nullptr)), dev_(std::exchange(o.dev_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  template <class T = void>
  T* host() const { return static_cast<T*>(host_); }
  template <class T = void>
  T* device_ptr() const { return static_cast<T*>(dev_); }
  size_t bytes() const { return bytes_; }

 private:
  void* host_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();  // non-blocking with respect to the legacy default stream
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s);
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

// Bytes moved between tiers, printed by benchmarks (STYLE rule 7).
struct CopyStats {
  uint64_t h2d_bytes = 0;      // by copy engines
  uint64_t d2h_bytes = 0;
  uint64_t zero_copy_bytes = 0;  // read by kernels through mapped pinned pointers
  uint64_t n_copies = 0;
};

void copy_h2d_async(void* dst, const void* src, size_t bytes, cudaStream_t s, CopyStats* stats = nullptr);
void copy_d2h_async(void* dst, const void* src, size_t bytes, cudaStream_t s, CopyStats* stats = nullptr);

// Fills n elements of bf16 / f32 with uniform values in [lo, hi) from a
// counter-based hash of (seed, index): reproducible, no host round trip.
void fill_uniform_bf16(void* dst, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s);
void fill_uniform_f32(float* dst, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s);
void fill_random_bytes(void* dst, int64_t n_bytes, uint64_t seed, cudaStream_t s);

struct DeviceInfo {
  int n_sm = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
  size_t total_mem = 0;
};
const DeviceInfo& device_info();  // device 0, read once

}  // namespace kvtier::cuda
