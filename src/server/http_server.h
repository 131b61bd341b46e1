// The OpenAI-compatible HTTP front end (Boost.Beast on Asio, event-driven:
// http_connection.h): GET /health, GET /metrics (Prometheus), GET /v1/models,
// POST /v1/completions, POST /v1/chat/completions (JSON or server-sent
// events), POST /tokenize, POST /detokenize, GET /tokenizer_info. Requests go
// through api_request → job_builder → scheduler; a few I/O threads serve
// every connection and a small pool parses and tokenizes, so every engine
// call stays on the scheduler's worker and no client can hold a thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/engine.h"

namespace kvtier::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0: any free port (see HttpServer::bind)
  std::string default_kv_policy = "full";
  int max_active = 4;               // sequences decoding at once
  int max_queue = 64;               // requests waiting; more → 503
  int64_t max_prompt_tokens = 0;    // 0: the context minus one
  int64_t max_new_tokens = 2048;    // ceiling for max_tokens
  int64_t host_kv_budget_bytes = 0;  // Σ host KV of active requests; 0: no limit
  int64_t prefill_tokens_per_round = 0;  // prompt tokens per scheduler round; 0: no limit (SchedulerOptions)
  int64_t pin_host_bytes = 0;  // --device cuda: host memory pinned for the host KV tier at start, in the background
  size_t max_body_bytes = 8u << 20;  // larger bodies → 413
  double shutdown_grace_seconds = 10;  // active requests may finish for this long
  int heartbeat_ms = 250;  // SSE keep-alive comment period while no token is ready
  std::string api_key;     // non-empty: the API needs "Authorization: Bearer <key>" (401 otherwise)
  double header_timeout_seconds = 10;   // a request header must arrive whole within this
  double request_timeout_seconds = 0;   // a request not finished after this is cancelled (0: none)
  int max_connections = 4096;           // open connections; more are closed at once
  int io_threads = 2;                   // threads serving connections
};

class HttpServer {
 public:
  HttpServer(Engine& engine, const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one for port 0).
  // Throws kvtier::Error when the address cannot be bound.
  int bind();
  // Serves until shutdown(); call after bind().
  void run();
  // Graceful stop, callable from any thread (a signal watcher): refuse new
  // requests, let active ones finish within the grace period, cancel the
  // rest, close the listening socket; run() then returns.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::server
