"""Training batches from the project's own generators.

Each batch is a pure function of (recipe, seed, step, stage): `kvtier gen --ids`
writes samples of every task at a length drawn from the stage's range, with
the prompt exactly as `kvtier bench` feeds it (chat template, answer prefix)
and the reference answer closed by <|im_end|>. One sample per row, padded.
Loss weights: 1 on answer tokens (a Text2JSON-style answer's decision tokens
may weigh more: `Job.decision_weight`), PROMPT_WEIGHT on prompt tokens (the
document's own language modelling helps copying heads form), 0 on padding.
All samples of a batch share one drawn prompt length, so rows are cut to the
longest sample (rounded up to 64) and padding stays small.
"""
import bisect
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from byte_level import byte_chars

# Task mix of v1 (the committed model): the Text2JSON-style generator (four
# domains, by sample index), MultiNeedle (NeedleBench's fixed needles) and the
# RULER-style tasks in RULER's own wording.
MIX_V1 = {"text2json": 0.55, "multineedle": 0.20, "niah_single": 0.04, "niah_multikey": 0.04,
          "niah_multivalue": 0.04, "niah_multiquery": 0.04, "vt": 0.03, "cwe": 0.03, "fwe": 0.03}
# v2: every generator's train split (`kvtier gen --split train`): open-ended
# names and values, varied instruction wording and document styles, ten
# Text2JSON-style domains (the four official ones and six more), generated
# needles instead of NeedleBench's pool, RULER's wording among paraphrases.
# The held-out split (other domains, wording, value shapes, essays) is for
# evaluation only.
MIX_V2 = {"text2json": 0.50, "multineedle-gen": 0.22, "niah_single": 0.04, "niah_multikey": 0.04,
          "niah_multivalue": 0.04, "niah_multiquery": 0.04, "vt": 0.04, "cwe": 0.04, "fwe": 0.04}
GEN_ARGS_V2 = {"text2json": ["--split", "train", "--domain", "all"]}
GEN_ARGS_V2_DEFAULT = ["--split", "train"]
# v3: v2's mix with two fifths of the Text2JSON-style share on domains made up
# per sample (`--domain generated`: entity kind, fields and JSON keys), so
# that the keys and fields have to be read from the instructions: v2 answers
# held-out domains with keys of its training domains.
MIX_V3 = {"text2json": 0.30, "text2json-generated": 0.20, **{k: v for k, v in MIX_V2.items() if k != "text2json"}}
GEN_ARGS_V3 = {**GEN_ARGS_V2, "text2json-generated": ["--split", "train", "--domain", "generated"]}
GEN_TASK = {"text2json-generated": "text2json"}  # mix entries that are another `kvtier gen --task` with arguments
PROMPT_WEIGHT = 0.05
# Decision tokens of a Text2JSON-style answer (`decision_positions`): which
# record comes next, and whether the list ends. v2 predicts 98-99 % of its
# answer tokens teacher-forced but only 60-76 % of these; a wrong one is where
# free decoding skips a record, takes a distractor or loops. Training reports
# their accuracy (`decision_acc`); `--decision-weight` weighs their loss.
# Weight 5 did not raise it in a CPU fine-tune (train/README.md), so no
# recipe weighs them by default.
SEED_BASE = 1_000_000  # training seeds never meet the benchmark's (small) seeds


@dataclass(frozen=True)
class Stage:
    row: int         # most tokens per row (prompt + answer + padding)
    lo: int          # prompt length range, tokens of the user message
    hi: int
    share: float     # share of the training budget


# Curriculum: short, dense samples first, then longer contexts up to 32K (v1)
# or 64K (v2, whose benchmarks run at 16K-64K).
STAGES = [Stage(2048, 512, 1536, 0.15), Stage(4608, 1536, 3584, 0.20), Stage(9216, 3584, 8192, 0.20),
          Stage(17408, 7168, 16384, 0.20), Stage(34816, 14336, 32768, 0.25)]
STAGES_V2 = [Stage(2048, 512, 1536, 0.10), Stage(4608, 1536, 3584, 0.12), Stage(9216, 3584, 8192, 0.18),
             Stage(17408, 7168, 16384, 0.20), Stage(34816, 14336, 32768, 0.22), Stage(67584, 28672, 65536, 0.18)]
SMOKE_STAGES = [Stage(1536, 512, 900, 0.5), Stage(2560, 900, 1800, 0.5)]


@dataclass(frozen=True)
class Recipe:
    mix: dict
    gen_args: dict
    default_args: tuple
    stages: list
    decision_weight: float = 1.0


