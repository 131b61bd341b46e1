#!/usr/bin/env bash
# Bounded load test of `kvtier serve` on loopback: starts the server on a free
# port with the default model, sends 200 requests 16 at a time (completions,
# chat, streaming; max_tokens 8) through the openai client, prints latency
# percentiles and throughput, stops the server with SIGTERM. Extra arguments go
# to tests/server/load_test.py (e.g. -r 400 -c 32 --max-tokens 16).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KVTIER_BIN:-build/tools/kvtier}
[ -x "$bin" ] || { echo "build kvtier first (scripts/build.sh), or set KVTIER_BIN" >&2; exit 1; }
exec python3 tests/server/load_test.py --start --kvtier "$bin" -r 200 -c 16 --max-tokens 8 "$@"
