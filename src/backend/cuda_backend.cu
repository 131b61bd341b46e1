#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"

namespace kvtier {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_summary() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no CUDA device: cudaGetDeviceCount failed: {}", cudaGetErrorString(err));
  }
  if (n == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA device 0: properties unreadable";
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB, L2 {} MiB)", p.name, p.major, p.minor,
                     p.multiProcessorCount, double(p.totalGlobalMem) / (1ull << 30),
                     p.l2CacheSize >> 20);
}

namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(fmt::format("CUDA error in {} at {}:{}: {}: {}", what, file, line,
                          cudaGetErrorName(err), cudaGetErrorString(err)));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw OutOfMemoryError(fmt::format("cudaMalloc of {:.3f} GiB failed ({}); {:.3f} GiB free of {:.3f}",
                                 double(bytes) / (1ull << 30), cudaGetErrorString(err),
                                 double(free_b) / (1ull << 30), double(total_b) / (1ull << 30)));
  }
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw LimitError(fmt::format("cudaHostAlloc of {:.3f} GiB pinned host memory failed: {}",
                                 double(bytes) / (1ull << 30), cudaGetErrorString(err)));
  }
  KVT_CUDA_CHECK(cudaHostGetDevicePointer(&dev_, host_, 0));
}
PinnedBuffer::~PinnedBuffer() {
  if (host_) cudaFreeHost(host_);
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (host_) cudaFreeHost(host_);
    host_ = std::exchange(o.host_, nullptr);
    dev_ = std::exchange(o.dev_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Stream::Stream() { KVT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
void Stream::synchronize() const { KVT_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  KVT_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(cudaStream_t s) { KVT_CUDA_CHECK(cudaEventRecord(e_, s)); }
void Event::synchronize() const { KVT_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  KVT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

void copy_h2d_async(void* dst, const void* src, size_t bytes, cudaStream_t s, CopyStats* stats) {
  KVT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  if (stats) {
    stats->h2d_bytes += bytes;
    ++stats->n_copies;
  }
}
void copy_d2h_async(void* dst, const void* src, size_t bytes, cudaStream_t s, CopyStats* stats) {
  KVT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  if (stats) {
    stats->d2h_bytes += bytes;
    ++stats->n_copies;
  }
}

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i, float lo, float hi) {
  uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
  float u = float(h >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

__global__ void fill_bf16_kernel(__nv_bfloat16* dst, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(hash_uniform(seed, uint64_t(i), lo, hi));
}
__global__ void fill_f32_kernel(float* dst, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = hash_uniform(seed, uint64_t(i), lo, hi);
}
__global__ void fill_bytes_kernel(uint64_t* dst, int64_t n_words, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
}
__global__ void fill_tail_kernel(uint8_t* dst, int64_t n, uint64_t seed) {
  int64_t i = threadIdx.x;
  if (i < n) dst[i] = uint8_t(mix64(seed + 77 + uint64_t(i)));
}

int fill_blocks(int64_t n) {
  int64_t b = (n + 255) / 256;
  return int(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

void fill_uniform_bf16(void* dst, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  fill_bf16_kernel<<<fill_blocks(n), 256, 0, s>>>(static_cast<__nv_bfloat16*>(dst), n, seed, lo, hi);
  KVT_CUDA_LAUNCH_CHECK("fill_bf16_kernel");
}
void fill_uniform_f32(float* dst, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  fill_f32_kernel<<<fill_blocks(n), 256, 0, s>>>(dst, n, seed, lo, hi);
  KVT_CUDA_LAUNCH_CHECK("fill_f32_kernel");
}
void fill_random_bytes(void* dst, int64_t n_bytes, uint64_t seed, cudaStream_t s) {
  KVT_CHECK(reinterpret_cast<uintptr_t>(dst) % 8 == 0, "fill_random_bytes: destination not 8-byte aligned");
  int64_t n_words = n_bytes / 8;
  if (n_words > 0) {
    fill_bytes_kernel<<<fill_blocks(n_words), 256, 0, s>>>(static_cast<uint64_t*>(dst), n_words, seed);
    KVT_CUDA_LAUNCH_CHECK("fill_bytes_kernel");
  }
  if (n_bytes % 8) {
    fill_tail_kernel<<<1, 8, 0, s>>>(static_cast<uint8_t*>(dst) + n_words * 8, n_bytes % 8, seed);
    KVT_CUDA_LAUNCH_CHECK("fill_tail_kernel");
  }
}

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    cudaDeviceProp p{};
    KVT_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    d.n_sm = p.multiProcessorCount;
    d.l2_bytes = size_t(p.l2CacheSize);
    d.smem_per_block_optin = p.sharedMemPerBlockOptin;
    d.total_mem = p.totalGlobalMem;
    return d;
  }();
  return info;
}

}  // namespace cuda
}  // namespace kvtier
