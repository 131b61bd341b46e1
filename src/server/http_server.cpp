#include "server/http_server.h"

#include <fmt/format.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "backend/pinned_arena.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/completion_call.h"
#include "server/http_connection.h"
#include "server/job_builder.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace kvtier::server {

using nlohmann::json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::chrono::milliseconds ms(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000.0)); }

Reply json_reply(int status, const json& body) {
  Reply r;
  r.status = status;
  r.body = dump_json(body);
  if (status == 503 || status == 429) r.headers.push_back({"Retry-After", "1"});
  return r;
}

Reply error_reply(const RequestError& e) { return json_reply(e.status(), error_json(e)); }

// A JSON object body, or a RequestError (400).
json parse_object(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw RequestError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw RequestError(400, "the request body must be a JSON object");
  return j;
}

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  ServerOptions options;
  ServerLimits limits;
  Scheduler scheduler;
  Metrics metrics;
  std::string model_id;
  int64_t started_at = unix_now();
  std::atomic<uint64_t> next_id{0};
  std::atomic<int> n_open_calls{0};
  std::atomic<uint64_t> n_cancelled{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> running{false};

  // Declared before the io_context: calls and connections that it destroys
  // with its pending handlers still refer to them.
  std::shared_ptr<ConnectionContext> conn_ctx = std::make_shared<ConnectionContext>();
  CallContext call_ctx;
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> guard{ioc.get_executor()};
  tcp::acceptor acceptor{ioc};
  net::thread_pool work{2};  // request parsing and tokenization, off the I/O threads

  Impl(Engine& e, const ServerOptions& o)
      : engine(e),
        options(o),
        limits(make_limits(e, o.max_prompt_tokens, o.max_new_tokens, o.default_kv_policy)),
        scheduler(e, SchedulerOptions{o.max_active, o.max_queue, o.host_kv_budget_bytes, e.gpu_kv_budget_bytes(),
                                          o.prefill_tokens_per_round}),
        metrics(e.model_name(), limits.n_ctx),
        model_id(e.model_name()),
        call_ctx{scheduler, metrics, e.tokenizer(), std::chrono::milliseconds(o.heartbeat_ms),
                 ms(o.request_timeout_seconds), n_open_calls, n_cancelled} {
    KVT_CHECK(o.heartbeat_ms >= 1, "server: heartbeat_ms must be ≥ 1, got {}", o.heartbeat_ms);
    KVT_CHECK(o.header_timeout_seconds > 0, "server: the header timeout must be > 0 s, got {}",
              o.header_timeout_seconds);
    KVT_CHECK(o.request_timeout_seconds >= 0, "server: the request timeout must be ≥ 0 s, got {}",
              o.request_timeout_seconds);
    KVT_CHECK(o.max_connections >= 1, "server: max_connections must be ≥ 1, got {}", o.max_connections);
    KVT_CHECK(o.io_threads >= 1 && o.io_threads <= 64, "server: io_threads must be in 1..64, got {}", o.io_threads);
    KVT_CHECK(o.pin_host_bytes >= 0, "server: pin_host_bytes must be ≥ 0, got {}", o.pin_host_bytes);
    if (o.pin_host_bytes > 0 && e.options().device == "cuda") pin_host(size_t(o.pin_host_bytes));
    ConnectionLimits& l = conn_ctx->limits;
    l.header_timeout = ms(o.header_timeout_seconds);
    l.body_timeout = std::max(ms(30), l.header_timeout * 3);
    l.write_timeout = std::max(ms(30), l.header_timeout * 3);
    l.max_body_bytes = o.max_body_bytes;
    l.api_key = o.api_key;
    conn_ctx->on_response = [this](int status) { metrics.count_response(status); };
    conn_ctx->error_reply = [](int status, const std::string& message, const std::string& type) {
      return json_reply(status, error_json(message, type));
    };
    routes();
  }

  std::string new_id(Endpoint ep) {
    const uint64_t n = next_id.fetch_add(1);
    return fmt::format("{}-{:x}{:06x}", ep == Endpoint::chat ? "chatcmpl" : "cmpl", started_at, n);
  }

  using Handler = std::function<void(const std::shared_ptr<Connection>&, Request&)>;
  void route(const char* path, http::verb method, bool needs_key, Handler h) {
    conn_ctx->routes.push_back({path, method, needs_key, std::move(h)});
  }

  // Runs f (returning a Reply; RequestError → its status) on the work pool,
  // then replies on the connection's strand.
  template <class F>
  void on_work(const std::shared_ptr<Connection>& c, F f) {
    net::post(work, [c, f = std::move(f)]() mutable {
      Reply r;
      try {
        r = f();
      } catch (const RequestError& e) {
        r = error_reply(e);
      } catch (const Error& e) {
        r = json_reply(400, error_json(e.what()));
      }
      c->post([c, r = std::move(r)]() mutable { c->reply(std::move(r)); });
    });
  }

  void routes() {
    using http::verb;
    route("/health", verb::get, false, [this](auto& c, Request&) { c->reply(health()); });
    route("/metrics", verb::get, false, [this](auto& c, Request&) {
      Reply r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics.render(gauges());
      c->reply(std::move(r));
    });
    route("/v1/models", verb::get, true, [this](auto& c, Request&) {
      json m = {{"id", model_id}, {"object", "model"}, {"created", started_at}, {"owned_by", "kvtier"},
                {"max_model_len", limits.n_ctx}};
      c->reply(json_reply(200, json{{"object", "list"}, {"data", json::array({m})}}));
    });
    route("/v1/completions", verb::post, true, [this](auto& c, Request& req) { generate(c, req, Endpoint::completions); });
    route("/v1/chat/completions", verb::post, true,
          [this](auto& c, Request& req) { generate(c, req, Endpoint::chat); });
    route("/tokenize", verb::post, true, [this](auto& c, Request& req) {
      on_work(c, [this, body = std::move(req.body())] { return tokenize(body); });
    });
    route("/detokenize", verb::post, true, [this](auto& c, Request& req) {
      on_work(c, [this, body = std::move(req.body())] { return detokenize(body); });
    });
    route("/tokenizer_info", verb::get, true, [this](auto& c, Request&) { c->reply(tokenizer_info()); });
  }

  SchedulerStats stats() const { return scheduler.stats(); }

  // Hook for the engine's transfer statistics (host → GPU bytes, slot-cache
  // hits): the engine does not report them per sequence yet, so nothing is
  // filled in and /metrics leaves those series out.
  void transfer_stats(ServerGauges&) const {}

  ServerGauges gauges() const {
    const SchedulerStats s = stats();
    ServerGauges g;
    g.n_running = s.n_active;
    g.n_waiting = s.n_queued;
    g.kv_gpu_bytes = s.kv_gpu_bytes;
    g.kv_host_bytes = s.kv_host_bytes;
    g.host_kv_reserved_bytes = s.host_kv_reserved_bytes;
    g.host_kv_budget_bytes = options.host_kv_budget_bytes;
    g.gpu_kv_reserved_bytes = s.gpu_kv_reserved_bytes;
    g.gpu_kv_budget_bytes = engine.gpu_kv_budget_bytes();
    // vLLM's gauge: the fuller of the two pools that have a budget.
    auto usage = [](int64_t reserved, int64_t budget) { return budget > 0 ? double(reserved) / double(budget) : 0.0; };
    g.kv_cache_usage = std::max(usage(s.host_kv_reserved_bytes, options.host_kv_budget_bytes),
                                usage(s.gpu_kv_reserved_bytes, g.gpu_kv_budget_bytes));
    g.open_connections = conn_ctx->n_open.load();
    g.rejected = s.n_rejected;
    g.cancelled = n_cancelled.load();
    transfer_stats(g);
    return g;
  }

  Reply health() {
    const SchedulerStats s = stats();
    const PinnedStats pinned = pinned_host_stats();  // the host tier's pool (CUDA; zeros on the CPU)
    json j = {
        {"status", s.accepting && !stopping ? "ok" : "shutting_down"},
        {"model", model_id},
        {"default_kv_policy", limits.default_kv_policy},
        {"active_sequences", s.n_active},
        {"queued_requests", s.n_queued},
        {"kv_gpu_bytes", s.kv_gpu_bytes},
        {"kv_host_bytes", s.kv_host_bytes},
        {"host_kv_reserved_bytes", s.host_kv_reserved_bytes},
        {"gpu_kv_reserved_bytes", s.gpu_kv_reserved_bytes},
        {"host_pinned_bytes", pinned.pinned_bytes},
        {"host_pinned_in_use_bytes", pinned.in_use_bytes},
        {"open_connections", conn_ctx->n_open.load()},
        {"open_requests", n_open_calls.load()},
        {"requests",
         {{"completed", s.n_completed},
          {"cancelled", s.n_cancelled},
          {"failed", s.n_failed},
          {"rejected", s.n_rejected}}},
        {"tokens_generated", s.n_tokens_generated},
        {"scheduler_rounds", s.n_rounds},
        {"worker_seconds", {{"start", s.start_seconds}, {"step", s.step_seconds}, {"finish", s.finish_seconds}}},
        {"limits",
         {{"n_ctx", limits.n_ctx},
          {"max_prompt_tokens", limits.max_prompt_tokens},
          {"max_new_tokens", limits.max_new_tokens},
          {"max_active", options.max_active},
          {"max_queue", options.max_queue},
          {"prefill_tokens_per_round", options.prefill_tokens_per_round},
          {"host_kv_budget_bytes", options.host_kv_budget_bytes},
          {"gpu_kv_budget_bytes", engine.gpu_kv_budget_bytes()},
          {"pin_host_bytes", options.pin_host_bytes},
          {"header_timeout_seconds", options.header_timeout_seconds},
          {"request_timeout_seconds", options.request_timeout_seconds},
          {"max_connections", options.max_connections}}},
    };
    return json_reply(s.accepting && !stopping ? 200 : 503, j);
  }

  // vLLM's /tokenize: {"prompt": str, "add_special_tokens": bool} or
  // {"messages": [...]} → {"count", "max_model_len", "tokens"}.
  Reply tokenize(const std::string& body) {
    const json j = parse_object(body);
    std::vector<int32_t> ids;
    if (j.contains("messages")) {
      json chat = {{"messages", j["messages"]}};
      const ApiRequest r = parse_request(dump_json(chat), Endpoint::chat);
      ids = engine.tokenize(engine.chat_prompt(r.messages), true);
    } else {
      auto p = j.find("prompt");
      if (p == j.end() || !p->is_string()) throw RequestError(400, "'prompt' (a string) or 'messages' is required", "prompt");
      bool add_special = true;
      if (auto a = j.find("add_special_tokens"); a != j.end() && !a->is_null()) {
        if (!a->is_boolean()) throw RequestError(400, "'add_special_tokens' must be a boolean", "add_special_tokens");
        add_special = a->get<bool>();
      }
      ids = engine.tokenize(p->get<std::string>(), add_special);
    }
    json out = {{"count", ids.size()}, {"max_model_len", limits.n_ctx}, {"tokens", ids}};
    if (auto t = j.find("return_token_strs"); t != j.end() && t->is_boolean() && t->get<bool>()) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(engine.tokenizer().token_to_piece(id));
      out["token_strs"] = strs;
    }
    return json_reply(200, out);
  }

  // vLLM's /detokenize: {"tokens": [ids]} → {"prompt": text}.
  Reply detokenize(const std::string& body) {
    const json j = parse_object(body);
    auto t = j.find("tokens");
    if (t == j.end() || !t->is_array()) throw RequestError(400, "'tokens' (an array of token ids) is required", "tokens");
    const int32_t n_vocab = engine.tokenizer().n_vocab();
    std::vector<int32_t> ids;
    for (size_t i = 0; i < t->size(); ++i) {
      const json& v = (*t)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab)
        throw RequestError(400, fmt::format("tokens[{}] is not a token id in [0, {})", i, n_vocab), "tokens");
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    return json_reply(200, json{{"prompt", engine.tokenizer().decode(ids)}});
  }

  // vLLM's /tokenizer_info (what lm-evaluation-harness reads to use the
  // server's tokenizer remotely).
  Reply tokenizer_info() {
    const Tokenizer& t = engine.tokenizer();
    auto piece = [&](int32_t id) { return id >= 0 ? json(t.token_to_piece(id)) : json(nullptr); };
    json j = {{"tokenizer_class", "kvtier-bpe"},
              {"model_max_length", limits.n_ctx},
              {"vocab_size", t.n_vocab()},
              {"bos_token", piece(t.bos_id())},
              {"eos_token", piece(t.eos_id())},
              {"pad_token", nullptr},
              {"add_bos_token", t.add_bos_default()}};
    return json_reply(200, j);
  }

  void generate(const std::shared_ptr<Connection>& c, Request& req, Endpoint ep) {
    net::post(work, [this, c, ep, body = std::move(req.body())] {
      // Parsing and tokenizing here, off the I/O threads; the scheduler's
      // worker does every engine call.
      ApiRequest r;
      Job job;
      std::shared_ptr<Channel> ch;
      CallRequest cr;
      try {
        r = parse_request(body, ep);
        job = build_job(r, engine, limits);
        cr.meta = ResponseMeta{ep, new_id(ep), unix_now(), model_id};
        cr.stream = r.stream;
        cr.include_usage = r.include_usage;
        cr.logprobs = r.logprobs;
        cr.echo = r.echo;
        cr.max_tokens = job.sampling.max_new_tokens;
        if (r.echo) {
          cr.prompt = job.prompt;
          cr.echo_text = r.prompt_text ? *r.prompt_text : engine.tokenizer().decode(job.prompt);
        }
        ch = scheduler.submit(std::move(job));
      } catch (const RequestError& e) {
        c->post([c, rep = error_reply(e)]() mutable { c->reply(std::move(rep)); });
        return;
      } catch (const Error& e) {
        // Tokenizer or chat-template refusals of this input.
        c->post([c, rep = json_reply(400, error_json(e.what()))]() mutable { c->reply(std::move(rep)); });
        return;
      }
      c->post([this, c, ch, cr = std::move(cr)]() mutable {
        std::make_shared<CompletionCall>(call_ctx, c, ch, std::move(cr))->start();
      });
    });
  }

  void accept() {
    Strand strand = net::make_strand(ioc);
    acceptor.async_accept(strand, [this, strand](boost::system::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
        // Out of descriptors and the like: wait a little rather than spin.
        auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
        t->async_wait([this, t](boost::system::error_code) { accept(); });
        return;
      }
      if (conn_ctx->n_open.load() >= options.max_connections) {
        boost::system::error_code ignore;
        socket.close(ignore);  // over the limit: closed at once
      } else {
        std::make_shared<Connection>(strand, std::move(socket), conn_ctx)->start();
      }
      accept();
    });
  }
};

