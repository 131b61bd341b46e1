#!/usr/bin/env python3
"""Fine-tunes an exported model for a fixed number of steps at one prompt
length range: a quick comparison of recipes (data mixes, loss weights) that
runs on a CPU. Every arm started with the same --seed sees the same batch
sequence of its recipe; the batches come from `kvtier gen --ids` through
data.build_batch, the loss is train.py's.

    python3 train/finetune.py --init models/kvtier-longctx-19m --out /tmp/v3 --recipe v3 --steps 160

On a GPU it is also the last stage of the committed model (v2s, from v2):

    python3 train/finetune.py --init models/kvtier-longctx-19m --out out/SY --recipe v2 --sparse-frac 0.5 \
        --lo 3584 --hi 32768 --tokens-per-step 65536 --lr 5e-5

--sparse-frac P trains a share P of the steps with the answer tokens
attending as a sparse KV policy decodes them (model.sparse_decode: the local
window plus the budget's best tokens by exact attention), so that the model
learns to keep what it needs within a policy's budget.
"""
import argparse
import contextlib
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402
from model import export, load  # noqa: E402
from train import add_sparse_args, step_attn, train_step  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", required=True, help="exported model directory to start from (and its tokenizer)")
    ap.add_argument("--out", required=True, help="directory to export the fine-tuned model to")
    ap.add_argument("--recipe", choices=sorted(D.RECIPES), default="v3")
    ap.add_argument("--decision-weight", type=float, default=-1.0, help="loss weight of decision tokens (recipe's: 1)")
    ap.add_argument("--dup-rate", type=float, default=0.0,
                    help="share of Text2JSON-style rows with a repeated record to recover from (data.with_repeat)")
    add_sparse_args(ap)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--lo", type=int, default=1000, help="shortest prompt, tokens")
    ap.add_argument("--hi", type=int, default=1536, help="longest prompt, tokens")
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=2e-4, help="constant after --warmup steps")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--kvtier", default=os.path.join(ROOT, "build", "tools", "kvtier"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = lambda: torch.autocast(device, dtype=torch.bfloat16)  # noqa: E731
    model = load(args.init, device)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    row = -(-(args.hi + 512) // 64) * 64
    tok_dir = os.path.abspath(args.init)

    def job(s):  # step numbers apart from train.py's (0.. and 100,000..)
        return D.Job(step=200_000 + s, stage=0, row=row, lo=args.lo, hi=args.hi, tokens=args.tokens_per_step,
                     seed=args.seed, kvtier=os.path.abspath(args.kvtier), tokenizer_dir=tok_dir, data=args.data,
                     recipe=args.recipe, decision_weight=args.decision_weight, dup_rate=args.dup_rate)

    coin = torch.Generator().manual_seed(args.seed + 7)  # apart from the model's RNG: same batches with or without
    pool = ThreadPoolExecutor(1)  # `kvtier gen` runs while the model trains
    ahead = [pool.submit(D.build_batch, job(s)) for s in range(min(3, args.steps))]
    t0 = time.time()
    win = {"ans": 0.0, "dec": 0.0, "n": 0}
    for s in range(args.steps):
        _, tokens, weights, decisions, stats = ahead.pop(0).result()
        for e in stats["gen_errors"]:
            print(f"warning: step {s}: {e}", flush=True)
        if s + 3 < args.steps:
            ahead.append(pool.submit(D.build_batch, job(s + 3)))
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (s + 1) / args.warmup)
        t = torch.from_numpy(tokens).to(device).long()
        w = torch.from_numpy(weights).to(device)[:, :-1]
        ce = train_step(model, opt, t, w, amp, step_attn(args, coin, weights, device, contextlib.nullcontext))
        with torch.no_grad():
            ans = (w >= 1.0).float()
            dec = torch.from_numpy(decisions).to(device)[:, :-1].float()
            win["ans"] += ((ce * ans).sum() / ans.sum().clamp(min=1)).item()
            win["dec"] += ((ce * dec).sum() / dec.sum().clamp(min=1)).item()
            win["n"] += 1
        if (s + 1) % 25 == 0 or s + 1 == args.steps:
            print(f"step {s + 1}: answer loss {win['ans'] / win['n']:.4f}, decision loss {win['dec'] / win['n']:.4f}, "
                  f"{time.time() - t0:.0f} s", flush=True)
            win = {"ans": 0.0, "dec": 0.0, "n": 0}
    pool.shutdown()
    export(model, args.out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(args.init, f)):
            shutil.copy(os.path.join(args.init, f), os.path.join(args.out, f))
    print(f"finetune: {args.steps} steps in {time.time() - t0:.0f} s, exported to {args.out}", flush=True)


if __name__ == "__main__":
    main()
