#!/usr/bin/env python3
"""HF transformers peer for `kvtier gpu-bench` and `kvtier perf`: the same
Llama-3.1-8B shapes (or, with --model qwen3-30b-a3b, Qwen3-30B-A3B's: 48
layers, 128 experts of width 768, 8 used per token) with random bf16 weights,
SDPA attention, its dynamic cache and its offloaded cache. Prints one table and
writes JSON.

The KV cache of each context is filled with random K/V through the cache's own
update() (prefilling 128K tokens through the model would take minutes); the
decode step is then timed with CUDA events (median of --steps), cropping the
cache back after each step so every step sees the same context.

Run on the GPU machine:  python3 bench/hf_peer.py --json out.json
                         python3 bench/hf_peer.py --model qwen3-30b-a3b --layers 48 --json moe.json
"""
import argparse
import json
import time

import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM


def make_model(layers, name="llama3.1-8b", experts_impl=None):
    if name == "qwen3-30b-a3b":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        cfg = Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                             num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                             vocab_size=151936, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                             max_position_embeddings=262144, rope_theta=1000000.0, rms_norm_eps=1e-6,
                             tie_word_embeddings=False, attn_implementation="sdpa", torch_dtype=torch.bfloat16,
                             **({"experts_implementation": experts_impl} if experts_impl else {}))
        model_cls = Qwen3MoeForCausalLM
    else:
        cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                          max_position_embeddings=131072, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                          attn_implementation="sdpa", torch_dtype=torch.bfloat16)
        model_cls = LlamaForCausalLM
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = model_cls(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    return cfg, model


def make_cache(cfg, offloaded):
    if not offloaded:
        return DynamicCache(config=cfg), "DynamicCache"
    try:
        return DynamicCache(config=cfg, offloading=True), "DynamicCache(offloading=True)"
    except TypeError:
        from transformers import OffloadedCache  # older API
        return OffloadedCache(), "OffloadedCache"


def fill_cache(cache, cfg, batch, ctx):
    g = torch.Generator(device="cuda").manual_seed(0)
    n_kv = cfg.num_key_value_heads
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(batch, n_kv, ctx, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, n_kv, ctx, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        cache.update(k, v, layer)
        del k, v


@torch.no_grad()
def decode(model, cfg, batch, ctx, steps, offloaded):
    cache, kind = make_cache(cfg, offloaded)
    fill_cache(cache, cfg, batch, ctx)
    torch.cuda.synchronize()
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
    pos = torch.full((batch, 1), ctx, device="cuda", dtype=torch.long)
    times = []
    for i in range(steps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(a.elapsed_time(b))
        cache.crop(ctx)
    times.sort()
    mem = torch.cuda.max_memory_allocated() / 1e9
    del cache
    return kind, times[len(times) // 2], mem


@torch.no_grad()
def prefill(model, tokens, reps):
    """Median ms of `reps` timed forwards of one prompt, after one warm-up."""
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), device="cuda")
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["llama3.1-8b", "qwen3-30b-a3b"], default="llama3.1-8b")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--experts-impl", default=None,
                    help="MoE: transformers' experts_implementation (eager, batched_mm, grouped_mm); default: its own")
    ap.add_argument("--prefill", default="32768", help="prompt lengths to time one prefill forward of (comma list)")
    ap.add_argument("--prefill-reps", type=int, default=1, help="timed prefill forwards per length (median)")
    ap.add_argument("--configs", default="dynamic:32768:1,dynamic:131072:1,dynamic:131072:4,offloaded:131072:1",
                    help="comma list of cache:context:batch (empty: no decode)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(0), "decode": []}
    t0 = time.time()
    cfg, model = make_model(args.layers, args.model, args.experts_impl)
    out["model"] = args.model
    out["layers"] = args.layers
    out["weights_gb"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    out["experts_implementation"] = str(getattr(cfg, "_experts_implementation", None))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {out['device']}; "
          f"model built in {time.time() - t0:.1f} s", flush=True)
    out["prefills"] = []
    for n in [int(x) for x in args.prefill.split(",") if int(x) > 0]:
        torch.cuda.empty_cache()
        try:
            ms = prefill(model, n, args.prefill_reps)
            row = {"tokens": n, "ms": ms, "tok_per_s": n / ms * 1e3}
            print(f"HF prefill {n} tokens: {ms:.1f} ms, {n / ms * 1e3:.0f} tok/s", flush=True)
        except torch.OutOfMemoryError:
            row = {"tokens": n, "error": "out of memory"}
            print(f"HF prefill {n} tokens: out of memory", flush=True)
        out["prefills"].append(row)
        out.setdefault("prefill", row)
    print(f"{'cache':<32} {'ctx':>7} {'batch':>5} {'step ms':>9} {'tok/s':>8} {'peak GB':>8}")
    for c in filter(None, args.configs.split(",")):
        kind, ctx, batch = c.split(":")
        ctx, batch = int(ctx), int(batch)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        row = {"cache": kind, "context": ctx, "batch": batch}
        try:
            name, ms, mem = decode(model, cfg, batch, ctx, args.steps if kind == "dynamic" else 3, kind == "offloaded")
            row.update({"impl": name, "step_ms": ms, "tok_per_s": batch / ms * 1e3, "peak_gpu_gb": mem})
            print(f"{name:<32} {ctx:>7} {batch:>5} {ms:>9.2f} {batch / ms * 1e3:>8.1f} {mem:>8.1f}", flush=True)
        except torch.OutOfMemoryError as e:
            row["error"] = "out of memory"
            print(f"{kind:<32} {ctx:>7} {batch:>5}  out of memory", flush=True)
        out["decode"].append(row)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
