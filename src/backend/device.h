// Where work runs and where bytes live, for code above the backend that is
// written once for both devices (the KV cache, the decode step, the model).
//
// Exec names a device and its queues: on the CPU calls run at once on the
// calling thread (ops parallelize inside); on CUDA they are enqueued on
// `stream`, and `side` is a second stream for work that overlaps the main one
// (fork/join order them). Buffer owns memory of one of three kinds:
//   device  GPU memory (cudaMalloc), or plain host memory on the CPU;
//   host    the host tier: page-locked host memory mapped into the GPU's
//           address space (kernels read it zero-copy through data()), or plain
//           host memory on the CPU. host_ptr() is the CPU's view.
// Copies and fills are asynchronous on CUDA (ordered on the Exec's stream) and
// immediate on the CPU. Without CUDA in the build, asking for it throws.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace kvtier {

enum class DeviceKind { cpu, cuda };
const char* device_name(DeviceKind kind);

enum class MemKind { device, host };

class Buffer {
 public:
  Buffer() = default;
  Buffer(DeviceKind dev, MemKind mem, size_t bytes);  // uninitialized (CPU: zeroed pages)
  // Bytes [offset, offset + bytes) of `of`, not owned: valid while `of` is
  // (one allocation carved into many buffers: the allocator rounds each
  // cudaMalloc up to whole 2 MiB pages).
  static Buffer view(const Buffer& of, size_t offset, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // The address the device's kernels use (CPU: the host address).
  template <class T = void>
  T* data() const { return static_cast<T*>(data_); }
  // The CPU's address of host-tier memory (null for GPU memory).
  template <class T = void>
  T* host_ptr() const { return static_cast<T*>(host_); }
  size_t bytes() const { return bytes_; }
  DeviceKind device() const { return dev_; }
  MemKind mem() const { return mem_; }
  explicit operator bool() const { return bytes_ > 0; }

 private:
  void release();
  void* data_ = nullptr;
  void* host_ = nullptr;
  size_t bytes_ = 0;
  DeviceKind dev_ = DeviceKind::cpu;
  MemKind mem_ = MemKind::device;
  bool owned_ = true;  // false: a view
};

class StageClock;

// A device and its streams. Exec values are cheap handles into a Device.
struct Exec {
  DeviceKind kind = DeviceKind::cpu;
  void* stream = nullptr;  // cudaStream_t
  void* side = nullptr;    // cudaStream_t, overlapping work
  void* fork_ev = nullptr;  // cudaEvent_t
  void* join_ev = nullptr;
  StageClock* clock = nullptr;  // set: stages of the work are timed (backend/stage_clock.h)
  bool cuda() const { return kind == DeviceKind::cuda; }
};

class Device {
 public:
  explicit Device(DeviceKind kind);  // CUDA: device 0, two non-blocking streams
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceKind kind() const { return exec_.kind; }
  const Exec& exec() const { return exec_; }
  Buffer alloc(size_t bytes) const { return Buffer(kind(), MemKind::device, bytes); }
  Buffer alloc_host(size_t bytes) const { return Buffer(kind(), MemKind::host, bytes); }
  // Free and total device memory in bytes (CPU: of the machine).
  std::pair<size_t, size_t> mem_info() const;
  // Times the stages of the work enqueued through exec() from now on (null: stop).
  void set_clock(StageClock* clock) { exec_.clock = clock; }

 private:
  Exec exec_;
};

// Asynchronous on CUDA (the Exec's stream), immediate on the CPU. Pointers
// are data() addresses, or any host pointer for the host side of h2d/d2h
// (pageable host memory makes CUDA stage and return early: keep it alive).
void copy(const Exec& x, void* dst, const void* src, size_t bytes);
void fill(const Exec& x, void* dst, int byte, size_t bytes);
// Waits until everything enqueued on the stream (and side) has finished.
void sync(const Exec& x);
// side waits for everything enqueued on stream so far / stream waits for side.
void fork(const Exec& x);
void join(const Exec& x);
// The side stream as an Exec of its own (CPU: the same Exec).
Exec side_exec(const Exec& x);

// Copies a host array to a device buffer of x's device, growing it when
// needed (a small table: row pointers, lengths). Returns dst.data(). On CUDA
// the source must stay unchanged until the copy has run (pinned staging is
// not assumed: the copy is issued from pageable memory, which CUDA stages
// before returning).
void* upload(const Exec& x, Buffer& dst, const void* src, size_t bytes);

}  // namespace kvtier
