#include "server/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "server/api_request.h"

namespace kvtier::server {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// ---- Channel ---------------------------------------------------------------

Channel::Update Channel::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.empty() || !pending_logprobs_.empty() || finished_; });
  Update u;
  u.text.swap(pending_);
  u.logprobs.swap(pending_logprobs_);
  u.finished = finished_;
  return u;
}

Channel::Update Channel::take() { return wait(std::chrono::milliseconds(0)); }

void Channel::set_listener(std::function<void()> listener) {
  std::lock_guard lk(mu_);
  listener_ = std::move(listener);
}

void Channel::notify() {
  cv_.notify_all();
  std::function<void()> l;
  {
    std::lock_guard lk(mu_);
    l = listener_;
  }
  if (l) l();
}

Channel::Timing Channel::timing() const {
  std::lock_guard lk(mu_);
  return timing_;
}

void Channel::wait_finished() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return finished_; });
}

bool Channel::finished() const {
  std::lock_guard lk(mu_);
  return finished_;
}

std::vector<uint64_t> Channel::step_rounds() const {
  std::lock_guard lk(mu_);
  return rounds_;
}

void Channel::push(const std::string& piece, uint64_t round, std::vector<TokenLogprob> logprobs) {
  {
    std::lock_guard lk(mu_);
    pending_ += piece;
    rounds_.push_back(round);
    timing_.steps.push_back(Clock::now());
    for (auto& lp : logprobs) pending_logprobs_.push_back(std::move(lp));
  }
  notify();
}

void Channel::finish(GenerationResult r) {
  {
    std::lock_guard lk(mu_);
    result_ = std::move(r);
    finished_ = true;
  }
  notify();
}

void Channel::fail(JobError e) {
  {
    std::lock_guard lk(mu_);
    error_ = std::move(e);
    finished_ = true;
  }
  notify();
}

// ---- Scheduler -------------------------------------------------------------

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options)
    : engine_(engine), options_(options) {
  KVT_CHECK(options_.max_active >= 1, "scheduler: max_active must be ≥ 1, got {}",
            options_.max_active);
  KVT_CHECK(options_.max_queue >= 0, "scheduler: max_queue must be ≥ 0, got {}",
            options_.max_queue);
  KVT_CHECK(options_.host_kv_budget_bytes >= 0,
            "scheduler: host_kv_budget_bytes must be ≥ 0, got {}", options_.host_kv_budget_bytes);
  KVT_CHECK(options_.gpu_kv_budget_bytes >= 0, "scheduler: gpu_kv_budget_bytes must be ≥ 0, got {}",
            options_.gpu_kv_budget_bytes);
  worker_ = std::thread([this] { worker_loop(); });
}

Scheduler::~Scheduler() { drain(std::chrono::milliseconds(0)); }

std::shared_ptr<Channel> Scheduler::submit(Job job) {
  const int64_t budget = options_.host_kv_budget_bytes;
  if (budget > 0 && job.host_kv_bytes > budget) {
    std::lock_guard lk(mu_);
    ++stats_.n_rejected;
    throw RequestError(400,
                       fmt::format("the request needs up to {} bytes of host KV memory (prompt + "
                                   "max_tokens); the server's host KV budget is {} bytes",
                                   job.host_kv_bytes, budget),
                       "max_tokens", "kv_budget_exceeded");
  }
  const int64_t gpu_budget = options_.gpu_kv_budget_bytes;
  if (gpu_budget > 0 && job.gpu_kv_peak() > gpu_budget) {
    std::lock_guard lk(mu_);
    ++stats_.n_rejected;
    throw RequestError(400,
                       fmt::format("the request needs up to {} bytes of GPU KV memory (prompt + max_tokens); the "
                                   "server's GPU KV budget is {} bytes",
                                   job.gpu_kv_peak(), gpu_budget),
                       "max_tokens", "kv_budget_exceeded");
  }
  auto ch = std::make_shared<Channel>();
  ch->job_ = std::move(job);
  ch->timing_.submitted = Channel::Clock::now();
  {
    std::lock_guard lk(mu_);
    if (!stats_.accepting) {
      ++stats_.n_rejected;
      throw RequestError(503, "the server is shutting down", {}, "shutting_down", "server_error");
    }
    // max_queue counts requests that must wait: ones a free slot will take at
    // the next round do not (so max_queue 0 means "no waiting", not "refuse all").
    const int free_slots = std::max(0, options_.max_active - stats_.n_active);
    if (int(queue_.size()) >= options_.max_queue + free_slots) {
      ++stats_.n_rejected;
      throw RequestError(503,
                         fmt::format("the server is busy: {} requests are waiting (the limit); "
                                     "retry later",
                                     queue_.size()),
                         {}, "queue_full", "server_error");
    }
    queue_.push_back(ch);
    stats_.n_queued = int(queue_.size());
  }
  cv_.notify_all();
  return ch;
}

