#!/usr/bin/env python3
"""A bounded load test of `kvtier serve` on loopback with the official openai
client: R requests (default 200), C at a time (default 16), a mix of
completions, chat and streaming, short max_tokens. Prints latency percentiles
(p50/p90/p99, and time to first token for the streams) and throughput; exits
non-zero on any failed request.

Standalone:  load_test.py --base-url http://127.0.0.1:PORT [-r 200] [-c 16] [--max-tokens 8]
Or let it start the server:  load_test.py --start [--kvtier build/tools/kvtier]
test_fuzz_and_load.py runs it against the test server.
"""
import argparse
import concurrent.futures as cf
import sys
import time
import urllib.parse

import httpx
import openai

TOPICS = ["the sea", "a robot", "coffee", "mountains", "a library", "the moon", "trains",
          "gardens", "winter", "music", "bridges", "a lighthouse", "bees", "clocks", "rain",
          "deserts"]


def percentile(xs, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def one_request(client, model, i, max_tokens):
    topic = TOPICS[i % len(TOPICS)]
    kind = i % 4
    t0 = time.perf_counter()
    ttft = None
    if kind == 0:
        r = client.completions.create(model=model, prompt=f"A short note about {topic}:",
                                      max_tokens=max_tokens, temperature=0)
        n = r.usage.completion_tokens
    elif kind == 1:
        r = client.chat.completions.create(
            model=model, max_tokens=max_tokens, temperature=0.7, seed=i,
            messages=[{"role": "user", "content": f"Say something about {topic}."}])
        n = r.usage.completion_tokens
    else:
        chat = kind == 3
        kw = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True,
                  stream_options={"include_usage": True})
        if chat:
            stream = client.chat.completions.create(
                messages=[{"role": "user", "content": f"Describe {topic}."}], **kw)
        else:
            stream = client.completions.create(prompt=f"Facts about {topic}:", **kw)
        n = None
        for chunk in stream:
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
            elif ttft is None and chunk.choices and (
                    (chunk.choices[0].delta.content if chat else chunk.choices[0].text)):
                ttft = time.perf_counter() - t0
        if n is None:
            raise RuntimeError("stream ended without a usage chunk")
    return time.perf_counter() - t0, ttft, n


def run(base_url, n_requests=200, concurrency=16, max_tokens=8, log=print):
    host = urllib.parse.urlparse(base_url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the load test only targets loopback addresses")
    client = openai.OpenAI(
        base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300,
        http_client=httpx.Client(limits=httpx.Limits(max_connections=concurrency,
                                                     max_keepalive_connections=concurrency)))
    model = client.models.list().data[0].id
    latencies, ttfts, errors, n_tokens = [], [], [], 0
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        futs = [ex.submit(one_request, client, model, i, max_tokens) for i in range(n_requests)]
        for f in cf.as_completed(futs):
            try:
                lat, ttft, n = f.result()
                latencies.append(lat)
                n_tokens += n
                if ttft is not None:
                    ttfts.append(ttft)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                errors.append(f"{type(e).__name__}: {e}")
    wall = time.perf_counter() - t0
    summary = {
        "requests": n_requests, "concurrency": concurrency, "max_tokens": max_tokens,
        "ok": len(latencies), "failed": len(errors), "wall_s": wall,
        "req_per_s": len(latencies) / wall, "completion_tok_per_s": n_tokens / wall,
    }
    if latencies:
        for q in (50, 90, 99):
            summary[f"p{q}_s"] = percentile(latencies, q)
        summary["max_s"] = max(latencies)
    if ttfts:
        for q in (50, 90, 99):
            summary[f"ttft_p{q}_s"] = percentile(ttfts, q)
    log(f"load test: {n_requests} requests, {concurrency} concurrent, max_tokens {max_tokens}: "
        f"{len(latencies)} ok, {len(errors)} failed in {wall:.1f} s "
        f"({summary['req_per_s']:.2f} req/s, {summary['completion_tok_per_s']:.1f} completion tok/s)")
    if latencies:
        log("latency  p50 {p50_s:.3f} s  p90 {p90_s:.3f} s  p99 {p99_s:.3f} s  max {max_s:.3f} s"
            .format(**summary))
    if ttfts:
        log("stream time to first token  p50 {ttft_p50_s:.3f} s  p90 {ttft_p90_s:.3f} s  "
            "p99 {ttft_p99_s:.3f} s".format(**summary))
    for e in errors[:10]:
        log("error:", e)
    return summary, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url")
    ap.add_argument("--start", action="store_true", help="start `kvtier serve` on a free port")
    ap.add_argument("--kvtier", help="kvtier binary for --start (default: build*/tools/kvtier)")
    ap.add_argument("-r", "--requests", type=int, default=200)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--server-args", default="--max-active 4 --max-queue 64",
                    help="extra `kvtier serve` arguments for --start")
    args = ap.parse_args()
    server = None
    if args.start:
        import os
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        if args.kvtier:
            os.environ["KVTIER_BIN"] = args.kvtier
        from conftest import Server  # the same launcher as the tests
        server = Server(*args.server_args.split())
        base_url = server.base_url
    elif args.base_url:
        base_url = args.base_url
    else:
        ap.error("give --base-url or --start")
    try:
        _, errors = run(base_url, args.requests, args.concurrency, args.max_tokens)
    finally:
        if server:
            code = server.stop()
            print(f"server exit code after SIGTERM: {code}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
