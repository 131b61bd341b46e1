#!/usr/bin/env python3
"""Greedy continuations from llama.cpp (llama-cpp-python) on the default GGUF,
for the end-to-end check of kvtier's model and tokenizer:
tests/golden/llama_cpp_greedy_smollm2.json.

For each prompt: the prompt text (chat prompts rendered with the GGUF's own
tokenizer.chat_template through Jinja, as HF does), its token ids
(llama.cpp's tokenizer, special tokens parsed, no BOS since the GGUF says
add_bos_token = false), and up to N_GEN greedy tokens (argmax of the last
logits, ties to the lowest id; stops after an end-of-generation token). Each
step also records the gap between the two largest logits: a kvtier run whose
logits differ by quantization noise can only legitimately disagree where that
gap is tiny.

  pip install llama-cpp-python==0.3.36
  python3 scripts/gen_llama_cpp_golden.py [--model PATH]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_meta  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_GEN = 40
N_THREADS = 2
N_CTX = 1024

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a short poem about the ocean."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "List three primary colors and explain why they are called primary."}],
    [{"role": "user", "content": "Explain what a hash table is, in simple words."}],
]
PLAIN_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    '{"name": "Alice", "age": 30, "city": "Paris"}\n{"name": "Bob",',
]


def render_chat(template, messages):
    import jinja2
    env = jinja2.Environment(loader=jinja2.BaseLoader())
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def greedy(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    out, gaps = [], []
    for _ in range(N_GEN):
        logits = last_logits(llm)
        tok = int(np.argmax(logits))
        top2 = np.partition(logits, -2)[-2:]
        gaps.append(round(float(top2[1] - top2[0]), 4))
        out.append(tok)
        if llm.token_eos() == tok or llama_is_eog(llm, tok):
            break
        llm.eval([tok])
    return out, gaps


def last_logits(llm):
    # Llama.scores is only filled with logits_all; read the context's last row.
    import llama_cpp
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)


def llama_is_eog(llm, tok):
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return bool(llama_cpp.llama_vocab_is_eog(vocab, tok))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "cache", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "llama_cpp_greedy_smollm2.json"))
    args = ap.parse_args()
    import llama_cpp
    meta = gguf_meta.read_metadata(args.model)
    template = meta["tokenizer.chat_template"]
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                          n_batch=N_CTX, seed=0, verbose=False)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    cases = []
    prompts = [("chat", render_chat(template, m), m) for m in CHAT_PROMPTS] + \
              [("plain", p, None) for p in PLAIN_PROMPTS]
    for kind, text, messages in prompts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        gen, gaps = greedy(llm, ids)
        case = {"kind": kind, "prompt": text, "prompt_ids": ids, "generated_ids": gen,
                "generated_text": llm.detokenize(gen).decode("utf-8", errors="replace"),
                "top2_logit_gap": gaps}
        if messages:
            case["messages"] = messages
        cases.append(case)
        print(f"{kind}: {len(ids)} prompt tokens -> {len(gen)} generated: {case['generated_text'][:60]!r}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"peer": f"llama-cpp-python {llama_cpp.__version__}",
                   "model": os.path.relpath(args.model, ROOT),
                   "settings": {"n_threads": N_THREADS, "n_ctx": N_CTX, "n_gen": N_GEN, "sampling": "greedy argmax",
                                "add_bos": add_bos, "parse_special": True},
                   "cases": cases}, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
