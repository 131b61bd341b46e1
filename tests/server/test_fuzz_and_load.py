"""Runs fuzz_requests.py and load_test.py against the test server (bounded in
count and time, loopback only)."""
import fuzz_requests
import greedy_load
import load_test


def test_fuzzed_bodies_and_policies_never_crash_the_server_or_exceed_its_budget(make_server):
    # Its own server with a tiny --max-new-tokens bounds the work of the bodies
    # that happen to be valid (a larger max_tokens is refused with 400), and a
    # host KV budget that every admitted request is charged against.
    budget = 64 << 20
    server = make_server("--max-active", 4, "--max-new-tokens", 4, "--host-kv-budget", budget)
    pid = server.proc.pid
    # Warm up every path once (first allocations of the threads, the echo buffer), then
    # reset the peak RSS so that VmHWM measures the fuzz round alone.
    fuzz_requests.run_policies(server.base_url, n=20, seed=99, log=lambda *_: None)
    fuzz_requests.send(server.port, "/v1/completions",
                       b'{"prompt": "warm up", "max_tokens": 4, "echo": true, "logprobs": 5}')
    baseline = fuzz_requests.rss_kib(pid)
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    counts, failures = fuzz_requests.run(server.base_url, n=2000, seed=7, time_limit=400)
    pcounts, pfailures = fuzz_requests.run_policies(server.base_url, n=250, seed=7)
    peak = fuzz_requests.rss_kib(pid, "VmHWM")
    print(f"RSS: baseline {baseline / 1024:.1f} MiB, peak during the round {peak / 1024:.1f} MiB, "
          f"budget {budget / 2**20:.0f} MiB")
    assert not failures, "\n".join(failures[:20])
    assert not pfailures, "\n".join(pfailures[:20])
    assert sum(counts.values()) >= 2000 and sum(pcounts.values()) >= 200
    assert counts.get(400, 0) > 800  # most bodies are invalid and must be refused
    assert not any(code >= 500 for code in list(counts) + list(pcounts))
    assert peak - baseline <= budget // 1024, f"RSS grew by {(peak - baseline) / 1024:.1f} MiB"
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


def test_32_way_greedy_answers_equal_solo_answers(server):
    summary, mismatches = greedy_load.run(server.base_url, n=32, rounds=1, max_tokens=8)
    assert not mismatches, mismatches[:3]
    assert summary["requests"] == 32