void Scheduler::cancel(Channel& channel) {
  channel.cancelled_.store(true);
  cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Scheduler::drain(std::chrono::milliseconds grace) {
  std::deque<std::shared_ptr<Channel>> dropped;
  {
    std::unique_lock lk(mu_);
    if (!worker_.joinable()) return;
    stats_.accepting = false;
    dropped.swap(queue_);
    stats_.n_queued = 0;
    stats_.n_failed += dropped.size();
  }
  for (auto& ch : dropped) {
    ch->fail({503, "the server is shutting down", "server_error", "shutting_down"});
  }
  {
    std::unique_lock lk(mu_);
    idle_cv_.wait_for(lk, grace, [&] { return stats_.n_active == 0; });
    cancel_all_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void Scheduler::worker_loop() {
  std::vector<Active> active;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return !active.empty() || !queue_.empty() || stop_; });
      if (stop_ && active.empty() && queue_.empty()) return;
    }
    admit(active);
    step_round(active);
  }
}

// Moves queued requests into `active` while there is a slot and budget;
// starting a Sequence happens here, on the worker, like every engine call.
void Scheduler::admit(std::vector<Active>& active) {
  for (;;) {
    std::shared_ptr<Channel> ch;
    {
      std::lock_guard lk(mu_);
      if (cancel_all_) return;
      // Requests whose client left while queued are dropped without running.
      while (!queue_.empty() && queue_.front()->cancelled()) {
        GenerationResult r;
        r.finish_reason = "cancelled";
        queue_.front()->finish(std::move(r));
        queue_.pop_front();
        ++stats_.n_cancelled;
      }
      stats_.n_queued = int(queue_.size());
      if (queue_.empty() || int(active.size()) >= options_.max_active) return;
      const Job& head = queue_.front()->job_;
      const int64_t need = head.host_kv_bytes, gpu_need = head.gpu_kv_peak();
      const int64_t budget = options_.host_kv_budget_bytes, gpu_budget = options_.gpu_kv_budget_bytes;
      // FIFO: the head waits for both budgets rather than being overtaken, so
      // a large request is not starved by a stream of small ones.
      if (!active.empty() && ((budget > 0 && stats_.host_kv_reserved_bytes + need > budget) ||
                              (gpu_budget > 0 && stats_.gpu_kv_reserved_bytes + gpu_need > gpu_budget)))
        return;
      ch = queue_.front();
      queue_.pop_front();
      stats_.n_queued = int(queue_.size());
      stats_.host_kv_reserved_bytes += need;
      stats_.gpu_kv_reserved_bytes += gpu_need;
      stats_.n_active = int(active.size()) + 1;
    }
    {
      std::lock_guard lk(ch->mu_);
      ch->timing_.admitted = Channel::Clock::now();
    }
    Job& job = ch->job_;
    std::optional<JobError> err;
    std::unique_ptr<Sequence> seq;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      seq = engine_.start(std::move(job.prompt), job.sampling, job.kv_policy);
    } catch (const LimitError& e) {
      err = JobError{400, e.what(), "invalid_request_error", "limit_exceeded"};
    } catch (const Error& e) {
      err = JobError{400, e.what(), "invalid_request_error", ""};
    } catch (const std::exception& e) {
      err = JobError{500, fmt::format("internal error while starting: {}", e.what())};
    }
    {
      std::lock_guard lk(mu_);
      stats_.start_seconds += seconds_since(t0);
    }
    if (err) {
      {
        std::lock_guard lk(mu_);
        stats_.host_kv_reserved_bytes -= job.host_kv_bytes;
        stats_.gpu_kv_reserved_bytes -= job.gpu_kv_peak();
        stats_.n_active = int(active.size());
        ++stats_.n_failed;
      }
      ch->fail(std::move(*err));
      idle_cv_.notify_all();
      continue;
    }
    const int64_t gpu_charged = ch->job_.gpu_kv_peak();
    active.push_back({std::move(ch), std::move(seq), gpu_charged});
  }
}

void Scheduler::release_budgets(const Active& a) {
  stats_.host_kv_reserved_bytes -= a.channel->job_.host_kv_bytes;
  stats_.gpu_kv_reserved_bytes -= a.gpu_charged;
}

