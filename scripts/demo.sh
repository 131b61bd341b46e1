#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job: a chat answer
# from the default model (SmolLM2-135M-Instruct), streamed, with prefill and
# decode tokens/s. Extra arguments go to `kvtier run`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
KVT_TARGET=kvtier ./scripts/build.sh
prompt=${PROMPT:-"Explain in three sentences why a KV cache grows with context length."}
exec ./build/tools/kvtier run -m models/cache/SmolLM2-135M-Instruct.Q4_1.gguf -p "$prompt" -n 200 "$@"
