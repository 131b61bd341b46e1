// How fast a kernel reads scattered rows of pinned host memory (zero-copy),
// by row size, by the span the rows are drawn from, and by how the memory was
// pinned: cudaHostAlloc (4 KiB pages), mmap + transparent huge pages or
// hugetlbfs 2 MiB pages (each registered with cudaHostRegister), or host
// memory of the virtual memory API (cuMemCreate on the host, mapped with the
// recommended granularity into one address range for GPU and CPU). It answers
// whether the decode step's misses are bound by PCIe bytes, by read requests
// (128-byte lines), or by address translation of many distinct host pages.
// Not run by CTest; on the GPU machine:
//   kvt_host_rows_bench [--gib 8] [--rows 18432] [--reps 20]
// One JSON line per case on stdout.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    const cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

constexpr int kThreads = 256, kUnroll = 4;

// Row i (of n) starts at src + off[i]; read as 16-byte chunks, kUnroll loads
// in flight per thread (the decode step's copy loop), written densely.
__global__ void __launch_bounds__(kThreads) read_rows(const uint8_t* __restrict__ src, const int64_t* __restrict__ off,
                                                      int64_t n, int row_bytes, uint4* __restrict__ dst) {
  const int64_t chunks = row_bytes / 16, items = n * chunks;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < items; b += stride * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t it = b + u * stride;
      if (it < items) v[u] = *(reinterpret_cast<const uint4*>(src + off[it / chunks]) + it % chunks);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (b + u * stride < items) dst[b + u * stride] = v[u];
  }
}

struct Pinned {
  std::string kind;
  uint8_t* host = nullptr;
  size_t bytes = 0;
  bool mapped = false;  // mmap'd (else cudaHostAlloc)
  CUmemGenericAllocationHandle vmm = 0;
  size_t granularity = 0;
};

// cuMemCreate on the host, mapped read-write for device 0 and the CPU.
Pinned pin_vmm(size_t bytes) {
  Pinned p{"vmm", nullptr, 0, false};
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  size_t g = 0;
  if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS) return p;
  const size_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cuMemCreate(&h, size, &prop, 0);
  if (r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    cuGetErrorString(r, &msg);
    std::fprintf(stderr, "vmm: cuMemCreate failed: %s\n", msg ? msg : "?");
    return p;
  }
  CUdeviceptr va = 0;
  if (cuMemAddressReserve(&va, size, g, 0, 0) != CUDA_SUCCESS || cuMemMap(va, size, 0, h, 0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "vmm: reserve/map failed\n");
    cuMemRelease(h);
    return p;
  }
  CUmemAccessDesc acc[2]{};
  acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc[0].location.id = 0;
  acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  acc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  acc[1].location.id = 0;
  acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = cuMemSetAccess(va, size, acc, 2);
  if (r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    cuGetErrorString(r, &msg);
    std::fprintf(stderr, "vmm: cuMemSetAccess failed: %s\n", msg ? msg : "?");
    cuMemUnmap(va, size);
    cuMemAddressFree(va, size);
    cuMemRelease(h);
    return p;
  }
  p.host = reinterpret_cast<uint8_t*>(va);
  p.bytes = size;
  p.vmm = h;
  p.granularity = g;
  std::memset(p.host, 1, size);
  return p;
}

Pinned pin(const std::string& kind, size_t bytes) {
  if (kind == "vmm") return pin_vmm(bytes);
  Pinned p{kind, nullptr, bytes, kind != "hostalloc"};
  if (kind == "hostalloc") {
    CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p.host), bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(p.host, 1, bytes);
    return p;
  }
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (kind == "hugetlb") flags |= MAP_HUGETLB | (21 << MAP_HUGE_SHIFT);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "%s: mmap of %zu bytes failed\n", kind.c_str(), bytes);
    return Pinned{kind, nullptr, 0, false};
  }
  if (kind == "thp") madvise(m, bytes, MADV_HUGEPAGE);
  std::memset(m, 1, bytes);
  const cudaError_t e = cudaHostRegister(m, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: cudaHostRegister failed: %s\n", kind.c_str(), cudaGetErrorString(e));
    cudaGetLastError();
    munmap(m, bytes);
    return Pinned{kind, nullptr, 0, false};
  }
  p.host = static_cast<uint8_t*>(m);
  return p;
}