HttpServer::HttpServer(Engine& engine, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(engine, options)) {}

HttpServer::~HttpServer() {
  shutdown();
  impl_->work.join();
}

int HttpServer::bind() {
  Impl& m = *impl_;
  const ServerOptions& o = m.options;
  KVT_CHECK(o.port >= 0 && o.port < 65536, "server: port {} is not in 0..65535", o.port);
  boost::system::error_code ec;
  const auto address = net::ip::make_address(o.host, ec);
  KVT_CHECK(!ec, "server: '{}' is not an IP address ({})", o.host, ec.message());
  const tcp::endpoint ep(address, static_cast<unsigned short>(o.port));
  m.acceptor.open(ep.protocol(), ec);
  KVT_CHECK(!ec, "server: cannot open a socket for {} ({})", o.host, ec.message());
  m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  m.acceptor.bind(ep, ec);
  KVT_CHECK(!ec, "server: cannot bind {}:{} ({}; in use, or not an address of this machine?)", o.host, o.port,
            ec.message());
  m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  KVT_CHECK(!ec, "server: cannot listen on {}:{} ({})", o.host, o.port, ec.message());
  return m.acceptor.local_endpoint().port();
}

void HttpServer::run() {
  Impl& m = *impl_;
  m.running = true;
  if (!m.stopping) {
    m.accept();
    std::vector<std::thread> extra;
    for (int i = 1; i < m.options.io_threads; ++i) extra.emplace_back([&m] { m.ioc.run(); });
    m.ioc.run();
    for (auto& t : extra) t.join();
  }
  m.running = false;
}

void HttpServer::shutdown() {
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return;
  // No new connections; requests on open ones get 503 from the scheduler.
  net::post(m.ioc, [&m] {
    boost::system::error_code ignore;
    m.acceptor.close(ignore);
  });
  m.scheduler.drain(std::chrono::milliseconds(int64_t(m.options.shutdown_grace_seconds * 1000)));
  // Every request has ended; let the calls write their last bytes.
  for (int i = 0; i < 200 && m.n_open_calls.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.guard.reset();
  m.ioc.stop();
}

}  // namespace kvtier::server
