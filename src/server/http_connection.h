// One HTTP/1.1 connection of the server (Boost.Beast over Asio), event-driven
// on a strand: the request header must arrive whole within a deadline (slow
// or idle clients are closed, never holding a thread), the parser is strict
// (conflicting Content-Length, bad chunking, oversized headers → 400), the
// route table answers 404 for unknown paths and 405 with Allow for a wrong
// method, POST bodies must be JSON (415), and an API key, when set, is
// checked in constant time (401). While a handler works, the connection can
// watch its socket, so that a client that closes (or half-closes) is seen at
// once even when nothing is being written.
#pragma once
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvtier::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Strand = net::strand<net::io_context::executor_type>;

// A complete response.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class Connection;

struct Route {
  std::string path;
  http::verb method = http::verb::get;
  bool needs_key = false;  // behind --api-key (the API; not /health or /metrics)
  // Runs on the connection's strand with the whole request; must end in
  // reply() or start_stream()…end_stream() on `c`, now or later.
  std::function<void(const std::shared_ptr<Connection>& c, Request& req)> handler;
};

struct ConnectionLimits {
  std::chrono::milliseconds header_timeout{10000};  // whole header, from the first wait
  std::chrono::milliseconds body_timeout{30000};    // whole body, after the header
  std::chrono::milliseconds write_timeout{30000};   // each write
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 8u << 20;
  std::string api_key;  // empty: no authentication
};

// Shared by every connection: routes, limits, and hooks for counting.
struct ConnectionContext {
  std::vector<Route> routes;
  ConnectionLimits limits;
  std::function<void(int status)> on_response;  // every response written (status)
  std::function<Reply(int status, const std::string& message, const std::string& type)> error_reply;
  std::atomic<int64_t> n_open{0};
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `socket` runs its completions on `strand` (accepted with that executor).
  Connection(Strand strand, tcp::socket socket, std::shared_ptr<ConnectionContext> ctx);
  ~Connection();
  void start();

  // Handler side (call on the strand; post() from elsewhere).
  void reply(Reply r);
  void start_stream(Reply head);         // status + headers, then chunks
  void stream_write(std::string data);   // one chunk (queued)
  void end_stream();                     // last chunk; then keep-alive or close
  // Watches the socket for the client going away (EOF, reset); on_gone runs
  // once on the strand. Bytes that arrive meanwhile (a pipelined request)
  // are kept for the next request.
  void watch_disconnect(std::function<void()> on_gone);
  bool gone() const { return gone_; }
  const Strand& strand() const { return strand_; }
  template <class F>
  void post(F&& f) {
    net::post(strand_, std::forward<F>(f));
  }
  void close();

 private:
  void read_header();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_body(boost::beast::error_code ec);
  void dispatch();
  void arm_read_deadline(std::chrono::milliseconds d);
  void fail_request(int status, const std::string& message, const std::string& type, bool close_after,
                    std::vector<std::pair<std::string, std::string>> extra_headers = {});
  void write_queued();
  void after_response();
  void linger_close();
  void drain_input();
  bool authorized(const Request& req) const;

  Strand strand_;
  tcp::socket socket_;
  std::shared_ptr<ConnectionContext> ctx_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Request req_;
  const Route* route_ = nullptr;
  net::steady_timer read_deadline_;
  net::steady_timer write_deadline_;
  bool keep_alive_ = true;
  bool reading_ = false;   // a header/body read is in flight
  bool watching_ = false;  // a disconnect watch read is in flight
  bool gone_ = false;
  bool closed_ = false;
  bool busy_ = false;  // a request is being handled (between header and response end)
  std::function<void()> on_gone_;
  // Outgoing bytes: whole serialized responses or stream chunks, written in order.
  std::vector<std::string> out_;
  bool writing_ = false;
  bool streaming_ = false;
  bool close_after_write_ = false;
  bool end_after_write_ = false;  // the queued bytes end the current response
  // Lingering close: input read and dropped after the last response.
  std::array<char, 4096> sink_{};
  size_t lingered_ = 0;
};

// Constant-time comparison (no early exit on the first differing byte).
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace kvtier::server
