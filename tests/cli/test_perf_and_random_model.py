"""`kvtier perf` runs every (prompt length, policy) pair in one process and
refuses nonsense; bench/make_random_model.py writes a directory the engine
loads and runs (the tool behind the engine's timings at Llama-3.1-8B
shapes, here at a tiny size)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KVTIER = os.environ.get("KVTIER_BIN", os.path.join(ROOT, "build", "tools", "kvtier"))
TINY = os.path.join(ROOT, "tests", "fixtures", "hf_tiny_qwen2")


def run(*args):
    return subprocess.run([KVTIER, *args], capture_output=True, text=True, errors="replace", timeout=240)


def test_perf_runs_every_length_and_policy_once_each():
    r = run("perf", "-m", TINY, "-t", "1", "-p", "24,40", "--kv", "full", "--kv", "yakv,budget=4,local=4",
            "-g", "3", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [(x["n_prompt"], x["kv"]) for x in rows] == [(24, "full"), (24, "yakv,budget=4,local=4"),
                                                        (40, "full"), (40, "yakv,budget=4,local=4")]
    for x in rows:
        assert x["prefill_tok_s"] > 0 and x["decode_tok_s"] > 0
    full40, yakv40 = rows[2], rows[3]
    assert full40["host_kv_bytes"] == 0 and full40["gpu_kv_bytes"] > 0
    assert yakv40["host_kv_bytes"] > 0 and yakv40["gpu_kv_bytes"] < full40["gpu_kv_bytes"]


def test_perf_batches_decode_several_sequences_together():
    r = run("perf", "-m", TINY, "-t", "1", "-p", "32", "--kv", "yakv,budget=4,local=4", "-b", "1,3",
            "-g", "4", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [x["batch"] for x in rows] == [1, 3]
    one, three = rows
    # Three sequences hold three caches; each step decodes a token of each.
    assert three["host_kv_bytes"] == 3 * one["host_kv_bytes"] > 0
    assert three["selected_rows"] == 3 * one["selected_rows"] > 0
    for x in rows:
        assert x["decode_tok_s"] > 0
        assert abs(x["ms_per_step"] - 1000 * x["batch"] / x["decode_tok_s"]) < 1e-6 * x["ms_per_step"]
    r = run("perf", "-m", TINY, "-p", "16", "-b", "0", "-g", "3", "-r", "1")
    assert r.returncode != 0 and "batch 0" in r.stderr


def test_perf_refuses_bad_lengths_and_policies():
    r = run("perf", "-m", TINY, "-p", "0", "-g", "3", "-r", "1")
    assert r.returncode != 0 and "prompt length 0" in r.stderr
    r = run("perf", "-m", TINY, "-p", "16", "--kv", "yakv,budget=-3", "-g", "3", "-r", "1")
    assert r.returncode != 0 and "budget" in r.stderr


def test_random_model_loads_and_decodes(tmp_path):
    pytest.importorskip("numpy")
    out = tmp_path / "rand"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_random_model.py"), "--out", str(out),
                    "--layers", "2", "--hidden", "256", "--heads", "2", "--kv-heads", "1", "--ffn", "512",
                    "--vocab", "3000", "--ctx", "4096"], check=True, timeout=120)
    info = run("info", "-m", str(out))
    assert info.returncode == 0, info.stderr
    assert "head dim 128" in info.stdout and "scaling llama3" in info.stdout
    r = run("perf", "-m", str(out), "-t", "1", "-p", "64", "--kv", "yakv", "-g", "3", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.splitlines()[-1])
    assert row["decode_tok_s"] > 0 and row["host_kv_bytes"] > 0
    # Its byte-level tokenizer serves text: every byte is a token, plus bos.
    r = run("run", "-m", str(out), "-t", "1", "-p", "Hello, wörld", "--raw", "-n", "4", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert "prompt 14 tok" in r.stderr and "generated 4 tok" in r.stderr


def test_tokenizer_option_replaces_the_models_own(tmp_path):
    pytest.importorskip("numpy")
    make = [sys.executable, os.path.join(ROOT, "bench", "make_random_model.py")]
    model, tok, big = tmp_path / "rand", tmp_path / "tok", tmp_path / "big"
    subprocess.run(make + ["--out", str(model), "--layers", "1", "--hidden", "256", "--heads", "2", "--kv-heads", "1",
                           "--ffn", "512", "--vocab", "3000", "--ctx", "4096"], check=True, timeout=120)
    subprocess.run(make + ["--out", str(tok), "--tokenizer-only", "--vocab", "2000"], check=True, timeout=120)
    subprocess.run(make + ["--out", str(big), "--tokenizer-only", "--vocab", "5000"], check=True, timeout=120)
    os.remove(model / "tokenizer.json")
    r = run("run", "-m", str(model), "-t", "1", "-p", "Hi", "--raw", "-n", "2")
    assert r.returncode != 0 and "no tokenizer" in r.stderr
    for where in (tok, tok / "tokenizer.json"):  # the folder or the file
        r = run("run", "-m", str(model), "--tokenizer", str(where), "-t", "1", "-p", "Hi", "--raw", "-n", "2",
                "--ignore-eos")
        assert r.returncode == 0, r.stderr
        assert "prompt 3 tok" in r.stderr
    r = run("run", "-m", str(model), "--tokenizer", str(big), "-t", "1", "-p", "Hi", "-n", "2")
    assert r.returncode != 0 and "5000 tokens, more than the model's vocabulary of 3000" in r.stderr
    r = run("run", "-m", str(model), "--tokenizer", str(tmp_path / "absent"), "-t", "1", "-p", "Hi", "-n", "2")
    assert r.returncode != 0 and "not found" in r.stderr


def test_random_moe_model_loads_and_decodes(tmp_path):
    """The Qwen3-30B-A3B writer (qwen3moe GGUF, Q8_0) at a tiny size."""
    pytest.importorskip("numpy")
    out = tmp_path / "moe.gguf"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_random_model.py"), "--shape", "qwen3-30b-a3b",
                    "--out", str(out), "--layers", "2", "--hidden", "128", "--heads", "2", "--kv-heads", "1",
                    "--experts", "8", "--experts-used", "2", "--expert-ffn", "64", "--vocab", "600"],
                   check=True, timeout=120)
    info = run("info", "-m", str(out))
    assert info.returncode == 0, info.stderr
    assert "architecture     qwen3moe" in info.stdout
    assert "experts          8 of width 64, 2 per token (renormalized), in 2 of 2 layers" in info.stdout
    assert "blk.1.ffn_gate_exps.weight" in info.stdout
    r = run("perf", "-m", str(out), "-t", "1", "-p", "64", "--kv", "full", "--kv", "yakv", "-g", "3", "-r", "1",
            "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert [row["kv"] for row in rows] == ["full", "yakv"]
    assert all(row["decode_tok_s"] > 0 for row in rows)


def test_memory_of_qwen3_30b_a3b_next_to_its_weights():
    """A 128K yakv sequence of Qwen3-30B-A3B shapes fits next to its 61 GB of
    bf16 weights on an H200 with room for more than 20 such sequences."""
    r = run("memory", "--shape", "qwen3-30b-a3b", "--kv", "full", "--kv", "yakv", "-c", "131072")
    assert r.returncode == 0, r.stderr
    assert "30.53 B parameters" in r.stdout and "(61.1 GB)" in r.stdout
    seqs = {line.split()[0]: int(line.split()[-1]) for line in r.stdout.splitlines()
            if line.split() and line.split()[0] in ("full", "yakv")}
    assert seqs["yakv"] >= 20 and seqs["full"] < seqs["yakv"]
    bad = run("memory", "--shape", "qwen3-30b-a3b", "--gpu-mem", "0")
    assert bad.returncode != 0 and "--gpu-mem" in bad.stderr


def test_long_prompt_load_streams_every_request(tmp_path):
    """bench/long_prompt_load.py (the H200 load test's client) against `kvtier serve` on a tiny random
    model with a byte-level tokenizer: every stream answers, under the default prefill budget and
    with --prefill-budget 0, and the summary has TTFT and ITL percentiles."""
    pytest.importorskip("numpy")
    model = tmp_path / "rand"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_random_model.py"), "--out", str(model),
                    "--layers", "1", "--hidden", "256", "--heads", "2", "--kv-heads", "1", "--ffn", "512",
                    "--vocab", "3000", "--ctx", "4096"], check=True, timeout=120)
    for extra, budget in (("", 256), (" --prefill-budget 0", 0)):  # default: one --prefill-chunk
        out = tmp_path / "load.json"
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "long_prompt_load.py"), "--start",
                            "--kvtier", KVTIER, "-n", "3", "-l", "600", "-m", "12", "--vocab", "2900",
                            f"--server-args=-m {model} -t 1 --kv yakv --max-active 3 --prefill-chunk 256{extra}",
                            "--out", str(out), "--timeout", "120"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        d = json.loads(out.read_text())
        assert d["ok"] == 3 and d["failed"] == 0 and d["generated_tokens"] == 36
        assert d["health_last"]["limits"]["prefill_tokens_per_round"] == budget
        assert d["health_last"]["limits"]["pin_host_bytes"] == 0  # the CPU's host tier is not pinned
        assert d["health_last"]["host_pinned_bytes"] == 0
        assert d["health_last"]["worker_seconds"]["step"] > 0
        # A chunk carries every token decoded since the last one was written (and none while the byte-level
        # detokenizer holds a partial UTF-8 character), so on a loaded machine a stream's 12 tokens may come
        # in a few chunks: the gaps between chunks are counted, at least one over the three streams.
        assert d["ttft_s"]["n"] == 3 and d["itl_s"]["n"] >= 1 and d["ttft_s"]["p99"] >= d["ttft_s"]["p50"] > 0
