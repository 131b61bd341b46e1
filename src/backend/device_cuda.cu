// The CUDA half of device.h.
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "backend/device_cuda.h"
#include "backend/pinned_arena.h"

namespace kvtier::cuda_dev {
namespace {
using ::kvtier::cuda_device_count;
using ::kvtier::cuda_device_summary;
cudaStream_t st(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t ev(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

void* malloc_device(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw OutOfMemoryError(fmt::format("GPU memory: cudaMalloc of {:.3f} GiB failed ({}); {:.3f} GiB free of {:.3f}",
                                 double(bytes) / (1ull << 30), cudaGetErrorString(err), double(free_b) / (1ull << 30),
                                 double(total_b) / (1ull << 30)));
  }
  return p;
}

void free_device(void* p) { cudaFree(p); }

// The host tier's pool. Leaked on purpose: blocks may be freed by static
// destructors after main, when cudaFreeHost can no longer run.
PinnedArena& pinned_arena() {
  static PinnedArena* arena = new PinnedArena(PinnedArena::Pinner{
      [](size_t bytes) {
        void* host = nullptr;
        void* dev = nullptr;
        if (cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
          cudaGetLastError();
          return PinnedBlock{};
        }
        if (cudaHostGetDevicePointer(&dev, host, 0) != cudaSuccess) {
          cudaGetLastError();
          cudaFreeHost(host);
          return PinnedBlock{};
        }
        return PinnedBlock{host, dev};
      },
      [](void* host) { cudaFreeHost(host); }});
  return *arena;
}

void* malloc_host(size_t bytes, void** host) {
  const PinnedBlock b = pinned_arena().alloc(bytes);
  if (!b.host) {
    const PinnedStats s = pinned_arena().stats();
    throw LimitError(fmt::format("host memory: pinning {:.3f} GiB failed ({:.3f} GiB pinned, {:.3f} GiB in use)",
                                 double(bytes) / (1ull << 30), double(s.pinned_bytes) / (1ull << 30),
                                 double(s.in_use_bytes) / (1ull << 30)));
  }
  *host = b.host;
  return b.dev;
}

void free_host(void* host) { pinned_arena().free(host); }

PinnedStats pinned_stats() { return pinned_arena().stats(); }

void create(Exec& x) {
  KVT_CHECK(cuda_device_count() > 0, "--device cuda: no CUDA device found ({})", cuda_device_summary());
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t f = nullptr, j = nullptr;
  KVT_CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  KVT_CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  KVT_CUDA_CHECK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
  KVT_CUDA_CHECK(cudaEventCreateWithFlags(&j, cudaEventDisableTiming));
  x.stream = a;
  x.side = b;
  x.fork_ev = f;
  x.join_ev = j;
}

void destroy(Exec& x) {
  if (x.stream) cudaStreamSynchronize(st(x.stream));
  if (x.side) cudaStreamSynchronize(st(x.side));
  if (x.fork_ev) cudaEventDestroy(ev(x.fork_ev));
  if (x.join_ev) cudaEventDestroy(ev(x.join_ev));
  if (x.stream) cudaStreamDestroy(st(x.stream));
  if (x.side) cudaStreamDestroy(st(x.side));
  x = Exec{};
}

std::pair<size_t, size_t> mem_info() {
  size_t f = 0, t = 0;
  KVT_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return {f, t};
}

void copy(const Exec& x, void* dst, const void* src, size_t bytes) {
  KVT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st(x.stream)));
}

void fill(const Exec& x, void* dst, int byte, size_t bytes) {
  KVT_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, st(x.stream)));
}

void sync(const Exec& x) {
  KVT_CUDA_CHECK(cudaStreamSynchronize(st(x.stream)));
  if (x.side) KVT_CUDA_CHECK(cudaStreamSynchronize(st(x.side)));
}

void fork(const Exec& x) {
  KVT_CUDA_CHECK(cudaEventRecord(ev(x.fork_ev), st(x.stream)));
  KVT_CUDA_CHECK(cudaStreamWaitEvent(st(x.side), ev(x.fork_ev), 0));
}

void join(const Exec& x) {
  KVT_CUDA_CHECK(cudaEventRecord(ev(x.join_ev), st(x.side)));
  KVT_CUDA_CHECK(cudaStreamWaitEvent(st(x.stream), ev(x.join_ev), 0));
}

void* event_create() {
  cudaEvent_t e = nullptr;
  KVT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
void event_destroy(void* e) { cudaEventDestroy(ev(e)); }
void event_record(const Exec& x, void* e) { KVT_CUDA_CHECK(cudaEventRecord(ev(e), st(x.stream))); }
void event_sync(void* e) { KVT_CUDA_CHECK(cudaEventSynchronize(ev(e))); }
float event_ms(void* from, void* to) {
  float ms = 0;
  KVT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev(from), ev(to)));
  return ms;
}

}  // namespace kvtier::cuda_dev
