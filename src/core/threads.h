// A small fork-join pool for the CPU backend. The forward pass calls
// parallel_for hundreds of times per token, so workers spin briefly before
// sleeping: a wake-up through the kernel costs more than a small matmul.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint ranges covering [0, n).
  // Ranges are multiples of `grain` (except the last). Blocks until all finish.
  // Not reentrant: fn must not call parallel_for on the same pool.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker_loop(int index);
  void run_share(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex call_mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
};

// The process-wide pool used by the CPU backend (created on first use).
ThreadPool& default_pool();
// Set the size of the default pool; must be called before its first use
// (later calls rebuild it).
void set_default_threads(int n_threads);

}  // namespace kvtier