void unpin(Pinned& p) {
  if (!p.host) return;
  if (p.vmm) {
    const CUdeviceptr va = reinterpret_cast<CUdeviceptr>(p.host);
    cuMemUnmap(va, p.bytes);
    cuMemAddressFree(va, p.bytes);
    cuMemRelease(p.vmm);
  } else if (p.mapped) {
    cudaHostUnregister(p.host);
    munmap(p.host, p.bytes);
  } else {
    cudaFreeHost(p.host);
  }
  p.host = nullptr;
}

long meminfo_kb(const char* key) {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, std::strlen(key)) == 0) v = std::atol(line + std::strlen(key) + 1);
  std::fclose(f);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 8;
  int64_t rows = 18432;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--gib") gib = std::atof(argv[i + 1]);
    else if (a == "--rows") rows = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--gib G] [--rows N] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  const size_t bytes = size_t(gib * double(1ull << 30)) / (2u << 20) * (2u << 20);
  int n_sm = 0;
  CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  const int row_sizes[] = {64, 128, 144, 160, 256, 512, 1152, 2048};
  const size_t spans[] = {size_t(64) << 20, bytes};
  const int64_t max_chunks = rows * (2048 / 16);
  uint4* dst = nullptr;
  int64_t* d_off = nullptr;
  CHECK(cudaMalloc(&dst, size_t(max_chunks) * 16));
  CHECK(cudaMalloc(&d_off, size_t(rows) * reps * sizeof(int64_t)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::mt19937_64 rng(7);
  CHECK(cudaFree(nullptr));  // the primary context, for the driver API calls
  for (const char* kind : {"vmm", "hostalloc", "hugetlb"}) {
    const long huge0 = meminfo_kb("AnonHugePages:"), tlb0 = meminfo_kb("HugePages_Free:");
    const auto t0 = std::chrono::steady_clock::now();
    Pinned p = pin(kind, bytes);
    const double pin_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!p.host) {
      std::printf("{\"alloc\":\"%s\",\"error\":\"unavailable\"}\n", kind);
      continue;
    }
    const long huge1 = meminfo_kb("AnonHugePages:"), tlb1 = meminfo_kb("HugePages_Free:");
    uint8_t* dev = p.host;
    if (!p.vmm) CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), p.host, 0));
    std::fprintf(stderr, "%s: granularity %zu\n", kind, p.granularity);
    for (const size_t span : spans) {
      for (const int rb : row_sizes) {
        // Rows at a stride of rb (the host tier's records back to back), drawn
        // uniformly from the span; every rep a fresh draw (no L2 reuse).
        const int64_t n_slots = int64_t(span / size_t(rb));
        std::vector<int64_t> off(size_t(rows) * reps);
        std::uniform_int_distribution<int64_t> pick(0, n_slots - 1);
        for (auto& o : off) o = pick(rng) * rb;
        CHECK(cudaMemcpy(d_off, off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
        const unsigned grid = unsigned(n_sm * 8);
        read_rows<<<grid, kThreads>>>(dev, d_off, rows, rb, dst);  // warm-up
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaEventRecord(e0));
        for (int r = 0; r < reps; ++r) read_rows<<<grid, kThreads>>>(dev, d_off + int64_t(r) * rows, rows, rb, dst);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double s = ms / 1e3, n = double(rows) * reps;
        std::printf(
            "{\"alloc\":\"%s\",\"span_mib\":%zu,\"row_bytes\":%d,\"rows\":%lld,\"us_per_launch\":%.2f,"
            "\"mrows_per_s\":%.1f,\"gb_per_s\":%.2f,\"pin_s\":%.2f,\"anon_huge_kb\":%ld,\"hugetlb_pages_used\":%ld}\n",
            kind, span >> 20, rb, (long long)rows, ms * 1e3 / reps, n / s / 1e6, n * rb / s / 1e9, pin_s,
            huge1 - huge0, tlb0 >= 0 && tlb1 >= 0 ? tlb0 - tlb1 : -1);
        std::fflush(stdout);
      }
    }
    unpin(p);
  }
  return 0;
}
