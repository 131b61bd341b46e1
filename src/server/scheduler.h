// The server's scheduler: one engine worker thread owns every Sequence.
// Requests wait in a bounded FIFO queue; the worker admits up to max_active of
// them (and, with a host KV budget, only while their reserved host-tier bytes
// fit) and steps the active ones together, one token each per round (one
// batched forward pass on the CPU: Engine::step_batch), so
// that a long generation never starves a short one. Each request talks to its
// HTTP handler through a Channel: text pieces flow out, a cancel flag flows in
// (a client that went away), and the worker destroys a cancelled Sequence at
// the next round, which frees its KV memory.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "kvtier/engine.h"

namespace kvtier::server {

struct Job {
  std::vector<int32_t> prompt;  // [n_prompt] token ids
  SamplingParams sampling;
  std::string kv_policy = "full";
  // Host-tier KV bytes the request may reach (prompt + max new tokens), held
  // against SchedulerOptions::host_kv_budget_bytes while it is active.
  int64_t host_kv_bytes = 0;
  // GPU KV bytes (kv_gpu_charge) while the prompt runs and while it decodes,
  // held against SchedulerOptions::gpu_kv_budget_bytes: the larger until the
  // prompt is done, then the decode charge.
  int64_t gpu_kv_prefill_bytes = 0;
  int64_t gpu_kv_bytes = 0;
  int64_t gpu_kv_peak() const { return std::max(gpu_kv_prefill_bytes, gpu_kv_bytes); }
};

// Why a request ended without a result: an HTTP status and OpenAI error fields.
struct JobError {
  int status = 500;
  std::string message;
  std::string type = "server_error";
  std::string code;
};

// One request's link between its HTTP handler (reads) and the worker (writes).
class Channel {
 public:
  struct Update {
    std::string text;       // text produced since the last wait
    std::vector<TokenLogprob> logprobs;  // of the tokens decoded since (when asked for)
    bool finished = false;  // result() or error() is now final
  };
  // Waits until new text arrives, the request ends, or `timeout` passes.
  Update wait(std::chrono::milliseconds timeout);
  // What has arrived since the last take/wait, without waiting.
  Update take();
  // Called (on the worker thread, no lock held) after every push, finish or
  // fail: an event-driven front end wakes its connection with it. Set it
  // before the request can make progress (right after submit).
  void set_listener(std::function<void()> listener);
  // Waits for the end, collecting nothing (non-streaming requests).
  void wait_finished();

  bool cancelled() const { return cancelled_.load(); }
  bool finished() const;
  // Valid once finished and without error; finish_reason "cancelled" when the
  // request was cancelled.
  const GenerationResult& result() const { return result_; }
  const std::optional<JobError>& error() const { return error_; }
  // The scheduler round of each step this request took (its first is the
  // prompt prefill); equal-length active requests step in the same rounds.
  std::vector<uint64_t> step_rounds() const;

  // Timing for metrics (steady clock): when the request was submitted, when
  // a slot took it (unset while queued), when each step produced its token.
  using Clock = std::chrono::steady_clock;
  struct Timing {
    Clock::time_point submitted;
    std::optional<Clock::time_point> admitted;
    std::vector<Clock::time_point> steps;
  };
  Timing timing() const;

 private:
  friend class Scheduler;
  void push(const std::string& piece, uint64_t round, std::vector<TokenLogprob> logprobs = {});
  void notify();
  void finish(GenerationResult r);
  void fail(JobError e);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};
  GenerationResult result_;
  std::optional<JobError> error_;
  std::vector<uint64_t> rounds_;
  std::vector<TokenLogprob> pending_logprobs_;
  size_t n_logprobs_pushed_ = 0;  // worker only
  Timing timing_;
  std::function<void()> listener_;
  Job job_;  // handed to the worker at admission
};

struct SchedulerOptions {
  int max_active = 4;   // sequences decoding at once
  int max_queue = 64;   // requests waiting for a busy slot; more → 503
  int64_t host_kv_budget_bytes = 0;  // 0: no limit; else Σ Job::host_kv_bytes of active ≤ this
  int64_t gpu_kv_budget_bytes = 0;   // 0: no limit; else Σ of the active jobs' GPU charges ≤ this
  // Prompt tokens run per round, over the requests still in their prompt, in
  // admission order (each round's first prompt always runs, so a chunk larger
  // than the budget still progresses). 0: every such request runs its next
  // chunk each round. Bounds how long a burst of long prompts stalls the
  // sequences that are decoding, and lets the earliest prompt finish first.
  int64_t prefill_tokens_per_round = 0;
};

struct SchedulerStats {
  bool accepting = true;
  int n_active = 0;
  int n_queued = 0;
  int64_t kv_gpu_bytes = 0;   // GPU-tier KV bytes held by active sequences now
  int64_t kv_host_bytes = 0;  // host-tier KV bytes held by active sequences now
  int64_t host_kv_reserved_bytes = 0;  // Σ Job::host_kv_bytes of active sequences
  int64_t gpu_kv_reserved_bytes = 0;   // Σ of the active sequences' GPU charges (Job::gpu_kv_*)
  uint64_t n_completed = 0;
  uint64_t n_cancelled = 0;
  uint64_t n_failed = 0;
  uint64_t n_rejected = 0;  // refused at submit (queue full, shutting down)
  uint64_t n_rounds = 0;
  uint64_t n_tokens_generated = 0;
  // Where the worker's time went, in seconds: starting sequences (their KV
  // memory is allocated then), stepping them, and finishing them.
  double start_seconds = 0;
  double step_seconds = 0;
  double finish_seconds = 0;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& options);
  ~Scheduler();  // drains with no grace: cancels everything, joins the worker
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Throws RequestError: 503 (with retry advice) when the
  // queue is full or the server is shutting down, 400 when the job alone
  // exceeds the host KV budget.
  std::shared_ptr<Channel> submit(Job job);
  // The client went away: the worker drops the request (queued) or cancels and
  // destroys its Sequence (active) before its next step.
  void cancel(Channel& channel);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }

  // Graceful stop: refuse new requests, fail queued ones with 503, let active
  // ones finish for up to `grace`, cancel the rest (503), then stop the worker.
  void drain(std::chrono::milliseconds grace);

 private:
  struct Active {
    std::shared_ptr<Channel> channel;
    std::unique_ptr<Sequence> sequence;
    int64_t gpu_charged = 0;  // held against the GPU budget now
  };
  // Gives back what `a` holds of both budgets (under mu_).
  void release_budgets(const Active& a);
  void worker_loop();
  void admit(std::vector<Active>& active);
  void step_round(std::vector<Active>& active);
  void finish_active(Active& a, bool cancelled_by_server);

  Engine& engine_;
  SchedulerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the worker
  std::condition_variable idle_cv_;  // wakes drain() when nothing is active
  std::deque<std::shared_ptr<Channel>> queue_;
  SchedulerStats stats_;
  bool cancel_all_ = false;  // drain's grace ran out
  bool stop_ = false;        // the worker exits once idle
  std::thread worker_;
};

}  // namespace kvtier::server
