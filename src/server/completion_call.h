// One generation request in flight between its connection and the
// scheduler, on the connection's strand: the channel's listener wakes it for
// each token; a non-streaming request answers once at the end, a stream
// writes a chunk per update (with keep-alive comments between). A client that
// goes away — seen by the connection's socket watch even while nothing is
// written — cancels the request at once, which frees its slot and KV memory.
// A request timeout cancels it too. Every end is observed by the metrics.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "server/api_logprobs.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/http_connection.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace kvtier::server {

struct CallContext {
  Scheduler& scheduler;
  Metrics& metrics;
  const Tokenizer& tokenizer;
  std::chrono::milliseconds heartbeat{250};
  std::chrono::milliseconds request_timeout{0};  // 0: none
  std::atomic<int>& n_open_calls;
  std::atomic<uint64_t>& n_cancelled;
};

struct CallRequest {
  ResponseMeta meta;
  bool stream = false;
  bool include_usage = false;
  int logprobs = -1;
  bool echo = false;
  std::string echo_text;         // the prompt's text (echo)
  std::vector<int32_t> prompt;   // the prompt's tokens (echo with logprobs)
  int64_t max_tokens = 0;
};

class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(CallContext& ctx, std::shared_ptr<Connection> conn, std::shared_ptr<Channel> ch, CallRequest req);
  ~CompletionCall();
  // On the connection's strand, right after submit.
  void start();

 private:
  void on_update();
  void on_gone();
  void on_timeout();
  void arm_heartbeat();
  void finish_stream(const Channel::Update& u);
  void reply_whole();
  void observe(const std::string& reason);
  nlohmann::json chunk_logprobs(const std::vector<TokenLogprob>& lps);
  Reply error_reply(int status, const std::string& message, const std::string& type, const std::string& code);

  CallContext& ctx_;
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<Channel> ch_;
  CallRequest req_;
  net::steady_timer heartbeat_;
  net::steady_timer timeout_;
  bool done_ = false;
  bool first_ = true;
  bool wrote_since_beat_ = false;
  bool timed_out_ = false;
  CompletionLogprobs stream_lp_;  // completions stream: text offsets run on
};

}  // namespace kvtier::server
