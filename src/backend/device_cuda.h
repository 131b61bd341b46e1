// Internal to the backend: the CUDA half of device.h, implemented in
// device_cuda.cu (or device_nocuda.cpp without CUDA, where each throws).
#pragma once
#include <cstddef>
#include <utility>

#include "backend/device.h"
#include "backend/pinned_arena.h"

namespace kvtier::cuda_dev {

void* malloc_device(size_t bytes);
void free_device(void* p);
// Page-locked, mapped: *host is the CPU address, the return value the device's.
void* malloc_host(size_t bytes, void** host);
void free_host(void* host);
PinnedArena& pinned_arena();  // the pool behind malloc_host
PinnedStats pinned_stats();
void create(Exec& x);
void destroy(Exec& x);
std::pair<size_t, size_t> mem_info();
void copy(const Exec& x, void* dst, const void* src, size_t bytes);
void fill(const Exec& x, void* dst, int byte, size_t bytes);
void sync(const Exec& x);
void fork(const Exec& x);
void join(const Exec& x);
// Timing events (StageClock).
void* event_create();
void event_destroy(void* e);
void event_record(const Exec& x, void* e);
void event_sync(void* e);
float event_ms(void* from, void* to);

}  // namespace kvtier::cuda_dev
