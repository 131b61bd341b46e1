#!/usr/bin/env python3
"""Writes the tokenizer fixtures and goldens under tests/golden/.

Fixtures (tokenizer.json files built from the default GGUF's vocabulary, read
by the C++ tests through Tokenizer::from_hf):
  tokenizer_smollm2.json          full vocabulary and merges, with the
                                  pre-tokenizer of HF's SmolLM2 tokenizer.json
                                  (Digits(individual) then ByteLevel's GPT-2
                                  regex); merges as ["a", "b"] pairs
  tokenizer_config_smollm2.json   bos/eos/add_bos/chat_template from the GGUF
  tokenizer_llama3style_8k.json   the first 8000 tokens and the merges among
                                  them, Llama 3's Split regex + ByteLevel,
                                  ignore_merges, Llama 3's special tokens added
                                  after the vocabulary; merges as "a b" strings
  tokenizer_qwen2style_8k.json    the same vocabulary with Qwen2's Split regex

Goldens (token ids of scripts/tokenizer_cases.py's strings, with special-token
parsing on and off):
  tokenizer_smollm2_llamacpp.json from llama.cpp (llama-cpp-python) on the GGUF
  tokenizer_hf_<name>.json        from HF tokenizers on each fixture
  tokenizer_pre_<pre>_llamacpp.json  from llama.cpp on the GGUF's vocabulary
                                  with tokenizer.ggml.pre = gpt-2, llama-bpe,
                                  qwen2 (a vocab-only copy, not kept)

Peers are only needed to run this script:
  pip install llama-cpp-python==0.3.36 tokenizers==0.23.3
Usage: python3 scripts/gen_tokenizer_golden.py [--model models/cache/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_meta  # noqa: E402
from tokenizer_cases import CASES  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")
N_SMALL = 8000

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eot_id|>"]


def added(i, content, special=True):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def split_step(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def tokenizer_json(vocab, merges, added_tokens, pre_tokenizer, post_processor=None, ignore_merges=False,
                   merges_as_pairs=True):
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": BYTE_LEVEL_DECODER,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": [list(m) for m in merges] if merges_as_pairs else [" ".join(m) for m in merges],
        },
    }


def write_json(name, obj, compact=True):
    path = os.path.join(GOLDEN, name)
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(obj, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")
    return path


def build_fixtures(meta):
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    control = [i for i, t in enumerate(types) if t == 3]
    vocab = {t: i for i, t in enumerate(tokens)}

    # 1. Full vocabulary, SmolLM2's own pre-tokenizer.
    smollm_pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    paths = {}
    paths["smollm2"] = write_json("tokenizer_smollm2.json", tokenizer_json(
        vocab, merges, [added(i, tokens[i]) for i in control], smollm_pre,
        post_processor={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}))
    config = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
        "eos_token": tokens[meta["tokenizer.ggml.eos_token_id"]],
        "pad_token": tokens[meta["tokenizer.ggml.padding_token_id"]],
        "unk_token": tokens[meta["tokenizer.ggml.unknown_token_id"]],
        "chat_template": meta["tokenizer.chat_template"],
        "tokenizer_class": "GPT2Tokenizer",
    }
    write_json("tokenizer_config_smollm2.json", config, compact=False)

    # 2./3. The first N_SMALL tokens and the merges that stay inside them.
    small_vocab = {t: i for i, t in enumerate(tokens[:N_SMALL])}
    small_merges = [m for m in merges
                    if m[0] in small_vocab and m[1] in small_vocab and (m[0] + m[1]) in small_vocab]
    base_added = [added(i, tokens[i]) for i in control if i < N_SMALL]

    llama3_added = base_added + [added(N_SMALL + k, t) for k, t in enumerate(LLAMA3_SPECIALS)]
    # A non-special added token: matched in text even when special parsing is off.
    llama3_added.append(added(N_SMALL + len(LLAMA3_SPECIALS), "<custom_marker>", special=False))
    bot = "<|begin_of_text|>"
    llama3_post = {"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": bot, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [{"SpecialToken": {"id": bot, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                            {"SpecialToken": {"id": bot, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                   "special_tokens": {bot: {"id": bot, "ids": [N_SMALL], "tokens": [bot]}}}
    paths["llama3style"] = write_json("tokenizer_llama3style_8k.json", tokenizer_json(
        small_vocab, small_merges, llama3_added,
        {"type": "Sequence", "pretokenizers": [
            split_step(LLAMA3_REGEX),
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        post_processor=llama3_post, ignore_merges=True, merges_as_pairs=False))

    qwen_added = base_added + [added(N_SMALL, "<tool_call>", special=False)]
    paths["qwen2style"] = write_json("tokenizer_qwen2style_8k.json", tokenizer_json(
        small_vocab, small_merges, qwen_added,
        {"type": "Sequence", "pretokenizers": [
            split_step(QWEN2_REGEX),
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        merges_as_pairs=False))
    return paths


# Strings that only matter for the variants' extra added tokens.
EXTRA_CASES = [
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "a <custom_marker> b<custom_marker>c",
    "call <tool_call> now<tool_call>",
]


def hf_goldens(paths):
    import tokenizers
    for name, path in paths.items():
        tok = tokenizers.Tokenizer.from_file(path)
        cases = []
        for text in CASES + EXTRA_CASES:
            tok.encode_special_tokens = False
            ids = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            ids_plain = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "ids_no_special": ids_plain})
        write_json(f"tokenizer_hf_{name}.json", {
            "peer": f"tokenizers {tokenizers.__version__}",
            "tokenizer_json": os.path.relpath(path, ROOT),
            "note": "ids: special tokens parsed; ids_no_special: encode_special_tokens=True; no BOS",
            "cases": cases}, compact=False)


def llama_cpp_golden(model_path):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    cases = []
    for text in CASES:
        data = text.encode("utf-8")
        cases.append({"text": text,
                      "ids": llm.tokenize(data, add_bos=False, special=True),
                      "ids_no_special": llm.tokenize(data, add_bos=False, special=False)})
    write_json("tokenizer_smollm2_llamacpp.json", {
        "peer": f"llama-cpp-python {llama_cpp.__version__}",
        "model": os.path.relpath(model_path, ROOT),
        "note": "llama_cpp.Llama(vocab_only=True).tokenize(text, add_bos=False, special=True/False)",
        "cases": cases}, compact=False)


# tokenizer.ggml.pre values checked against llama.cpp on the default GGUF's
# vocabulary (besides its own "smollm"): a vocab-only copy with `pre` swapped.
OTHER_PRES = ["gpt-2", "llama-bpe", "qwen2"]


def llama_cpp_pre_goldens(model_path):
    import tempfile
    import llama_cpp
    with tempfile.TemporaryDirectory() as tmp:
        for pre in OTHER_PRES:
            path = os.path.join(tmp, f"vocab_{pre}.gguf")
            gguf_meta.write_vocab_only_copy(model_path, path, {"tokenizer.ggml.pre": pre})
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            cases = []
            for text in CASES:
                data = text.encode("utf-8")
                cases.append({"text": text,
                              "ids": llm.tokenize(data, add_bos=False, special=True),
                              "ids_no_special": llm.tokenize(data, add_bos=False, special=False)})
            del llm
            write_json(f"tokenizer_pre_{pre}_llamacpp.json", {
                "peer": f"llama-cpp-python {llama_cpp.__version__}",
                "model": os.path.relpath(model_path, ROOT),
                "pre": pre,
                "note": "the model's vocabulary with tokenizer.ggml.pre replaced; "
                        "tokenize(text, add_bos=False, special=True/False)",
                "cases": cases}, compact=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "cache", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--skip-llama-cpp", action="store_true")
    args = ap.parse_args()
    os.makedirs(GOLDEN, exist_ok=True)
    meta = gguf_meta.read_metadata(args.model)
    paths = build_fixtures(meta)
    hf_goldens(paths)
    if not args.skip_llama_cpp:
        llama_cpp_golden(args.model)
        llama_cpp_pre_goldens(args.model)


if __name__ == "__main__":
    main()
