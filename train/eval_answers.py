#!/usr/bin/env python3
"""Teacher-forced accuracy of models on Text2JSON-style answers, by the kind
of answer token: the JSON keys (copied from the instructions), the names,
the other values (copied from the document), the structure (braces, quotes,
commas) and the decision tokens (data.decision_positions: which record comes
next, and where the list ends). On the train split (every training domain)
and the held-out split (domains, wording, layouts and values training never
sees), the same samples for every model.

    python3 train/eval_answers.py models/kvtier-longctx-19m /tmp/v3 --tokens 1536 --n 40
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("key", "name", "value", "structure", "decision")


def char_kinds(text):
    """The kind of each character of a JSON list of flat objects: "key",
    "name" (the value of key "name"), "value" or "structure"."""
    kinds = ["structure"] * len(text)
    in_str, expect_key, key, start, i = False, True, None, 0, 0
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                kind = "key" if expect_key else ("name" if key == "name" else "value")
                kinds[start:i] = [kind] * (i - start)
                if expect_key:
                    key = text[start:i]
                in_str = False
        elif c == '"':
            in_str, start = True, i + 1
        elif c == ":":
            expect_key = False
        elif c in ",{":
            expect_key = True
        i += 1
    return kinds


def token_kinds(answer_ids, pieces):
    """Each answer token's kinds: its first non-structure character's kind (else
    "structure"), plus "decision" for decision tokens."""
    text = "".join(pieces[t] for t in answer_ids)
    chars = char_kinds(text)
    out, at = [], 0
    for t in answer_ids:
        span = chars[at:at + len(pieces[t])]
        at += len(pieces[t])
        out.append({next((k for k in span if k != "structure"), "structure")})
    for i in D.decision_positions(answer_ids, pieces):
        out[i].add("decision")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="exported model directories")
    ap.add_argument("--tokens", type=int, default=1536, help="prompt length")
    ap.add_argument("--n", type=int, default=40, help="samples per split")
    ap.add_argument("--seed", type=int, default=9191)
    ap.add_argument("--splits", default="train,heldout")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kvtier", default=os.path.join(ROOT, "build", "tools", "kvtier"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data"))
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    import torch
    from model import load
    if args.threads:
        torch.set_num_threads(args.threads)
    tok_dir = os.path.abspath(args.models[0])
    pieces = D.token_pieces(tok_dir)
    samples = {}
    with tempfile.TemporaryDirectory() as work:
        for split in args.splits.split(","):
            out = os.path.join(work, split + ".jsonl")
            extra = ["--domain", "all"] if split == "train" else []
            subprocess.run([args.kvtier, "gen", "--task", "text2json", "--split", split, "--tokens", str(args.tokens),
                            "--n", str(args.n), "--seed", str(args.seed), "--ids", "-m", tok_dir, "--data", args.data,
                            "-o", out] + extra, check=True, capture_output=True)
            with open(out, encoding="utf-8") as f:
                samples[split] = [json.loads(line) for line in f]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {}
    print(f"| model | split | answer | {' | '.join(KINDS)} |\n|---|---|---|{'---|' * len(KINDS)}")
    for m in args.models:
        model = load(m, device)
        model.eval()
        for split, recs in samples.items():
            hits = {k: [0, 0] for k in ("answer",) + KINDS}
            for r in recs:
                p, a = r["prompt_ids"], r["answer_ids"]
                with torch.no_grad():
                    logits = model(torch.tensor([p + a], device=device))[0]
                pred = logits[len(p) - 1:len(p) + len(a) - 1].argmax(-1).tolist()
                for y, t, kinds in zip(pred, a, token_kinds(a, pieces)):
                    for k in kinds | {"answer"}:
                        hits[k][0] += int(y == t)
                        hits[k][1] += 1
            res = {k: {"acc": round(h[0] / max(1, h[1]), 4), "tokens": h[1]} for k, h in hits.items()}
            results[f"{m}:{split}"] = res
            cells = " | ".join(f"{100 * res[k]['acc']:.1f} ({res[k]['tokens']})" for k in ("answer",) + KINDS)
            print(f"| {m} | {split} | {cells} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.tokens, "n": args.n, "seed": args.seed, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
