#!/usr/bin/env python3
"""Trains the project's long-context test model (see train/README.md).

One command trains until its wall-clock limit (--deadline, seconds) or until
the whole budget (--budget, seconds of training summed over commands) is
spent, then saves a checkpoint in --ckpt and exports the model; run it again
to resume. The curriculum (data.STAGES) and the learning rate follow the
fraction of the budget spent; each stage's first step is logged, and
--stage-steps with --total-steps replays a logged run's schedule by step
(the data of a step depends only on the seed, the step and its stage).

    python3 train/train.py --kvtier build/tools/kvtier --budget 980 --deadline 505 \\
        --ckpt out/train --export models/kvtier-longctx-19m
"""
import argparse
import contextlib
import json
import math
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402
from model import Config, LlamaModel, export, n_params, sparse_decode  # noqa: E402


def stage_at(progress, stages):
    acc = 0.0
    for i, s in enumerate(stages):
        acc += s.share
        if progress < acc:
            return i
    return len(stages) - 1


def lr_at(progress, step, peak, warmup):
    w = min(1.0, (step + 1) / warmup)
    return peak * w * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def eval_jobs(args, stages, kvtier, tok_dir):
    """Evaluation batches (another seed) at each stage's length, for teacher-forced
    answer accuracy: the share of answer tokens the model predicts exactly. v2
    adds batches of the held-out split (domains, wording and values never trained on)."""
    out = []
    splits = ["", "heldout"] if args.recipe != "v1" else [""]
    for split in splits:
        for i, s in enumerate(stages):
            job = D.Job(step=i, stage=i, row=s.row, lo=s.hi, hi=s.hi, tokens=max(2, args.eval_rows) * (s.hi + 300),
                        seed=args.seed + 7777, kvtier=kvtier, tokenizer_dir=tok_dir, data=args.data,
                        recipe=args.recipe, split=split, decision_weight=args.decision_weight)
            out.append((f"{split or 'train'}/{s.row}", job))
    return out


def add_sparse_args(ap):
    """The options of sparse-policy steps (model.sparse_decode), for train.py and finetune.py."""
    ap.add_argument("--sparse-frac", type=float, default=0.0,
                    help="share of steps whose answer tokens attend as a sparse KV policy decodes (model.sparse_decode)")
    ap.add_argument("--sparse-budget", type=float, default=0.03125, help="sparse steps: budget, a fraction of the prompt")
    ap.add_argument("--sparse-local", type=int, default=64, help="sparse steps: recent positions always attended")


@contextlib.contextmanager
def _with_sparse(attn_ctx, budget, local, starts, end):
    with attn_ctx(), sparse_decode(budget, local, starts, end):
        yield


def step_attn(args, coin, weights, device, attn_ctx):
    """This step's attention context: attn_ctx, with model.sparse_decode over
    the rows' answers (data.answer_starts of the batch's weights) when the
    coin (a torch.Generator) falls under --sparse-frac."""
    if float(torch.rand(1, generator=coin)) >= args.sparse_frac:
        return attn_ctx
    starts = torch.from_numpy(D.answer_starts(weights)).to(device)
    end = D.answer_end(weights)
    return lambda: _with_sparse(attn_ctx, args.sparse_budget, args.sparse_local, starts, end)


def train_step(model, opt, t, wt, amp, attn_ctx):
    """One optimizer step on the weighted next-token loss of rows t [n, T]
    (wt [n, T - 1]: the weight of predicting t[:, i + 1]); returns the
    per-token cross-entropy [n, T - 1] for the log."""
    with amp(), attn_ctx():
        logits = model(t[:, :-1])
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1),
                         reduction="none").view(t.shape[0], -1)
    loss = (ce * wt).sum() / wt.sum().clamp(min=1e-6)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return ce.detach()