RECIPES = {"v1": Recipe(MIX_V1, {}, (), STAGES),
           "v2": Recipe(MIX_V2, GEN_ARGS_V2, tuple(GEN_ARGS_V2_DEFAULT), STAGES_V2),
           "v3": Recipe(MIX_V3, GEN_ARGS_V3, tuple(GEN_ARGS_V2_DEFAULT), STAGES_V2)}
TEXT2JSON_TASKS = ("text2json", "text2json-generated")


_pieces = {}  # tokenizer directory -> list of each token id's decoded text


def token_pieces(tokenizer_dir):
    """Each token id's text, read from a byte-level BPE tokenizer.json (the
    pieces of a sequence concatenate to its text; a piece that splits a
    multi-byte character decodes to U+FFFD, which never matters here: the
    marks sought are ASCII). No dependency beyond the standard library."""
    if tokenizer_dir not in _pieces:
        with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        byte_of = {c: b for b, c in enumerate(byte_chars())}
        vocab = dict(tj["model"]["vocab"])
        for t in tj.get("added_tokens", []):
            vocab[t["content"]] = t["id"]
        pieces = [""] * (max(vocab.values()) + 1)
        special = {t["content"] for t in tj.get("added_tokens", [])}
        for s, i in vocab.items():
            pieces[i] = s if s in special else bytes(byte_of.get(c, 0x3f) for c in s).decode("utf-8", "replace")
        _pieces[tokenizer_dir] = pieces
    return _pieces[tokenizer_dir]


NAME_KEY = re.compile(r'\{\s*"name"\s*:\s*"')


def record_marks(answer_ids, pieces):
    """Of a Text2JSON-style answer (a JSON list of objects whose first key is
    "name"): the indices of the tokens that hold the first character of each
    record's name, and of the first token after each record's closing brace."""
    starts, text = [], []
    n = 0
    for t in answer_ids:
        starts.append(n)
        p = pieces[t] if 0 <= t < len(pieces) else ""
        text.append(p)
        n += len(p)
    text = "".join(text)
    names = [m.end() for m in NAME_KEY.finditer(text)]
    ends = []
    depth, in_str, esc = 0, False, False
    for i, c in enumerate(text):  # closing braces of the list's objects (outside strings)
        if in_str:
            esc, in_str = (not esc and c == "\\"), in_str and not (c == '"' and not esc)
            continue
        if c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                j = i + 1
                while j < len(text) and text[j].isspace():
                    j += 1
                ends.append(j)

    def token_at(chars):  # the token whose span holds each character
        return [bisect.bisect_right(starts, c) - 1 for c in chars if c < n]
    return token_at(names), token_at(ends)


def decision_positions(answer_ids, pieces):
    """Indices of a Text2JSON-style answer's decision tokens: the token that
    holds the first character of each record's name (which entity comes
    next), and the first token after each record's closing brace (another
    record, or the end of the list)."""
    names, ends = record_marks(answer_ids, pieces)
    return sorted(set(names) | set(ends))


@dataclass(frozen=True)
class Job:
    step: int
    stage: int
    row: int
    lo: int
    hi: int
    tokens: int      # per batch, roughly
    seed: int
    kvtier: str
    tokenizer_dir: str
    data: str
    recipe: str = "v1"
    split: str = ""  # "heldout": evaluation batches from the held-out split (v2)
    decision_weight: float = -1.0  # loss weight of decision tokens; < 0: the recipe's
    dup_rate: float = 0.0  # share of Text2JSON-style rows given a repeated record to recover from (`with_repeat`)


def gen_args(job, task):
    """Extra `kvtier gen` arguments of a task under the job's recipe and split."""
    r = RECIPES[job.recipe]
    args = list(r.gen_args.get(task, r.default_args))
    if job.split == "heldout":
        if "--split" not in args:
            args = ["--split", "heldout"] + args
        args = ["heldout" if a == "train" else a for a in args]
        if "--domain" in args:  # the held-out split's own domains
            i = args.index("--domain")
            del args[i:i + 2]
    return args


