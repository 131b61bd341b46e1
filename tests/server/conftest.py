"""Fixtures for the server tests: start `kvtier serve` on a free loopback port
with the default model, wait until /health answers, stop it with SIGTERM at
the end and check that it exits 0 (graceful shutdown).

The kvtier binary comes from $KVTIER_BIN (CTest sets it), else the first of
build*/tools/kvtier. Without the default model every test here is skipped.
"""
import glob
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get(
    "KVTIER_TEST_MODEL", os.path.join(ROOT, "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"))


def kvtier_binary():
    env = os.environ.get("KVTIER_BIN")
    if env:
        return env
    for cand in sorted(glob.glob(os.path.join(ROOT, "build*/tools/kvtier"))):
        if os.access(cand, os.X_OK):
            return cand
    return None


class Server:
    """One `kvtier serve` process on 127.0.0.1 and an ephemeral port."""

    def __init__(self, *extra_args, threads=2):
        binary = kvtier_binary()
        if not binary:
            pytest.skip("kvtier binary not built (set KVTIER_BIN)")
        if not os.path.exists(MODEL):
            pytest.skip(f"default model absent: {MODEL}")
        cmd = [binary, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0",
               "-t", str(threads), *map(str, extra_args)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 120
        # The first stderr line names the bound port.
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log) +
                               self.proc.stderr.read())
        # Keep draining stderr so that the server never blocks on a full pipe.
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.port}"
        while time.time() < deadline:
            try:
                if self.health()["status"] == "ok":
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("server never became healthy")

    def health(self):
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 503 while shutting down still has a body
            return json.loads(e.read())

    def wait_idle(self, timeout=20.0):
        """Waits until no sequence is active or queued; returns the last /health."""
        deadline = time.time() + timeout
        h = self.health()
        while time.time() < deadline and (h["active_sequences"] or h["queued_requests"]):
            time.sleep(0.05)
            h = self.health()
        return h

    def stop(self, timeout=30.0):
        """SIGTERM; returns the exit code (None if it had to be killed)."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    """The shared server: 4 active sequences, a queue of 64."""
    s = Server("--max-active", 4, "--max-queue", 64, "--max-new-tokens", 256)
    yield s
    code = s.stop()
    assert code == 0, f"server exit code {code} after SIGTERM"


@pytest.fixture
def make_server():
    """Starts extra servers with their own limits; stops them after the test."""
    started = []

    def make(*args):
        s = Server(*args)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
