#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) on the tiny mixture-of-experts GGUFs of
tests/llama_cpp_moe_parity_test.cpp — a Qwen3-MoE in F32 and in Q8_0 (experts
stacked, router F32) and a Mixtral-style llama in Q4_0 — for
tests/golden/llama_cpp_moe.json.

The test writes the models itself; build/tests/write_tiny_moe_gguf writes the
same bytes here, and the golden keeps each file's FNV-1a hash so that the test
can tell when the writer changed. For each model and prompt (fixed token ids):
the logits after the prompt, then 24 greedy tokens (argmax, ties to the lowest
id, end-of-generation ignored: the weights are random) with the gap between the
two largest logits at each step. llama.cpp runs with an f32 KV cache, so its
own rounding is that of its matmuls.

  pip install llama-cpp-python==0.3.36
  cmake --build build --target write_tiny_moe_gguf
  python3 scripts/gen_llama_cpp_moe_golden.py [--bin build/tests/write_tiny_moe_gguf]
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_GEN = 24
N_CTX = 512
GGML_TYPE_F32 = 0


def prompts(n_vocab):
    out = []
    for n, mult in ((12, 7919), (40, 104729), (97, 31337)):
        out.append([(i * mult + 11) % (n_vocab - 1) for i in range(n)])
    return out


def last_logits(llm):
    import llama_cpp
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tests", "write_tiny_moe_gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "llama_cpp_moe.json"))
    args = ap.parse_args()
    import llama_cpp
    tmp = tempfile.mkdtemp(prefix="kvt_moe_golden_")
    lines = subprocess.run([args.bin, tmp], check=True, capture_output=True, text=True).stdout.split("\n")
    files = [l.split() for l in lines if l.strip()]
    models = []
    for path, fnv in files:
        llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_threads=2, n_threads_batch=2, n_batch=N_CTX,
                              type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, seed=0, verbose=False)
        cases = []
        for ids in prompts(llm.n_vocab()):
            llm.reset()
            llm.eval(ids)
            first = last_logits(llm)
            gen, gaps = [], []
            logits = first
            for _ in range(N_GEN):
                tok = int(np.argmax(logits))
                top2 = np.partition(logits, -2)[-2:]
                gaps.append(round(float(top2[1] - top2[0]), 5))
                gen.append(tok)
                llm.eval([tok])
                logits = last_logits(llm)
            cases.append({"prompt_ids": ids, "prompt_logits": [round(float(x), 5) for x in first],
                          "generated_ids": gen, "top2_logit_gap": gaps})
        name = os.path.splitext(os.path.basename(path))[0]
        models.append({"name": name, "fnv1a": fnv, "n_vocab": llm.n_vocab(), "cases": cases})
        print(f"{name}: {[len(c['prompt_ids']) for c in cases]} prompt tokens, greedy {cases[0]['generated_ids'][:8]}")
        del llm
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"peer": f"llama-cpp-python {llama_cpp.__version__}",
                   "settings": {"n_ctx": N_CTX, "n_gen": N_GEN, "kv_cache": "f32", "sampling": "greedy argmax"},
                   "models": models}, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
