#!/usr/bin/env bash
# The Hopper flash-prefill kernel on the GPU machine, in one command (about a
# minute of GPU time, builds nothing):
#   1. the flash-prefill CUDA tests: the mma.sync kernel, then each Hopper
#      variant, each in its own process (a kernel that traps or hangs cannot
#      hide the others' results);
#   2. the timing table at Llama-3.1-8B shapes (32/8 heads, head_dim 128),
#      causal prefill of 8K/32K/128K tokens, old kernel vs new, TFLOP/s
#      against the measured 790 TFLOP/s bf16 peak, with each kernel's error
#      against an f64 reference on sampled rows (only the Hopper variants
#      whose tests passed are timed; the mma.sync rows come first);
#   3. whole-model prefill of 32K tokens (random Llama-3.1-8B weights) with
#      each kernel (`kvtier gpu-bench --prefill-kernels`);
#   4. the rest of the CUDA tests (the GPU model now prefills with the new
#      kernel where it is available).
# Then a summary (the tail of the output).
#
# Binaries come from the dev machine (nvcc 13.0, sm_90a), see NOTES.md:
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-cuda -j2 --target kvt_cuda_tests kvt_flash_prefill_bench kvtier
#   mkdir -p .device/bin && cp build-cuda/src/backend/kvt_cuda_tests build-cuda/src/backend/kvt_flash_prefill_bench \
#       build-cuda/tools/kvtier .device/bin/ && strip .device/bin/*
# and on the GPU machine, from the repository root:
#   bash dev/kernels/flash_prefill_h200.sh
#
# Knobs (this script's environment only): BIN (binaries, default .device/bin;
# shared libraries the GPU machine lacks may sit in $BIN/../lib), OUT (logs,
# default $OUT or out/fa3), FA3=0 (old kernel only: no Hopper tests or
# timings), MODEL=0 (skip step 3), REST=0 (skip step 4), LENGTHS (default
# 8192,32768,131072), REPS (default 5).
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-.device/bin}
OUT=${OUT:-out/fa3}
FA3=${FA3:-1}
MODEL=${MODEL:-1}
REST=${REST:-1}
LENGTHS=${LENGTHS:-8192,32768,131072}
REPS=${REPS:-5}
mkdir -p "$OUT"
[ -d "$BIN/../lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
for f in test_mma_sync test_wgmma test_wgmma_serial bench model_prefill test_rest; do rm -f "$OUT/$f.log"; done

# step NAME SECONDS CMD...: runs CMD under a time limit, output to $OUT/NAME.log
# (and its tail here); records the exit status in the summary.
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  local verdict=ok
  [ $rc -ne 0 ] && verdict="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', time limit'))"
  printf '%-16s %-34s %4ss\n' "$name" "$verdict" "$((SECONDS - t0))" | tee -a "$SUMMARY"
  return $rc
}

for b in kvt_cuda_tests kvt_flash_prefill_bench kvtier; do
  [ -x "$BIN/$b" ] || echo "missing $BIN/$b (build it on the dev machine, see the header of this script)"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv | tee "$OUT/nvidia_smi.txt"

# 1. tests
T="$BIN/kvt_cuda_tests"
step test_mma_sync 120 "$T" --gtest_filter='FlashPrefillCuda.MmaSync*:FlashPrefillCuda.DispatchAndRefusals'
# Only Hopper variants whose tests pass are timed (a hung or wrong kernel would
# waste the time limit and tell nothing).
KERNELS=mma_sync
if [ "$FA3" = 1 ]; then
  step test_wgmma 90 "$T" --gtest_filter='FlashPrefillCuda.WgmmaMatchesCausalReference' && KERNELS=$KERNELS,wgmma
  step test_wgmma_serial 90 "$T" --gtest_filter='FlashPrefillCuda.WgmmaSerialMatchesCausalReference' &&
    KERNELS=$KERNELS,wgmma_serial
fi
echo "kernels to time: $KERNELS" | tee -a "$SUMMARY"

# 2. timing table (the mma.sync rows come first: a failure later cannot hide them)
step bench 180 "$BIN/kvt_flash_prefill_bench" --kernels "$KERNELS" --lengths "$LENGTHS" --reps "$REPS" \
  --json "$OUT/bench.json"

# 3. whole-model prefill, 32K tokens, one prefill per kernel
if [ "$MODEL" = 1 ]; then
  step model_prefill 180 "$BIN/kvtier" gpu-bench --no-kernels --contexts 4096 --batches 1 --policies full \
    --steps 2 --prefill 32768 --prefill-kernels "$KERNELS" --json "$OUT/model_prefill.json"
fi

# 4. the other CUDA tests. Tests that read fixtures look under the source
# directory compiled into the binary: point it at this checkout if it is not here.
if [ "$REST" = 1 ]; then
  SRC=$(grep -a -m1 -o '/[[:alnum:]_./+-]*/tests/fixtures/hf_tiny_llama' "$T" | head -n1 | sed 's#/tests/fixtures/hf_tiny_llama$##')
  if [ -n "$SRC" ] && [ ! -e "$SRC" ]; then
    mkdir -p "$(dirname "$SRC")" && ln -s "$(pwd)" "$SRC" && echo "linked $SRC -> $(pwd)"
  fi
  step test_rest 120 "$T" --gtest_filter='-FlashPrefillCuda.*'
fi

echo
echo "================ summary ================"
cat "$SUMMARY"
echo
echo "--- timing (kvt_flash_prefill_bench) ---"
[ -f "$OUT/bench.log" ] && grep -E '^(kernel|mma_sync|wgmma|device|error)|WRONG|not available' "$OUT/bench.log"
if [ -f "$OUT/model_prefill.log" ]; then
  echo "--- whole-model prefill (kvtier gpu-bench) ---"
  grep -E '^(prefill|model|error)' "$OUT/model_prefill.log"
fi
echo "--- tests ---"
for f in test_mma_sync test_wgmma test_wgmma_serial test_rest; do
  [ -f "$OUT/$f.log" ] && echo "$f: $(grep -E '^\[==========\] [0-9]|^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]' "$OUT/$f.log" | tr '\n' ' ')" &&
    grep -E '^\[  FAILED  \] [A-Za-z]|Failure|error:|rel|differ|outside' "$OUT/$f.log" | head -12
done
grep -q FAILED "$SUMMARY" && exit 1
exit 0
