"""The training batches of train/data.py, built with the real `kvtier gen`:
every task generates at the curriculum's extreme lengths, rows hold the
prompt then the answer closed by <|im_end|>, the loss weights mark exactly
those spans, and a batch is a pure function of (seed, step, stage)."""
import json
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import data as D  # noqa: E402

KVTIER = os.environ.get("KVTIER_BIN", os.path.join(ROOT, "build", "tools", "kvtier"))
TOK = os.path.join(ROOT, "models", "kvtier-longctx-19m")
DATA = os.path.join(ROOT, "data")
IM_START, IM_END = 1, 2


def job(step, stage, tokens=6000, recipe="v1", split=""):
    s = D.SMOKE_STAGES[stage]
    return D.Job(step=step, stage=stage, row=s.row, lo=s.lo, hi=s.hi, tokens=tokens, seed=5, kvtier=KVTIER,
                 tokenizer_dir=TOK, data=DATA, recipe=recipe, split=split)


@pytest.mark.parametrize("length", [D.STAGES[0].lo, D.STAGES[-1].hi])
def test_every_task_generates_at_the_curriculum_extremes(tmp_path, length):
    for task in D.MIX_V1:
        recs = D.gen(job(0, 0), task, 1, length, 123, str(tmp_path))
        assert len(recs) == 1, task
        p, a = recs[0]["prompt_ids"], recs[0]["answer_ids"]
        assert a[-1] == IM_END and len(a) >= 2, task
        assert len(p) + len(a) <= D.STAGES[-1].row, (task, len(p), len(a))


@pytest.mark.parametrize("split", ["", "heldout"])
@pytest.mark.parametrize("length", [D.STAGES_V2[0].lo, 12288])
def test_v2_tasks_generate_in_both_splits(tmp_path, length, split):
    """v2's mix draws each generator's train split; evaluation draws the held-out one."""
    seen = set()
    for task in D.MIX_V2:
        j = job(0, 0, recipe="v2", split=split)
        args = D.gen_args(j, task)
        assert ("heldout" if split else "train") in args and ("--domain" in args) == (task == "text2json" and not split)
        recs = D.gen(j, task, 1, length, 123, str(tmp_path))
        assert len(recs) == 1, task
        p, a = recs[0]["prompt_ids"], recs[0]["answer_ids"]
        assert a[-1] == IM_END and len(a) >= 2, task
        assert recs[0]["id"].endswith("heldout") == bool(split), recs[0]["id"]
        seen.add(recs[0]["id"])
    assert len(seen) == len(D.MIX_V2)


def test_v3_draws_made_up_domains_for_training_only(tmp_path):
    """v3's extra Text2JSON-style entry is `--domain generated` (a kind, fields and keys made up per sample) in
    training; its held-out batches are the held-out domains like every other entry's."""
    assert abs(sum(D.MIX_V3.values()) - 1.0) < 1e-9 and set(D.MIX_V2) < set(D.MIX_V3)
    keys = set()
    for seed in (1, 2, 3):
        recs = D.gen(job(0, 0, recipe="v3"), "text2json-generated", 2, 1200, seed, str(tmp_path))
        for r in recs:
            assert r["id"].startswith("t2j-generated-")
            keys.add(tuple(json.loads(r["answer"])[0]))
    assert len(keys) >= 5, keys
    held = D.gen(job(0, 0, recipe="v3", split="heldout"), "text2json-generated", 1, 1200, 1, str(tmp_path))
    assert held[0]["id"].endswith("-heldout") and not held[0]["id"].startswith("t2j-generated-")


def test_v2_curriculum_reaches_64k():
    assert D.STAGES_V2[-1].hi == 65536 and D.STAGES_V2[-1].row >= 65536 + 2048
    assert abs(sum(s.share for s in D.STAGES_V2) - 1.0) < 1e-9
    assert all(a.hi <= b.hi for a, b in zip(D.STAGES_V2, D.STAGES_V2[1:]))


