"""model.sparse_decode, the sparse-policy training mode of train.py and
finetune.py (--sparse-frac): answer rows attend to their local window and the
budget's best tokens by the group-summed softmax, prompt rows stay dense, and
a budget that covers everything changes nothing. Checked against a direct
per-row loop; skips without torch."""
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import data as D  # noqa: E402
import model as M  # noqa: E402


def dense(q, k, v):
    g = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                            is_causal=True)


def reference(q, k, v, y, budget, local, starts):
    """Row by row: rank the tokens outside the local window by the softmax
    summed over the KV head's queries, keep the best ceil(budget · start)."""
    B, Hq, T, D_ = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    out = y.clone()
    for b in range(B):
        kb = math.ceil(budget * int(starts[b]))
        for t in range(int(starts[b]), T):
            for h in range(Hkv):
                s = torch.stack([q[b, h * g + j, t] @ k[b, h, :t + 1].T / math.sqrt(D_) for j in range(g)])
                agg = s.softmax(-1).sum(0)
                recent = [i for i in range(t + 1) if i > t - local]
                others = sorted((i for i in range(t + 1) if i <= t - local), key=lambda i: -float(agg[i]))
                keep = sorted(set(recent) | set(others[:kb]))
                for j in range(g):
                    out[b, h * g + j, t] = s[j, keep].softmax(-1) @ v[b, h, keep]
    return out


def inputs(seed=0, B=2, Hq=4, Hkv=2, T=48, D_=16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D_, generator=gen)
    k = torch.randn(B, Hkv, T, D_, generator=gen)
    v = torch.randn(B, Hkv, T, D_, generator=gen)
    return q, k, v


def test_answer_rows_keep_the_local_window_and_the_budgets_best():
    q, k, v = inputs()
    y = dense(q, k, v)
    starts = torch.tensor([20, 33])
    got = M.sparse_rows(q, k, v, y, 0.1, 4, starts)
    want = reference(q, k, v, y, 0.1, 4, starts)
    assert torch.allclose(got, want, atol=1e-5)
    assert (got - y).abs().max() > 0.1  # the rule does change the answer rows
    for b, s in enumerate(starts.tolist()):  # the prompt's rows are dense attention's
        assert torch.equal(got[b, :, :s], y[b, :, :s])


def test_a_budget_that_covers_every_token_is_dense_attention():
    q, k, v = inputs(1)
    y = dense(q, k, v)
    got = M.sparse_rows(q, k, v, y, 1.0, 1000, torch.tensor([10, 40]))
    assert torch.allclose(got, y, atol=1e-5)


def test_the_mode_reaches_the_model_and_ends_with_its_context():
    torch.manual_seed(0)
    cfg = M.Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8)
    model = M.LlamaModel(cfg).eval()
    tokens = torch.randint(0, 64, (2, 96))
    with torch.no_grad():
        base = model(tokens)
        with M.sparse_decode(0.05, 4, torch.tensor([60, 70])):
            sparse = model(tokens)
        after = model(tokens)
    assert torch.equal(base, after)
    assert torch.equal(sparse[0, :60], base[0, :60]) and torch.equal(sparse[1, :70], base[1, :70])
    assert (sparse[0, 60:] - base[0, 60:]).abs().max() > 1e-3


def test_rows_past_the_end_stay_dense_and_the_rest_is_unchanged():
    q, k, v = inputs(1, T=64)
    y = dense(q, k, v)
    starts = torch.tensor([30, 45])
    whole = M.sparse_rows(q, k, v, y, 0.1, 4, starts)
    cut = M.sparse_rows(q, k, v, y, 0.1, 4, starts, end=50)
    assert torch.equal(cut[:, :, :50], whole[:, :, :50])
    assert torch.equal(cut[:, :, 50:], y[:, :, 50:])
    assert (whole[:, :, 50:] - y[:, :, 50:]).abs().max() > 0.1  # without `end` those rows were sparse
    assert torch.equal(M.sparse_rows(q, k, v, y, 0.1, 4, starts, end=20), y)  # every answer starts past the end


def test_answer_starts_is_the_first_position_after_the_prompt():
    w = np.zeros((3, 10), dtype=np.float32)
    w[0, :4] = D.PROMPT_WEIGHT  # prompt of 5 tokens: weights 0..3, then the answer's
    w[0, 4:8] = 1.0
    w[1, :6] = D.PROMPT_WEIGHT
    w[1, 6] = 5.0  # a decision token first
    assert D.answer_starts(w).tolist() == [5, 7, 10]  # row 2 is padding: nothing to decode
    assert D.answer_end(w) == 8  # row 0's last answer weight
    assert D.answer_end(np.zeros((2, 6), dtype=np.float32)) == 0


def test_step_attn_turns_the_mode_on_for_the_share_of_steps_asked():
    import argparse
    import contextlib
    import train as T
    ap = argparse.ArgumentParser()
    T.add_sparse_args(ap)
    w = np.full((2, 12), D.PROMPT_WEIGHT, dtype=np.float32)
    w[:, 7:] = 1.0
    seen = []
    for frac, n_on in ((0.0, 0), (1.0, 20)):
        args = ap.parse_args(["--sparse-frac", str(frac)])
        coin = torch.Generator().manual_seed(3)
        on = 0
        for _ in range(20):
            ctx = T.step_attn(args, coin, w, "cpu", contextlib.nullcontext)
            with ctx():
                if M._sparse is not None:
                    on += 1
                    seen.append(M._sparse)
            assert M._sparse is None
        assert on == n_on
    budget, local, starts, end = seen[0]
    assert (budget, local, starts.tolist(), end) == (0.03125, 64, [8, 8], 12)
    args = ap.parse_args(["--sparse-frac", "0.5"])
    coin = torch.Generator().manual_seed(3)
    on = 0
    for _ in range(200):
        with T.step_attn(args, coin, w, "cpu", contextlib.nullcontext)():
            on += M._sparse is not None
    assert 70 <= on <= 130
