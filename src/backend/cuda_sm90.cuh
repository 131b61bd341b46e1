// Hopper (sm_90a) device helpers for the warp-specialized kernels: mbarriers,
// TMA tile loads (cp.async.bulk.tensor completing on an mbarrier), wgmma
// (warpgroup MMA) with shared-memory matrix descriptors, setmaxnreg and named
// barriers. Include from .cu files only. wgmma and setmaxnreg assemble only
// for the sm_90a target: callers put their bodies under KVT_SM90A_DEVICE.
#pragma once
#include <cuda.h>  // CUtensorMap: a plain type here, no link to libcuda
#include <cuda_bf16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVT_SM90A_DEVICE 1
#else
#define KVT_SM90A_DEVICE 0
#endif

namespace kvtier::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers (shared-memory addresses) ----

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialized barriers visible to the async proxy (TMA) and to the other
// threads; follow with a block barrier.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA traffic to wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile(
      "{\n"
      ".reg .b64 st;\n"
      "mbarrier.arrive.shared::cta.b64 st, [%0];\n"
      "}\n" ::"r"(bar)
      : "memory");
}
// True once the phase of parity `parity` has completed.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Waits for the phase of parity `parity`.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// The same, but a wait that lasts seconds is a protocol bug (a phase that
// never completes): trap, so that the launch fails with an error instead of
// hanging the process. Only for threads without register pressure: a trap in
// a wgmma warpgroup's code caps its register allocation (ptxas then spills
// and serializes the wgmmas).
__device__ __forceinline__ void mbar_wait_or_trap(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = global_timer_ns();
  for (uint32_t i = 1;; ++i) {
    if (mbar_try_wait(bar, parity)) return;
    if ((i & 1023u) == 0 && global_timer_ns() - t0 > 4'000'000'000ull) __trap();
  }
}

// Orders this thread's shared-memory accesses through the generic proxy
// (ordinary loads and stores) with those of the async proxy (TMA, wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- TMA ----

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Box at element coordinates (c0 = innermost, c1) of a 2-D tensor map into
// shared memory at dst; completes `bar`'s transaction count with the box's
// bytes (out-of-bounds elements arrive as zeros).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// ---- registers and named barriers ----

template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
// Barrier `id` (1..15; 0 is __syncthreads) over `n_threads` threads (whole warps).
__device__ __forceinline__ void named_barrier_sync(int id, int n_threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n_threads) : "memory");
}

// Keeps the compiler from moving reads or writes of these registers across
// this point (wgmma reads and writes them asynchronously).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// 2^x on the special-function unit (2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- wgmma ----

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
// start address, leading- and stride-dimension byte offsets (all in 16-byte
// units, 14 bits each) and the 128-byte swizzle mode (value 1 in bits 62-63).
// The tile must start on a 1024-byte boundary (base offset 0).
//  - K-major (rows of 64 bf16 = 128 B): SBO = 1024 (8 rows), LBO unused (16).
//  - MN-major: SBO = 1024 (8 rows along K), LBO = bytes between 64-column blocks.
// Adding (bytes >> 4) to a descriptor moves its start address.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo_bytes >> 4) << 16) | (uint64_t(sbo_bytes >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

#define KVT_WGMMA_D64                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, "          \
  "%8, %9, %10, %11, %12, %13, %14, %15, "     \
  "%16, %17, %18, %19, %20, %21, %22, %23, "   \
  "%24, %25, %26, %27, %28, %29, %30, %31, "   \
  "%32, %33, %34, %35, %36, %37, %38, %39, "   \
  "%40, %41, %42, %43, %44, %45, %46, %47, "   \
  "%48, %49, %50, %51, %52, %53, %54, %55, "   \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define KVT_WGMMA_D64_OPS(d)                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),       \
      "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),   \
      "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),           \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),           \
      "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),           \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
      "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),           \
      "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]),           \
      "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),           \
      "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),           \
      "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),           \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),           \
      "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),           \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),           \
      "+f"(d[62]), "+f"(d[63])

// d[64×128] (f32) = (accumulate ? d : 0) + A[64×16] · B[16×128], bf16 operands,
// A and B both from shared memory, both K-major (no transpose).
// Accumulator layout: warp w of the warpgroup holds rows 16w..16w+15; lane
// (g = lane/4, t = lane%4) holds, for n8 block j, d[4j+0..1] = (row g, cols
// 8j+2t, 8j+2t+1) and d[4j+2..3] = the same columns of row g+8.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                    int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KVT_WGMMA_D64
      ", %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : KVT_WGMMA_D64_OPS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[64×128] = (accumulate ? d : 0) + A[64×16] · B[16×128]: A from registers (the mma.m16n8k16 A
// layout per warp: a[0] = (row g, k 2t..2t+1), a[1] = (row g+8, k 2t..2t+1),
// a[2] = (row g, k 2t+8..2t+9), a[3] = (row g+8, k 2t+8..2t+9), low half the
// lower k), B from shared memory MN-major (transposed: N contiguous).
__device__ __forceinline__ void wgmma_m64n128k16_rs_bt(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KVT_WGMMA_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : KVT_WGMMA_D64_OPS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

#undef KVT_WGMMA_D64
#undef KVT_WGMMA_D64_OPS

}  // namespace kvtier::cuda::sm90
