#!/usr/bin/env python3
"""Pivot of `kvtier bench` records: one row per policy (with its GPU-tier
bytes per token), one column per (task, context), cells = mean score (n).

    python3 scripts/bench_pivot.py bench/results/longctx/gpu_h200.jsonl [more.jsonl ...] [--mark FILE]

Records of files given with --mark get a '*' (e.g. cells measured elsewhere).
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--mark", action="append", default=[], help="records from this file are marked with *")
    a = ap.parse_args()
    cells = collections.defaultdict(list)
    marked = set()
    bytes_of = {}
    seen = set()
    for path in a.files + a.mark:
        for line in open(path, encoding="utf-8"):
            if not line.strip():
                continue
            r = json.loads(line)
            key = (r["task"], r["id"], r["policy"], r["ctx"])
            if key in seen:
                continue
            seen.add(key)
            col = (r["task"], r["ctx"])
            cells[(r["policy"], col)].append(r["score"])
            bytes_of[r["policy"]] = r.get("gpu_bytes_per_token", 0)
            if path in a.mark:
                marked.add((r["policy"], col))
    cols = sorted({c for _, c in cells})
    policies = sorted(bytes_of, key=lambda p: (-bytes_of[p], p))
    head = "| policy | GPU B/tok | " + " | ".join(f"{t} {c // 1024}K" for t, c in cols) + " |"
    print(head)
    print("|" + "---|" * (2 + len(cols)))
    for p in policies:
        row = [p, f"{bytes_of[p]:.0f}"]
        for c in cols:
            v = cells.get((p, c))
            row.append("—" if not v else f"{sum(v) / len(v):.1f} ({len(v)}){'*' if (p, c) in marked else ''}")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
