#include "server/completion_call.h"

#include <fmt/format.h>

namespace kvtier::server {

using nlohmann::json;

CompletionCall::CompletionCall(CallContext& ctx, std::shared_ptr<Connection> conn, std::shared_ptr<Channel> ch,
                               CallRequest req)
    : ctx_(ctx),
      conn_(std::move(conn)),
      ch_(std::move(ch)),
      req_(std::move(req)),
      heartbeat_(conn_->strand()),
      timeout_(conn_->strand()) {
  ctx_.n_open_calls.fetch_add(1);
}

CompletionCall::~CompletionCall() { ctx_.n_open_calls.fetch_sub(1); }

void CompletionCall::start() {
  auto self = shared_from_this();
  std::weak_ptr<CompletionCall> weak = self;
  Strand strand = conn_->strand();
  ch_->set_listener([weak, strand] {
    net::post(strand, [weak] {
      if (auto c = weak.lock()) c->on_update();
    });
  });
  conn_->watch_disconnect([self] { self->on_gone(); });
  if (ctx_.request_timeout.count() > 0) {
    timeout_.expires_after(ctx_.request_timeout);
    timeout_.async_wait([self](boost::system::error_code ec) {
      if (!ec) self->on_timeout();
    });
  }
  if (req_.stream) {
    Reply head;
    head.content_type = "text/event-stream";
    head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    conn_->start_stream(std::move(head));
    if (req_.echo && !req_.echo_text.empty()) {
      // The prompt's text comes first (its log-probabilities only in non-streaming responses).
      stream_lp_.offset = int64_t(req_.echo_text.size());
      conn_->stream_write(
          sse_event(stream_chunk_json(req_.meta, req_.echo_text, true, std::nullopt, req_.include_usage)));
    }
    arm_heartbeat();
  }
  on_update();  // whatever arrived before the listener was set
}

void CompletionCall::arm_heartbeat() {
  heartbeat_.expires_after(ctx_.heartbeat);
  heartbeat_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->done_) return;
    if (!self->wrote_since_beat_) self->conn_->stream_write(sse_comment("keep-alive"));
    self->wrote_since_beat_ = false;
    self->arm_heartbeat();
  });
}

void CompletionCall::on_gone() {
  if (done_) return;
  ++ctx_.n_cancelled;
  ctx_.scheduler.cancel(*ch_);  // the worker drops it before its next step
}

void CompletionCall::on_timeout() {
  if (done_) return;
  timed_out_ = true;
  ++ctx_.n_cancelled;
  ctx_.scheduler.cancel(*ch_);
}

json CompletionCall::chunk_logprobs(const std::vector<TokenLogprob>& lps) {
  if (req_.logprobs < 0) return nullptr;
  if (req_.meta.endpoint == Endpoint::chat) return chat_logprobs_json(lps, ctx_.tokenizer);
  CompletionLogprobs c;
  c.offset = stream_lp_.offset;
  for (const auto& lp : lps) c.add(lp, ctx_.tokenizer);
  stream_lp_.offset = c.offset;
  return c.to_json();
}

Reply CompletionCall::error_reply(int status, const std::string& message, const std::string& type,
                                  const std::string& code) {
  Reply r;
  r.status = status;
  r.body = dump_json(error_json(message, type, {}, code));
  if (status == 503 || status == 429) r.headers.push_back({"Retry-After", "1"});
  return r;
}

void CompletionCall::on_update() {
  if (done_) return;
  Channel::Update u = ch_->take();
  if (req_.stream && !conn_->gone()) {
    // Chunks carry text; logprobs ride with the text of the same tokens.
    if (!u.text.empty() || !u.logprobs.empty()) {
      conn_->stream_write(sse_event(stream_chunk_json(req_.meta, u.text, first_, std::nullopt, req_.include_usage,
                                                      chunk_logprobs(u.logprobs))));
      first_ = false;
      wrote_since_beat_ = true;
    }
  }
  if (!u.finished) return;
  done_ = true;
  heartbeat_.cancel();
  timeout_.cancel();
  if (req_.stream) finish_stream(u);
  else reply_whole();
}

