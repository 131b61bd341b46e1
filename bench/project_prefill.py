#!/usr/bin/env python3
"""Projects a long prefill's total time from the progress lines `kvtier perf`
prints on stderr ("[kvtier] prefill 950272/1048576 tokens (91%), ... 524.9 s"),
for a run that a time limit stopped before the end.

Each chunk's time grows linearly with its position (attention reads every
earlier token; the GEMMs are the same per chunk): the time per chunk between
consecutive progress lines is fitted as a + b * position by least squares, and
the chunks not measured are summed from the fit.

    python3 bench/project_prefill.py bench/results/prefill/run4_1m_progress.log --chunk 16384
"""
import argparse
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--chunk", type=int, required=True, help="--prefill-chunk of the run")
    a = ap.parse_args()
    pts = []
    for line in open(a.log):
        m = re.search(r"prefill (\d+)/(\d+) tokens \(\d+%\), \d+ tok/s, ([\d.]+) s", line)
        if m:
            pts.append((int(m.group(1)), int(m.group(2)), float(m.group(3))))
    if len(pts) < 3:
        sys.exit("project_prefill: fewer than 3 progress lines in " + a.log)
    total = pts[0][1]
    # (mid position, seconds per chunk) between consecutive lines
    xs, ys = [], []
    for (n0, _, t0), (n1, _, t1) in zip(pts, pts[1:]):
        if n1 > n0:
            xs.append((n0 + n1) / 2)
            ys.append((t1 - t0) / (n1 - n0) * a.chunk)
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    c0 = my - b * mx
    worst = max(abs(c0 + b * x - y) / y for x, y in zip(xs, ys))
    done, t_done = pts[-1][0], pts[-1][2]
    rest = sum(c0 + b * (p + a.chunk / 2) for p in range(done, total, a.chunk))
    print(f"per chunk: {c0:.4f} s + {b:.4e} s per token of position (worst residual {100 * worst:.0f} %)")
    print(f"measured: {done}/{total} tokens in {t_done:.1f} s ({done / t_done:.0f} tok/s)")
    print(f"projected: {rest:.1f} s more, {t_done + rest:.1f} s in total, {total / (t_done + rest):.0f} tok/s")


if __name__ == "__main__":
    main()
