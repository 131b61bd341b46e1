#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/job_builder.h"
#include "server/scheduler.h"

namespace kvtier::server {

using nlohmann::json;

namespace {

const char* kJson = "application/json";

void send_error(httplib::Response& res, int status, const json& body) {
  res.status = status;
  if (status == 503 || status == 429) res.set_header("Retry-After", "1");
  res.set_content(dump_json(body), kJson);
}

const char* status_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What the chunked content provider of one streaming request carries between calls.
struct StreamState {
  std::shared_ptr<Channel> channel;
  ResponseMeta meta;
  bool include_usage = false;
  bool first = true;
};

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  ServerOptions options;
  ServerLimits limits;
  Scheduler scheduler;
  httplib::Server http;
  std::string model_id;
  int64_t started_at = unix_now();
  std::atomic<uint64_t> next_id{0};
  std::atomic<int> n_open_streams{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> running{false};

  Impl(Engine& e, const ServerOptions& o)
      : engine(e),
        options(o),
        limits(make_limits(e, o.max_prompt_tokens, o.max_new_tokens, o.default_kv_policy)),
        scheduler(e, SchedulerOptions{o.max_active, o.max_queue, o.host_kv_budget_bytes}),
        model_id(e.model_name()) {
    KVT_CHECK(o.heartbeat_ms >= 1, "server: heartbeat_ms must be ≥ 1, got {}", o.heartbeat_ms);
    // Handlers mostly wait on their channel, so one thread per request that can
    // be in flight (active + queued) plus a few for /health and refusals.
    const size_t n_threads = size_t(std::clamp(o.max_active + o.max_queue + 8, 8, 1024));
    http.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
    http.set_payload_max_length(o.max_body_bytes);
    // Clients such as the openai package keep connections open; httplib's
    // default closes one after 5 requests.
    http.set_keep_alive_max_count(1000);
    routes();
  }

  std::string new_id(Endpoint ep) {
    const uint64_t n = next_id.fetch_add(1);
    return fmt::format("{}-{:x}{:06x}", ep == Endpoint::chat ? "chatcmpl" : "cmpl", started_at, n);
  }

  void routes() {
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", model_id}, {"object", "model"}, {"created", started_at},
                {"owned_by", "kvtier"}};
      res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({m})}}), kJson);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::completions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::chat);
    });
    // Routing misses, oversized bodies (413) and the like get OpenAI-style bodies too.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string msg = res.status == 404 ? fmt::format("no route for {} {}", req.method, req.path)
                                          : fmt::format("HTTP {}", res.status);
      if (res.status == 413) msg = "the request body is too large";
      res.set_content(dump_json(error_json(msg, status_type(res.status))), kJson);
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string msg = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            msg = fmt::format("internal error: {}", e.what());
          } catch (...) {
          }
          send_error(res, 500, error_json(msg, "server_error"));
        });
  }

  void health(httplib::Response& res) {
    const SchedulerStats s = scheduler.stats();
    json j = {
        {"status", s.accepting ? "ok" : "shutting_down"},
        {"model", model_id},
        {"default_kv_policy", limits.default_kv_policy},
        {"active_sequences", s.n_active},
        {"queued_requests", s.n_queued},
        {"kv_gpu_bytes", s.kv_gpu_bytes},
        {"kv_host_bytes", s.kv_host_bytes},
        {"host_kv_reserved_bytes", s.host_kv_reserved_bytes},
        {"open_streams", n_open_streams.load()},
        {"requests",
         {{"completed", s.n_completed},
          {"cancelled", s.n_cancelled},
          {"failed", s.n_failed},
          {"rejected", s.n_rejected}}},
        {"tokens_generated", s.n_tokens_generated},
        {"scheduler_rounds", s.n_rounds},
        {"limits",
         {{"n_ctx", limits.n_ctx},
          {"max_prompt_tokens", limits.max_prompt_tokens},
          {"max_new_tokens", limits.max_new_tokens},
          {"max_active", options.max_active},
          {"max_queue", options.max_queue},
          {"host_kv_budget_bytes", options.host_kv_budget_bytes}}},
    };
    res.status = s.accepting ? 200 : 503;
    res.set_content(dump_json(j), kJson);
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    std::shared_ptr<Channel> ch;
    ApiRequest r;
    try {
      r = parse_request(req.body, ep);
      ch = scheduler.submit(build_job(r, engine, limits));
    } catch (const RequestError& e) {
      send_error(res, e.status(), error_json(e));
      return;
    } catch (const Error& e) {
      // Tokenizer or chat-template refusals of this input.
      send_error(res, 400, error_json(e.what()));
      return;
    }
    ResponseMeta meta{ep, new_id(ep), unix_now(), model_id};
    if (r.stream) {
      stream(res, std::move(ch), std::move(meta), r.include_usage);
      return;
    }
    // cpp-httplib 0.11 offers no way to see a closed connection without
    // writing, so a non-streaming request runs to its end (bounded by
    // max_tokens); a streaming client that leaves is cancelled at once.
    ch->wait_finished();
    if (const auto& err = ch->error()) {
      send_error(res, err->status, error_json(err->message, err->type, {}, err->code));
      return;
    }
    res.set_content(dump_json(completion_json(meta, ch->result())), kJson);
  }

  void stream(httplib::Response& res, std::shared_ptr<Channel> ch, ResponseMeta meta,
              bool include_usage) {
    auto st = std::make_shared<StreamState>();
    st->channel = std::move(ch);
    st->meta = std::move(meta);
    st->include_usage = include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    n_open_streams.fetch_add(1);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) { return stream_step(*st, sink); },
        [this, st](bool) {
          // Runs when the response is destroyed, however it ended: a stream
          // cut short (write failure, server stop) cancels its request.
          if (!st->channel->finished()) scheduler.cancel(*st->channel);
          n_open_streams.fetch_sub(1);
        });
  }

  // One call of the content provider: waits up to one heartbeat for text,
  // writes it as a chunk (or a keep-alive comment, which also reveals a
  // client that went away), and closes the stream when the request ends.
  bool stream_step(StreamState& st, httplib::DataSink& sink) {
    Channel& ch = *st.channel;
    const Channel::Update u = ch.wait(std::chrono::milliseconds(options.heartbeat_ms));
    std::string out;
    if (!u.text.empty()) {
      out += sse_event(stream_chunk_json(st.meta, u.text, st.first, std::nullopt, st.include_usage));
      st.first = false;
    }
    if (u.finished) {
      if (const auto& err = ch.error()) {
        out += sse_event(error_json(err->message, err->type, {}, err->code));
      } else {
        const GenerationResult& r = ch.result();
        json last = stream_chunk_json(st.meta, "", st.first,
                                      openai_finish_reason(r.finish_reason), st.include_usage);
        last["kvtier"] = kvtier_json(r);
        out += sse_event(last);
        if (st.include_usage) out += sse_event(usage_chunk_json(st.meta, r));
      }
      out += sse_done();
      if (!sink.write(out.data(), out.size())) return false;
      sink.done();
      return true;
    }
    if (out.empty()) out = sse_comment("keep-alive");
    if (!sink.write(out.data(), out.size())) {
      scheduler.cancel(ch);
      return false;
    }
    return true;
  }
};

HttpServer::HttpServer(Engine& engine, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(engine, options)) {}

HttpServer::~HttpServer() { shutdown(); }

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    KVT_CHECK(port > 0, "server: cannot bind {} to any port", o.host);
  } else {
    KVT_CHECK(port > 0 && port < 65536, "server: port {} is not in 1..65535", port);
    KVT_CHECK(impl_->http.bind_to_port(o.host, port),
              "server: cannot bind {}:{} (in use, or not an address of this machine?)", o.host,
              port);
  }
  return port;
}

void HttpServer::run() {
  impl_->running = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->running = false;
}

void HttpServer::shutdown() {
  if (impl_->stopping.exchange(true)) return;
  const auto grace = std::chrono::milliseconds(int64_t(impl_->options.shutdown_grace_seconds * 1000));
  impl_->scheduler.drain(grace);
  // Every request has ended; let the streams write their last events before
  // the listener stops (httplib stops calling providers once it is stopping).
  for (int i = 0; i < 200 && impl_->n_open_streams.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // stop() only acts once the listen loop runs; wait for it briefly.
  for (int i = 0; i < 200 && impl_->running && !impl_->http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->http.stop();
}

}  // namespace kvtier::server
