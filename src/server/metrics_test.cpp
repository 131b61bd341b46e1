#include "server/metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvtier::server {
namespace {

TEST(Metrics, HistogramIsCumulativeWithInf) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  std::string out;
  h.render(out, "x", "a=\"b\"");
  EXPECT_EQ(out,
            "x_bucket{a=\"b\",le=\"0.1\"} 2\n"
            "x_bucket{a=\"b\",le=\"1\"} 3\n"
            "x_bucket{a=\"b\",le=\"+Inf\"} 4\n"
            "x_sum{a=\"b\"} 7.65\n"
            "x_count{a=\"b\"} 4\n");
}

TEST(Metrics, Buckets125) {
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(buckets_1_2_5(8192).back(), 5000);
}

TEST(Metrics, VllmNamesAndKvtierOwn) {
  Metrics m("Smol\"LM", 8192);
  RequestObservation r;
  r.finished_reason = "length";
  r.n_prompt_tokens = 12;
  r.n_generation_tokens = 3;
  r.ttft_seconds = 0.2;
  r.inter_token_seconds = {0.05, 0.06};
  r.e2e_seconds = 0.4;
  m.observe(r);
  m.count_response(200);
  ServerGauges g;
  g.n_running = 2;
  g.n_waiting = 1;
  const std::string out = m.render(g);
  const std::string L = "model_name=\"Smol\\\"LM\",engine=\"0\"";
  for (const std::string& line : std::vector<std::string>{"# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running{" + L + "} 2",
        "vllm:num_requests_waiting{" + L + "} 1", "# TYPE vllm:prompt_tokens_total counter",
        "vllm:prompt_tokens_total{" + L + "} 12", "vllm:generation_tokens_total{" + L + "} 3",
        "vllm:request_success_total{" + L + ",finished_reason=\"length\"} 1",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        "vllm:time_to_first_token_seconds_bucket{" + L + ",le=\"0.25\"} 1",
        "vllm:inter_token_latency_seconds_count{" + L + "} 2", "vllm:e2e_request_latency_seconds_count{" + L + "} 1",
        "# TYPE vllm:kv_cache_usage_perc gauge", "kvtier:kv_host_tier_bytes{" + L + "} 0",
        "kvtier:http_responses_total{" + L + ",code=\"200\"} 1"})
    EXPECT_NE(out.find(line + "\n"), std::string::npos) << line << "\n" << out;
  // Transfer counters appear only once the engine reports them.
  EXPECT_EQ(out.find("kvtier:pcie_bytes"), std::string::npos);
  g.transfers_reported = true;
  g.pcie_bytes = 4096;
  EXPECT_NE(m.render(g).find("kvtier:pcie_bytes_total{" + L + "} 4096\n"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::server
