#!/usr/bin/env bash
# Streamed prefill on the H200 (issue: contexts larger than the GPU), stage by
# stage, each well inside a 10-minute GPU command; binaries built here and
# packed by `BINS="kvtier kvt_cuda_tests" bench/pack_device.sh`:
#   bench/prefill_h200.sh STAGE OUT_DIR
# Stages:
#   tests     the CUDA tests (fetch_dense vs the CPU, streamed vs dense prefill, budgets)
#   128k      Llama-3.1-8B shapes (random weights), 128K prompt: yakv with the dense
#             copy, streamed, and streamed with cache=step (one process each: the
#             sampled peak GPU memory is the process's)
#   512k      512K prompt, yakv streamed, end to end
#   1m-decode 1M context, decode: the first 1,032,192 tokens' K/V random (--random-kv),
#             the last 16K prefilled through the model
#   1m        1M prompt, yakv (auto streams: the dense copy does not fit); a time limit
#             stops it near the end: bench/project_prefill.py projects the rest
#   peer      32K and 128K prompts, full and yakv, with bf16 and with FP8 weight products
#             (--prefill-gemm), and HF transformers' prefill at 32K (bench/hf_peer.py) in the
#             same command; then the FP8 prefill's stages at 32K
# PREFILL_GEMM=fp8 runs the 128k, 512k and 1m stages with FP8 weight products.
set -u
cd "$(dirname "$0")/.."
STAGE=${1:?stage}
OUT=${2:?output directory}
mkdir -p "$OUT"
[ -x .device/bin/kvtier ] || tar -xJf .device/pack.tar.xz -C .device
export LD_LIBRARY_PATH=$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=.device/bin
K=$B/kvtier
L8B=(--device cuda -m shape:llama3.1-8b -r 1 --json --prefill-gemm "${PREFILL_GEMM:-bf16}")
case $STAGE in
  tests)
    SRC=$(grep -a -m1 -o '/[[:alnum:]_./+-]*/tests/fixtures/hf_tiny_llama' "$B/kvt_cuda_tests" | head -n1 |
      sed 's#/tests/fixtures/hf_tiny_llama$##')
    if [ -n "$SRC" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$(pwd)" "$SRC"; fi
    timeout 420 "$B/kvt_cuda_tests" > "$OUT/cuda_tests.log" 2>&1
    grep -E "^\[  (PASSED|FAILED)" "$OUT/cuda_tests.log" ;;
  128k)
    i=0
    for kv in yakv yakv,prefill=stream yakv,prefill=stream,cache=step; do
      i=$((i + 1))
      timeout 120 "$K" perf "${L8B[@]}" -c 140000 --prefill-chunk 8192 -p 131072 -g 16 --kv "$kv" \
        >> "$OUT/128k.jsonl" 2> "$OUT/128k_$i.err"
    done ;;
  512k)
    timeout 400 "$K" perf "${L8B[@]}" -c 530000 --prefill-chunk 16384 -p 524288 -g 16 --kv yakv,prefill=stream \
      > "$OUT/512k.jsonl" 2> "$OUT/512k_progress.log" ;;
  1m-decode)
    timeout 240 "$K" perf "${L8B[@]}" -c 1060000 --prefill-chunk 16384 -p 1048576 --random-kv 1032192 -g 32 \
      --kv yakv > "$OUT/1m_random_kv_decode.jsonl" 2> "$OUT/1m_random_kv_decode.err" ;;
  1m)
    (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> "$OUT/1m_nvidia_smi_mem_mib.txt"
       sleep 10; done) &
    smi=$!
    timeout 560 "$K" perf "${L8B[@]}" -c 1060000 --prefill-chunk 16384 -p 1048576 -g 8 --kv yakv \
      > "$OUT/1m.jsonl" 2> "$OUT/1m_progress.log"
    kill $smi
    python3 bench/project_prefill.py "$OUT/1m_progress.log" --chunk 16384 ;;
  peer)
    P32=(--device cuda -m shape:llama3.1-8b -c 40000 --prefill-chunk 8192 -p 32768 -g 4 -r 3 --json)
    P128=(--device cuda -m shape:llama3.1-8b -c 140000 --prefill-chunk 8192 -p 131072 -g 4 -r 1 --json)
    for g in bf16 fp8; do
      timeout 120 "$K" perf "${P32[@]}" --prefill-gemm $g --kv full --kv yakv > "$OUT/peer_32k_$g.jsonl"
    done
    timeout 150 python3 bench/hf_peer.py --prefill 32768 --prefill-reps 3 --configs "" --json "$OUT/peer_hf.json"
    timeout 100 "$K" perf "${P32[@]}" --prefill-gemm fp8 --stages --kv full > "$OUT/peer_32k_fp8_stages.jsonl"
    for g in bf16 fp8; do
      timeout 100 "$K" perf "${P128[@]}" --prefill-gemm $g --kv full --kv yakv > "$OUT/peer_128k_$g.jsonl"
    done ;;
  *) echo "prefill_h200.sh: unknown stage $STAGE" >&2; exit 2 ;;
esac
