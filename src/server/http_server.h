// The OpenAI-compatible HTTP front end (cpp-httplib): GET /health,
// GET /v1/models, POST /v1/completions, POST /v1/chat/completions (JSON or
// server-sent events). Requests go through api_request → job_builder →
// scheduler; httplib's own thread pool runs the handlers, which only wait on
// their Channel, so every engine call stays on the scheduler's worker.
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
  size_t max_body_bytes = 8u << 20;  // larger bodies → 413
  double shutdown_grace_seconds = 10;  // active requests may finish for this long
  int heartbeat_ms = 250;  // SSE keep-alive comment period while no token is ready
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
