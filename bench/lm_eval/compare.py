#!/usr/bin/env python3
"""Checks an lm_eval run of bench/lm_eval/run.sh against kvtier itself:
- generate_until (local-chat-completions and local-completions): every
  generation equals `kvtier bench`'s prediction for the same sample, and
  `kvtier score` of lm_eval's generations equals bench's score;
- loglikelihood (local-completions, multiple choice): every (context,
  continuation) log-likelihood lm_eval computed equals the sum of the
  server's echo logprobs over the continuation, tokenized as lm_eval does.
Prints a report; exits 1 on any difference."""
import argparse
import glob
import json
import math
import subprocess
import sys
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def samples(work, task):
    files = glob.glob(f"{work}/**/samples_{task}_*.jsonl", recursive=True)
    assert files, f"no lm_eval samples for {task} under {work}"
    return [json.loads(x) for x in open(sorted(files)[-1], encoding="utf-8")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    bad = 0
    checks = [("text2json", "bench.jsonl", "tasks/t2j.jsonl", ["kvtier_t2j_chat", "kvtier_t2j_completions"]),
              ("niah_single", "bench_niah.jsonl", "tasks/niah.jsonl", ["kvtier_niah_gen"])]
    for score_task, bench_file, gold, tasks in checks:
        bench = {r["id"]: r for r in map(json.loads, open(f"{args.work}/{bench_file}"))}
        bench_mean = sum(r["score"] for r in bench.values()) / len(bench)
        print(f"kvtier bench {score_task} (full, greedy): {len(bench)} samples, mean score {bench_mean:.2f}")
        for task in tasks:
            rows = samples(args.work, task)
            preds = f"{args.work}/{task}_preds.jsonl"
            same = 0
            with open(preds, "w") as f:
                for s in rows:
                    pred = s["resps"][0][0]
                    f.write(json.dumps({"id": s["doc"]["id"], "prediction": pred}) + "\n")
                    same += pred == bench[s["doc"]["id"]]["prediction"]
            out = subprocess.run([args.bin, "score", "--task", score_task, "--pred", preds, "--gold",
                                  f"{args.work}/{gold}", "--json"], capture_output=True, text=True, check=True)
            score = json.loads(out.stdout)["summary"]["score"]
            ok = same == len(rows) == len(bench) and math.isclose(score, bench_mean, abs_tol=1e-9)
            bad += not ok
            print(f"{task}: {same}/{len(rows)} generations equal bench's predictions; kvtier score of lm_eval's "
                  f"generations {score:.2f} vs bench {bench_mean:.2f}: {'equal' if ok else 'DIFFERENT'}")
    rows = samples(args.work, "kvtier_niah_choice")
    n, worst, correct = 0, 0.0, 0
    for s in rows:
        lls = [float(r[0][0]) for r in s["resps"]]  # lm_eval logs them as strings
        correct += max(range(len(lls)), key=lambda i: lls[i]) == 0
        args_list = s["arguments"]  # {"gen_args_i": {"arg_0": context, "arg_1": continuation}}
        pairs = [(a["arg_0"], a["arg_1"]) for _, a in sorted(args_list.items(), key=lambda kv: int(kv[0][9:]))]
        for (context, cont), ll in zip(pairs, lls):
            ctx_ids = post(args.base, "/tokenize", {"prompt": context, "add_special_tokens": False})["tokens"]
            whole = post(args.base, "/tokenize", {"prompt": context + cont, "add_special_tokens": False})["tokens"]
            r = post(args.base, "/v1/completions", {"prompt": whole, "max_tokens": 0, "echo": True, "logprobs": 1})
            ref = sum(r["choices"][0]["logprobs"]["token_logprobs"][len(ctx_ids):])
            worst = max(worst, abs(ref - ll))
            n += 1
    ok = worst < 1e-4
    bad += not ok
    print(f"kvtier_niah_choice: {len(rows)} samples, acc {correct / len(rows):.3f}; {n} log-likelihoods, "
          f"max |lm_eval - server echo| = {worst:.2e}: {'equal' if ok else 'DIFFERENT'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
