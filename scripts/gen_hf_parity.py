#!/usr/bin/env python3
"""Generates the HF-parity fixtures: tiny random-weight Llama, Qwen2, Qwen3 and
the mixtures of experts Qwen3-MoE and Mixtral, saved as Hugging Face
directories (config.json + safetensors, f32), and HF transformers' logits for a
fixed token sequence (golden file).

Run where torch + transformers are installed (CPU is enough):
    python3 scripts/gen_hf_parity.py OUT_DIR [NAME ...]   # NAME: only these fixtures
then copy OUT_DIR/* to tests/fixtures/. kvtier's test (tests/hf_parity_test.cpp)
loads each directory and compares its logits (max abs diff <= 1e-3).
"""
import json
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

out = sys.argv[1]
only = set(sys.argv[2:])
torch.manual_seed(0)
common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
              rms_norm_eps=1e-6, torch_dtype="float32")
models = {
    # Llama 3.1 RoPE scaling, untied head, sharded safetensors with an index.
    "hf_tiny_llama": (LlamaConfig, LlamaForCausalLM,
                      dict(rope_theta=500000.0, tie_word_embeddings=False,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64}),
                      "150KB"),
    # Qwen2: q/k/v biases, tied embeddings.
    "hf_tiny_qwen2": (Qwen2Config, Qwen2ForCausalLM,
                      dict(rope_theta=1000000.0, tie_word_embeddings=True), None),
    # Qwen3: q/k RMSNorm, head_dim (32) != hidden/heads (16).
    "hf_tiny_qwen3": (Qwen3Config, Qwen3ForCausalLM,
                      dict(rope_theta=1000000.0, head_dim=32, tie_word_embeddings=False), None),
    # Qwen3-MoE: 8 experts, top-2 renormalized (Qwen3-30B-A3B's norm_topk_prob), q/k norm.
    "hf_tiny_qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                          dict(rope_theta=1000000.0, head_dim=32, tie_word_embeddings=False, num_experts=8,
                               num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True), None),
    # Qwen3-MoE with a dense layer between MoE layers (mlp_only_layers) and
    # top-3 of 4 without renormalization.
    "hf_tiny_qwen3_moe_mixed": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                                dict(rope_theta=1000000.0, head_dim=16, tie_word_embeddings=True, num_experts=4,
                                     num_experts_per_tok=3, moe_intermediate_size=48, norm_topk_prob=False,
                                     num_hidden_layers=3, mlp_only_layers=[1]), None),
    # Mixtral: 4 experts of intermediate_size, top-2, sharded checkpoint.
    "hf_tiny_mixtral": (MixtralConfig, MixtralForCausalLM,
                        dict(rope_theta=1000000.0, tie_word_embeddings=False, num_local_experts=4,
                             num_experts_per_tok=2, sliding_window=None), "400KB"),
}
tokens = [(i * 37 + 11) % 256 for i in range(100)]
for name, (cfg_cls, model_cls, extra, shard) in models.items():
    if only and name not in only:
        continue
    cfg = cfg_cls(**{**common, **extra})
    model = model_cls(cfg).eval().to(torch.float32)
    with torch.no_grad():
        # Norm weights are ones at init; randomise them so that they matter.
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith(".gate.weight"):
                # MoE routers: logits ~ N(0, 1), so that the top-k is decisive.
                p.copy_(torch.randn_like(p) / cfg.hidden_size ** 0.5)
            elif "experts" in n:
                # Experts at unit gain (the 0.02 init would make them vanish in the logits).
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn_like(p))
        logits = model(torch.tensor([tokens])).logits[0]  # [n_tok, vocab]
    d = os.path.join(out, name)
    kwargs = {"safe_serialization": True}
    if shard:
        kwargs["max_shard_size"] = shard
    model.save_pretrained(d, **kwargs)
    golden = {"transformers": transformers.__version__, "torch": torch.__version__,
              "tokens": tokens, "n_vocab": cfg.vocab_size,
              "logits": [[round(float(x), 6) for x in row] for row in logits]}
    with open(os.path.join(d, "golden_logits.json"), "w") as f:
        json.dump(golden, f)
    print(name, "ok", sorted(os.listdir(d)))
