#include "server/http_connection.h"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>

#include <algorithm>
#include <cctype>

namespace kvtier::server {

namespace beast = boost::beast;

bool constant_time_equal(const std::string& a, const std::string& b) {
  // The length is not secret (a bearer token's length is public in practice);
  // the bytes are compared without an early exit.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

// "application/json" or "application/json; charset=utf-8" (case-insensitive
// media type, any parameters).
bool is_json_content_type(std::string_view v) {
  const size_t semi = v.find(';');
  std::string_view type = v.substr(0, semi);
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  static const std::string_view kJson = "application/json";
  if (type.size() != kJson.size()) return false;
  for (size_t i = 0; i < type.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(type[i])) != kJson[i]) return false;
  return true;
}

std::string serialize_head(int status, const std::string& content_type,
                           const std::vector<std::pair<std::string, std::string>>& headers, bool keep_alive,
                           std::optional<size_t> content_length) {
  const auto st = http::int_to_status(unsigned(status));
  std::string reason(http::obsolete_reason(st));
  if (reason.empty() || reason == "<unknown-status>") reason = "Status";
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nServer: kvtier\r\n", status, reason);
  if (!content_type.empty()) out += fmt::format("Content-Type: {}\r\n", content_type);
  for (const auto& [k, v] : headers) out += fmt::format("{}: {}\r\n", k, v);
  if (content_length) out += fmt::format("Content-Length: {}\r\n", *content_length);
  else out += "Transfer-Encoding: chunked\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

constexpr auto kLingerTime = std::chrono::milliseconds(2000);
constexpr size_t kLingerBytes = 1u << 20;

}  // namespace

Connection::Connection(Strand strand, tcp::socket socket, std::shared_ptr<ConnectionContext> ctx)
    : strand_(std::move(strand)),
      socket_(std::move(socket)),
      ctx_(std::move(ctx)),
      read_deadline_(strand_),
      write_deadline_(strand_) {
  ctx_->n_open.fetch_add(1);
}

Connection::~Connection() { ctx_->n_open.fetch_sub(1); }

void Connection::start() {
  net::post(strand_, [self = shared_from_this()] { self->read_header(); });
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  on_gone_ = nullptr;  // breaks the call ↔ connection reference cycle
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  read_deadline_.cancel();
  write_deadline_.cancel();
}

void Connection::linger_close() {
  if (closed_) return;
  // Closing a socket whose receive queue holds unread bytes (the rest of an
  // oversized header or of a refused body) sends a reset, and the client may
  // lose the error response it was about to read. So, like nginx's
  // lingering close: end our side, then read and drop what the client still
  // sends until it ends its side, for at most kLingerTime and kLingerBytes.
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    close();
    return;
  }
  read_deadline_.expires_after(kLingerTime);
  read_deadline_.async_wait([self = shared_from_this()](beast::error_code e) {
    if (!e) self->close();
  });
  lingered_ = 0;
  drain_input();
}

void Connection::drain_input() {
  socket_.async_read_some(net::buffer(sink_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->lingered_ += n;
    if (ec || self->closed_ || self->lingered_ >= kLingerBytes) {
      self->close();
      return;
    }
    self->drain_input();
  });
}

void Connection::arm_read_deadline(std::chrono::milliseconds d) {
  read_deadline_.expires_after(d);
  read_deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec) return;  // cancelled: the read finished in time
    // The header (or body) did not arrive in time: the client is too slow or
    // idle. Closing aborts the pending read; nothing is answered.
    if (self->reading_) self->close();
  });
}

