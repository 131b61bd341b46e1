#!/usr/bin/env python3
"""The paper's accuracy table as one resumable command.

Runs `kvtier bench` (greedy generation scored by each task's metric, plus
teacher-forced fidelity to full attention) for three sweeps and writes, per
sweep, the per-sample JSONL, a Markdown summary with 95 % intervals and an
SVG plot of score and fidelity against GPU KV bytes per token:

  main    the policies of the paper's table: full, oracle, yakv (2-bit
          landmarks), yakv 1-bit, residual landmarks, chunk-8 bf16 landmarks,
          ShadowKV (default) and ShadowKV at yakv's GPU bytes per token
  budget  sparse budget 1.5625 % - 12.5 % for yakv, oracle and ShadowKV
  bits    landmark bits 0.5 - 4 (HIGGS) and residual landmarks, budget fixed

Every cell holds --n samples (20 by default). Each policy runs in its own
`kvtier bench` process (--jobs at a time, each decoding --batch samples at
once) writing OUT/<sweep>/<policy>.jsonl,
so that an interrupted run resumes where it stopped: run the same command
again until it prints "complete". --deadline bounds the whole command.

    # on the GPU (the paper's sizes)
    python3 bench/paper_table.py --device cuda --deadline 560
    # end-to-end check on a CPU at a tiny size
    python3 bench/paper_table.py --device cpu --ctx 1024 --n 2 --sweep-ctx 1024 \\
        --tasks text2json-gen,multineedle,niah_multikey --max-tokens 64 --out /tmp/paper
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

RESIDUAL = "yakv,lm=residual,meta=higgs4,res=1bit,m=8"
CHUNK8 = "landmarks,chunk=8,lm=bf16,budget=0.03125,local=64"
BUDGETS = ["0.015625", "0.03125", "0.0625", "0.125"]
BITS = ["higgs0.5", "higgs1", "higgs2", "higgs3", "higgs4"]


def gpu_bytes(kvtier, model, policies, ctx):
    """GPU bytes per token of each policy at ctx (`kvtier memory`)."""
    cmd = [kvtier, "memory", "-m", model, "-c", str(ctx)]
    for p in policies:
        cmd += ["--kv", p]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        for p in policies:
            if line.startswith(p + " ") and p not in got:
                got[p] = float(line[len(p):].split()[0])
    missing = [p for p in policies if p not in got]
    if missing:
        sys.exit(f"paper_table: `kvtier memory` did not report {missing}:\n{out}")
    return got


def shadowkv_at(kvtier, model, target_policy, ctx):
    """The ShadowKV rank whose GPU bytes per token come closest to the target policy's."""
    ranks = [f"shadowkv,rank={r}" for r in range(1, 129)]
    b = gpu_bytes(kvtier, model, [target_policy] + ranks, ctx)
    best = min(ranks, key=lambda p: abs(b[p] - b[target_policy]))
    return best, b[best], b[target_policy]


