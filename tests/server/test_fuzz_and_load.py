"""Runs fuzz_requests.py and load_test.py against the test server (bounded in
count and time, loopback only)."""
import fuzz_requests
import load_test


def test_fuzzed_bodies_never_crash_the_server(make_server):
    # Its own server with a tiny --max-new-tokens bounds the work of the bodies
    # that happen to be valid (a larger max_tokens is refused with 400).
    server = make_server("--max-active", 4, "--max-new-tokens", 4)
    counts, failures = fuzz_requests.run(server.base_url, n=2000, seed=7, time_limit=240)
    assert not failures, "\n".join(failures[:20])
    assert sum(counts.values()) >= 2000
    assert counts.get(400, 0) > 800  # most bodies are invalid and must be refused
    assert server.proc.poll() is None
    assert server.wait_idle()["active_sequences"] == 0
    assert server.stop() == 0


def test_load_200_requests_16_concurrent(server):
    summary, errors = load_test.run(server.base_url, n_requests=200, concurrency=16,
                                    max_tokens=8)
    assert not errors, errors[:5]
    assert summary["ok"] == 200
    assert summary["p99_s"] < 120
    h = server.wait_idle()
    assert h["active_sequences"] == 0 and h["kv_gpu_bytes"] == 0 and h["kv_host_bytes"] == 0