void Connection::read_header() {
  if (closed_) return;
  busy_ = false;
  route_ = nullptr;
  parser_.emplace();
  parser_->header_limit(std::uint32_t(ctx_->limits.max_header_bytes));
  parser_->body_limit(ctx_->limits.max_body_bytes);
  reading_ = true;
  // One deadline for the whole header, idle keep-alive wait included: a
  // client that dribbles a line every few seconds is closed like an idle one.
  arm_read_deadline(ctx_->limits.header_timeout);
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Connection::on_header(beast::error_code ec) {
  reading_ = false;
  read_deadline_.cancel();
  if (closed_) return;
  if (ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset) {
      close();
      return;
    }
    if (ec == http::error::body_limit) {
      fail_request(413, "the request body is too large", "invalid_request_error", true);
      return;
    }
    if (ec == http::error::header_limit) {
      fail_request(431, "the request header is too large", "invalid_request_error", true);
      return;
    }
    fail_request(400, fmt::format("malformed HTTP request: {}", ec.message()), "invalid_request_error", true);
    return;
  }
  busy_ = true;
  const auto& h = parser_->get();
  keep_alive_ = h.keep_alive();
  std::string_view target(h.target().data(), h.target().size());
  const std::string path(target.substr(0, target.find('?')));
  const Route* match = nullptr;
  std::string allow;
  for (const Route& r : ctx_->routes) {
    if (r.path != path) continue;
    allow += (allow.empty() ? "" : ", ") + std::string(http::to_string(r.method));
    if (r.method == h.method()) match = &r;
  }
  // A request with a body we will not read cannot be followed by another on
  // this connection: such refusals close it.
  const bool has_body = h.has_content_length() || h.chunked();
  if (allow.empty()) {
    fail_request(404, fmt::format("no route for {} {}", std::string(h.method_string()), path), "not_found_error",
                 has_body);
    return;
  }
  if (!match) {
    fail_request(405, fmt::format("{} does not allow {} (allowed: {})", path, std::string(h.method_string()), allow),
                 "invalid_request_error", has_body, {{"Allow", allow}});
    return;
  }
  route_ = match;
  if (match->needs_key && !ctx_->limits.api_key.empty() && !authorized(h)) {
    fail_request(401, "a valid API key is required (Authorization: Bearer KEY)", "authentication_error", has_body,
                 {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  if (match->method == http::verb::post) {
    const auto ct = h[http::field::content_type];
    if (!is_json_content_type(std::string_view(ct.data(), ct.size()))) {
      fail_request(415,
                   fmt::format("Content-Type must be application/json, got '{}'", std::string(ct.data(), ct.size())),
                   "invalid_request_error", true);
      return;
    }
    const auto expect = h[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      out_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
      write_queued();
    }
  }
  read_body();
}

bool Connection::authorized(const Request& h) const {
  const auto v = h[http::field::authorization];
  const std::string value(v.data(), v.size());
  static const std::string kBearer = "Bearer ";
  if (value.size() < kBearer.size() || !beast::iequals(value.substr(0, kBearer.size()), kBearer)) return false;
  return constant_time_equal(value.substr(kBearer.size()), ctx_->limits.api_key);
}

void Connection::read_body() {
  if (parser_->is_done()) {
    on_body({});
    return;
  }
  reading_ = true;
  arm_read_deadline(ctx_->limits.body_timeout);
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Connection::on_body(beast::error_code ec) {
  reading_ = false;
  read_deadline_.cancel();
  if (closed_) return;
  if (ec) {
    if (ec == http::error::body_limit) {
      fail_request(413, "the request body is too large", "invalid_request_error", true);
    } else if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
               ec == net::error::connection_reset) {
      close();
    } else {
      fail_request(400, fmt::format("malformed HTTP request body: {}", ec.message()), "invalid_request_error", true);
    }
    return;
  }
  req_ = parser_->release();
  dispatch();
}

void Connection::dispatch() {
  const Route* r = route_;
  auto self = shared_from_this();
  r->handler(self, req_);
}

void Connection::fail_request(int status, const std::string& message, const std::string& type, bool close_after,
                              std::vector<std::pair<std::string, std::string>> extra_headers) {
  busy_ = true;
  if (close_after) keep_alive_ = false;
  Reply r = ctx_->error_reply(status, message, type);
  for (auto& h : extra_headers) r.headers.push_back(std::move(h));
  reply(std::move(r));
}

void Connection::reply(Reply r) {
  if (closed_) return;
  if (ctx_->on_response) ctx_->on_response(r.status);
  std::string bytes = serialize_head(r.status, r.content_type, r.headers, keep_alive_, r.body.size());
  bytes += r.body;
  out_.push_back(std::move(bytes));
  end_after_write_ = true;
  if (!keep_alive_) close_after_write_ = true;
  write_queued();
}

void Connection::start_stream(Reply head) {
  if (closed_) return;
  if (ctx_->on_response) ctx_->on_response(head.status);
  streaming_ = true;
  out_.push_back(serialize_head(head.status, head.content_type, head.headers, keep_alive_, std::nullopt));
  write_queued();
}

void Connection::stream_write(std::string data) {
  if (closed_ || data.empty()) return;
  out_.push_back(fmt::format("{:x}\r\n", data.size()) + data + "\r\n");
  write_queued();
}

void Connection::end_stream() {
  if (closed_) return;
  streaming_ = false;
  out_.push_back("0\r\n\r\n");
  end_after_write_ = true;
  if (!keep_alive_) close_after_write_ = true;
  write_queued();
}

void Connection::write_queued() {
  if (writing_ || closed_) return;
  if (out_.empty()) {
    if (end_after_write_) after_response();
    return;
  }
  writing_ = true;
  auto data = std::make_shared<std::string>();
  for (auto& s : out_) *data += s;
  out_.clear();
  write_deadline_.expires_after(ctx_->limits.write_timeout);
  write_deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec && self->writing_) self->close();  // a client that stopped reading
  });
  net::async_write(socket_, net::buffer(*data), [self = shared_from_this(), data](beast::error_code ec, size_t) {
    self->writing_ = false;
    self->write_deadline_.cancel();
    if (ec) {
      // The peer is gone: whoever waits on it learns it now.
      if (!self->gone_) {
        self->gone_ = true;
        if (self->on_gone_) {
          auto f = std::move(self->on_gone_);
          self->on_gone_ = nullptr;
          f();
        }
      }
      self->close();
      return;
    }
    self->write_queued();
  });
}