def test_rows_and_weights():
    _, tokens, weights, decisions, stats = D.build_batch(job(3, 1))
    assert not stats["gen_errors"]
    assert decisions.shape == tokens.shape and not decisions[weights != 1.0].any(), "decisions are answer tokens"
    assert tokens.shape == weights.shape and tokens.shape[1] % 64 == 0 and tokens.shape[1] <= D.SMOKE_STAGES[1].row
    assert stats["rows"] == tokens.shape[0] and stats["rows"] >= 2
    assert set(np.unique(weights).tolist()) <= {0.0, float(np.float32(D.PROMPT_WEIGHT)), 1.0}
    for t, w in zip(tokens, weights):
        ans = np.flatnonzero(w == 1.0)
        prompt = np.flatnonzero(w == D.PROMPT_WEIGHT)
        assert ans.size > 0 and prompt.size > 0
        assert np.all(np.diff(ans) == 1), "one answer span"
        assert prompt[0] == 0 and prompt[-1] + 1 == ans[0], "prompt, then answer"
        last = ans[-1] + 1  # weights[i] is the weight of predicting tokens[i + 1]
        assert t[last] == IM_END, "the answer ends with the end-of-turn token"
        assert np.all(w[last:] == 0) and np.all(t[last + 1:] == 0), "padding after it"
        # The assistant header right before the answer: <|im_start|> ... twice (user, assistant).
        assert (t[:ans[0] + 1] == IM_START).sum() == 2
    assert stats["tokens"] == int((weights > 0).sum()) + tokens.shape[0]


def test_batches_are_a_function_of_seed_step_and_stage():
    a = D.build_batch(job(7, 0))
    b = D.build_batch(job(7, 0))
    c = D.build_batch(job(8, 0))
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])
    assert a[1].shape != c[1].shape or not np.array_equal(a[1], c[1])


def test_a_failing_generator_is_reported_not_fatal(tmp_path):
    bad = D.Job(step=0, stage=0, row=1536, lo=600, hi=600, tokens=3000, seed=1, kvtier=KVTIER,
                tokenizer_dir=str(tmp_path), data=DATA)  # no tokenizer.json there
    _, tokens, weights, _, stats = D.build_batch(bad)
    assert stats["gen_errors"] and stats["rows"] == 0 and not weights.any()
    assert "tokenizer.json" in stats["gen_errors"][0]


def char_ids(text, pieces):
    """Ids spelling `text` one character per token (the byte-level vocabulary holds every ASCII character)."""
    return [pieces.index(c) for c in text]


def test_token_pieces_concatenate_to_the_text(tmp_path):
    pieces = D.token_pieces(TOK)
    recs = D.gen(job(0, 0, recipe="v2"), "text2json", 1, 1500, 77, str(tmp_path))
    a = recs[0]["answer_ids"]
    text = "".join(pieces[t] for t in a)
    assert text.endswith("]<|im_end|>") and text.startswith('[{"name":')
    assert json.loads(text[:-len("<|im_end|>")]) == json.loads(recs[0]["answer"])


def test_decision_positions_of_a_hand_built_answer():
    pieces = D.token_pieces(TOK)
    # A brace and an escaped quote inside strings must not end a record.
    text = '[{"name":"A}\\"x","k":"1"}, {"name":"B","k":"{2}"}]'
    ids = char_ids(text, pieces) + [IM_END]
    pos = D.decision_positions(ids, pieces)
    got = [text[i] for i in pos]
    assert got == ["A", ",", "B", "]"], got
    assert pos == [text.index("A}"), text.index("}, ") + 1, text.index("B"), len(text) - 1]


def test_decision_positions_of_generated_answers(tmp_path):
    """Two per record: the first token of its name, and the token after its closing brace."""
    pieces = D.token_pieces(TOK)
    for split in ("", "heldout"):
        recs = D.gen(job(0, 0, recipe="v2", split=split), "text2json", 3, 2500, 91, str(tmp_path))
        for r in recs:
            a = r["answer_ids"]
            names = [x["name"] for x in json.loads(r["answer"])]
            pos = D.decision_positions(a, pieces)
            assert len(pos) == 2 * len(names) and len(names) >= 3
            text = "".join(pieces[t] for t in a)
            at = 0
            for k, name in enumerate(names):
                start, after = pos[2 * k], pos[2 * k + 1]
                at = text.index(json.dumps(name, ensure_ascii=False), at) + 1  # the name's first character
                begin = len("".join(pieces[t] for t in a[:start]))
                assert begin <= at < begin + len(pieces[a[start]]), (name, k)
                assert "}" in "".join(pieces[t] for t in a[start:after + 1])
            assert "]" in pieces[a[pos[-1]]]