def slug(policy):
    return re.sub(r"[^A-Za-z0-9.]+", "_", policy).strip("_")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvtier", default="build/tools/kvtier")
    ap.add_argument("-m", "--model", default="models/kvtier-longctx-19m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data", default="data" if os.path.isdir("data/needlebench") else "../shared/data")
    ap.add_argument("--tasks", default="text2json-gen,multineedle,longproc-0.5k,niah_multikey,niah_multivalue,"
                    "niah_multiquery,vt,cwe,fwe", help="tasks of the main table")
    ap.add_argument("--ctx", default="16384,32768,65536", help="context lengths of the main table")
    ap.add_argument("--sweep-tasks", default="text2json-gen,multineedle", help="tasks of the budget and bits sweeps")
    ap.add_argument("--sweep-ctx", default="32768", help="context lengths of the sweeps")
    ap.add_argument("--sweeps", default="main,budget,bits")
    ap.add_argument("--n", type=int, default=20, help="samples per cell")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--fidelity", default="on", choices=["on", "off", "only"])
    ap.add_argument("--jobs", type=int, default=4, help="bench processes at once (one policy each)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per process (0: cores / jobs)")
    ap.add_argument("--prefill-chunk", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1,
                    help="samples each process decodes at once (kvtier bench --batch; the same greedy outputs)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole command (0: none)")
    ap.add_argument("--out", default="bench/results/paper")
    a = ap.parse_args()
    t0 = time.time()
    threads = a.threads or max(1, (os.cpu_count() or 2) // a.jobs)
    longest = max(int(c) for c in (a.ctx + "," + a.sweep_ctx).split(","))

    shadow_eq, sb, yb = shadowkv_at(a.kvtier, a.model, "yakv", longest)
    print(f"paper_table: ShadowKV at yakv's GPU bytes: {shadow_eq} ({sb:.0f} vs {yb:.0f} B/token at {longest})",
          flush=True)
    sweeps = {
        "main": (a.tasks, a.ctx, ["full", "oracle", "yakv", "yakv,lm=higgs1", RESIDUAL, CHUNK8, "shadowkv", shadow_eq]),
        "budget": (a.sweep_tasks, a.sweep_ctx,
                   ["full"] + [f"{p},budget={b}" for p in ("yakv", "oracle", "shadowkv") for b in BUDGETS]),
        "bits": (a.sweep_tasks, a.sweep_ctx, ["full"] + [f"yakv,lm={b}" for b in BITS] + [RESIDUAL]),
    }
    work = []
    for name in a.sweeps.split(","):
        if name not in sweeps:
            sys.exit(f"paper_table: unknown sweep '{name}' (main, budget, bits)")
        tasks, ctx, policies = sweeps[name]
        os.makedirs(os.path.join(a.out, name), exist_ok=True)
        for p in policies:
            work.append((name, tasks, ctx, p))

    def remaining():
        return a.deadline - (time.time() - t0) if a.deadline > 0 else None

    running, results, timed_out = [], [], False

    def reap(until_below):
        """Collects finished processes; waits while `until_below` or more still run."""
        nonlocal running
        while True:
            still = []
            for p, w in running:
                rc = p.poll()
                if rc is None:
                    still.append((p, w))
                else:
                    results.append((*w, rc))
            running = still
            if len(running) < until_below:
                return
            time.sleep(0.5)

    for name, tasks, ctx, policy in work:
        reap(a.jobs)
        left = remaining()
        if left is not None and left < 60:
            timed_out = True
            break
        cmd = [a.kvtier, "bench", "--device", a.device, "-m", a.model, "--data", a.data, "--task", tasks, "-c", ctx,
               "--n", str(a.n), "--max-tokens", str(a.max_tokens), "--prefill-chunk", str(a.prefill_chunk),
               "-t", str(threads), "-b", str(a.batch), "--fidelity", a.fidelity, "--no-progress", "--kv", policy,
               "-o", os.path.join(a.out, name, slug(policy) + ".jsonl")]
        if left is not None:
            cmd = ["timeout", str(int(left - 30))] + cmd  # 30 s for the reports
        log = open(os.path.join(a.out, name, slug(policy) + ".log"), "a")
        print(f"paper_table: {name}: {policy}", flush=True)
        running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), (name, policy)))
    reap(1)
    failed = [(n, p, rc) for n, p, rc in results if rc not in (0, 124)]
    timed_out = timed_out or any(rc == 124 for _, _, rc in results)

    complete = not timed_out and not failed
    for name in a.sweeps.split(","):
        tasks, ctx, policies = sweeps[name]
        merged = os.path.join(a.out, name + ".jsonl")
        with open(merged, "w") as out:
            for p in policies:
                path = os.path.join(a.out, name, slug(p) + ".jsonl")
                if os.path.exists(path):
                    text = open(path).read()
                    out.write(text[:text.rfind("\n") + 1])  # an interrupted last line is left out
        subprocess.run([a.kvtier, "bench", "--report-only", "--task", tasks, "-o", merged,
                        "--summary", os.path.join(a.out, name + ".md"), "--plot", os.path.join(a.out, name + ".svg")],
                       stdout=subprocess.DEVNULL, check=True)
        n_rec = sum(1 for _ in open(merged))
        print(f"paper_table: {name}: {n_rec} records -> {a.out}/{name}.md, {name}.svg", flush=True)
    for name, policy, rc in failed:
        print(f"paper_table: {name} {policy} failed (exit {rc}); see {a.out}/{name}/{slug(policy)}.log", flush=True)
    print("paper_table: complete" if complete else "paper_table: run again to continue", flush=True)
    with open(os.path.join(a.out, "command.json"), "w") as f:
        json.dump({"argv": sys.argv, "shadowkv_at_yakv_bytes": shadow_eq, "seconds": round(time.time() - t0)}, f,
                  indent=1)
    return 0 if complete else 3


if __name__ == "__main__":
    sys.exit(main())
