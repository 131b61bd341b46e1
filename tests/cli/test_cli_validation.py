"""The command line refuses nonsense with a clear message and a non-zero exit
(-t out of range, --top-k -1, run -f DIR, an empty prompt, --pin-host on the CPU), warns about a
context above the trained one, shows prefill progress on long prompts, and
its bench/score tools neither corrupt a results file on resume nor miscount
(duplicate ids, gold samples without a prediction)."""
import json
import os
import resource
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KVTIER = os.environ.get("KVTIER_BIN", os.path.join(ROOT, "build", "tools", "kvtier"))
TINY = os.path.join(ROOT, "tests", "fixtures", "hf_tiny_qwen2")
M19 = os.path.join(ROOT, "models", "kvtier-longctx-19m")


def run(*args, timeout=240, **kw):
    return subprocess.run([KVTIER, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def test_threads_out_of_range_are_refused():
    for t in ["100000", "-1", str(os.cpu_count() + 1), "two"]:
        r = run("run", "-m", M19, "-t", t, "-p", "hi", "-n", "1")
        assert r.returncode != 0, t
        assert f"-t {t}" in r.stderr and "hardware threads" in r.stderr, r.stderr
    assert run("run", "-m", M19, "-t", "1", "--raw", "-p", "hi", "-n", "1", "-q").returncode == 0


def test_top_k_negative_is_a_short_clear_error():
    r = run("run", "-m", M19, "--top-k", "-1", "-p", "hi", "-n", "1")
    assert r.returncode != 0
    assert "--top-k -1" in r.stderr and len(r.stderr) < 400, r.stderr
    assert not any(len(w) > 40 and w.isdigit() for w in r.stderr.split())


def test_pin_host_on_the_cpu_is_refused():
    """Host memory is pinned only for --device cuda: asking for it on the CPU is an error, not a no-op."""
    r = run("serve", "-m", TINY, "-t", "1", "--port", "0", "--pin-host", "1000000", timeout=60)
    assert r.returncode != 0
    assert "--pin-host 1000000" in r.stderr and "--device cuda" in r.stderr, r.stderr
    bad = run("serve", "-m", TINY, "--pin-host", "-2", timeout=60)
    assert bad.returncode != 0 and "--pin-host" in bad.stderr, bad.stderr


def test_prompt_file_that_is_a_directory_or_empty(tmp_path):
    r = run("run", "-m", M19, "-f", tmp_path, "-n", "1")
    assert r.returncode != 0 and "is a directory" in r.stderr, r.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = run("run", "-m", M19, "-f", empty, "-n", "1")
    assert r.returncode != 0 and "empty" in r.stderr, r.stderr
    r = run("run", "-m", M19, "-f", tmp_path / "absent.txt", "-n", "1")
    assert r.returncode != 0 and "does not exist" in r.stderr, r.stderr


def test_context_above_the_trained_one_warns():
    r = run("run", "-m", M19, "-c", "100000", "--raw", "-p", "hi", "-n", "1", "-q")
    assert r.returncode == 0, r.stderr
    assert "warning: -c 100000 is above the model's trained context" in r.stderr, r.stderr
    r = run("run", "-m", M19, "-c", "1024", "--raw", "-p", "hi", "-n", "1", "-q")
    assert "warning" not in r.stderr


def test_long_prefill_shows_progress(tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text(" ".join(f"word{i % 97}" for i in range(3000)))
    r = run("run", "-m", M19, "-t", "1", "--raw", "-f", prompt, "-n", "1", "--prefill-chunk", "512")
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "[kvtier] prefill" in x]
    assert lines, r.stderr
    assert "tokens (100%)" in lines[-1]
    assert " tok/s, " in lines[-1], lines[-1]


def _sanitized():
    """An ASan build reserves terabytes of address space: RLIMIT_AS cannot apply to it."""
    out = subprocess.run(["ldd", KVTIER], capture_output=True, text=True).stdout
    return "libasan" in out


def test_out_of_memory_says_what_and_how():
    if _sanitized():
        pytest.skip("AddressSanitizer build: an address-space limit stops it before main")
    # An address-space limit the 19M model fits in, but not a 60K-token scratch.
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    r = run("perf", "-m", M19, "-t", "1", "-p", "60000", "--prefill-chunk", "60000", "-g", "2", "-r", "1",
            preexec_fn=limit, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "out of memory" in r.stderr and "kvtier perf" in r.stderr and "--prefill-chunk" in r.stderr, r.stderr


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_score_refuses_duplicates_and_missing_predictions(tmp_path):
    gold = tmp_path / "gold.jsonl"
    _write(gold, [{"id": f"s{i}", "answer": "[{\"name\": \"a\", \"x\": \"1\", \"y\": \"2\"}]"} for i in range(5)])
    good = "[{\"name\": \"a\", \"x\": \"1\", \"y\": \"2\"}]"
    dup = tmp_path / "dup.jsonl"
    _write(dup, [{"id": "s0", "prediction": good}, {"id": "s1", "prediction": good},
                 {"id": "s1", "prediction": "no"}])
    r = run("score", "--task", "text2json", "--pred", dup, "--gold", gold)
    assert r.returncode == 1 and "id 's1' repeats the prediction of line 2" in r.stderr, r.stderr

    partial = tmp_path / "partial.jsonl"
    _write(partial, [{"id": "s0", "prediction": good}, {"id": "s3", "prediction": good}])
    r = run("score", "--task", "text2json", "--pred", partial, "--gold", gold)
    assert r.returncode == 1 and "3 of 5 gold samples" in r.stderr and "--missing zero" in r.stderr, r.stderr
    r = run("score", "--task", "text2json", "--pred", partial, "--gold", gold, "--missing", "zero", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["summary"]["n_missing"] == 3 and out["summary"]["n_scored"] == 5
    assert abs(out["summary"]["score"] - 40.0) < 1e-9
    assert sorted(s["id"] for s in out["samples"] if s.get("missing")) == ["s1", "s2", "s4"]


def test_bench_resume_after_a_half_written_line(tmp_path):
    out = tmp_path / "res.jsonl"
    def bench(n):
        return run("bench", "-m", M19, "-t", "1", "--task", "niah_single", "--ctx", "512", "--n", n,
                   "--max-tokens", "4", "--kv", "full", "--no-progress", "-o", out)
    r = bench(1)
    assert r.returncode == 0, r.stderr
    first = out.read_text()
    assert first.count("\n") == 1
    out.write_text(first + "{\"task\": \"niah_single\", \"id\": \"x\", \"pol")  # interrupted mid-write
    r = bench(2)
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["task"] == "niah_single" for x in lines)
    r = run("bench", "--task", "niah_single", "--report-only", "-o", out)
    assert r.returncode == 0, r.stderr