void Connection::after_response() {
  end_after_write_ = false;
  on_gone_ = nullptr;
  if (closed_) return;
  if (close_after_write_) {
    // A watch read still pending would race the drain; it ends on its own.
    if (watching_)
      close();
    else
      linger_close();
    return;
  }
  // The next request, unless a disconnect watch is still reading: it
  // finishes (into buffer_) first, then read_header takes over.
  busy_ = false;
  if (watching_) {
    // The watch read becomes the wait for the next request: same deadline.
    reading_ = true;
    arm_read_deadline(ctx_->limits.header_timeout);
    return;
  }
  read_header();
}

void Connection::watch_disconnect(std::function<void()> on_gone) {
  on_gone_ = std::move(on_gone);
  if (watching_ || closed_) return;
  // Bytes of a next (pipelined) request already held: the client is there,
  // and after the response read_header parses them. A watch read now would
  // wait for bytes that never come while they sit unparsed.
  if (buffer_.size() > 0) return;
  watching_ = true;
  socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->watching_ = false;
    if (!self->busy_) self->reading_ = false;
    if (self->closed_) return;
    if (ec) {
      // EOF (the client closed or half-closed its side) or a reset: gone.
      // Like Go's net/http and nginx, a half-close counts as leaving.
      self->gone_ = true;
      if (self->on_gone_) {
        auto f = std::move(self->on_gone_);
        self->on_gone_ = nullptr;
        f();
      }
      if (!self->busy_) self->close();
      return;
    }
    self->buffer_.commit(n);
    // Busy: the next request began before this response ended; it waits in
    // buffer_ for after_response (no further watch, see watch_disconnect).
    if (!self->busy_) self->read_header();  // the response ended while this read was in flight
  });
}

}  // namespace kvtier::server