void CompletionCall::finish_stream(const Channel::Update&) {
  const auto& err = ch_->error();
  if (conn_->gone()) {
    observe("abort");
    conn_->close();
    return;
  }
  std::string out;
  if (timed_out_) {
    out += sse_event(error_json(fmt::format("the request did not finish within {} s and was cancelled",
                                            double(ctx_.request_timeout.count()) / 1000.0),
                                "server_error", {}, "request_timeout"));
    observe("abort");
  } else if (err) {
    out += sse_event(error_json(err->message, err->type, {}, err->code));
    observe("error");
  } else {
    const GenerationResult& r = ch_->result();
    json last = stream_chunk_json(req_.meta, "", first_, openai_finish_reason(r.finish_reason), req_.include_usage);
    last["kvtier"] = kvtier_json(r);
    out += sse_event(last);
    if (req_.include_usage) out += sse_event(usage_chunk_json(req_.meta, r));
    observe(r.finish_reason == "cancelled" ? "abort" : openai_finish_reason(r.finish_reason));
  }
  out += sse_done();
  conn_->stream_write(std::move(out));
  conn_->end_stream();
}

void CompletionCall::reply_whole() {
  if (conn_->gone()) {
    observe("abort");
    conn_->close();
    return;
  }
  if (timed_out_) {
    observe("abort");
    conn_->reply(error_reply(503,
                             fmt::format("the request did not finish within {} s and was cancelled",
                                         double(ctx_.request_timeout.count()) / 1000.0),
                             "server_error", "request_timeout"));
    return;
  }
  if (const auto& err = ch_->error()) {
    observe("error");
    conn_->reply(error_reply(err->status, err->message, err->type, err->code));
    return;
  }
  const GenerationResult& r = ch_->result();
  json logprobs = nullptr;
  if (req_.logprobs >= 0) {
    if (req_.meta.endpoint == Endpoint::chat) {
      logprobs = chat_logprobs_json(r.logprobs, ctx_.tokenizer);
    } else {
      CompletionLogprobs c;
      if (req_.echo && !req_.prompt.empty()) {
        c.add_unscored(req_.prompt[0], ctx_.tokenizer);
        for (const auto& lp : r.prompt_logprobs) c.add(lp, ctx_.tokenizer);
        // Offsets of the answer's tokens count from the end of the echoed text.
        c.offset = int64_t(req_.echo_text.size());
      }
      for (const auto& lp : r.logprobs) c.add(lp, ctx_.tokenizer);
      logprobs = c.to_json();
    }
  }
  observe(openai_finish_reason(r.finish_reason));
  Reply rep;
  rep.body = dump_json(completion_json(req_.meta, r, req_.echo ? req_.echo_text : std::string(), logprobs));
  conn_->reply(std::move(rep));
}

void CompletionCall::observe(const std::string& reason) {
  using Clock = Channel::Clock;
  const Channel::Timing t = ch_->timing();
  const auto now = Clock::now();
  auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  RequestObservation o;
  o.finished_reason = reason;
  o.max_tokens = req_.max_tokens;
  o.e2e_seconds = secs(now - t.submitted);
  if (t.admitted) o.queue_seconds = secs(*t.admitted - t.submitted);
  if (!t.steps.empty()) o.ttft_seconds = secs(t.steps.front() - t.submitted);
  for (size_t i = 1; i < t.steps.size(); ++i) o.inter_token_seconds.push_back(secs(t.steps[i] - t.steps[i - 1]));
  if (!ch_->error()) {
    const GenerationResult& r = ch_->result();
    o.n_prompt_tokens = r.n_prompt_tokens;
    o.n_generation_tokens = int64_t(r.tokens.size());
    o.prefill_seconds = r.prefill_seconds;
    o.decode_seconds = r.decode_seconds;
  }
  ctx_.metrics.observe(o);
}

}  // namespace kvtier::server
