#!/usr/bin/env bash
# Model v2 of the project's long-context model, as ONE resumable command that
# fits a 10-minute GPU command: run it again (same machine, or a later one
# with the weights it wrote) until the summary says "done": true.
#
#   bash train/run_v2.sh            # on the GPU machine, from the repository root
#
# Each run trains until its deadline (LIMIT seconds for the whole command,
# minus what building kvtier took), saves a checkpoint in $CKPT (optimizer
# included; kept on the machine between runs while it stays warm) and
# exports the model. v2 starts from the v1 weights (models/kvtier-longctx-19m,
# same architecture) at 22 % of the budget (stage 2 of the curriculum: 3.5K-8K
# prompts), unless FROM_SCRATCH=1. On a fresh machine, INIT=<an exported v2
# folder> resumes from carried-back weights (fresh optimizer).
#
# Environment: BUDGET (training seconds over all runs, 1080), LIMIT (seconds
# for this command, 570), DATA (benchmark data: data/ or ../shared/data),
# KVTIER (a kvtier binary; built CPU-only into build-train/ when missing),
# CKPT (out/train-v2), EXPORT (out/kvtier-longctx-v2), OUT (when set, the
# files to carry back are copied there: 3 weight shards, config.json,
# model.safetensors.index.json, summary.json, train.log), PYTHON (python3),
# RECIPE (v2, the committed model's; v3 adds Text2JSON-style domains made up
# per sample), TRAIN_ARGS (more train.py arguments). A CPU check of this script:
#   FROM_SCRATCH=1 BUDGET=60 LIMIT=200 TRAIN_ARGS="--smoke --tokens-per-step 8192 --warmup 10" \
#   CKPT=/tmp/v2c EXPORT=/tmp/v2e OUT=/tmp/v2o bash train/run_v2.sh
set -euo pipefail
t0=$(date +%s)
PYTHON=${PYTHON:-python3}
BUDGET=${BUDGET:-1080}
LIMIT=${LIMIT:-570}
CKPT=${CKPT:-out/train-v2}
EXPORT=${EXPORT:-out/kvtier-longctx-v2}
V1=models/kvtier-longctx-19m
if [ -z "${DATA:-}" ]; then
  if [ -d data/needlebench ]; then DATA=data; else DATA=../shared/data; fi
fi
{ [ -f "$DATA/needlebench/needles.jsonl" ] || [ -f "$DATA/needlebench/needles.jsonl.xz" ]; } || { echo "run_v2: no benchmark data in $DATA (set DATA)" >&2; exit 2; }
KVTIER=${KVTIER:-build/tools/kvtier}
if [ ! -x "$KVTIER" ]; then
  cmake -S . -B build-train -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=OFF > /dev/null
  cmake --build build-train -j"$(nproc)" --target kvtier > /dev/null
  KVTIER=build-train/tools/kvtier
fi
mkdir -p "$CKPT" "$EXPORT"
init=()
if [ ! -f "$CKPT/ckpt.pt" ]; then
  if [ -n "${INIT:-}" ]; then
    trained=$($PYTHON -c "import json,sys; print(json.load(open(sys.argv[1]))['trained_s'])" "$INIT/summary.json")
    init=(--init "$INIT" --init-trained-s "$trained")
  elif [ "${FROM_SCRATCH:-0}" != 1 ]; then
    init=(--init "$V1" --init-trained-s "$($PYTHON -c "print(0.22 * $BUDGET)")")
  fi
fi
deadline=$(( LIMIT - ($(date +%s) - t0) - 45 ))  # 45 s for the final evaluation and export
workers=$(( $(nproc) > 6 ? $(nproc) - 4 : 1 ))
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of words
PYTHONUNBUFFERED=1 $PYTHON train/train.py --recipe "${RECIPE:-v2}" --kvtier "$KVTIER" --tokenizer "$V1" --data "$DATA" \
  --budget "$BUDGET" --deadline "$deadline" --ckpt "$CKPT" --export "$EXPORT" --workers "$workers" \
  "${init[@]}" ${TRAIN_ARGS:-} 2>&1 | tee -a "$EXPORT/train.log"
cp "$CKPT/summary.json" "$EXPORT/summary.json"
if [ -n "${OUT:-}" ]; then
  files=("$EXPORT"/model*.safetensors "$EXPORT"/config.json "$EXPORT"/summary.json "$EXPORT"/train.log)
  [ -f "$EXPORT/model.safetensors.index.json" ] && files+=("$EXPORT/model.safetensors.index.json")
  cp "${files[@]}" "$OUT"/
fi
$PYTHON -c "import json,sys; s=json.load(open(sys.argv[1])); print('run_v2:', 'done' if s['done'] else 'run again', \
  f\"({s['trained_s']:.0f} of {s['budget_s']:.0f} s trained, step {s['step']})\")" "$EXPORT/summary.json"
