#!/usr/bin/env bash
# lm-evaluation-harness (lm_eval, pinned) against `kvtier serve` on loopback,
# on tasks over local files made by `kvtier gen` (bench/lm_eval/make_tasks.py):
# local-completions (loglikelihood: multiple choice; generate_until) and
# local-chat-completions (generate_until). Then `kvtier bench` runs the same
# samples, and bench/lm_eval/compare.py checks that lm_eval's generations and
# their `kvtier score` equal bench's, and that its log-likelihoods equal the
# server's echo logprobs. Run by hand (lm_eval pulls datasets, pyarrow, ...):
#
#   python3 -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install "lm_eval[api]==0.4.13"
#   LM_EVAL=/tmp/lmeval/bin/lm_eval bench/lm_eval/run.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/lm_eval}
bin=${KVTIER_BIN:-build/tools/kvtier}
lm_eval=${LM_EVAL:-lm_eval}
n=${N:-4}
tokens=${TOKENS:-1024}
niah_tokens=${NIAH_TOKENS:-512}
max_gen=${MAX_GEN:-128}
mkdir -p "$out"
work=$(mktemp -d)
trap 'kill $server_pid 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin" gen --task text2json --tokens "$tokens" --n "$n" --seed 1 --ids -o "$work/t2j.jsonl"
"$bin" gen --task niah_single --tokens "$niah_tokens" --n "$((2 * n))" --seed 1 --ids -o "$work/niah.jsonl"

"$bin" serve --port 0 -t "${THREADS:-2}" --max-active 2 2> "$work/serve.log" &
server_pid=$!
for _ in $(seq 600); do grep -q "http://" "$work/serve.log" && break; sleep 0.2; done
port=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log" | head -1)
base=http://127.0.0.1:$port
python3 bench/lm_eval/make_tasks.py --t2j "$work/t2j.jsonl" --niah "$work/niah.jsonl" --detok "$base" \
    --out "$work/tasks" --max-gen-toks "$max_gen"

run() {  # model, tasks, extra args
  local model=$1 tasks=$2; shift 2
  (set -x; "$lm_eval" --model "$model" --tasks "$tasks" --include_path "$work/tasks" --log_samples \
      --output_path "$work/lm_eval_$model" --seed 1234 "$@") 2>&1 | tail -n 25
}
run local-completions kvtier_niah_choice,kvtier_niah_gen,kvtier_t2j_completions \
    --model_args "model=kvtier,base_url=$base/v1/completions,tokenizer_backend=remote,num_concurrent=1,max_retries=1"
run local-chat-completions kvtier_t2j_chat --apply_chat_template \
    --model_args "model=kvtier,base_url=$base/v1/chat/completions,num_concurrent=1,max_retries=1"

(set -x; "$bin" bench --task text2json-gen --ctx "$tokens" --n "$n" --seed 1 --kv full --max-tokens "$max_gen" \
    --no-progress -o "$work/bench.jsonl") > /dev/null
(set -x; "$bin" bench --task niah_single --ctx "$niah_tokens" --n "$((2 * n))" --seed 1 --kv full --max-tokens 32 \
    --no-progress -o "$work/bench_niah.jsonl") > /dev/null
python3 bench/lm_eval/compare.py --work "$work" --base "$base" --bin "$bin" | tee "$out/compare.txt" || status=$?
cp "$work/bench.jsonl" "$work/bench_niah.jsonl" "$out/"
mkdir -p "$out/tasks" && cp "$work"/tasks/* "$out/tasks/"
find "$work" -name 'samples_*.jsonl' -exec cp {} "$out/" \;
find "$work" -name 'results_*.json' -exec cp {} "$out/" \;
exit "${status:-0}"
