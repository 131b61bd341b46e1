#!/usr/bin/env bash
# One GPU session's measurements in one command (binaries built elsewhere):
#   bench/gpu_run.sh [STEP ...]      steps: tests fa3 perf32k perf128k perf19m batch stages score gemm maxbatch
#                                    maxbatch21 ncuscore
#                                    (default: tests fa3 perf32k perf128k perf19m)
# Binaries in $BIN (default .device/bin), shared libraries the GPU machine
# lacks in $BIN/../lib; logs and JSON under $OUT (default out/gpu). Every step
# has a time limit and its own log; a summary prints last.
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-cuda --target kvt_cuda_tests kvt_flash_prefill_bench kvtier
#   bench/pack_device.sh     # packs them and their libraries into .device/pack.tar.xz
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.device/bin}
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
[ -f .device/pack.tar.xz ] && [ ! -x "$BIN/kvtier" ] && tar -xJf .device/pack.tar.xz -C .device
[ -d "$BIN/../lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
STEPS=${*:-tests fa3 perf32k perf128k perf19m}
K=$BIN/kvtier

step() {  # step NAME SECONDS CMD...: output to $OUT/NAME.log, its tail here, the verdict in the summary
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 30 "$OUT/$name.log"
  local verdict=ok
  [ $rc -ne 0 ] && verdict="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', time limit'))"
  printf '%-14s %-30s %4ss\n' "$name" "$verdict" "$((SECONDS - t0))" | tee -a "$SUMMARY"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv \
  > "$OUT/nvidia_smi.txt" 2>&1
# Tests that read fixtures look under the source directory compiled into the
# binary: point it at this checkout when it is not here.
SRC=$(grep -a -m1 -o '/[[:alnum:]_./+-]*/tests/fixtures/hf_tiny_llama' "$BIN/kvt_cuda_tests" | head -n1 |
  sed 's#/tests/fixtures/hf_tiny_llama$##')
if [ -n "$SRC" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$(pwd)" "$SRC"; fi

# The presets and the equal-bytes variants of the decode-step table (issue: one decode step).
if [ "${POLICY_SET:-all}" = core ]; then
  POLICIES=(--kv full --kv yakv --kv "yakv,kv=fp8" --kv shadowkv --kv "yakv,cache=step")
else
  POLICIES=(--kv full --kv yakv --kv "yakv,kv=fp8" --kv shadowkv --kv oracle --kv landmarks --kv "yakv,lm=higgs1"
    --kv "yakv,lm=residual" --kv "shadowkv,rank=4"
    --kv "yakv,cache=step" --kv "yakv,kv=fp8,cache=step" --kv "shadowkv,cache=step")
fi
TESTS_LIMIT=${TESTS_LIMIT:-420}
for s in $STEPS; do
  case $s in
    tests) step tests "$TESTS_LIMIT" "$BIN/kvt_cuda_tests" ;;
    fa3) step fa3 150 "$BIN/kvt_flash_prefill_bench" --kernels mma_sync,wgmma --lengths 32768,131072 --reps 3 \
           --json "$OUT/fa3.json" ;;
    perf32k) step perf32k 300 "$K" perf --device cuda -m shape:llama3.1-8b -c 40000 --prefill-chunk 8192 \
               -p 32768 -g 48 -r 1 "${POLICIES[@]}" --json ;;
    perf128k) step perf128k 560 "$K" perf --device cuda -m shape:llama3.1-8b -c 140000 --prefill-chunk 8192 \
                -p 131072 -g 48 -r 1 "${POLICIES[@]}" --json ;;
    perf19m) step perf19m 120 "$K" perf --device cuda -m models/kvtier-longctx-19m -p 16384 -g 256 -r 3 \
               --kv full --kv yakv --kv "yakv,kv=fp8" --kv shadowkv --json &&
             step perf19m_nograph 120 "$K" perf --device cuda --no-cuda-graphs -m models/kvtier-longctx-19m \
               -p 16384 -g 256 -r 3 --kv full --kv yakv --json ;;
    batch) step batch19m 200 "$K" perf --device cuda -m models/kvtier-longctx-19m -p 16384 -g 64 -r 1 \
             --batch 1,4,16,64 --kv full --kv yakv --kv "yakv,kv=fp8" --json
           step batch32k 400 "$K" perf --device cuda -m shape:llama3.1-8b -c 40000 --prefill-chunk 8192 \
             -p 32768 -g 32 -r 1 --batch 1,8 --kv full --kv "yakv,kv=fp8" --kv yakv --json ;;
    stages) for c in 32768 131072; do
              step "stages$((c / 1024))k" 280 "$K" perf --device cuda -m shape:llama3.1-8b -c $((c + 8192)) \
                --prefill-chunk 8192 -p "$c" -g 16 -r 1 --stages "${POLICIES[@]}" --json
            done ;;
    score) step score 200 "$BIN/kvt_score_bench" --batch 1,6,12,21 --blocks auto --table xor,rotated,mma \
             --json "$OUT/score.json" ;;
    gemm) step gemm 120 "$BIN/kvt_gemm_bench" --m 1,8,21,32 --json "$OUT/gemm.json" ;;
    maxbatch)  # 128K prompts whose first 126,976 tokens' K/V are random (bench/results/gpu/batch/README.md)
      M=(-m shape:llama3.1-8b -c 132000 --prefill-chunk 4096 -p 131072 --random-kv 126976 -g 16 -r 1 --json)
      step maxbatch_full 200 "$K" perf --device cuda "${M[@]}" --batch 6 --kv full
      step maxbatch_store_gpu 330 "$K" perf --device cuda "${M[@]}" --batch 6,12,18 --kv "yakv,store=gpu,prefill=stream" ;;
    maxbatch21)  # batch 21 (the H200's largest for yakv,store=gpu) per planar scorer, and its stages
      M=(-m shape:llama3.1-8b -c 132000 --prefill-chunk 4096 -p 131072 --random-kv 126976 -g 16 -r 1 --json)
      step maxbatch_full 200 "$K" perf --device cuda "${M[@]}" --batch 6 --kv full
      for sc in mma rotated; do
        step "maxbatch21_$sc" 150 env KVT_PLANAR_SCORER=$sc "$K" perf --device cuda "${M[@]}" --batch 21 \
          --kv "yakv,store=gpu,prefill=stream"
      done
      step stages21 150 "$K" perf --device cuda "${M[@]}" --batch 21 --stages --kv "yakv,store=gpu,prefill=stream" ;;
    ncuscore)  # Nsight Compute on the default (tensor-core) planar scorer at batch 21
      step ncuscore 240 ncu --kernel-name regex:higgs2 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
        "$BIN/kvt_score_bench" --batch 21 --blocks auto --table mma --reps 1 ;;
    *) echo "unknown step $s" ;;
  esac
done
echo
echo "================ summary ================"
cat "$SUMMARY"
grep -h -E '^\[  FAILED  \]|Failure$|Expected|actual|Which is|rel-L2|gpu vs cpu' "$OUT/tests.log" 2>/dev/null | head -80
grep -q FAILED "$SUMMARY" && exit 1
exit 0
