#!/usr/bin/env python3
"""Long-prompt load test of `kvtier serve`: N streaming completions at once,
each with its own prompt of L token ids, M new tokens each (greedy,
ignore_eos). Reports time to first token (TTFT) and inter-token latency (ITL:
the gaps between a stream's chunks after its first) as p50/p99, the
end-to-end latency, the aggregate prompt and decode rates, and the server's
/health pools at the peak. Standard library only (runs on the GPU image).

With a random-weight model (bench/make_random_model.py writes a byte-level
tokenizer for it), the prompts are random token ids and the answers are
meaningless: this measures the scheduler and the engine, not the model.

    python3 bench/long_prompt_load.py --start --kvtier build/tools/kvtier -n 32 -l 32768 -m 64 \\
        --server-args="-m /tmp/llama8b --device cuda --kv yakv --max-active 32 --prefill-chunk 8192" \\
        --out result.json
"""
import argparse
import http.client
import json
import random
import shlex
import socket
import subprocess
import sys
import threading
import time


def percentile(xs, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(host, port, path, timeout=10):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def one_stream(host, port, model, prompt, max_tokens, t_start, out, timeout):
    """One streaming completion; appends its record to `out`."""
    rec = {"prompt_tokens": len(prompt), "chunks": [], "error": None}
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        rec["submitted_s"] = t0 - t_start
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # SSE comments (keep-alive) and blank separators
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("error"):  # an error after the stream began (the HTTP status was already 200)
                rec["error"] = json.dumps(ev["error"])[:300]
            if ev.get("usage"):
                rec["completion_tokens"] = ev["usage"]["completion_tokens"]
            if any(ch.get("text") for ch in ev.get("choices", [])):
                rec["chunks"].append(time.perf_counter() - t0)
        rec["total_s"] = time.perf_counter() - t0
    except Exception as e:  # a failed request is reported, never hidden
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        c.close()
        out.append(rec)


def watch_health(host, port, stop, peak):
    while not stop.is_set():
        try:
            _, h = get_json(host, port, "/health", timeout=5)
            for key in ("kv_gpu_bytes", "kv_host_bytes", "gpu_kv_reserved_bytes", "host_kv_reserved_bytes",
                        "active_sequences", "queued_requests"):
                v = h.get(key)
                if isinstance(v, (int, float)):
                    peak[key] = max(peak.get(key, 0), v)
            peak["last"] = h
        except Exception:
            pass
        stop.wait(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="http://HOST:PORT of a running server")
    ap.add_argument("--start", action="store_true", help="start `kvtier serve` with --server-args")
    ap.add_argument("--kvtier", default="build/tools/kvtier")
    ap.add_argument("--server-args", default="")
    ap.add_argument("-n", "--requests", type=int, default=32, help="concurrent requests")
    ap.add_argument("-l", "--prompt-tokens", type=int, default=32768)
    ap.add_argument("-m", "--max-tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=128000, help="prompt ids are drawn from [256, vocab)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=540, help="seconds one request may take")
    ap.add_argument("--ready-timeout", type=float, default=300, help="seconds the server may take to load")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", help="write the summary (and per-request records) as JSON here")
    a = ap.parse_args()

    proc = None
    if a.start:
        port = free_port()
        host = "127.0.0.1"
        cmd = [a.kvtier, "serve", "--port", str(port), *shlex.split(a.server_args)]
        print("server:", " ".join(shlex.quote(x) for x in cmd), file=sys.stderr, flush=True)
        proc = subprocess.Popen(cmd)
    else:
        if not a.base_url:
            ap.error("give --base-url or --start")
        hp = a.base_url.split("//", 1)[-1].rstrip("/")
        host, port = hp.rsplit(":", 1)
        port = int(port)
    try:
        t_ready = time.perf_counter()
        while True:
            try:
                st, _ = get_json(host, port, "/health", timeout=2)
                if st == 200:
                    break
            except OSError:
                pass
            if proc and proc.poll() is not None:
                sys.exit(f"server exited with {proc.returncode} before it was ready")
            if time.perf_counter() - t_ready > a.ready_timeout:
                sys.exit("server not ready in time")
            time.sleep(0.5)
        _, models = get_json(host, port, "/v1/models")
        model = models["data"][0]["id"]
        rng = random.Random(a.seed)
        prompts = [[rng.randrange(256, a.vocab) for _ in range(a.prompt_tokens)] for _ in range(a.requests)]
        records, peak, stop = [], {}, threading.Event()
        watcher = threading.Thread(target=watch_health, args=(host, port, stop, peak), daemon=True)
        watcher.start()
        t_start = time.perf_counter()
        threads = [threading.Thread(target=one_stream,
                                    args=(host, port, model, p, a.max_tokens, t_start, records, a.timeout))
                   for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t_start
        stop.set()
        watcher.join()
        try:  # the totals after every request (worker_seconds, counters)
            peak["last"] = get_json(host, port, "/health", timeout=5)[1]
        except Exception:
            pass
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    ok = [r for r in records if not r["error"] and r["chunks"]]
    failed = [r for r in records if r not in ok]
    ttft = [r["chunks"][0] for r in ok]
    itl = [b - x for r in ok for x, b in zip(r["chunks"], r["chunks"][1:])]
    e2e = [r["total_s"] for r in ok]
    gen = sum(r.get("completion_tokens", len(r["chunks"])) for r in ok)
    summary = {
        "label": a.label, "requests": a.requests, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
        "server_args": a.server_args, "ok": len(ok), "failed": len(failed), "wall_s": round(wall, 3),
        "prompt_tok_per_s": round(len(ok) * a.prompt_tokens / wall, 1),
        "generated_tokens": gen, "decode_tok_per_s_overall": round(gen / wall, 2),
        "peak_pools": {k: v for k, v in peak.items() if k != "last"},
        "health_last": peak.get("last"),
        "errors": [r["error"] for r in failed][:5],
    }
    for name, xs in (("ttft_s", ttft), ("itl_s", itl), ("e2e_s", e2e)):
        if xs:
            summary[name] = {"p50": round(percentile(xs, 50), 4), "p99": round(percentile(xs, 99), 4),
                             "max": round(max(xs), 4), "n": len(xs)}
    print(json.dumps({k: v for k, v in summary.items() if k != "health_last"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({**summary, "records": records}, f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
