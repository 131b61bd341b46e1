// The CUDA half of device.h in a build without CUDA: every entry point says so.
#include "backend/device_cuda.h"
#include "core/status.h"

namespace kvtier::cuda_dev {
namespace {
[[noreturn]] void no_cuda() { fail("--device cuda: kvtier was built without CUDA (configure with -DKVT_CUDA=ON and nvcc)"); }
}  // namespace

void* malloc_device(size_t) { no_cuda(); }
void free_device(void*) {}
void* malloc_host(size_t, void**) { no_cuda(); }
void free_host(void*) {}
PinnedArena& pinned_arena() { no_cuda(); }
PinnedStats pinned_stats() { return {}; }
void create(Exec&) { no_cuda(); }
void destroy(Exec&) {}
std::pair<size_t, size_t> mem_info() { no_cuda(); }
void copy(const Exec&, void*, const void*, size_t) { no_cuda(); }
void fill(const Exec&, void*, int, size_t) { no_cuda(); }
void sync(const Exec&) { no_cuda(); }
void fork(const Exec&) { no_cuda(); }
void join(const Exec&) { no_cuda(); }
void* event_create() { no_cuda(); }
void event_destroy(void*) {}
void event_record(const Exec&, void*) { no_cuda(); }
void event_sync(void*) { no_cuda(); }
float event_ms(void*, void*) { no_cuda(); }

}  // namespace kvtier::cuda_dev
