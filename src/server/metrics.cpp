#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvtier::server {

namespace {

// vLLM's buckets (vllm/v1/metrics/loggers.py).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// Prometheus' float format: integers without a fraction, +Inf spelled so.
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}

// A label value with \, " and newline escaped.
std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += fmt::format("{}{{{}}} {}\n", name, labels, num(v));
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cum);
  }
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, num(sum_));
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

std::vector<double> buckets_1_2_5(double max_value) {
  std::vector<double> b;
  for (double m = 1;; m *= 10) {
    for (double k : {1.0, 2.0, 5.0}) {
      if (k * m > max_value) return b;
      b.push_back(k * m);
    }
  }
}

Metrics::Metrics(std::string model_name, int64_t max_model_len)
    : labels_(fmt::format("model_name=\"{}\",engine=\"0\"", escape_label(model_name))),
      ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kLatencyBuckets),
      queue_(kLatencyBuckets),
      prefill_(kLatencyBuckets),
      decode_(kLatencyBuckets),
      inference_(kLatencyBuckets),
      tpot_(kItlBuckets),
      prompt_len_(buckets_1_2_5(double(max_model_len))),
      gen_len_(buckets_1_2_5(double(max_model_len))),
      max_tokens_(buckets_1_2_5(double(max_model_len))) {
  for (const char* r : {"stop", "length", "abort", "error"}) success_[r] = 0;
}

void Metrics::observe(const RequestObservation& r) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += uint64_t(std::max<int64_t>(0, r.n_prompt_tokens));
  generation_tokens_ += uint64_t(std::max<int64_t>(0, r.n_generation_tokens));
  ++success_[r.finished_reason];
  if (r.ttft_seconds >= 0) ttft_.observe(r.ttft_seconds);
  for (double x : r.inter_token_seconds) itl_.observe(x);
  if (r.finished_reason == "error") return;  // vLLM observes finished requests only
  e2e_.observe(r.e2e_seconds);
  queue_.observe(r.queue_seconds);
  prefill_.observe(r.prefill_seconds);
  decode_.observe(r.decode_seconds);
  inference_.observe(r.prefill_seconds + r.decode_seconds);
  if (r.n_generation_tokens > 1) tpot_.observe(r.decode_seconds / double(r.n_generation_tokens - 1));
  prompt_len_.observe(double(r.n_prompt_tokens));
  gen_len_.observe(double(r.n_generation_tokens));
  if (r.max_tokens > 0) max_tokens_.observe(double(r.max_tokens));
}

void Metrics::count_response(int status) {
  std::lock_guard lk(mu_);
  ++responses_[status];
}

std::string Metrics::render(const ServerGauges& g) const {
  std::lock_guard lk(mu_);
  std::string out;
  const std::string& L = labels_;
  auto gauge = [&](const char* name, const char* help, double v) {
    header(out, name, "gauge", help);
    sample(out, name, L, v);
  };
  auto counter = [&](const std::string& base, const char* help, double v) {
    // As prometheus_client writes counters in format 0.0.4: the family named with _total.
    header(out, base + "_total", "counter", help);
    sample(out, base + "_total", L, v);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(out, name, "histogram", help);
    h.render(out, name, L);
  };
  // vLLM's names.
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", g.n_running);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", g.n_waiting);
  gauge("vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage (kvtier: host KV reserved / --host-kv-budget).",
        g.kv_cache_usage);
  counter("vllm:num_preemptions", "Cumulative number of preemption from the engine (kvtier never preempts).", 0);
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.", double(prompt_tokens_));
  counter("vllm:generation_tokens", "Number of generation tokens processed.", double(generation_tokens_));
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& [reason, n] : success_)
    sample(out, "vllm:request_success_total", L + fmt::format(",finished_reason=\"{}\"", reason), double(n));
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
            tpot_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            inference_);
  histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_);
  histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", gen_len_);
  histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", max_tokens_);
  // kvtier's own.
  gauge("kvtier:kv_gpu_tier_bytes", "GPU-tier KV bytes (key index, resident tokens) held by running requests.",
        double(g.kv_gpu_bytes));
  gauge("kvtier:kv_host_tier_bytes", "Host-tier KV bytes held by running requests.", double(g.kv_host_bytes));
  gauge("kvtier:host_kv_reserved_bytes", "Host KV bytes reserved by running requests (charged to the budget).",
        double(g.host_kv_reserved_bytes));
  gauge("kvtier:host_kv_budget_bytes", "The server's host KV budget (0: none).", double(g.host_kv_budget_bytes));
  gauge("kvtier:gpu_kv_reserved_bytes", "GPU KV bytes reserved by running requests (charged to the budget).",
        double(g.gpu_kv_reserved_bytes));
  gauge("kvtier:gpu_kv_budget_bytes", "The server's GPU KV budget (0: none).", double(g.gpu_kv_budget_bytes));
  gauge("kvtier:open_connections", "Open HTTP connections.", double(g.open_connections));
  counter("kvtier:requests_rejected", "Requests refused at admission (queue full, shutting down, budget).",
          double(g.rejected));
  counter("kvtier:requests_cancelled", "Requests cancelled (client gone, request timeout).", double(g.cancelled));
  if (g.transfers_reported) {
    counter("kvtier:pcie_bytes", "Bytes copied from the host tier to the GPU.", double(g.pcie_bytes));
    counter("kvtier:slot_cache_hits", "Selected tokens found in the GPU slot cache.", double(g.slot_cache_hits));
    counter("kvtier:slot_cache_queries", "Selected tokens looked up in the GPU slot cache.",
            double(g.slot_cache_queries));
  }
  header(out, "kvtier:http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : responses_)
    sample(out, "kvtier:http_responses_total", L + fmt::format(",code=\"{}\"", status), double(n));
  return out;
}

}  // namespace kvtier::server
