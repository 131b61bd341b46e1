// kvtier serve: the OpenAI-compatible HTTP server (src/server/) on one engine.
// SIGINT/SIGTERM stop it gracefully: new requests are refused, active ones
// get a grace period, the rest are cancelled, and the process exits 0.
#include <fmt/format.h>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "command.h"
#include "core/status.h"
#include "options.h"
#include "server/http_server.h"

namespace kvtier::tools {
namespace {

struct ServeArgs {
  EngineOptions engine;
  server::ServerOptions server;
};

// Set by the SIGINT/SIGTERM handler (any thread may take the signal: OpenBLAS
// starts its threads before main, so masking cannot confine it); a watcher
// thread polls it and calls into the server outside signal context.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

void serve(ServeArgs& a) {
  a.server.host_kv_budget_bytes = a.engine.host_kv_budget_bytes;
  const bool cuda = a.engine.device == "cuda";
  KVT_CHECK(cuda || a.server.pin_host_bytes <= 0,
            "--pin-host {}: host memory is pinned only for --device cuda (the CPU's host tier is plain memory)",
            a.server.pin_host_bytes);
  if (a.server.pin_host_bytes < 0) a.server.pin_host_bytes = cuda ? a.engine.host_kv_budget_bytes : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that vanished must not kill the server
  // Each connection is a descriptor: raise the soft limit to the hard one so
  // that --max-connections, not the default 1024, is the limit.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (a.server.api_key.empty()) {
    // The key may come from the environment, so that it stays out of `ps`.
    if (const char* k = std::getenv("KVTIER_API_KEY"); k && *k) a.server.api_key = k;
  }

  // A prompt runs one --prefill-chunk per scheduler round, between the decode
  // steps of the sequences already streaming.
  a.engine.prefill_chunk_per_step = true;
  if (a.server.prefill_tokens_per_round < 0) a.server.prefill_tokens_per_round = a.engine.prefill_chunk;
  auto engine = load_engine(a.engine);
  if (a.server.pin_host_bytes > 0)
    fmt::print(stderr, "kvtier serve: pinning {:.1f} GB of host memory for the host KV tier (--pin-host)\n",
               double(a.server.pin_host_bytes) / 1e9);
  server::HttpServer http(*engine, a.server);
  const int port = http.bind();
  fmt::print(stderr, "kvtier serve: {} on http://{}:{} (kv policy {}, {} active, queue {})\n",
             engine->model_name(), a.server.host, port, a.server.default_kv_policy,
             a.server.max_active, a.server.max_queue);

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      if (const int sig = g_stop_signal.load()) {
        fmt::print(stderr, "kvtier serve: {} received, shutting down\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
        http.shutdown();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  http.run();
  done = true;
  watcher.join();
  http.shutdown();
  fmt::print(stderr, "kvtier serve: stopped\n");
}

Registration reg(20, [](CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming)");
  add_engine_options(*cmd, a->engine);
  add_kv_option(*cmd, a->server.default_kv_policy);
  server::ServerOptions& s = a->server;
  cmd->add_option("--host", s.host, "address to listen on (loopback unless told otherwise)")
      ->capture_default_str();
  cmd->add_option("--port", s.port, "TCP port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-active", s.max_active, "sequences running at once (one batched forward per round)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  s.prefill_tokens_per_round = -1;
  cmd->add_option("--prefill-budget", s.prefill_tokens_per_round,
                  "prompt tokens run per round, earliest request first, beside the decode steps "
                  "(-1: one --prefill-chunk; 0: every new request runs a chunk each round)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 30))
      ->capture_default_str();
  s.pin_host_bytes = -1;
  cmd->add_option("--pin-host", s.pin_host_bytes,
                  "--device cuda: bytes of host memory to pin for the host KV tier before the server answers, so "
                  "that admitting a request does not pin its host K/V then (-1: --host-kv-budget; 0: pin as "
                  "requests come)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 50))
      ->capture_default_str();
  cmd->add_option("--max-queue", s.max_queue, "requests waiting for a slot; more get 503")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--max-prompt-tokens", s.max_prompt_tokens,
                  "longest prompt accepted (0: the context minus one)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", s.max_new_tokens, "largest max_tokens accepted")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "largest request body (413 above)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 30))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", s.shutdown_grace_seconds,
                  "seconds active requests may run on after SIGINT/SIGTERM")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--api-key", s.api_key,
                  "require 'Authorization: Bearer KEY' on the API (401 otherwise; also $KVTIER_API_KEY)");
  cmd->add_option("--header-timeout", s.header_timeout_seconds,
                  "seconds a client has to send a whole request header (idle keep-alive included)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--request-timeout", s.request_timeout_seconds,
                  "seconds after which an unfinished request is cancelled (0: none)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections, "open connections; more are closed at once")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--io-threads", s.io_threads, "threads serving connections")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->callback([a] { serve(*a); });
});

}  // namespace
}  // namespace kvtier::tools