void Scheduler::finish_active(Active& a, bool cancelled_by_server) {
  Channel& ch = *a.channel;
  if (!a.sequence->finished()) a.sequence->cancel();
  GenerationResult r = a.sequence->result();
  const auto t0 = std::chrono::steady_clock::now();
  a.sequence.reset();  // frees the sequence's KV memory now
  std::lock_guard lk(mu_);
  stats_.finish_seconds += seconds_since(t0);
  release_budgets(a);
  if (cancelled_by_server) {
    ++stats_.n_failed;
    ch.fail({503, "the server is shutting down; the request was cancelled", "server_error",
             "shutting_down"});
  } else {
    if (ch.cancelled()) r.finish_reason = "cancelled";
    ++(r.finish_reason == "cancelled" ? stats_.n_cancelled : stats_.n_completed);
    ch.finish(std::move(r));
  }
}

// One round: every active sequence past its prompt decodes one token, and the
// earliest ones still in their prompt run a chunk of it within the round's
// prefill budget, all in one Engine::step_batch.
void Scheduler::step_round(std::vector<Active>& active) {
  uint64_t round = 0;
  bool cancel_all = false;
  {
    std::lock_guard lk(mu_);
    round = stats_.n_rounds++;
    cancel_all = cancel_all_;
  }
  // Cancelled sequences leave first; the others step together (one forward
  // pass on the CPU for all that are past their prompt).
  std::vector<Active*> running;
  std::vector<Sequence*> seqs;
  std::vector<size_t> n_before;
  int64_t prefill_spent = 0;
  for (auto& a : active) {
    if (cancel_all || a.channel->cancelled()) {
      finish_active(a, cancel_all);
      continue;
    }
    if (const int64_t n = a.sequence->next_prompt_tokens(); n > 0) {
      const int64_t budget = options_.prefill_tokens_per_round;
      if (budget > 0 && prefill_spent > 0 && prefill_spent + n > budget) continue;  // waits a round
      prefill_spent += n;
    }
    running.push_back(&a);
    seqs.push_back(a.sequence.get());
    n_before.push_back(a.sequence->result().tokens.size());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Engine::StepResult> results = engine_.step_batch(seqs);
  {
    std::lock_guard lk(mu_);
    stats_.step_seconds += seconds_since(t0);
  }
  uint64_t n_new_tokens = 0;
  for (size_t i = 0; i < running.size(); ++i) {
    Active& a = *running[i];
    const Engine::StepResult& r = results[i];
    try {
      if (r.error) std::rethrow_exception(r.error);
      const GenerationResult& res = a.sequence->result();
      n_new_tokens += res.tokens.size() - n_before[i];
      std::vector<TokenLogprob> lps;
      for (size_t& k = a.channel->n_logprobs_pushed_; k < res.logprobs.size(); ++k) lps.push_back(res.logprobs[k]);
      // A step that ran a prompt chunk but not yet the first token reports nothing.
      if (r.stepped && (a.sequence->prompt_done() || a.sequence->finished()))
        a.channel->push(r.piece, round, std::move(lps));
      if (!r.stepped || a.sequence->finished()) {
        finish_active(a, false);
      } else if (a.sequence->prompt_done() && a.gpu_charged > a.channel->job_.gpu_kv_bytes) {
        // The prompt's bf16 K/V has moved to the host tier: the decode charge remains.
        std::lock_guard lk(mu_);
        stats_.gpu_kv_reserved_bytes -= a.gpu_charged - a.channel->job_.gpu_kv_bytes;
        a.gpu_charged = a.channel->job_.gpu_kv_bytes;
      }
    } catch (const std::exception& e) {
      a.sequence.reset();
      std::lock_guard lk(mu_);
      release_budgets(a);
      ++stats_.n_failed;
      a.channel->fail({500, fmt::format("internal error while generating: {}", e.what())});
    }
  }
  std::erase_if(active, [](const Active& a) { return !a.sequence; });

  int64_t gpu = 0, host = 0;
  for (auto& a : active) {
    const KvMemory m = a.sequence->kv_memory();
    gpu += m.gpu_bytes;
    host += m.host_bytes;
  }
  {
    std::lock_guard lk(mu_);
    stats_.n_active = int(active.size());
    stats_.kv_gpu_bytes = gpu;
    stats_.kv_host_bytes = host;
    stats_.n_tokens_generated += n_new_tokens;
  }
  if (active.empty()) idle_cv_.notify_all();
}

}  // namespace kvtier::server
