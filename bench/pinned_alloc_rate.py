"""How fast this machine pins host memory, the cost the host tier's pool
(src/backend/pinned_arena.h) pays once per slab: cudaHostAlloc (mapped,
portable) of 32 blocks of 38 MiB and of one 1.2 GiB block, and their
cudaFreeHost; cudaMalloc/cudaFree of 64 blocks of 67 MiB; first touch of
pageable memory for comparison. Calls the CUDA runtime through ctypes (no
torch needed).

    python3 bench/pinned_alloc_rate.py
"""
import ctypes
import glob
import sys
import time

MAPPED_PORTABLE = 0x2 | 0x1  # cudaHostAllocMapped | cudaHostAllocPortable


def load_cudart():
    libs = sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*")
                  + glob.glob("/usr/local/cuda*/targets/x86_64-linux/lib/libcudart.so*"))
    if not libs:
        sys.exit("libcudart.so not found under /usr/local/cuda*")
    rt = ctypes.CDLL(libs[0])
    rt.cudaFree(ctypes.c_void_p(0))  # creates the context outside the timings
    return libs[0], rt


def timed(f, *args):
    t0 = time.perf_counter()
    err = f(*args)
    if err != 0:
        sys.exit(f"{f.__name__} failed with CUDA error {err}")
    return time.perf_counter() - t0


def main():
    path, rt = load_cudart()
    print("cudart", path)
    for block, count in [(38 << 20, 32), (1210 << 20, 1), (38 << 20, 32)]:
        ptrs = [ctypes.c_void_p() for _ in range(count)]
        t_alloc = sum(timed(rt.cudaHostAlloc, ctypes.byref(p), ctypes.c_size_t(block), ctypes.c_uint(MAPPED_PORTABLE))
                      for p in ptrs)
        t_free = sum(timed(rt.cudaFreeHost, p) for p in ptrs)
        gb = block * count / 1e9
        print(f"cudaHostAlloc {count} x {block >> 20} MiB = {gb:.2f} GB: alloc {t_alloc:.3f} s "
              f"({gb / t_alloc:.2f} GB/s), free {t_free:.3f} s")
    ptrs = [ctypes.c_void_p() for _ in range(64)]
    t_alloc = sum(timed(rt.cudaMalloc, ctypes.byref(p), ctypes.c_size_t(67 << 20)) for p in ptrs)
    t_free = sum(timed(rt.cudaFree, p) for p in ptrs)
    print(f"cudaMalloc 64 x 67 MiB: alloc {t_alloc:.3f} s, free {t_free:.3f} s")
    t0 = time.perf_counter()
    page = bytearray(1210 << 20)
    for i in range(0, len(page), 4096):
        page[i] = 1
    print(f"pageable 1.2 GiB, allocated and touched: {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
