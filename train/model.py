"""The project's long-context test model in PyTorch: a standard Llama (GQA,
RoPE, RMSNorm, SwiGLU, tied embeddings) whose parameter names, RoPE layout
(rotate-half) and numerics follow Hugging Face's LlamaForCausalLM, so that the
exported directory loads in transformers and in kvtier unchanged.

Also: export to a Hugging Face directory (config.json, sharded bf16
safetensors, generation_config.json) and loading it back.
"""
import contextlib
import json
import math
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab_size: int = 4096
    hidden_size: int = 512
    intermediate_size: int = 1280
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 65536
    bos_token_id: int = 0   # <|endoftext|>; never prepended (add_bos_token false)
    eos_token_id: int = 2   # <|im_end|>
    pad_token_id: int = 0


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):  # as HF: normalize in f32, scale in the input dtype
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(cfg, positions, device):
    """cos, sin: [n_pos, head_dim] f32, HF's rotate-half layout."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=device).float()
                                         / cfg.head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# While sparse_decode is active: (budget, local, starts) of the rows in training.
_sparse = None


@contextlib.contextmanager
def sparse_decode(budget, local, starts, end=None):
    """Within it, position t >= starts[b] of row b (an answer token, which a
    KV policy decodes one at a time) attends as an offloading policy's decode
    step does: to its `local` most recent positions and to the
    ceil(budget * starts[b]) others that carry the most attention, ranked per
    KV head by the softmax probabilities summed over the head's queries (the
    oracle of `yakv`'s GQA rule). Positions before starts[b] (the prompt,
    prefilled densely) attend to everything. Gradients flow through the kept
    scores only. Positions from `end` on (padding after every row's answer)
    stay dense: nothing is learnt there, and skipping them bounds the
    memory of rows padded far beyond their answers."""
    global _sparse
    prev, _sparse = _sparse, (budget, local, starts, end)
    try:
        yield
    finally:
        _sparse = prev


def sparse_rows(q, k, v, y, budget, local, starts, end=None):
    """y with its rows starts[b] <= t < end recomputed under sparse_decode's
    rule; q [B, Hq, T, D], k and v [B, Hkv, T, D] (not repeated over the
    group), y [B, Hq, T, D] the dense output."""
    B, Hq, Tall, D = q.shape
    T = Tall if end is None else min(int(end), Tall)  # rows and keys past T are not needed
    q, k, v, y, rest = q[:, :, :T], k[:, :, :T], v[:, :, :T], y[:, :, :T], y[:, :, T:]
    Hkv = k.shape[1]
    g = Hq // Hkv
    t0 = int(starts.min())
    if t0 >= T:
        return torch.cat([y, rest], dim=2)
    qs = q[:, :, t0:].reshape(B, Hkv, g, T - t0, D)
    s = torch.einsum("bhgtd,bhsd->bhgts", qs, k) / math.sqrt(D)  # [B, Hkv, g, T - t0, T]
    pos_q = torch.arange(t0, T, device=q.device)[:, None]
    pos_k = torch.arange(T, device=q.device)[None, :]
    causal = pos_k <= pos_q
    recent = causal & (pos_k > pos_q - local)
    s = s.masked_fill(~causal, float("-inf"))
    with torch.no_grad():
        agg = s.float().softmax(-1).sum(2)  # [B, Hkv, T - t0, T]
        agg = agg.masked_fill(recent | ~causal, -1.0)
        kb = torch.ceil(budget * starts.float()).long().clamp(min=1)  # [B]
        kmax = int(kb.max())
        top = agg.topk(min(kmax, T), dim=-1).values  # descending
        thr = top.gather(-1, (kb.clamp(max=T) - 1).view(B, 1, 1, 1).expand(B, Hkv, T - t0, 1))
        keep = ((agg >= thr) & (agg >= 0)) | recent
    s = s.masked_fill(~keep[:, :, None], float("-inf"))
    ys = torch.einsum("bhgts,bhsd->bhgtd", s.softmax(-1).to(v.dtype), v).reshape(B, Hq, T - t0, D)
    answer = (torch.arange(t0, T, device=q.device)[None, :] >= starts[:, None])[:, None, :, None]
    return torch.cat([y[:, :, :t0], torch.where(answer, ys.to(y.dtype), y[:, :, t0:]), rest], dim=2)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin):  # x: [B, T, d]
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = c.num_attention_heads // c.num_key_value_heads
        kr = k.repeat_interleave(groups, dim=1)  # q head h reads kv head h // groups, as HF's repeat_kv
        vr = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
        if _sparse is not None:
            y = sparse_rows(q, k, v, y, *_sparse)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                # GPT-2's scaled init of the residual projections.
                nn.init.normal_(p, std=std / math.sqrt(2 * self.cfg.num_hidden_layers))
            else:
                nn.init.normal_(p, std=std)

    def hidden(self, tokens):  # tokens: [B, T] -> [B, T, d]
        T = tokens.shape[1]
        cos, sin = rope_cos_sin(self.cfg, torch.arange(T, device=tokens.device), tokens.device)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, tokens):  # logits [B, T, V] (tied embeddings)
        return F.linear(self.hidden(tokens), self.model.embed_tokens.weight)

    @torch.no_grad()
    def greedy(self, prompt, max_new, eos):
        """Greedy continuation of one prompt (list of ids), recomputing the whole
        sequence each step: slow, but the same function as training."""
        ids = list(prompt)
        dev = self.model.embed_tokens.weight.device
        for _ in range(max_new):
            logits = self.forward(torch.tensor([ids], device=dev))[0, -1]
            t = int(torch.argmax(logits.float()))
            ids.append(t)
            if t == eos:
                break
        return ids[len(prompt):]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def hf_config(cfg: Config):
    c = asdict(cfg)
    c.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
              "torch_dtype": "bfloat16", "initializer_range": 0.02, "rope_scaling": None,
              "attention_dropout": 0.0, "use_cache": True})
    return c


def export(model: LlamaModel, out_dir, max_shard_bytes=15 * 1024 * 1024):
    """Writes config.json, generation_config.json and bf16 safetensors shards of
    at most max_shard_bytes (with model.safetensors.index.json when sharded)."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    shards, cur, size = [], {}, 0
    for k in sorted(state):
        nbytes = state[k].numel() * 2
        if cur and size + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = state[k]
        size += nbytes
    shards.append(cur)
    for f in os.listdir(out_dir):  # old shards of another layout
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
            os.remove(os.path.join(out_dir, f))
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for i, sh in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(sh, os.path.join(out_dir, name), metadata=meta)
            weight_map.update({k: name for k in sh})
        index = {"metadata": {"total_size": sum(v.numel() * 2 for v in state.values())}, "weight_map": weight_map}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    cfg = model.cfg
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg.bos_token_id, "eos_token_id": [cfg.eos_token_id],
                   "pad_token_id": cfg.pad_token_id, "do_sample": False}, f, indent=2)


def load(model_dir, device="cpu", dtype=torch.float32):
    """An exported directory back as a LlamaModel (weights upcast to dtype)."""
    from safetensors.torch import load_file
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    cfg = Config(**{k: c[k] for k in Config.__dataclass_fields__})
    model = LlamaModel(cfg)
    state = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            state.update(load_file(os.path.join(model_dir, f)))
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return model.to(device)
