#!/usr/bin/env python3
"""Writes lm-evaluation-harness tasks over samples that `kvtier gen --ids`
made (local files, no dataset hub), so that lm_eval drives `kvtier serve`
through its own OpenAI-API models:

  kvtier_t2j_chat        generate_until, local-chat-completions: the user message
                         is the sample's problem (the server applies the chat template)
  kvtier_t2j_completions generate_until, local-completions: the prompt exactly as
                         `kvtier bench` feeds it (chat template + answer prefix, as text)
  kvtier_niah_choice     multiple_choice (loglikelihood), local-completions: the
                         needle's value against three other samples' values
  kvtier_niah_gen        generate_until, local-completions: the RULER-style needle
                         prompt as bench feeds it (answer prefix included)

Usage: make_tasks.py --t2j t2j.jsonl --niah niah.jsonl --detok http://127.0.0.1:PORT --out DIR
(--detok turns prompt_ids back into text with the server's /detokenize.)
"""
import argparse
import json
import os
import urllib.request


def detokenize(base, ids):
    req = urllib.request.Request(base + "/detokenize", data=json.dumps({"tokens": ids}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["prompt"]


def load(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def task_yaml(name, data, output_type, extra):
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\noutput_type: {output_type}\n{extra}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t2j", required=True)
    ap.add_argument("--niah", required=True)
    ap.add_argument("--detok", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-gen-toks", type=int, default=256)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)

    t2j = []
    for r in load(args.t2j):
        t2j.append({"id": r["id"], "problem": r["problem"], "answer": r["answer"],
                    "formatted": detokenize(args.detok, r["prompt_ids"])})
    write_jsonl(f"{out}/t2j.jsonl", t2j)
    gen = (f"doc_to_target: \"{{{{answer}}}}\"\ngeneration_kwargs:\n  until: [\"<|im_end|>\"]\n"
           f"  max_gen_toks: {args.max_gen_toks}\n  do_sample: false\n  temperature: 0\n"
           "metric_list:\n  - metric: exact_match\n")
    open(f"{out}/kvtier_t2j_chat.yaml", "w").write(
        task_yaml("kvtier_t2j_chat", f"{out}/t2j.jsonl", "generate_until", "doc_to_text: \"{{problem}}\"\n" + gen))
    open(f"{out}/kvtier_t2j_completions.yaml", "w").write(
        task_yaml("kvtier_t2j_completions", f"{out}/t2j.jsonl", "generate_until",
                  "doc_to_text: \"{{formatted}}\"\n" + gen))

    niah = load(args.niah)
    values = [r["outputs"][0] for r in niah]
    rows = []
    for i, r in enumerate(niah):
        others = [v for v in values if v != values[i]]
        choices = [" " + values[i]] + [" " + others[(i + k) % len(others)] for k in range(3)]
        rows.append({"id": r["id"], "formatted": detokenize(args.detok, r["prompt_ids"]), "choices": choices,
                     "outputs": r["outputs"]})
    write_jsonl(f"{out}/niah.jsonl", rows)
    open(f"{out}/kvtier_niah_choice.yaml", "w").write(
        task_yaml("kvtier_niah_choice", f"{out}/niah.jsonl", "multiple_choice",
                  "doc_to_text: \"{{formatted}}\"\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: 0\n"
                  "target_delimiter: \"\"\nmetric_list:\n  - metric: acc\n"))
    open(f"{out}/kvtier_niah_gen.yaml", "w").write(
        task_yaml("kvtier_niah_gen", f"{out}/niah.jsonl", "generate_until",
                  "doc_to_text: \"{{formatted}}\"\ndoc_to_target: \"{{outputs[0]}}\"\ngeneration_kwargs:\n"
                  "  until: [\"<|im_end|>\"]\n  max_gen_toks: 32\n  do_sample: false\n  temperature: 0\n"
                  "metric_list:\n  - metric: exact_match\n"))
    print(f"tasks written to {out}: {len(t2j)} text2json samples, {len(rows)} niah samples")


if __name__ == "__main__":
    main()
