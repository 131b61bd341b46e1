#!/usr/bin/env python3
"""Writes a model with random weights and real shapes, so that the kvtier
engine itself (`kvtier perf --device cuda -m PATH`) can be timed at scale
without a download. Weights are uniform in ±sqrt(3 / fan_in) (unit-variance
activations), norms 1. No real tokenizer: `kvtier perf` feeds token ids. The
Llama directory gets a byte-level tokenizer.json without merges (the 256 byte
tokens, then 2- and 3-letter ASCII fillers up to the vocabulary, bos and eos
last), so that `kvtier serve` can load it and stream readable text for a
load test whose prompts are token ids.

Llama (Hugging Face directory, config.json + model.safetensors, bf16):

    python3 bench/make_random_model.py --out /tmp/llama8b-random            # Llama-3.1-8B shapes
    python3 bench/make_random_model.py --out /tmp/tiny --layers 2 --hidden 512 --heads 4 --kv-heads 2 \\
        --ffn 1024 --vocab 4096
    python3 bench/make_random_model.py --out /tmp/tok --tokenizer-only     # for -m shape:llama3.1-8b --tokenizer /tmp/tok

Qwen3-30B-A3B (mixture of experts: 48 layers, 128 experts of width 768, 8
used per token, 32 query and 4 KV heads of 128): a qwen3moe GGUF whose
matrices are Q8_0 (random int8 codes, one f16 scale per 32 values, i.e.
uniform ±sqrt(3 / fan_in)), 32 GB on disk instead of 61 GB of bf16, with a
minimal byte-level vocabulary. On the GPU every weight becomes bf16 (61 GB),
as for the real checkpoint:

    python3 bench/make_random_model.py --shape qwen3-30b-a3b --out /tmp/qwen3-30b-a3b.gguf
    python3 bench/make_random_model.py --shape qwen3-30b-a3b --layers 2 --experts 16 --out /tmp/small-moe.gguf
"""
import argparse
import json
import os

import numpy as np


def bf16_uniform(rng, shape, a):
    """uniform(-a, a) rounded to bf16 (round to nearest even), as uint16 bits."""
    x = rng.random(shape, dtype=np.float32)
    x *= np.float32(2 * a)
    x -= np.float32(a)
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


# ---- qwen3moe GGUF ---------------------------------------------------------------

GGUF_U32, GGUF_I32, GGUF_F32, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 8, 9
GGML_F32, GGML_Q8_0 = 0, 8


def gguf_str(s):
    b = s.encode()
    return len(b).to_bytes(8, "little") + b


def gguf_kv(key, vtype, value):
    out = gguf_str(key) + vtype.to_bytes(4, "little")
    if vtype == GGUF_U32:
        return out + int(value).to_bytes(4, "little")
    if vtype == GGUF_F32:
        return out + np.float32(value).tobytes()
    if vtype == GGUF_STRING:
        return out + gguf_str(value)
    etype, items = value  # array
    out += etype.to_bytes(4, "little") + len(items).to_bytes(8, "little")
    if etype == GGUF_STRING:
        return out + b"".join(gguf_str(x) for x in items)
    return out + np.asarray(items, dtype=np.int32).tobytes()


def byte_tokens():
    """GPT-2's byte-to-unicode map: the 256 byte tokens of a byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def filler_tokens(n):
    """n distinct 2- and 3-letter ASCII tokens ("aa", "ab", ..., "aaa", ...)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    out = [x + y for x in letters for y in letters][:n]
    out += [x + y + z for x in letters for y in letters for z in letters][:n - len(out)]
    if len(out) < n:
        raise SystemExit(f"--vocab too large for the filler tokens ({n} needed)")
    return out


