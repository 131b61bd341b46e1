#!/usr/bin/env bash
# Qwen3-30B-A3B shapes on the H200 (random weights; 48 layers, 128 experts of
# width 768, 8 used, 32 query / 4 KV heads of 128): kvtier's prefill tok/s and
# decode ms/token at 32K and 128K under `full` and `yakv`, the GPU memory in
# use, the weights' share of the decode step (the step at a 512-token context,
# where attention is negligible, over the step at 32K / 128K), and HF
# transformers at the same shapes as the peer. Run from the repository root
# on the GPU machine:
#
#   bash bench/moe_h200.sh build            # CUDA build + the MoE CUDA tests
#   bash bench/moe_h200.sh measure OUT_DIR  # kvtier, batch, hf, then report (about 4 minutes)
#
# or, where one command must stay well inside 10 minutes, the stages of `measure`:
#   bash bench/moe_h200.sh kvtier OUT_DIR   # kvtier perf + memory
#   bash bench/moe_h200.sh batch OUT_DIR    # batched decode at 32K (batch 1 and 8; the experts' GEMV path)
#   bash bench/moe_h200.sh hf OUT_DIR       # HF transformers peer (same shapes, same contexts)
#   bash bench/moe_h200.sh experts OUT_DIR  # the MoE block alone: kvtier's kernels vs cuBLASLt per expert
#   bash bench/moe_h200.sh report OUT_DIR   # the summary table (also printed by the stages above)
#
# The model is the built-in shape (shape:qwen3-30b-a3b: random bf16 weights
# made on the GPU, no file); MODEL=/path/x.gguf times a qwen3moe GGUF instead,
# written by bench/make_random_model.py when absent (Q8_0, 32 GB on disk),
# which also times the loader's dequantize-and-upload path.
set -euo pipefail
stage=${1:?usage: bench/moe_h200.sh build|measure|kvtier|batch|experts|hf|report [OUT_DIR]}
out=${2:-bench/results/moe}
model=${MODEL:-shape:qwen3-30b-a3b}
build=${BUILD:-build-cuda}
mkdir -p "$out"

report() {
  python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "kvtier_perf.jsonl")) if l.startswith("{")] \
    if os.path.exists(os.path.join(out, "kvtier_perf.jsonl")) else []
hf = json.load(open(os.path.join(out, "hf_peer.json"))) if os.path.exists(os.path.join(out, "hf_peer.json")) else {}
hf_dec = {r["context"]: r.get("step_ms") for r in hf.get("decode", []) if r.get("batch") == 1}
hf_pre = {r["tokens"]: r.get("tok_per_s") for r in hf.get("prefills", [])}
short = {r["kv"]: 1e3 / r["decode_tok_s"] for r in rows if r["n_prompt"] == 512}
print("| kv | context | prefill tok/s | decode ms/token | weights' share | HF prefill tok/s | HF decode ms/token | decode vs HF |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["n_prompt"] == 512:
        continue
    ms = 1e3 / r["decode_tok_s"]
    share = short.get(r["kv"], float("nan")) / ms
    h = hf_dec.get(r["n_prompt"])
    print(f"| {r['kv']} | {r['n_prompt']} | {r['prefill_tok_s']:.0f} | {ms:.2f} | {share:.0%} | "
          f"{hf_pre.get(r['n_prompt'], float('nan')):.0f} | {h if h else float('nan'):.2f} | "
          f"{(h / ms) if h else float('nan'):.1f}x |")
mem = os.path.join(out, "gpu_mem.csv")
if os.path.exists(mem):
    vals = [int(l) for l in open(mem) if l.strip().isdigit()]
    if vals:
        print(f"GPU memory used (nvidia-smi, whole run): peak {max(vals) / 1024:.1f} GiB")
PY
}

run_kvtier() {
  case "$model" in
    shape:*) ;;
    *) [ -f "$model" ] || python3 bench/make_random_model.py --shape qwen3-30b-a3b --out "$model" ;;
  esac
  "$build/tools/kvtier" memory --shape qwen3-30b-a3b --kv full --kv yakv -c 131072 | tee "$out/memory.txt"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$out/gpu_mem.csv" &
  local smi=$!
  # -c: room for the 128K prompt and its 32 generated tokens.
  "$build/tools/kvtier" perf --device cuda -m "$model" -c 140000 --prefill-chunk 4096 --kv full --kv yakv \
      -p 512,32768,131072 -g 32 -r 1 --json | tee "$out/kvtier_perf.jsonl"
  kill "$smi" || true
}

run_batch() {
  "$build/tools/kvtier" perf --device cuda -m "$model" -c 40000 --prefill-chunk 4096 --kv full --kv yakv \
      -p 32768 -g 32 -r 1 --batch 1,8 --json | tee "$out/kvtier_batch.jsonl"
}

run_experts() {
  local bench=${MOE_BENCH:-$build/src/ops/kvt_moe_bench}
  "$bench" --tokens 1,8,64,512,4096,8192,12288,16384,32768 --reps 20 --json "$out/moe_block.json" | tee "$out/moe_block.md"
}

run_hf() {
  python3 bench/hf_peer.py --model qwen3-30b-a3b --layers 48 --prefill 32768,131072 \
      --configs dynamic:32768:1,dynamic:131072:1 --steps 5 --json "$out/hf_peer.json" 2>&1 | tee "$out/hf_peer.log"
}

case "$stage" in
  measure)
    run_kvtier
    run_batch
    run_experts
    run_hf
    report | tee "$out/summary.md"
    ;;
  build)
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
    cmake --build "$build" -j "$(nproc)" --target kvtier kvt_cuda_tests kvt_moe_bench
    (cd "$build" && ctest -L cuda -R 'Moe|moe' --output-on-failure) 2>&1 | tee "$out/moe_cuda_tests.log"
    ;;
  kvtier)
    run_kvtier
    report | tee "$out/summary.md"
    ;;
  batch)
    run_batch
    ;;
  experts)
    run_experts
    ;;
  hf)
    run_hf
    report | tee "$out/summary.md"
    ;;
  report)
    report | tee "$out/summary.md"
    ;;
  *)
    echo "unknown stage $stage (build, measure, kvtier, batch, experts, hf, report)" >&2
    exit 2
    ;;
esac
