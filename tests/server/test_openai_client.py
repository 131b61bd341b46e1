"""`kvtier serve` through the official openai Python client: completions, chat,
streaming, the per-request KV policy extension, concurrency (greedy outputs
equal single-request runs), error statuses, client disconnects, limits and
graceful shutdown. Every request goes to 127.0.0.1 and is bounded in tokens.
"""
import concurrent.futures as cf
import http.client
import json
import signal
import time

import openai
import pytest

PROMPTS = [
    "The capital of France is",
    "def add(a, b):",
    "List three colors:",
    "Water boils at",
    "The quick brown fox",
    "Once upon a time",
    "1, 2, 3, 4,",
]


def client_for(server, **kw):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0,
                         timeout=120, **kw)


def post(server, path, body, headers=None):
    """Raw POST: returns (status, headers, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    conn.request("POST", path, body=data,
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = (r.status, dict(r.getheaders()), r.read())
    conn.close()
    return out


def model_id(server):
    return client_for(server).models.list().data[0].id


def test_models_and_health(server):
    models = client_for(server).models.list()
    assert len(models.data) == 1
    assert models.data[0].id
    h = server.health()
    assert h["status"] == "ok"
    assert h["limits"]["max_active"] == 4


def test_completion(server):
    c = client_for(server)
    r = c.completions.create(model=model_id(server), prompt="The capital of France is",
                             max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ext = r.model_extra["kvtier"]
    assert ext["kv_policy"].startswith("full")
    assert ext["gpu_bytes_per_token"] > 0
    assert ext["gpu_bytes"] > 0


def test_chat(server):
    c = client_for(server)
    r = c.chat.completions.create(
        model=model_id(server), max_tokens=16, temperature=0,
        messages=[{"role": "system", "content": "You are brief."},
                  {"role": "user", "content": "What is the capital of France?"}])
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert msg.content
    assert r.usage.completion_tokens <= 16
    assert "kvtier" in r.model_extra


def test_completion_stream_equals_non_stream(server):
    c = client_for(server)
    m = model_id(server)
    whole = c.completions.create(model=m, prompt="Once upon a time", max_tokens=16,
                                 temperature=0)
    pieces, finish = [], None
    for chunk in c.completions.create(model=m, prompt="Once upon a time", max_tokens=16,
                                      temperature=0, stream=True):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == whole.choices[0].text
    assert finish == whole.choices[0].finish_reason


def test_chat_stream_with_usage(server):
    c = client_for(server)
    m = model_id(server)
    messages = [{"role": "user", "content": "Name a fruit."}]
    whole = c.chat.completions.create(model=m, messages=messages, max_tokens=12, temperature=0)
    stream = c.chat.completions.create(model=m, messages=messages, max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    text, roles, usage, finish, ext = "", [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            ext = chunk.model_extra.get("kvtier")
            assert chunk.choices == []
            continue
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        text += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant"]
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert ext["kv_policy"]


def test_kv_policy_per_request(server):
    c = client_for(server)
    m = model_id(server)
    prompt = "Summer is warm. Winter is cold. " * 12 + "Spring is"
    full = c.completions.create(model=m, prompt=prompt, max_tokens=6, temperature=0)
    tiered = c.completions.create(model=m, prompt=prompt, max_tokens=6, temperature=0,
                                  extra_body={"kv_policy": "yakv"})
    ns = c.completions.create(model=m, prompt=prompt, max_tokens=6, temperature=0,
                              extra_body={"kvtier": {"kv_policy": "oracle"}})
    f, t, o = (x.model_extra["kvtier"] for x in (full, tiered, ns))
    assert f["host_bytes_per_token"] == 0 and f["gpu_bytes_per_token"] > 0
    # The tiered policy keeps K/V on the host and only a small index on the GPU tier.
    assert t["kv_policy"] != f["kv_policy"]
    assert t["host_bytes_per_token"] > 0
    assert t["gpu_bytes_per_token"] < f["gpu_bytes_per_token"]
    assert t["host_bytes"] > 0
    assert o["kv_policy"] != t["kv_policy"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=m, prompt="x", max_tokens=2,
                             extra_body={"kv_policy": "no-such-policy"})
    assert e.value.body["param"] == "kv_policy"


def test_concurrent_greedy_equals_single_runs(server):
    c = client_for(server)
    m = model_id(server)

    def one(p):
        if p.startswith("1,"):  # mix in chat requests too
            r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": p}],
                                          max_tokens=8, temperature=0)
            return r.choices[0].message.content
        return c.completions.create(model=m, prompt=p, max_tokens=8, temperature=0,
                                    seed=1).choices[0].text

    single = [one(p) for p in PROMPTS]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        together = list(ex.map(one, PROMPTS))
    assert together == single


def test_seeded_sampling_is_reproducible(server):
    c = client_for(server)
    m = model_id(server)
    kw = dict(model=m, prompt="My favourite animal is", max_tokens=10, temperature=0.9,
              top_p=0.95, seed=1234)
    a = c.completions.create(**kw).choices[0].text
    b = c.completions.create(**kw).choices[0].text
    assert a == b


def test_stop_strings(server):
    c = client_for(server)
    m = model_id(server)
    base = c.completions.create(model=m, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    text = base.choices[0].text
    assert "," in text, text
    cut = c.completions.create(model=m, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                               stop=[","])
    assert cut.choices[0].text == text[:text.index(",")]
    assert cut.choices[0].finish_reason == "stop"


def test_errors_have_openai_shape(server):
    c = client_for(server)
    m = model_id(server)
    cases = [
        dict(prompt="x", n=2),
        dict(prompt="x", max_tokens=100000),
        dict(prompt="x", temperature="hot"),
        dict(prompt=["a", "b"]),
        dict(prompt="x", logprobs=30),
    ]
    for kw in cases:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=m, **{"max_tokens": 2, **kw})
        assert e.value.status_code == 400
        assert e.value.body["type"] == "invalid_request_error"
        assert e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=m, messages=[{"role": "wizard", "content": "x"}])
    status, _, body = post(server, "/v1/completions", b'{"prompt": "x", "max_tokens": 2')
    assert status == 400
    assert "not valid JSON" in json.loads(body)["error"]["message"]
    status, _, body = post(server, "/v1/completions", {"prompt": "x", "max_tokens": "2"})
    assert status == 400 and json.loads(body)["error"]["param"] == "max_tokens"
    status, _, body = post(server, "/v1/nothing", {})
    assert status == 404 and "error" in json.loads(body)
    # Over the context: a prompt of token ids longer than the model's context.
    n_ctx = server.health()["limits"]["n_ctx"]
    status, _, body = post(server, "/v1/completions", {"prompt": [1] * (n_ctx + 5),
                                                       "max_tokens": 2})
    assert status == 400
    assert json.loads(body)["error"]["code"] == "context_length_exceeded"


def read_events(resp, n):
    """Reads n SSE data events from a raw http.client response."""
    events = []
    while len(events) < n:
        line = resp.readline()  # de-chunked
        if not line:
            break
        if line.startswith(b"data: "):
            events.append(line[6:].strip())
    return events


def test_client_disconnect_cancels_and_frees_kv(server):
    before = server.wait_idle()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Tell me a long story.", "max_tokens": 250, "stream": True,
         "ignore_eos": True, "temperature": 0}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    assert len(read_events(resp, 3)) == 3
    mid = server.health()
    assert mid["active_sequences"] == 1
    assert mid["kv_gpu_bytes"] + mid["kv_host_bytes"] > 0
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    after = server.wait_idle(timeout=10)
    assert after["active_sequences"] == 0
    assert after["kv_gpu_bytes"] == 0 and after["kv_host_bytes"] == 0
    assert after["requests"]["cancelled"] == before["requests"]["cancelled"] + 1
    # Far fewer than 250 tokens were generated for it.
    assert after["tokens_generated"] - before["tokens_generated"] < 200


def test_limits_answer_4xx_and_503(make_server):
    s = make_server("--max-active", 1, "--max-queue", 1, "--max-prompt-tokens", 32,
                    "--max-new-tokens", 64, "--host-kv-budget", 8_000_000, "--kv", "yakv")
    c = client_for(s)
    m = model_id(s)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=m, prompt="word " * 100, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=m, prompt="hi", max_tokens=65)
    assert e.value.body["param"] == "max_tokens"
    # Occupy the only slot, fill the queue of one, and the next request gets 503.
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Go on:", "max_tokens": 64, "stream": True, "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    read_events(resp, 1)
    with cf.ThreadPoolExecutor(1) as ex:
        queued = ex.submit(lambda: c.completions.create(model=m, prompt="Queued", max_tokens=2))
        deadline = time.time() + 10
        while s.health()["queued_requests"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        status, headers, body = post(s, "/v1/completions", {"prompt": "Third", "max_tokens": 2})
        assert status == 503
        assert headers.get("Retry-After") == "1"
        assert json.loads(body)["error"]["code"] == "queue_full"
        conn.sock.close()
        conn.close()
        assert queued.result(timeout=60).choices[0].text is not None
    h = s.wait_idle()
    assert h["requests"]["rejected"] >= 1
    assert h["host_kv_reserved_bytes"] == 0
    assert h["gpu_kv_reserved_bytes"] == 0  # --device cpu: no GPU pool
    assert h["limits"]["gpu_kv_budget_bytes"] == 0


def test_sigterm_finishes_active_requests_and_exits_0(make_server):
    s = make_server("--max-active", 2, "--shutdown-grace", 20)
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Count:", "max_tokens": 24, "stream": True, "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    read_events(resp, 1)
    s.proc.send_signal(signal.SIGTERM)
    # The stream still ends properly ([DONE] after a finish_reason).
    rest = resp.read().decode()
    assert "data: [DONE]" in rest
    assert '"finish_reason":"length"' in rest
    assert s.proc.wait(timeout=30) == 0
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", s.port, timeout=5).request("GET", "/health")