def test_decision_tokens_are_marked_and_weighted_on_request():
    j = D.Job(step=4, stage=0, row=2048, lo=900, hi=900, tokens=12000, seed=3, kvtier=KVTIER, tokenizer_dir=TOK,
              data=DATA, recipe="v3")
    _, tokens, weights, decisions, stats = D.build_batch(j)
    assert not stats["gen_errors"] and decisions.any(), "the mix has Text2JSON-style rows"
    assert np.all(weights[decisions] == 1.0), "the recipes weigh them like any answer token"
    answer = weights >= 1.0
    assert np.all(answer[decisions]) and 0.01 < decisions.sum() / answer.sum() < 0.2
    other = D.build_batch(D.Job(**{**j.__dict__, "decision_weight": 2.5}))
    assert np.array_equal(other[1], tokens) and np.array_equal(other[3], decisions)
    assert np.all(other[2][decisions] == 2.5) and np.array_equal(other[2][~decisions], weights[~decisions])


def test_answer_token_kinds():
    """train/eval_answers.py: keys, names, values and structure of a JSON answer, and its decision tokens."""
    import eval_answers as E
    text = '[{"name":"A\\"b","k":"1"},{"name":"C","k2":"x,y"}]'
    kinds = "".join({"key": "k", "name": "n", "value": "v", "structure": "."}[k] for k in E.char_kinds(text))
    assert kinds == "...kkkk...nnnn...k...v.....kkkk...n...kk...vvv..."
    pieces = D.token_pieces(TOK)
    per_token = E.token_kinds(char_ids(text, pieces), pieces)
    assert per_token[text.index("A")] == {"name", "decision"}
    assert per_token[text.index('"k"') + 1] == {"key"} and per_token[text.index("x,")] == {"value"}
    assert per_token[text.index("}")] == {"structure"} and per_token[text.index("},") + 1] == {"structure", "decision"}
    assert per_token[len(text) - 1] == {"structure", "decision"}


def test_a_repeated_record_to_recover_from(tmp_path):
    """data.with_repeat writes an earlier record again before record k; the row then trains no loss on the
    repeat and full loss on going on with record k."""
    pieces = D.token_pieces(TOK)
    rec = D.gen(job(0, 0, recipe="v3"), "text2json", 1, 2500, 5, str(tmp_path))[0]
    a, gold = rec["answer_ids"], json.loads(rec["answer"])
    seen = set()
    for seed in range(12):
        ids, (lo, hi) = D.with_repeat(a, pieces, np.random.default_rng(seed))
        got = json.loads("".join(pieces[t] for t in ids[:-1]))  # without <|im_end|>
        k = next(i for i in range(len(gold)) if got[i] != gold[i])
        assert got[:k] + got[k + 1:] == gold and got[k] in gold[:k]
        assert ids[:lo] + ids[hi:] == a and 1 <= k <= len(gold) - 2
        seen.add(k)
    assert len(seen) >= 2
    assert D.with_repeat(a[:3], pieces, np.random.default_rng(0)) is None

    j = D.Job(step=2, stage=0, row=2560, lo=1200, hi=1200, tokens=16000, seed=9, kvtier=KVTIER, tokenizer_dir=TOK,
              data=DATA, recipe="v3")
    base = D.build_batch(j)
    assert np.array_equal(D.build_batch(D.Job(**{**j.__dict__, "dup_rate": 0.0}))[1], base[1])
    _, tokens, weights, decisions, stats = D.build_batch(D.Job(**{**j.__dict__, "dup_rate": 1.0}))
    assert stats["repeats"] >= 1 and base[4]["repeats"] == 0
    gaps = 0
    for w, d in zip(weights, decisions):
        ans = np.flatnonzero(w >= 1.0)
        inner = np.flatnonzero(w[ans[0]:ans[-1]] == 0)  # a zero-loss span inside the answer: the repeat
        if inner.size:
            gaps += 1
            assert np.all(np.diff(inner) == 1) and not d[ans[0] + inner].any()
            assert d[ans[0] + inner[-1] + 1], "going on after the repeat is a decision"
    assert gaps == stats["repeats"]
