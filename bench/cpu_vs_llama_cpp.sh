#!/usr/bin/env bash
# CPU speed of kvtier against llama.cpp (llama-cpp-python 0.3.36, built from
# source) on the same GGUF and thread count, in one run, alternating the two
# engines ROUNDS times; prints each engine's median and the ratio
# kvtier / llama.cpp for prefill and decode tokens/s.
#   pip install llama-cpp-python==0.3.36
#   bench/cpu_vs_llama_cpp.sh [ROUNDS] [THREADS] [PROMPT_TOKENS] [GEN_TOKENS]   (KVTIER=path/to/kvtier)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; threads=${2:-2}; n_prompt=${3:-512}; n_gen=${4:-128}
model=models/cache/SmolLM2-135M-Instruct.Q4_1.gguf
dir=$(mktemp -d)
for r in $(seq "$rounds"); do
  "${KVTIER:-./build/tools/kvtier}" perf -m "$model" -t "$threads" -p "$n_prompt" -g "$n_gen" -r 1 --json >"$dir/kvtier_$r.json"
  python3 bench/llama_cpp_peer.py --model "$model" --threads "$threads" --prompt-tokens "$n_prompt" \
    --gen "$n_gen" --reps 1 >"$dir/llama_$r.json" 2>/dev/null
done
python3 - "$dir" <<'PY'
import glob, json, statistics, sys
def med(engine, key):
    return statistics.median(json.load(open(f))[key] for f in glob.glob(f"{sys.argv[1]}/{engine}_*.json"))
k = {e: (med(e, "prefill_tok_s"), med(e, "decode_tok_s")) for e in ("kvtier", "llama")}
print("| engine | prefill tok/s | decode tok/s |\n|---|---|---|")
for e, (p, d) in k.items():
    print(f"| {e} | {p:.1f} | {d:.1f} |")
print(f"| ratio kvtier/llama.cpp | {k['kvtier'][0]/k['llama'][0]:.2f}x | {k['kvtier'][1]/k['llama'][1]:.2f}x |")
PY
