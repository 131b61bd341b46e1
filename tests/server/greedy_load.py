#!/usr/bin/env python3
"""Concurrency must not change answers: N distinct greedy requests (default
32, completions and chat alternating) are first answered one at a time
(solo), then all N at once, R rounds; every concurrent answer must equal its
solo answer token for token. Prints and optionally writes (Markdown) the
latency percentiles of the concurrent rounds. Loopback only.

Also reports the speedup: each round times the n requests one after
another, then all at once; the ratio of the medians.

Standalone:  greedy_load.py --start [--kvtier build/tools/kvtier] [-n 32] [-r 3] [--max-tokens 32]
                            [--kind both|chat|completion] [--server-args ARGS] [--out FILE]
or           greedy_load.py --base-url http://127.0.0.1:PORT ...
"""
import argparse
import concurrent.futures as cf
import os
import platform
import sys
import time
import urllib.parse

import httpx
import openai

from load_test import TOPICS, percentile


def ask(client, i, max_tokens, kind="both"):
    topic = TOPICS[i % len(TOPICS)]
    t0 = time.perf_counter()
    if kind == "completion" or (kind == "both" and i % 2 == 0):
        r = client.completions.create(model="m", prompt=f"Note {i} about {topic}:", max_tokens=max_tokens,
                                      temperature=0)
        text = r.choices[0].text
    else:
        r = client.chat.completions.create(model="m", max_tokens=max_tokens, temperature=0,
                                           messages=[{"role": "user", "content": f"Tell me fact {i} about {topic}."}])
        text = r.choices[0].message.content
    return text, time.perf_counter() - t0


def run(base_url, n=32, rounds=1, max_tokens=16, log=print, kind="both"):
    if urllib.parse.urlparse(base_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("loopback only")
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600,
                           http_client=httpx.Client(limits=httpx.Limits(max_connections=n,
                                                                        max_keepalive_connections=n)))
    solo = [ask(client, i, max_tokens, kind)[0] for i in range(n)]
    # Each round times the n requests one after another, then all at once
    # (alternating, so that a noisy machine slows both alike).
    latencies, mismatches, solo_walls, walls = [], [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(n):
            text = ask(client, i, max_tokens, kind)[0]
            if text != solo[i]:
                mismatches.append((i, solo[i], text))
        solo_walls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(n) as ex:
            results = list(ex.map(lambda i: ask(client, i, max_tokens, kind), range(n)))
        walls.append(time.perf_counter() - t0)
        for i, (text, lat) in enumerate(results):
            latencies.append(lat)
            if text != solo[i]:
                mismatches.append((i, solo[i], text))
    solo_wall, wall = percentile(solo_walls, 50), percentile(walls, 50)
    summary = {"n": n, "rounds": rounds, "max_tokens": max_tokens, "requests": len(latencies),
               "mismatches": len(mismatches), "wall_s": wall, "solo_wall_s": solo_wall,
               # one after another vs all at once, for the same n requests (medians over rounds)
               "speedup": solo_wall / wall,
               "p50_s": percentile(latencies, 50), "p90_s": percentile(latencies, 90),
               "p99_s": percentile(latencies, 99), "max_s": max(latencies)}
    log(f"greedy load: {n}-way x {rounds} rounds, max_tokens {max_tokens}: {len(latencies)} answers, "
        f"{len(mismatches)} differ from solo; latency p50 {summary['p50_s']:.2f} s p90 {summary['p90_s']:.2f} s "
        f"p99 {summary['p99_s']:.2f} s max {summary['max_s']:.2f} s; median round: one after another "
        f"{solo_wall:.1f} s, all at once {wall:.1f} s: {summary['speedup']:.2f}x")
    return summary, mismatches


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url")
    ap.add_argument("--start", action="store_true")
    ap.add_argument("--kvtier")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kind", choices=["both", "chat", "completion"], default="both",
                    help="request kind (both: completions and chat alternating)")
    ap.add_argument("--server-args", default="--max-active 4 --max-queue 64")
    ap.add_argument("--out", help="append a Markdown record of the run to this file")
    args = ap.parse_args()
    server = None
    if args.start:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        if args.kvtier:
            os.environ["KVTIER_BIN"] = args.kvtier
        from conftest import Server
        server = Server(*args.server_args.split())
        base_url = server.base_url
    else:
        base_url = args.base_url
    try:
        summary, mismatches = run(base_url, args.n, args.rounds, args.max_tokens, kind=args.kind)
    finally:
        if server:
            print(f"server exit code after SIGTERM: {server.stop()}")
    if args.out:
        load = os.getloadavg()
        with open(args.out, "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — {platform.node()}, load average {load[0]:.1f}\n\n"
                    f"    {' '.join(sys.argv)}\n    # server: kvtier serve {args.server_args}\n\n"
                    f"| way | rounds | max_tokens | answers | differ from solo | p50 s | p90 s | p99 s | max s "
                    f"| one after another s | all at once s | speedup |\n"
                    f"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
                    f"| {summary['n']} | {summary['rounds']} | {summary['max_tokens']} | {summary['requests']} | "
                    f"{summary['mismatches']} | {summary['p50_s']:.2f} | {summary['p90_s']:.2f} | "
                    f"{summary['p99_s']:.2f} | {summary['max_s']:.2f} | {summary['solo_wall_s']:.1f} | "
                    f"{summary['wall_s']:.1f} | {summary['speedup']:.2f}x |\n")
    for i, a, b in mismatches[:5]:
        print(f"#{i} differs:\n  solo: {a!r}\n  load: {b!r}")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
