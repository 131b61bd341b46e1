#!/usr/bin/env bash
# Configures and builds kvtier into build/ (CUDA backend when nvcc is found).
# KVT_TARGET=kvtier builds the binary alone (what the demo needs).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
./scripts/fetch_xgrammar.sh  # structured generation's grammar engine (a no-op once fetched)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$jobs" ${KVT_TARGET:+--target "$KVT_TARGET"}
