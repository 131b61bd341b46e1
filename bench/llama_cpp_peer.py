#!/usr/bin/env python3
"""llama.cpp peer for kvtier's CPU speed numbers: prefill tokens/s on a
~512-token prompt and decode tokens/s over 128 greedy tokens, on the same GGUF
with the same thread count, through llama-cpp-python (which builds llama.cpp
from source). Prints one JSON object on stdout.

Times come from llama.cpp's own counters (llama_perf_context: t_p_eval_ms /
n_p_eval for batched prompt evaluation, t_eval_ms / n_eval for one-token
decode steps), so Python overhead (argmax, ctypes) is excluded; wall-clock
times around the same calls are reported too. Each figure is the median over
--reps runs after one warm-up run.

  pip install llama-cpp-python==0.3.36
  python3 bench/llama_cpp_peer.py --threads 2 [--model PATH] [--prompt-tokens 512] [--gen 128]
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "cache", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Prose to cut the prompt from; repeated with a counter so it is not one
# string over and over.
TEXT = ("The history of computing is a story of abstraction: each generation of engineers hides the details "
        "of the last behind a simpler interface. Vacuum tubes gave way to transistors, transistors to "
        "integrated circuits, and hand-written machine code to compilers. Memory hierarchies grew deeper, "
        "with caches, main memory and disks trading capacity for speed. ")


def build_prompt(llm, n_tokens):
    text, i = "", 0
    while True:
        text += f"Section {i}. " + TEXT
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        i += 1


def last_argmax(llm):
    import llama_cpp
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))


def run_once(llm, prompt, n_gen):
    import llama_cpp
    ctx = llm._ctx.ctx
    llm.reset()
    llama_cpp.llama_perf_context_reset(ctx)
    t0 = time.perf_counter()
    llm.eval(prompt)
    # The counters (and the work) are settled by llama_synchronize, which the
    # logits getter would otherwise call later.
    llama_cpp.llama_synchronize(ctx)
    t1 = time.perf_counter()
    perf = llama_cpp.llama_perf_context(ctx)
    prefill_ms, n_prefill = perf.t_p_eval_ms, perf.n_p_eval
    tok = last_argmax(llm)
    decode_wall = 0.0
    for _ in range(n_gen):
        t2 = time.perf_counter()
        llm.eval([tok])
        llama_cpp.llama_synchronize(ctx)
        decode_wall += time.perf_counter() - t2
        tok = last_argmax(llm)
    perf = llama_cpp.llama_perf_context(ctx)
    return {
        "prefill_ms": prefill_ms, "n_prefill": n_prefill, "prefill_wall_ms": (t1 - t0) * 1e3,
        "decode_ms": perf.t_eval_ms, "n_decode": perf.n_eval, "decode_wall_ms": decode_wall * 1e3,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import llama_cpp
    n_ctx = args.prompt_tokens + args.gen + 16
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_batch=args.prompt_tokens,
                          n_ubatch=args.prompt_tokens, n_threads=args.threads, n_threads_batch=args.threads,
                          seed=0, verbose=False)
    prompt = build_prompt(llm, args.prompt_tokens)
    run_once(llm, prompt[:32], 4)  # warm-up: page in the weights, build the graphs
    runs = [run_once(llm, prompt, args.gen) for _ in range(args.reps)]
    med = lambda key: statistics.median(r[key] for r in runs)
    n_prefill, n_decode = runs[0]["n_prefill"], runs[0]["n_decode"]
    out = {
        "peer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "model": os.path.relpath(os.path.abspath(args.model), ROOT),
        "n_threads": args.threads,
        "prompt_tokens": len(prompt),
        "gen_tokens": args.gen,
        "reps": args.reps,
        "prefill_tok_s": n_prefill / (med("prefill_ms") / 1e3),
        "decode_tok_s": n_decode / (med("decode_ms") / 1e3),
        "prefill_ms": med("prefill_ms"),
        "decode_ms": med("decode_ms"),
        "wall_prefill_tok_s": len(prompt) / (med("prefill_wall_ms") / 1e3),
        "wall_decode_tok_s": args.gen / (med("decode_wall_ms") / 1e3),
        "counters": {"n_p_eval": n_prefill, "n_eval": n_decode},
        "timing_source": "llama_perf_context (t_p_eval_ms, t_eval_ms); wall_* from time.perf_counter",
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
