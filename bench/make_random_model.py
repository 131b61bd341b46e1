#!/usr/bin/env python3
"""Writes a Hugging Face-style Llama directory (config.json + model.safetensors)
with random bf16 weights and real shapes, so that the kvtier engine itself
(`kvtier perf --device cuda -m DIR`) can be timed at Llama-3.1-8B scale
without a download. Weights are uniform in ±sqrt(3 / fan_in) (unit-variance
activations), norms 1. No tokenizer: `kvtier perf` feeds token ids.

    python3 bench/make_random_model.py --out /tmp/llama8b-random            # Llama-3.1-8B shapes
    python3 bench/make_random_model.py --out /tmp/tiny --layers 2 --hidden 512 --heads 4 --kv-heads 2 \\
        --ffn 1024 --vocab 4096
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    hd = a.hidden // a.heads
    os.makedirs(a.out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": hd, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": a.ctx,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
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
