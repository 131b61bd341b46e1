#!/usr/bin/env python3
"""Writes small seed inputs for fuzz/tokenizer_json_fuzz.cpp into
fuzz/seeds/tokenizer_json/: tokenizer.json texts covering each supported
pre-tokenizer shape, merges in both formats, added tokens, post-processors,
each optionally followed by NUL and a tokenizer_config.json."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "train"))
from byte_level import byte_chars  # noqa: E402

OUT = os.path.join(ROOT, "fuzz", "seeds", "tokenizer_json")


def tiny(pre, merges_as_pairs, extra=None):
    syms = byte_chars()
    vocab = {s: i for i, s in enumerate(syms)}
    words = ["he", "hel", "ll", "hell", "hello", "\u0120t", "\u0120th", "\u0120the", "12"]
    merges = [("h", "e"), ("he", "l"), ("l", "l"), ("hel", "l"), ("hell", "o"), ("\u0120", "t"),
              ("\u0120t", "h"), ("\u0120th", "e"), ("1", "2")]
    for w in words:
        vocab[w] = len(vocab)
    added = [{"id": len(vocab), "content": "<|im_start|>", "special": True},
             {"id": len(vocab) + 1, "content": "<|im_end|>", "special": True},
             {"id": len(vocab) + 2, "content": "<tool>", "special": False, "lstrip": True}]
    j = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": pre,
         "post_processor": None, "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "vocab": vocab,
                   "merges": [list(m) for m in merges] if merges_as_pairs else [" ".join(m) for m in merges]}}
    if extra:
        j.update(extra)
    return json.dumps(j, ensure_ascii=False)


def main():
    os.makedirs(OUT, exist_ok=True)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    split = lambda r: {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    config = json.dumps({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
                         "add_bos_token": False,
                         "chat_template": "{{'<|im_start|>system\\nDefault<|im_end|>\\n'}}<|im_start|>"})
    seeds = {
        "gpt2.json": tiny(byte_level, False),
        "smollm.json": tiny({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}, True) + "\0" + config,
        "llama3.json": tiny({"type": "Sequence", "pretokenizers": [
            split(llama3), {"type": "ByteLevel", "use_regex": False}]}, False,
            {"post_processor": {"type": "TemplateProcessing",
                                "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}]}}),
        "prefix_nfc.json": tiny({"type": "Sequence", "pretokenizers": [
            {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
            {"type": "Split", "pattern": {"String": "lo"}, "behavior": "Isolated"}]}, True,
            {"normalizer": {"type": "NFC"}}) + "\0" + config,
    }
    for name, text in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(text.encode("utf-8"))
        print(f"wrote fuzz/seeds/tokenizer_json/{name} ({len(text)} chars)")


if __name__ == "__main__":
    main()