def write_llama_tokenizer(out_dir, vocab):
    """A byte-level BPE tokenizer.json of `vocab` tokens: 0..255 bytes, fillers, bos = vocab-2, eos = vocab-1."""
    if vocab < 260:
        raise SystemExit("--vocab must be at least 260 for the tokenizer")
    names = byte_tokens() + filler_tokens(vocab - 258) + ["<|begin_of_text|>", "<|end_of_text|>"]
    special = [{"id": vocab - 2 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, t in enumerate(names[-2:])]
    tok = {"version": "1.0", "added_tokens": special, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": {t: i for i, t in enumerate(names)}, "merges": []}}
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": names[-2], "eos_token": names[-1], "add_bos_token": True}, f)


def q8_0_random(rng, n_rows, n_cols, amp):
    """[n_rows, n_cols] as Q8_0 blocks: random int8 codes, scale amp / 127 (f16)."""
    n_blk = n_rows * n_cols // 32
    blocks = np.empty((n_blk, 34), dtype=np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(amp / 127.0).tobytes() * 1, dtype=np.uint8)
    blocks[:, 2:] = np.frombuffer(rng.bytes(n_blk * 32), dtype=np.uint8).reshape(n_blk, 32)
    blocks[:, 2:][blocks[:, 2:] == 0x80] = 0x81  # -128 → -127: symmetric codes
    return blocks.tobytes()


def write_qwen3moe_gguf(a):
    hd, d, f, n_exp = 128, a.hidden, a.expert_ffn, a.experts
    q, kv = a.heads * hd, a.kv_heads * hd
    # name → (ggml type, shape outermost first, fan_in or None for an F32 vector of ones)
    tensors = [("token_embd.weight", GGML_Q8_0, (a.vocab, d), 3.0)]
    for i in range(a.layers):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", GGML_F32, (d,), None),
            (p + "attn_q.weight", GGML_Q8_0, (q, d), d),
            (p + "attn_k.weight", GGML_Q8_0, (kv, d), d),
            (p + "attn_v.weight", GGML_Q8_0, (kv, d), d),
            (p + "attn_output.weight", GGML_Q8_0, (d, q), q),
            (p + "attn_q_norm.weight", GGML_F32, (hd,), None),
            (p + "attn_k_norm.weight", GGML_F32, (hd,), None),
            (p + "ffn_norm.weight", GGML_F32, (d,), None),
            (p + "ffn_gate_inp.weight", GGML_F32, (n_exp, d), d),
            (p + "ffn_gate_exps.weight", GGML_Q8_0, (n_exp, f, d), d),
            (p + "ffn_up_exps.weight", GGML_Q8_0, (n_exp, f, d), d),
            (p + "ffn_down_exps.weight", GGML_Q8_0, (n_exp, d, f), f),
        ]
    tensors += [("output_norm.weight", GGML_F32, (d,), None), ("output.weight", GGML_Q8_0, (a.vocab, d), d)]
    # A byte-level vocabulary padded to the model's size with unused tokens, one merge.
    tokens = byte_tokens() + ["Ġt"] + [f"<unused{i}>" for i in range(a.vocab - 257)]
    types = [1] * 257 + [5] * (a.vocab - 257)
    arch = "qwen3moe."
    kvs = [gguf_kv("general.architecture", GGUF_STRING, "qwen3moe"),
           gguf_kv("general.name", GGUF_STRING, "random-qwen3-30b-a3b"),
           gguf_kv(arch + "block_count", GGUF_U32, a.layers),
           gguf_kv(arch + "context_length", GGUF_U32, a.ctx),
           gguf_kv(arch + "embedding_length", GGUF_U32, d),
           gguf_kv(arch + "feed_forward_length", GGUF_U32, a.ffn),
           gguf_kv(arch + "expert_feed_forward_length", GGUF_U32, f),
           gguf_kv(arch + "expert_count", GGUF_U32, n_exp),
           gguf_kv(arch + "expert_used_count", GGUF_U32, a.experts_used),
           gguf_kv(arch + "attention.head_count", GGUF_U32, a.heads),
           gguf_kv(arch + "attention.head_count_kv", GGUF_U32, a.kv_heads),
           gguf_kv(arch + "attention.key_length", GGUF_U32, hd),
           gguf_kv(arch + "attention.value_length", GGUF_U32, hd),
           gguf_kv(arch + "rope.freq_base", GGUF_F32, 1000000.0),
           gguf_kv(arch + "attention.layer_norm_rms_epsilon", GGUF_F32, 1e-6),
           gguf_kv("tokenizer.ggml.model", GGUF_STRING, "gpt2"),
           gguf_kv("tokenizer.ggml.pre", GGUF_STRING, "qwen2"),
           gguf_kv("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
           gguf_kv("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, types)),
           gguf_kv("tokenizer.ggml.merges", GGUF_ARRAY, (GGUF_STRING, ["Ġ t"])),
           gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, a.vocab - 1)]

    def nbytes(t, shape):
        n = int(np.prod(shape))
        return n // 32 * 34 if t == GGML_Q8_0 else n * 4

    align = 32
    infos, off = [], 0
    for name, t, shape, _ in tensors:
        infos.append(gguf_str(name) + len(shape).to_bytes(4, "little") +
                     b"".join(int(x).to_bytes(8, "little") for x in reversed(shape)) +
                     t.to_bytes(4, "little") + off.to_bytes(8, "little"))
        off += (nbytes(t, shape) + align - 1) // align * align
    head = b"GGUF" + (3).to_bytes(4, "little") + len(tensors).to_bytes(8, "little") + len(kvs).to_bytes(8, "little")
    head += b"".join(kvs) + b"".join(infos)
    head += b"\0" * ((align - len(head) % align) % align)
    rng = np.random.default_rng(a.seed)
    with open(a.out, "wb") as fo:
        fo.write(head)
        for name, t, shape, fan in tensors:
            if fan is None:
                data = np.ones(shape, dtype=np.float32).tobytes()
            elif t == GGML_F32:  # the router: real random values
                data = ((rng.random(shape, dtype=np.float32) * 2 - 1) * np.float32(np.sqrt(3.0 / fan))).tobytes()
            else:
                amp = 1.0 if name == "token_embd.weight" else float(np.sqrt(3.0 / fan))
                rows, cols = int(np.prod(shape[:-1])), shape[-1]
                step = max(1, (1 << 26) // cols)
                for r in range(0, rows, step):
                    fo.write(q8_0_random(rng, min(step, rows - r), cols, amp))
                data = b""
            fo.write(data)
            pad = (align - nbytes(t, shape) % align) % align
            fo.write(b"\0" * pad)
    n_params = sum(int(np.prod(s)) for _, _, s, _ in tensors)
    print(f"wrote {a.out}: {n_params / 1e9:.2f} B parameters ({2 * n_params / 1e9:.1f} GB in bf16), "
          f"{os.path.getsize(a.out) / 1e9:.1f} GB on disk")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=["llama3.1-8b", "qwen3-30b-a3b"], default="llama3.1-8b",
                    help="defaults of the other options (llama: HF directory; qwen3-30b-a3b: qwen3moe GGUF)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--experts", type=int, help="MoE: experts per layer")
    ap.add_argument("--experts-used", type=int, help="MoE: experts per token")
    ap.add_argument("--expert-ffn", type=int, help="MoE: width of one expert")
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="write only the byte-level tokenizer.json into --out (for `-m shape:... --tokenizer DIR`)")
    a = ap.parse_args()
    defaults = {
        "llama3.1-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256),
        "qwen3-30b-a3b": dict(layers=48, hidden=2048, heads=32, kv_heads=4, ffn=6144, vocab=151936, experts=128,
                              experts_used=8, expert_ffn=768),
    }[a.shape]
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.shape == "qwen3-30b-a3b":
        a.ctx = max(a.ctx, 262144)
        write_qwen3moe_gguf(a)
        return
    hd = a.hidden // a.heads
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer_only:
        write_llama_tokenizer(a.out, a.vocab)
        print(f"wrote {a.out}/tokenizer.json ({a.vocab} tokens)")
        return
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": hd, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": a.ctx,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": a.vocab - 2, "eos_token_id": a.vocab - 1,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_llama_tokenizer(a.out, a.vocab)
    # name -> (shape, fan_in or None for a norm)
    tensors = [("model.embed_tokens.weight", (a.vocab, a.hidden), 3.0)]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", (a.hidden,), None),
            (p + "self_attn.q_proj.weight", (a.heads * hd, a.hidden), a.hidden),
            (p + "self_attn.k_proj.weight", (a.kv_heads * hd, a.hidden), a.hidden),
            (p + "self_attn.v_proj.weight", (a.kv_heads * hd, a.hidden), a.hidden),
            (p + "self_attn.o_proj.weight", (a.hidden, a.heads * hd), a.heads * hd),
            (p + "post_attention_layernorm.weight", (a.hidden,), None),
            (p + "mlp.gate_proj.weight", (a.ffn, a.hidden), a.hidden),
            (p + "mlp.up_proj.weight", (a.ffn, a.hidden), a.hidden),
            (p + "mlp.down_proj.weight", (a.hidden, a.ffn), a.ffn),
        ]
    tensors += [("model.norm.weight", (a.hidden,), None), ("lm_head.weight", (a.vocab, a.hidden), a.hidden)]
    header, off = {}, 0
    for name, shape, _ in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for name, shape, fan in tensors:
            if fan is None:
                f.write(np.full(shape, 0x3F80, dtype=np.uint16).tobytes())  # 1.0
            else:
                amp = 1.0 if name.endswith("embed_tokens.weight") else float(np.sqrt(3.0 / fan))
                rows = shape[0]
                step = max(1, (1 << 26) // int(np.prod(shape[1:])))
                for r in range(0, rows, step):
                    f.write(bf16_uniform(rng, (min(step, rows - r),) + tuple(shape[1:]), amp).tobytes())
    print(f"wrote {a.out}: {off / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
