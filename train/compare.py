#!/usr/bin/env python3
"""Greedy agreement between the training framework (PyTorch, f32 weights
upcast from the exported bf16) and kvtier (CPU or CUDA backend) on the
exported model: the same prompt ids, greedy decoding, and the number of
leading generated tokens that agree. With --hf, also checks that Hugging Face
transformers loads the directory and gives the same logits as train/model.py.

    python3 train/compare.py --model models/kvtier-longctx-19m --kvtier build/tools/kvtier --device cpu
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load  # noqa: E402


SEED = 424242


def prompts(kvtier, model, data, work, length):
    out = []
    for task in ("text2json", "multineedle", "niah_multivalue", "vt"):
        path = os.path.join(work, task + ".jsonl")
        subprocess.run([kvtier, "gen", "--task", task, "--tokens", str(length), "--n", "1", "--seed", str(SEED),
                        "--ids", "-m", model, "--data", data, "-o", path], check=True, capture_output=True)
        rec = json.loads(open(path, encoding="utf-8").readline())
        out.append((task, rec["prompt_ids"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kvtier", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="kvtier's backend (and torch's device)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
    ap.add_argument("--length", type=int, default=1024, help="prompt length in tokens")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--hf", action="store_true", help="also compare with transformers' LlamaForCausalLM")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--golden", help="write the torch greedy ids per task here (tests/golden/longctx_greedy.json)")
    a = ap.parse_args()

    torch_dev = "cuda" if a.device == "cuda" and torch.cuda.is_available() else "cpu"
    model = load(a.model, torch_dev, torch.float32).eval()
    eos = model.cfg.eos_token_id
    results = {"device": a.device, "prompts": []}
    golden = {"model": a.model, "seed": SEED, "length": a.length, "max_new": a.max_new, "samples": []}
    if a.hf:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).to(torch_dev).eval()
        x = torch.randint(0, model.cfg.vocab_size, (1, 300), device=torch_dev)
        with torch.no_grad():
            diff = (hf(x).logits - model(x)).abs().max().item()
        results["hf_max_abs_logit_diff"] = diff
        print(f"transformers vs train/model.py: max |logit diff| {diff:.2e}")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    with tempfile.TemporaryDirectory() as work:
        for task, ids in prompts(a.kvtier, a.model, a.data, work, a.length):
            ref = model.greedy(ids, a.max_new, eos)
            # kvtier reads the same ids back from text (the tokenizers agree:
            # `kvtier gen --ids` wrote them with kvtier's own tokenizer).
            pfile = os.path.join(work, "prompt.txt")
            with open(pfile, "w", encoding="utf-8") as f:
                f.write(tok.decode(ids, skip_special_tokens=False))
            r = subprocess.run([a.kvtier, "run", "-m", a.model, "--device", a.device, "--raw", "-f", pfile,
                                "-n", str(a.max_new), "--temp", "0"], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"kvtier run failed: {r.stderr[-500:]}")
            want_text = tok.decode(ref, skip_special_tokens=True)
            same_text = r.stdout.strip() == want_text.strip()
            # Leading torch tokens whose text kvtier's output starts with.
            body = [t for t in ref if t != eos]
            n_same = 0
            while n_same < len(body) and r.stdout.startswith(tok.decode(body[:n_same + 1], skip_special_tokens=True)):
                n_same += 1
            row = {"task": task, "prompt_tokens": len(ids), "torch_tokens": len(ref), "equal_prefix_tokens": n_same,
                   "same_text": same_text, "torch": want_text[:200], "kvtier": r.stdout[:200]}
            results["prompts"].append(row)
            golden["samples"].append({"task": task, "prompt_tokens": len(ids), "torch_ids": [t for t in ref if t != eos],
                                      "torch_stopped": bool(ref and ref[-1] == eos)})
            print(f"{task:16s} prompt {len(ids):5d}  torch {len(ref):3d} tokens  equal prefix {n_same:3d}  "
                  f"same text {same_text}")
    if a.golden:
        with open(a.golden, "w") as f:
            json.dump(golden, f, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
