#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizer of the project's long-context model.

Corpus: the NeedleBench essays (the filler of every task) plus samples of every
training task written by `kvtier gen` (prompts and reference answers), so that
entity names, JSON punctuation and the task instructions get their own merges.
Digits are split one by one (as SmolLM2 does): numbers are copied digit by
digit, and no merge depends on a number's value.

Writes tokenizer.json and tokenizer_config.json (ChatML template, no default
system turn) into --out. Deterministic for a given kvtier build and data.

    python3 train/tokenizer.py --kvtier build/tools/kvtier --out models/kvtier-longctx-19m
"""
import argparse
import json
import lzma
import os
import subprocess
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TASKS = ["text2json", "multineedle", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
         "vt", "cwe", "fwe"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def corpus(kvtier, model, data, workdir):
    texts = []
    path = os.path.join(data, "needlebench", "PaulGrahamEssays.jsonl")
    # The repository stores it xz-compressed (data/README.md).
    opener = (lambda: lzma.open(path + ".xz", "rt", encoding="utf-8")) if not os.path.exists(path) else \
        (lambda: open(path, encoding="utf-8"))
    for line in opener():
        texts.append(json.loads(line)["text"])
    for task in TASKS:
        out = os.path.join(workdir, task + ".jsonl")
        n = 40 if task == "text2json" else 8
        subprocess.run([kvtier, "gen", "--task", task, "--tokens", "2048", "--n", str(n), "--seed", "99",
                        "-m", model, "--data", data, "-o", out], check=True, stderr=subprocess.DEVNULL)
        for line in open(out, encoding="utf-8"):
            r = json.loads(line)
            texts.append(r.get("problem") or r["prompt"])
            texts.append(r.get("answer_prefix", "") + r["reference"])
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvtier", default="build/tools/kvtier")
    ap.add_argument("--model", default="models/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
                    help="tokenizer that measures the corpus samples' length (any)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with tempfile.TemporaryDirectory() as work:
        tok.train_from_iterator(corpus(a.kvtier, a.model, a.data, work), trainer=trainer)
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 65536,
              "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {a.out}")


if __name__ == "__main__":
    main()
