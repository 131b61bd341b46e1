"""What a hostile or careless client meets, and what operators rely on:
strict HTTP parsing (conflicting Content-Length, JSON Content-Type, 405),
pipelined requests, refusals that
reach a client still sending,
header deadlines against slow clients, disconnected non-streaming clients
that free their slot at once, request timeouts, bounded policy knobs, the API
key, Prometheus /metrics read by prometheus_client's parser, /tokenize and
/detokenize, logprobs and echo."""
import http.client
import json
import math
import selectors
import socket
import threading
import time

import openai
import pytest

from conftest import MODEL  # noqa: F401 (the fixtures skip without it)


def raw(port, payload: bytes, timeout=10):
    """Sends raw bytes and returns (status, headers text, body) of the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        out = b""
        try:
            while b"\r\n\r\n" not in out or len(out) < out.index(b"\r\n\r\n") + 4 + _content_length(out):
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return status, head.decode("latin-1"), body


def _content_length(out):
    head = out.split(b"\r\n\r\n")[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def request(server, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_strict_http_parsing(server):
    body = b'{"prompt": "hi", "max_tokens": 1}'
    # Conflicting Content-Length headers: refused, not guessed.
    status, _, _ = raw(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 33\r\nContent-Length: 5\r\n\r\n" + body)
    assert status == 400
    status, _, _ = raw(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 33\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert status == 400
    # Only JSON bodies.
    for ctype in ["text/plain", "application/x-www-form-urlencoded", None]:
        status, _, data = request(server, "POST", "/v1/completions", body,
                                  headers={"Content-Type": ctype} if ctype else {"Content-Type": ""})
        assert status == 415, (ctype, status, data)
        assert "application/json" in json.loads(data)["error"]["message"]
    assert request(server, "POST", "/v1/completions", body,
                   headers={"Content-Type": "Application/JSON; charset=utf-8"})[0] == 200
    # A known path with the wrong method: 405 and Allow; an unknown path: 404.
    status, headers, data = request(server, "GET", "/v1/completions")
    assert status == 405 and headers.get("Allow") == "POST" and "error" in json.loads(data)
    status, headers, _ = request(server, "DELETE", "/health")
    assert status == 405 and headers.get("Allow") == "GET"
    assert request(server, "GET", "/v2/nothing")[0] == 404


def _streamed_completion(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 3, "stream": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def test_pipelined_requests_on_one_connection_are_all_answered(server):
    # HTTP/1.1 pipelining, and a client that sends its next request as soon
    # as it has read the last chunk: the next request must be served whether
    # its bytes came with the first one or while the first was being
    # answered (it once sat unparsed until the 10 s header deadline closed
    # the connection).
    def read_until(s, n_responses, data=b""):
        while data.count(b"\r\n0\r\n\r\n") < n_responses:
            chunk = s.recv(65536)  # the socket timeout (5 s) is below the header deadline
            assert chunk, f"closed after {data.count(b'HTTP/1.1 200')} of {n_responses} responses"
            data += chunk
        return data

    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(_streamed_completion("One") + _streamed_completion("Two") + _streamed_completion("Three"))
        assert read_until(s, 3).count(b"HTTP/1.1 200 ") == 3
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(_streamed_completion("Four"))
        data = b""
        while b"\r\n\r\n" not in data:  # the first response has begun
            data += s.recv(65536)
        s.sendall(_streamed_completion("Five"))
        assert read_until(s, 2, data).count(b"HTTP/1.1 200 ") == 2


def test_refused_requests_with_unread_bytes_still_get_their_answer(server):
    # The server refuses a header over its limit (431) and a body over its
    # limit (413) before reading all of what the client sent. Closing with
    # those bytes unread makes the kernel send a reset, and the client lost
    # the answer (or saw "Transport endpoint is not connected" when it then
    # half-closed). The server must drain what follows before it closes.
    cases = [
        (b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\n\r\n" + b"b" * 200000, 431),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: 99999999\r\n\r\n" + b"c" * 300000, 413),
    ]
    for payload, want in cases:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            assert out.startswith(b"HTTP/1.1 %d " % want), out[:80]
            assert b"Connection: close" in out


def test_policy_knobs_are_bounded_by_the_context(server):
    n_ctx = server.health()["limits"]["n_ctx"]
    before = server.health()
    for policy in ["yakv,local=100000", "yakv,local=1000000000", f"yakv,sink={n_ctx + 1}", "oracle,budget=99999999"]:
        status, _, data = request(server, "POST", "/v1/completions",
                                  {"prompt": "hi", "max_tokens": 2, "kv_policy": policy})
        err = json.loads(data)["error"]
        assert status == 400 and err["param"] == "kv_policy", (policy, status, data)
        assert "exceeds the context" in err["message"]
    assert request(server, "POST", "/v1/completions",
                   {"prompt": "hi", "max_tokens": 2, "kv_policy": f"yakv,local={n_ctx}"})[0] == 200
    assert server.health()["requests"]["failed"] == before["requests"]["failed"]


def test_slow_header_clients_do_not_freeze_the_server(make_server):
    n_slow = 1000
    s = make_server("--header-timeout", 4, "--max-active", 2)
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n_slow):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        c.setblocking(False)
        c.send(b"POST /v1/completions HTTP/1.1\r\n")
        socks.append(c)
        sel.register(c, selectors.EVENT_READ)
    # Generation keeps going meanwhile.
    result = {}

    def generate():
        t0 = time.time()
        result["status"] = request(s, "POST", "/v1/completions",
                                   {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
                                   timeout=120)[0]
        result["seconds"] = time.time() - t0

    gen = threading.Thread(target=generate)
    gen.start()
    worst = 0.0
    closed = 0
    t_end = time.time() + 8
    next_line = time.time() + 2
    while time.time() < t_end:
        t0 = time.time()
        assert s.health()["status"] == "ok"
        worst = max(worst, time.time() - t0)
        if time.time() >= next_line:  # one more header line every 2 s, as the attack does
            for c in socks:
                try:
                    c.send(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            next_line += 2
        for key, _ in sel.select(timeout=0.2):
            try:
                if not key.fileobj.recv(100):
                    sel.unregister(key.fileobj)
                    closed += 1
            except OSError:
                sel.unregister(key.fileobj)
                closed += 1
    gen.join(timeout=120)
    for c in socks:
        c.close()
    print(f"slow headers: {n_slow} connections, worst /health {worst:.3f} s, generation {result}, "
          f"{closed} closed by the deadline")
    assert worst < 1.0, f"/health took {worst:.2f} s with {n_slow} slow clients"
    assert result.get("status") == 200, result
    assert closed == n_slow, f"{closed} of {n_slow} slow connections closed by the header deadline"


def test_disconnected_non_streaming_client_frees_its_slot(server):
    server.wait_idle()
    for how in ["close", "half-close"]:
        c = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "temperature": 0}).encode()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 60
        while server.health()["active_sequences"] == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert server.health()["active_sequences"] == 1
        cancelled = server.health()["requests"]["cancelled"]
        t0 = time.time()
        if how == "close":
            c.close()
        else:
            c.shutdown(socket.SHUT_WR)
        while server.health()["active_sequences"] and time.time() - t0 < 10:
            time.sleep(0.01)
        freed = time.time() - t0
        h = server.health()
        assert h["active_sequences"] == 0 and h["kv_host_bytes"] == 0 and h["kv_gpu_bytes"] == 0
        assert h["requests"]["cancelled"] == cancelled + 1
        print(f"disconnect ({how}): slot freed after {freed:.3f} s")
        assert freed < 1.0, f"{how}: the slot was freed after {freed:.2f} s"
        if how == "half-close":
            c.close()


def test_request_timeout(make_server):
    s = make_server("--request-timeout", 1)
    t0 = time.time()
    status, _, data = request(s, "POST", "/v1/completions",
                              {"prompt": "Count:", "max_tokens": 1000, "ignore_eos": True})
    assert status == 503 and json.loads(data)["error"]["code"] == "request_timeout", data
    assert time.time() - t0 < 10
    assert s.wait_idle()["active_sequences"] == 0


def test_api_key(make_server):
    s = make_server("--api-key", "s3cret")
    ok = {"prompt": "hi", "max_tokens": 1}
    assert request(s, "POST", "/v1/completions", ok)[0] == 401
    status, headers, data = request(s, "POST", "/v1/completions", ok, headers={"Authorization": "Bearer wrong"})
    assert status == 401 and headers.get("WWW-Authenticate") == "Bearer"
    assert json.loads(data)["error"]["type"] == "authentication_error"
    assert request(s, "POST", "/v1/completions", ok, headers={"Authorization": "Bearer s3cre"})[0] == 401
    assert request(s, "POST", "/v1/completions", ok, headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert request(s, "GET", "/v1/models")[0] == 401
    assert request(s, "GET", "/health")[0] == 200 and request(s, "GET", "/metrics")[0] == 200
    c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="s3cret", max_retries=0)
    assert c.completions.create(model="m", prompt="hi", max_tokens=1).choices[0].text is not None
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.base_url + "/v1", api_key="nope", max_retries=0).models.list()


def test_metrics_parse_with_prometheus_client(server):
    parser = pytest.importorskip("prometheus_client.parser")

    def scrape():
        status, headers, data = request(server, "GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        fams = {f.name: f for f in parser.text_string_to_metric_families(data.decode())}
        return fams

    before = scrape()
    assert request(server, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "temperature": 0,
                                                        "ignore_eos": True})[0] == 200
    after = scrape()
    for name, kind in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prompt_tokens", "counter"),
                       ("vllm:generation_tokens", "counter"), ("vllm:request_success", "counter"),
                       ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:inter_token_latency_seconds", "histogram"),
                       ("vllm:e2e_request_latency_seconds", "histogram"),
                       ("kvtier:kv_host_tier_bytes", "gauge"), ("kvtier:kv_gpu_tier_bytes", "gauge")]:
        assert name in after and after[name].type == kind, name

    def value(fams, name, suffix="", **labels):
        return sum(s.value for s in fams[name].samples
                   if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value(after, "vllm:generation_tokens", "_total") - value(before, "vllm:generation_tokens", "_total") == 3
    assert value(after, "vllm:e2e_request_latency_seconds", "_count") == \
        value(before, "vllm:e2e_request_latency_seconds", "_count") + 1
    assert value(after, "vllm:request_success", "_total", finished_reason="length") >= 1
    inf = [s for s in after["vllm:time_to_first_token_seconds"].samples if s.labels.get("le") == "+Inf"]
    assert inf and inf[0].value == value(after, "vllm:time_to_first_token_seconds", "_count")


def test_tokenize_detokenize_and_tokenizer_info(server):
    status, _, data = request(server, "POST", "/tokenize", {"prompt": "Hello world", "add_special_tokens": False})
    assert status == 200
    out = json.loads(data)
    assert out["count"] == len(out["tokens"]) > 0 and out["max_model_len"] == server.health()["limits"]["n_ctx"]
    status, _, data = request(server, "POST", "/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and json.loads(data)["prompt"] == "Hello world"
    status, _, data = request(server, "POST", "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(data)["count"] > 2
    assert request(server, "POST", "/detokenize", {"tokens": [-1]})[0] == 400
    assert request(server, "POST", "/tokenize", {"prompt": 5})[0] == 400
    status, _, data = request(server, "GET", "/tokenizer_info")
    assert status == 200 and "eos_token" in json.loads(data)


def test_logprobs_and_echo(server):
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    prompt = "The capital of France is"
    ids = json.loads(request(server, "POST", "/tokenize", {"prompt": prompt})[2])["tokens"]
    # Prompt scoring as evaluation harnesses do it: echo, max_tokens 0, logprobs.
    r = c.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) == 2 and max(t.values()) >= v for t, v in zip(lp.top_logprobs[1:], lp.token_logprobs[1:]))
    # echo + 1 generated token: the prompt's scores are the same, the new token is greedy.
    r2 = c.completions.create(model="m", prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    lp2 = r2.choices[0].logprobs
    assert len(lp2.tokens) == len(ids) + 1
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(lp.token_logprobs[1:], lp2.token_logprobs[1:]))
    assert math.isclose(lp2.token_logprobs[-1], max(lp2.top_logprobs[-1].values()), abs_tol=1e-6)
    # Chat: logprobs + top_logprobs, greedy tokens are their positions' best.
    ch = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4,
                                   temperature=0, logprobs=True, top_logprobs=3)
    content = ch.choices[0].logprobs.content
    assert len(content) == ch.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and math.isclose(t.logprob, t.top_logprobs[0].logprob, abs_tol=1e-6)
    assert "".join(t.token for t in content) == ch.choices[0].message.content
    # Streamed chat logprobs arrive with their tokens.
    got = []
    for chunk in c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=4, temperature=0, logprobs=True, stream=True):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            got += [t.token for t in chunk.choices[0].logprobs.content]
    assert got == [t.token for t in content]
