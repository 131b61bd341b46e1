// Prometheus metrics of the server (text exposition format 0.0.4), with
// vLLM's names, types, labels and buckets where vLLM has the metric (so that
// dashboards and load-aware routers — the Gateway API Inference Extension,
// llm-d — read kvtier replicas as they read vLLM), and kvtier's own under
// `kvtier:`. Thread-safe: request paths observe, /metrics renders.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kvtier::server {

// A Prometheus histogram: cumulative counts per upper bound, plus +Inf, sum, count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends name_bucket{labels,le=...}, name_sum, name_count lines.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound (not cumulative), last: +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// vLLM's 1-2-5 buckets up to max_value (1, 2, 5, 10, 20, 50, ...).
std::vector<double> buckets_1_2_5(double max_value);

// One finished request, as the metrics see it.
struct RequestObservation {
  std::string finished_reason;  // stop | length | abort | error (vLLM's FinishReason values, + error)
  int64_t n_prompt_tokens = 0;
  int64_t n_generation_tokens = 0;
  int64_t max_tokens = 0;
  double queue_seconds = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double e2e_seconds = 0;
  double ttft_seconds = -1;                  // < 0: no token was produced
  std::vector<double> inter_token_seconds;  // between consecutive tokens
};

// Gauges read at render time.
struct ServerGauges {
  int n_running = 0;
  int n_waiting = 0;
  double kv_cache_usage = 0;  // 0..1
  int64_t kv_gpu_bytes = 0;
  int64_t kv_host_bytes = 0;
  int64_t host_kv_reserved_bytes = 0;
  int64_t host_kv_budget_bytes = 0;
  int64_t gpu_kv_reserved_bytes = 0;
  int64_t gpu_kv_budget_bytes = 0;
  int64_t open_connections = 0;
  uint64_t rejected = 0;   // refused at submit (queue full, shutting down, budget)
  uint64_t cancelled = 0;  // client went away or timed out
  // Transfer statistics of the engine's offloading path (host → GPU bytes,
  // GPU slot-cache hits). The engine does not report them per request yet:
  // while `transfers_reported` is false these series are left out rather
  // than shown as zeros (hook: HttpServer::Impl::transfer_stats()).
  bool transfers_reported = false;
  uint64_t pcie_bytes = 0;
  uint64_t slot_cache_hits = 0;
  uint64_t slot_cache_queries = 0;
};

class Metrics {
 public:
  Metrics(std::string model_name, int64_t max_model_len);
  void observe(const RequestObservation& r);
  // An HTTP response, by status code (kvtier:http_responses_total).
  void count_response(int status);
  std::string render(const ServerGauges& g) const;

 private:
  mutable std::mutex mu_;
  std::string labels_;  // model_name="...",engine="0"
  uint64_t prompt_tokens_ = 0;
  uint64_t generation_tokens_ = 0;
  std::map<std::string, uint64_t> success_;  // by finished_reason
  std::map<int, uint64_t> responses_;        // by HTTP status
  Histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, inference_, tpot_;
  Histogram prompt_len_, gen_len_, max_tokens_;
};

}  // namespace kvtier::server