def gen(job, task, n, tokens, seed, workdir):
    out = os.path.join(workdir, f"{task}.jsonl")
    r = subprocess.run([job.kvtier, "gen", "--task", GEN_TASK.get(task, task), "--tokens", str(tokens), "--n", str(n),
                        "--seed", str(seed), "--ids", "-m", job.tokenizer_dir, "--data", job.data, "-o", out]
                       + gen_args(job, task), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kvtier gen {task} --tokens {tokens} failed: {r.stderr.strip()[-400:]}")
    with open(out, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def with_repeat(answer_ids, pieces, rng):
    """The answer with one earlier record written again before record k, as a
    model that loops would, and the span of the repeat (start, end) in the
    new ids; or None when the answer has fewer than three records. Trained
    with no loss on the repeat, the row teaches to continue with record k
    after a repeat instead of looping on."""
    names, _ = record_marks(answer_ids, pieces)
    if len(names) < 3:
        return None
    k = int(rng.integers(1, len(names) - 1))  # before record k (1 .. n-2): record k is followed by a separator
    j = int(rng.integers(0, k))  # an earlier record, its name up to the separator after it
    unit = answer_ids[names[j]:names[j + 1]]
    at = names[k]
    return answer_ids[:at] + unit + answer_ids[at:], (at, at + len(unit))


def answer_starts(weights):
    """Each row's first answer position (build_batch's weights [n_rows, row]):
    the first weight other than the prompt's is the last prompt position's,
    which predicts the answer's first token. A row of padding (no weight
    set) gives the row's length: it has no answer to decode sparsely."""
    first = (weights != PROMPT_WEIGHT).argmax(1) + 1
    return np.where((weights != 0).any(1), first, weights.shape[1])


def answer_end(weights):
    """One past the last position of build_batch's weights [n_rows, row]
    that any row weights (0 for a batch of padding)."""
    live = np.flatnonzero((weights != 0).any(0))
    return int(live[-1]) + 1 if live.size else 0


def build_batch(job: Job):
    """tokens [n_rows, row] int32, weights [n_rows, row] float32 (weights[i] is
    the weight of predicting tokens[i + 1]), decisions [n_rows, row] bool
    (decisions[i]: tokens[i + 1] is a decision token of a Text2JSON-style
    answer), and counts for the log."""
    rng = np.random.default_rng([job.seed, job.step])
    mix = RECIPES[job.recipe].mix
    names = list(mix)
    probs = np.array([mix[t] for t in names])
    length = int(rng.integers(job.lo, job.hi + 1))
    n_rows = max(1, round(job.tokens / (length + 300)))
    tasks = rng.choice(len(names), size=n_rows, p=probs / probs.sum())
    tokens = np.zeros((n_rows, job.row), dtype=np.int32)
    weights = np.zeros((n_rows, job.row), dtype=np.float32)
    decisions = np.zeros((n_rows, job.row), dtype=bool)
    decision_weight = job.decision_weight if job.decision_weight >= 0 else RECIPES[job.recipe].decision_weight
    stats = {"rows": 0, "dropped": 0, "answer_tokens": 0, "tokens": 0, "repeats": 0, "gen_errors": []}
    noise = np.random.default_rng([job.seed, job.step, 17])  # apart from `rng`: the batches of dup_rate 0 stay as they were
    row, longest = 0, 1
    with tempfile.TemporaryDirectory() as work:
        for ti in sorted(set(tasks.tolist())):
            n = int((tasks == ti).sum())
            seed = SEED_BASE + job.seed * 100_003 + job.step
            try:
                recs = gen(job, names[ti], n, length, seed, work)
            except RuntimeError as e:  # logged by the trainer; its rows stay padding
                stats["gen_errors"].append(str(e))
                continue
            for rec in recs:
                p, a = rec["prompt_ids"], rec["answer_ids"]
                repeat = None
                if names[ti] in TEXT2JSON_TASKS and job.dup_rate > 0 and noise.random() < job.dup_rate:
                    r = with_repeat(a, token_pieces(job.tokenizer_dir), noise)
                    if r is not None and len(p) + len(r[0]) <= job.row:
                        a, repeat = r
                if len(p) + len(a) > job.row:
                    stats["dropped"] += 1
                    continue
                seq = p + a
                tokens[row, :len(seq)] = seq
                weights[row, :len(p) - 1] = PROMPT_WEIGHT
                weights[row, len(p) - 1:len(seq) - 1] = 1.0
                if names[ti] in TEXT2JSON_TASKS:
                    d = [len(p) - 1 + i for i in decision_positions(a, token_pieces(job.tokenizer_dir))]
                    decisions[row, d] = True
                    weights[row, d] = decision_weight
                if repeat is not None:  # no loss on writing the repeat (nor on the decision to start it)
                    lo, hi = len(p) - 1 + repeat[0], len(p) - 1 + repeat[1]
                    weights[row, lo:hi] = 0.0
                    decisions[row, lo:hi] = False
                    stats["repeats"] += 1
                stats["rows"] += 1
                stats["answer_tokens"] += len(a)
                stats["tokens"] += len(seq)
                longest = max(longest, len(seq))
                row += 1
    cut = min(job.row, -(-longest // 64) * 64)
    return job.step, tokens[:, :cut], weights[:, :cut], decisions[:, :cut], stats