@torch.no_grad()
def evaluate(model, batches, device, amp, attn_ctx):
    res = {}
    model.eval()
    for name, (_, tokens, weights, decisions, _) in batches:
        t = torch.from_numpy(tokens).to(device).long()
        w = torch.from_numpy(weights).to(device)
        with amp(), attn_ctx():
            logits = model(t)
        hit = logits[:, :-1].argmax(-1) == t[:, 1:]
        ans = w[:, :-1] >= 1.0
        dec = torch.from_numpy(decisions).to(device)[:, :-1]
        acc = (hit & ans).sum().item() / max(1, ans.sum().item())
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1), reduction="none")
        loss = (ce * ans.reshape(-1)).sum().item() / max(1, ans.sum().item())
        res[name] = {"answer_acc": round(acc, 4), "answer_loss": round(loss, 4)}
        if dec.any():  # Text2JSON-style rows: which record next, and where the list ends
            res[name]["decision_acc"] = round((hit & dec).sum().item() / dec.sum().item(), 4)
            res[name]["decision_tokens"] = int(dec.sum().item())
    model.train()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvtier", required=True, help="kvtier binary (for `kvtier gen --ids`)")
    ap.add_argument("--tokenizer", default="models/kvtier-longctx-19m", help="directory with tokenizer.json")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
    ap.add_argument("--ckpt", required=True, help="checkpoint directory (resumed when it holds one)")
    ap.add_argument("--export", required=True, help="Hugging Face directory to write")
    ap.add_argument("--budget", type=float, default=980, help="training seconds over all commands")
    ap.add_argument("--deadline", type=float, default=505, help="this command's wall-clock limit, seconds")
    ap.add_argument("--tokens-per-step", type=int, default=131072)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    ap.add_argument("--eval-rows", type=int, default=4, help="held-out samples per stage length")
    ap.add_argument("--stage-steps", default="", help="replay: comma-separated first step of stages 1.. (from a log)")
    ap.add_argument("--total-steps", type=int, default=0, help="replay: steps of the logged run (learning rate by step)")
    ap.add_argument("--init", help="no checkpoint: start from this exported directory's weights (fresh optimizer)")
    ap.add_argument("--init-trained-s", type=float, default=0.0, help="with --init: budget seconds already spent")
    ap.add_argument("--recipe", choices=sorted(D.RECIPES), default="v1",
                    help="data mix and curriculum: v1, v2 (train splits, up to 64K; the committed model) or v3 "
                    "(v2 with Text2JSON-style domains made up per sample)")
    ap.add_argument("--decision-weight", type=float, default=-1.0,
                    help="loss weight of the decision tokens of Text2JSON-style answers (default: the recipe's, 1)")
    add_sparse_args(ap)
    ap.add_argument("--smoke", action="store_true", help="tiny model and short stages (CPU check of the recipe)")
    args = ap.parse_args()
    t_start = time.time()

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stages = D.SMOKE_STAGES if args.smoke else D.RECIPES[args.recipe].stages
    cfg = Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2) if args.smoke else Config()
    model = LlamaModel(cfg).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        from torch.nn.attention import SDPBackend, sdpa_kernel
        # No math fallback: at 32K it would need tens of GB; fail loudly instead.
        attn_ctx = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,  # noqa: E731
                                        SDPBackend.EFFICIENT_ATTENTION])
        amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        attn_ctx = contextlib.nullcontext
        amp = contextlib.nullcontext

    os.makedirs(args.ckpt, exist_ok=True)
    ckpt_path = os.path.join(args.ckpt, "ckpt.pt")
    step, trained_s, log, warm0 = 0, 0.0, [], 0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, trained_s, log = ck["step"], ck["trained_s"], ck["log"]
        print(f"resumed at step {step}, {trained_s:.0f} s of {args.budget:.0f} trained", flush=True)
    elif args.init:
        from model import load
        model.load_state_dict(load(args.init, device).state_dict())
        trained_s = args.init_trained_s
        step = warm0 = 100_000  # data seeds apart from the first run's; a short warm-up for the fresh Adam state
        args.warmup = 50
        print(f"initialized from {args.init}; {trained_s:.0f} s of {args.budget:.0f} counted as trained", flush=True)
    print(f"model: {n_params(model) / 1e6:.2f}M parameters on {device}; stages {[s.row for s in stages]}", flush=True)
    replay = [int(x) for x in args.stage_steps.split(",")] if args.stage_steps else None

    def stage_for(s, progress):
        if replay is not None:
            return sum(1 for b in replay if s >= b)
        return stage_at(progress, stages)

    kvtier = os.path.abspath(args.kvtier)
    tok_dir = os.path.abspath(args.tokenizer)

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "trained_s": trained_s,
                    "log": log, "config": cfg.__dict__}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    # spawn: the workers only run `kvtier gen`; they must not inherit CUDA state.
    pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
    # Evaluation batches are built by the workers while training starts.
    eval_futures = [(name, pool.submit(D.build_batch, job)) for name, job in eval_jobs(args, stages, kvtier, tok_dir)]
    pending = deque()
    next_step = step
    ahead = 2 * args.workers

    def progress_now():
        if replay is not None and args.total_steps > 0:
            return step / args.total_steps
        return trained_s / args.budget

    def submit():
        nonlocal next_step
        progress = progress_now()
        si = stage_for(next_step, progress)
        s = stages[si]
        job = D.Job(step=next_step, stage=si, row=s.row, lo=s.lo, hi=s.hi, tokens=args.tokens_per_step, seed=args.seed,
                    kvtier=kvtier, tokenizer_dir=tok_dir, data=args.data, recipe=args.recipe,
                    decision_weight=args.decision_weight)
        pending.append((job, pool.submit(D.build_batch, job)))
        next_step += 1

    while len(pending) < ahead:
        submit()
    model.train()
    coin = torch.Generator().manual_seed(args.seed * 1_000_003 + step)  # which steps are sparse (--sparse-frac)
    t_last_save = t_iter = time.time()
    window = {"tok": 0, "ans_loss": 0.0, "doc_loss": 0.0, "n": 0, "t": time.time(), "wait": 0.0}
    done = False
    while True:
        progress = progress_now()
        if progress >= 1.0:
            done = True
            break
        if time.time() - t_start > args.deadline:
            break
        job, fut = pending.popleft()
        tw = time.time()
        _, tokens, weights, _, stats = fut.result()
        window["wait"] += time.time() - tw
        for e in stats["gen_errors"]:
            print(f"warning: step {job.step}: {e}", flush=True)
        submit()
        lr = lr_at(progress, step - warm0, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        t = torch.from_numpy(tokens).to(device, non_blocking=True).long()
        wt = torch.from_numpy(weights).to(device, non_blocking=True)[:, :-1]
        ce = train_step(model, opt, t, wt, amp, step_attn(args, coin, weights, device, attn_ctx))
        with torch.no_grad():
            ans = (wt >= 1.0).float()
            doc = (wt == D.PROMPT_WEIGHT).float()
            window["ans_loss"] += ((ce * ans).sum() / ans.sum().clamp(min=1)).item()
            window["doc_loss"] += ((ce * doc).sum() / doc.sum().clamp(min=1)).item()
        window["tok"] += stats["tokens"]
        window["n"] += 1
        now = time.time()
        trained_s += now - t_iter  # the command's time: data waits count too
        t_iter = now
        if not log or log[-1]["stage"] != job.stage:
            log.append({"stage": job.stage, "first_step": step, "row": job.row})
            print(f"step {step}: stage {job.stage} (rows of {job.row} tokens, prompts {job.lo}-{job.hi})", flush=True)
        step += 1
        if step % 25 == 0:
            dt = time.time() - window["t"]
            print(f"step {step} stage {job.stage} lr {lr:.2e} answer-loss {window['ans_loss'] / window['n']:.3f} "
                  f"doc-loss {window['doc_loss'] / window['n']:.3f} {window['tok'] / dt / 1e6:.2f} Mtok/s "
                  f"data-wait {window['wait'] / dt:.0%} progress {progress:.1%}", flush=True)
            window = {"tok": 0, "ans_loss": 0.0, "doc_loss": 0.0, "n": 0, "t": time.time(), "wait": 0.0}
        if time.time() - t_last_save > 150:
            save()
            t_last_save = time.time()
    for _, f in pending:
        f.cancel()
    evals = [(name, f.result()) for name, f in eval_futures]
    pool.shutdown(wait=False, cancel_futures=True)
    save()
    export(model, args.export)
    src = os.path.join(tok_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(os.path.join(src, f)) != os.path.abspath(os.path.join(args.export, f)):
            shutil.copy(os.path.join(src, f), os.path.join(args.export, f))
    ev = evaluate(model, evals, device, amp, attn_ctx) if device == "cuda" or args.smoke else {}
    summary = {"recipe": args.recipe, "step": step, "trained_s": round(trained_s, 1), "budget_s": args.budget,
               "done": done,
               "stages": log, "eval": ev, "params": n_params(model), "wall_s": round(time.time() - t_start, 1)}
    with open(os.path.join(args.ckpt, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
