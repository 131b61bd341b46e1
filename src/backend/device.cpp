// Device, Buffer and the stream verbs: the CPU side here, the CUDA side in
// device_cuda.cu (the one place that chooses between them, STYLE rule 14).
#include "backend/device.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <new>

#include "backend/device_cuda.h"
#include "backend/pinned_arena.h"
#include "core/status.h"

namespace kvtier {

const char* device_name(DeviceKind kind) { return kind == DeviceKind::cuda ? "cuda" : "cpu"; }

Buffer::Buffer(DeviceKind dev, MemKind mem, size_t bytes) : bytes_(bytes), dev_(dev), mem_(mem) {
  if (bytes == 0) return;
  if (dev == DeviceKind::cpu) {
    // 64-byte aligned (vector loads, cache lines), zeroed by calloc's pages.
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (!data_)
      throw OutOfMemoryError(fmt::format("out of host memory: allocating {:.3f} GiB failed", double(bytes) / (1ull << 30)));
    std::memset(data_, 0, rounded);
    if (mem == MemKind::host) host_ = data_;
    return;
  }
  if (mem == MemKind::device) {
    data_ = cuda_dev::malloc_device(bytes);
  } else {
    data_ = cuda_dev::malloc_host(bytes, &host_);
  }
}

Buffer Buffer::view(const Buffer& of, size_t offset, size_t bytes) {
  KVT_CHECK(offset + bytes <= of.bytes_ && bytes > 0, "buffer view [{}, +{}) outside {} bytes", offset, bytes,
            of.bytes_);
  Buffer b;
  b.data_ = static_cast<char*>(of.data_) + offset;
  b.host_ = of.host_ ? static_cast<char*>(of.host_) + offset : nullptr;
  b.bytes_ = bytes;
  b.dev_ = of.dev_;
  b.mem_ = of.mem_;
  b.owned_ = false;
  return b;
}

void Buffer::release() {
  if (!data_) return;
  if (!owned_) {
    data_ = host_ = nullptr;
    bytes_ = 0;
    owned_ = true;
    return;
  }
  if (dev_ == DeviceKind::cpu) std::free(data_);
  else if (mem_ == MemKind::device) cuda_dev::free_device(data_);
  else cuda_dev::free_host(host_);
  data_ = host_ = nullptr;
  bytes_ = 0;
}

Buffer::~Buffer() { release(); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    host_ = std::exchange(o.host_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    dev_ = o.dev_;
    mem_ = o.mem_;
    owned_ = std::exchange(o.owned_, true);
  }
  return *this;
}

PinnedStats pinned_host_stats() { return cuda_dev::pinned_stats(); }

// The host memory the kernel could hand out now (MemAvailable), in bytes.
int64_t available_host_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
}

void pin_host(size_t bytes) {
  // Refused before pinning anything when the machine cannot have it: pinning
  // runs at 2-3 GB/s, and a request beyond the RAM would lock all of it first.
  const int64_t more = int64_t(bytes) - pinned_host_stats().pinned_bytes, avail = available_host_bytes();
  if (more > avail)
    throw LimitError(fmt::format("host memory: pinning {:.3f} GiB more is asked for, and {:.3f} GiB are available",
                                 double(more) / (1ull << 30), double(avail) / (1ull << 30)));
  const int64_t pinned = cuda_dev::pinned_arena().reserve(bytes);
  if (pinned < int64_t(bytes)) {
    cuda_dev::pinned_arena().trim();  // give back what no block uses
    throw LimitError(fmt::format("host memory: pinned {:.3f} of the {:.3f} GiB asked for; the machine locks no more",
                                 double(pinned) / (1ull << 30), double(bytes) / (1ull << 30)));
  }
}

Device::Device(DeviceKind kind) {
  exec_.kind = kind;
  if (kind == DeviceKind::cuda) cuda_dev::create(exec_);
}

Device::~Device() {
  if (exec_.kind == DeviceKind::cuda) cuda_dev::destroy(exec_);
}

std::pair<size_t, size_t> Device::mem_info() const {
  if (kind() == DeviceKind::cuda) return cuda_dev::mem_info();
  const long pages = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return {size_t(pages) * size_t(size), size_t(total) * size_t(size)};
}

void copy(const Exec& x, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (x.cuda()) return cuda_dev::copy(x, dst, src, bytes);
  std::memmove(dst, src, bytes);
}

void fill(const Exec& x, void* dst, int byte, size_t bytes) {
  if (bytes == 0) return;
  if (x.cuda()) return cuda_dev::fill(x, dst, byte, bytes);
  std::memset(dst, byte, bytes);
}

void sync(const Exec& x) {
  if (x.cuda()) cuda_dev::sync(x);
}
void fork(const Exec& x) {
  if (x.cuda()) cuda_dev::fork(x);
}
void join(const Exec& x) {
  if (x.cuda()) cuda_dev::join(x);
}

Exec side_exec(const Exec& x) {
  Exec s = x;
  if (x.cuda()) std::swap(s.stream, s.side);
  return s;
}

void* upload(const Exec& x, Buffer& dst, const void* src, size_t bytes) {
  if (dst.bytes() < bytes) {
    if (x.cuda()) sync(x);  // the old table may still be read by queued kernels
    dst = Buffer(x.kind, MemKind::device, std::max<size_t>(bytes, 2 * dst.bytes()));
  }
  copy(x, dst.data(), src, bytes);
  return dst.data();
}

}  // namespace kvtier
