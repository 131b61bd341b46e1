#include "core/threads.h"

#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_share(int index) {
  int64_t n_chunks = (n_ + grain_ - 1) / grain_;
  int64_t per = n_chunks / n_threads_, extra = n_chunks % n_threads_;
  int64_t c0 = index * per + std::min<int64_t>(index, extra);
  int64_t c1 = c0 + per + (index < extra ? 1 : 0);
  int64_t b = c0 * grain_, e = std::min(n_, c1 * grain_);
  if (b < e) (*fn_)(b, e, index);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a while: calls come in quick succession during a forward pass.
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < 4000) {
#if defined(__x86_64__)
      _mm_pause();
#endif
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    run_share(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  run_share(0);
  // Spin briefly, then yield: on an oversubscribed machine a worker may be
  // descheduled, and pure spinning would burn the slice it needs.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4000) {
#if defined(__x86_64__)
      _mm_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

namespace {
std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
int g_threads = 0;
}  // namespace

ThreadPool& default_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(g_threads);
  return *g_pool;
}

void set_default_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_threads = n_threads;
  g_pool.reset();
}

}  // namespace kvtier
