#!/usr/bin/env python3
"""Fuzzes `kvtier serve` with a few thousand random and mutated request bodies
(invalid UTF-8, deep nesting, huge numbers, wrong types, truncations, byte
flips, raw protocol garbage) on 127.0.0.1. The server must answer every one
with a well-formed HTTP response — 200 for the few that happen to be valid,
4xx (or 503 when busy) otherwise, never 5xx — and stay healthy. run_policies() does the same with hostile
KV policy strings.

Standalone: fuzz_requests.py --base-url http://127.0.0.1:PORT [-n 3000] [--seed 1]
(the server should run with a small --max-new-tokens, e.g. 64, to bound the
valid bodies' work). test_fuzz_and_load.py runs it against the test server.
"""
import argparse
import http.client
import json
import random
import socket
import sys
import time
import urllib.parse

VALID = [
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0}),
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1, "stop": ["\n"], "seed": 3}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 1, "kv_policy": "full"}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"},
                                           {"role": "user", "content": [
                                               {"type": "text", "text": "y"}]}],
                              "max_tokens": 1, "stream": True, "top_p": 0.5}),
]
FIELDS = ["prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "seed", "stop", "stream", "stream_options", "n", "best_of", "echo",
          "logprobs", "kv_policy", "kvtier", "model", "user", "presence_penalty",
          "logit_bias", "ignore_eos", "suffix", "tools", "response_format"]
WEIRD_VALUES = [None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 2**64 + 1, 10**400,
                1e308, -1e308, 0.5, 1e-320, "", "x", "\u0000", "\ud7ff", "💥" * 50,
                [], [1], [[1]], [[]], ["a", "b"], [None], {}, {"a": 1}, {"kv_policy": 5},
                {"include_usage": "yes"}, "yakv,budget=-1", "full,,", "shadowkv,rank=0",
                "yakv,lm=higgs99", [{"role": "user"}], [{"role": "user", "content": 5}],
                [{"type": "text"}], "a" * 5000]


def rand_json(rng, depth=0):
    r = rng.random()
    if depth > 4 or r < 0.3:
        return rng.choice(WEIRD_VALUES)
    if r < 0.65:
        return [rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(FIELDS + ["zz", ""]): rand_json(rng, depth + 1)
            for _ in range(rng.randint(0, 5))}


def mutate_bytes(rng, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(5)
        if op == 0 and b:  # flip a byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:  # truncate
            del b[rng.randrange(len(b)):]
        elif op == 2:  # insert junk (often invalid UTF-8)
            pos = rng.randint(0, len(b))
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        elif op == 3 and b:  # duplicate a slice
            i = rng.randrange(len(b))
            j = rng.randint(i, min(len(b), i + 20))
            b[j:j] = b[i:j]
        elif b:  # delete a slice
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 10)]
    return bytes(b)


def special_bodies():
    """Hand-made hard cases."""
    deep = 20000
    return [
        b"",
        b"{}",
        b"[]",
        b"null",
        b"\xff\xfe\xfd",
        b'{"prompt": "\xc3\x28", "max_tokens": 1}',           # invalid UTF-8 in a string
        b'{"prompt": "\xed\xa0\x80", "max_tokens": 1}',       # a UTF-8-encoded surrogate
        b'{"prompt": "\\ud800", "max_tokens": 1}',            # a lone surrogate escape
        b'{"prompt": "x", "max_tokens": 1e999}',
        b'{"prompt": "x", "max_tokens": -0}',
        b'{"prompt": "x", "max_tokens": 123456789012345678901234567890}',
        b'{"prompt": "x", "temperature": NaN}',
        b'{"prompt": "x", "temperature": Infinity}',
        b'{"prompt": "x", "seed": 18446744073709551616}',
        b'{"prompt": ' + b"[" * deep + b"]" * deep + b"}",
        b'{"messages": ' + b"[" * deep + b"]" * deep + b"}",
        b'{"prompt": "x", "kvtier": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
        b'{"prompt": "x"' + b', "prompt": "y"' * 1000 + b"}",
        b'{"prompt": ["' + b'", "'.join([b"a"] * 5000) + b'"]}',
        b'{"prompt": [' + b",".join([b"99999999"] * 100) + b"]}",
        b'{"prompt": "x", "stop": [' + b",".join([b'"s"'] * 100) + b"]}",
        b'{"prompt": "x", "max_tokens": 2}' + b"\x00" * 10,
        b"\xef\xbb\xbf" + b'{"prompt": "bom", "max_tokens": 1}',
    ]


def send(port, path, body, headers=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        return r.status, r.getheader("Content-Type") or "", data
    finally:
        conn.close()


def raw_exchange(port, payload: bytes, timeout=10):
    """Sends raw bytes (a broken request) and reads whatever comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        return out


RAW = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 2000 + b"\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n\xff\xff\xff\xff\xff",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello
]


def bodies(n, seed):
    rng = random.Random(seed)
    out = [(rng.choice(["/v1/completions", "/v1/chat/completions"]), b) for b in special_bodies()]
    while len(out) < n:
        kind = rng.random()
        path, base = rng.choice(VALID)
        if kind < 0.45:  # a valid body with one field replaced by a weird value
            body = dict(base)
            body[rng.choice(FIELDS)] = rng.choice(WEIRD_VALUES + [rand_json(rng)])
            if rng.random() < 0.2:
                body.pop(rng.choice(list(body)), None)
            data = json.dumps(body).encode()
        elif kind < 0.8:  # byte-level mutation of a valid body
            data = mutate_bytes(rng, json.dumps(base).encode())
        else:  # random JSON
            data = json.dumps(rand_json(rng)).encode()
        out.append((path, data))
    return out[:n]


POLICY_KEYS = ["index", "chunk", "lm", "meta", "res", "m", "rank", "kv", "keys_prerope", "budget", "min_budget",
               "sink", "local", "outliers", "gqa", "zz", ""]
POLICY_VALUES = ["0", "1", "-1", "7", "64", "4096", "65536", "100000", "1000000000", "2147483647",
                 "99999999999999999999", "1e9", "1e308", "nan", "inf", "-0", "0.5", "1.5", "0x10", " 5", "5 ",
                 "", "=", ",", "higgs0.5:g1048576", "higgs2:g0", "int8:g1", "int1:g999999999", "nvfp4", "fp8s",
                 "higgs:EDEN99-1:g128", "residual", "residual:meta=higgs4", "full", "100%", "0%", "\u0000",
                 "💥", "none", "exact", "shadowkv", "mean", "true"]


def hostile_policies(n, seed):
    """Policy strings an attacker would try: every knob at its extremes, in
    random combinations (memory-sizing knobs above the context, overflowing
    numbers, broken syntax)."""
    rng = random.Random(seed)
    out = ["yakv,local=1000000000", "yakv,local=100000", "yakv,sink=1073741824", "landmarks,chunk=1048576",
           "shadowkv,outliers=1073741824", "yakv,min_budget=1073741824", "oracle,budget=1e12",
           "yakv,lm=residual,m=65536", "shadowkv,rank=full", "yakv" + ",local=1" * 50, "," * 1000,
           "yakv," + "x" * 10000, "yakv,budget=0.9999999999", "full,kv=f32"]
    while len(out) < n:
        preset = rng.choice(["full", "shadowkv", "yakv", "oracle", "landmarks", "", "YAKV", "yakv "])
        items = [preset]
        for _ in range(rng.randint(1, 5)):
            items.append(f"{rng.choice(POLICY_KEYS)}={rng.choice(POLICY_VALUES)}")
        out.append(",".join(items))
    return out[:n]


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def run_policies(base_url, n=250, seed=1, log=print):
    """Sends n hostile policy strings (chat and completions, short prompts,
    max_tokens 2); returns (status counts, failures)."""
    port = urllib.parse.urlparse(base_url).port
    counts, failures = {}, []
    for i, policy in enumerate(hostile_policies(n, seed)):
        path, base = VALID[i % 2 * 3]
        body = json.dumps({**base, "kv_policy": policy, "max_tokens": 2, "stream": False}).encode()
        try:
            status, _, data = send(port, path, body)
        except Exception as e:  # noqa: BLE001
            failures.append(f"policy #{i} {policy[:80]!r}: {type(e).__name__}: {e}")
            continue
        counts[status] = counts.get(status, 0) + 1
        if status >= 500:
            failures.append(f"policy #{i} {policy[:80]!r}: HTTP {status} {data[:200]!r}")
        elif status != 200:
            err = json.loads(data)["error"]
            if status == 400 and err.get("param") != "kv_policy":
                failures.append(f"policy #{i} {policy[:80]!r}: 400 not naming kv_policy: {err}")
    log(f"policies: {sum(counts.values())} hostile policy strings; statuses {dict(sorted(counts.items()))}")
    return counts, failures


def run(base_url, n=3000, seed=1, time_limit=600.0, log=print):
    port = urllib.parse.urlparse(base_url).port
    counts = {}
    failures = []
    t0 = time.time()
    for i, (path, body) in enumerate(bodies(n, seed)):
        if time.time() - t0 > time_limit:
            failures.append(f"time limit of {time_limit}s reached after {i} bodies")
            break
        try:
            status, ctype, data = send(port, path, body)
        except Exception as e:  # noqa: BLE001 - any transport failure is a finding
            failures.append(f"#{i} {path} {body[:120]!r}: {type(e).__name__}: {e}")
            continue
        counts[status] = counts.get(status, 0) + 1
        if status >= 500:
            failures.append(f"#{i} {path} {body[:120]!r}: HTTP {status} {data[:200]!r}")
        elif status >= 400:
            try:
                err = json.loads(data)["error"]
                assert isinstance(err["message"], str) and err["message"]
            except Exception:  # noqa: BLE001
                failures.append(f"#{i}: HTTP {status} without an error object: {data[:200]!r}")
        elif "text/event-stream" in ctype:
            if not data.rstrip().endswith(b"data: [DONE]"):
                failures.append(f"#{i}: a stream without [DONE]: {data[-200:]!r}")
        elif status == 200:
            json.loads(data)
    for payload in RAW:
        try:
            raw_exchange(port, payload)
        except OSError as e:
            failures.append(f"raw {payload[:40]!r}: {e}")
    # Still alive and idle?
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    conn.close()
    if health.get("status") != "ok":
        failures.append(f"unhealthy after fuzzing: {health}")
    log(f"fuzz: {sum(counts.values())} bodies + {len(RAW)} raw requests in "
        f"{time.time() - t0:.1f} s; statuses {dict(sorted(counts.items()))}")
    return counts, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    host = urllib.parse.urlparse(args.base_url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("refusing to fuzz a non-loopback address")
    _, failures = run(args.base_url, args.n, args.seed)
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
