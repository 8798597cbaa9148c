#!/usr/bin/env python3
"""specdec against transformers on the same GGUF file, the same prompts and the same CPU.

Both decode greedily: transformers' plain `generate` and its prompt lookup
(`prompt_lookup_num_tokens = gamma`, `max_matching_ngram_size = 3`), specdec's autoregressive
decoding and its prompt lookup (`kind = "ngram"`, `max_ngram = 3`, the same gamma), through `exp`
with the model's chat template. Rounds are interleaved — in each round transformers plain,
transformers lookup, then one `exp` run of both specdec methods — so drift of the machine's
speed lands on all four alike. Per prompt and round, tok/s = new tokens / wall time of the
whole generation (prefill included, as `exp` times it); the table gives medians over prompts
and rounds, and paired ratios (same prompt, same round). Outputs are checked first: the
token ids of all four must be equal (a mismatch is printed and counted).

transformers dequantizes the GGUF to f32 (as specdec does on the CPU); torch uses every core.

    python3 scripts/bench_cpu_transformers.py --exp target/release/exp \
        --model models/real/SmolLM2-135M-Instruct.Q4_1.gguf --limit 8 --rounds 3

Needs torch, transformers, gguf and accelerate (scripts/requirements-compare.txt lists the
versions used).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def load_prompts(path, limit):
    prompts = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            pid = str(row.get("question_id", row.get("id")))
            text = row["turns"][0] if "turns" in row else row["prompt"]
            prompts.append((pid, text))
            if len(prompts) == limit:
                break
    return prompts


def run_exp(args, workdir):
    """One `exp` run of autoregressive and prompt-lookup decoding; {(method, id): (ids, tok/s)}."""
    cfg = f"""
name = "vs-transformers"
seed = 0
max_new_tokens = {args.max_new_tokens}
repeats = 1
device = "cpu"
dtype = "f32"
[target]
path = "{Path(args.model).resolve()}"
[drafters.lookup]
kind = "ngram"
max_ngram = 3
[dataset]
path = "{Path(args.prompts).resolve()}"
limit = {args.limit}
chat_template = true
[sweep]
method = ["autoregressive", "speculative"]
drafter = ["lookup"]
gamma = [{args.gamma}]
temperature = [0.0]
"""
    cfg_path = Path(workdir) / "exp.toml"
    cfg_path.write_text(cfg)
    out = Path(workdir) / f"exp-{time.monotonic_ns()}"
    subprocess.run([args.exp, str(cfg_path), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    results = {}
    with open(out / "results.jsonl") as f:
        for line in f:
            r = json.loads(line)
            method = "specdec plain" if r["method"] == "autoregressive" else "specdec lookup"
            results[(method, r["prompt_id"])] = (r["output_ids"], r["tokens_per_s"])
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exp", default="target/release/exp")
    ap.add_argument("--model", default="models/real/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompts", default="configs/prompts/spec_bench_question.jsonl")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = Path(args.model)
    tok = AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        model_path.parent, gguf_file=model_path.name, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    prompts = load_prompts(args.prompts, args.limit)
    encoded = {
        pid: tok.apply_chat_template([{"role": "user", "content": text}],
                                     add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)["input_ids"]
        for pid, text in prompts
    }

    def hf(pid, lookup):
        ids = encoded[pid]
        kw = dict(do_sample=False, max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                  pad_token_id=eos)
        if lookup:
            kw.update(prompt_lookup_num_tokens=args.gamma, max_matching_ngram_size=3)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kw)
        wall = time.perf_counter() - start
        new = out[0, ids.shape[1]:].tolist()
        return new, len(new) / wall

    rates = {}
    mismatches = 0
    with tempfile.TemporaryDirectory() as work:
        for rnd in range(args.rounds):
            got = {}
            for pid, _ in prompts:
                got[("transformers plain", pid)] = hf(pid, False)
                got[("transformers lookup", pid)] = hf(pid, True)
            got.update(run_exp(args, work))
            for pid, _ in prompts:
                ref = got[("transformers plain", pid)][0]
                for method in ("transformers lookup", "specdec plain", "specdec lookup"):
                    if got[(method, pid)][0] != ref:
                        mismatches += 1
                        print(f"round {rnd} prompt {pid}: {method} output differs from transformers plain",
                              file=sys.stderr)
            for key, (_, rate) in got.items():
                rates.setdefault(key, []).append(rate)
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)

    methods = ["transformers plain", "transformers lookup", "specdec plain", "specdec lookup"]
    print(f"\n{args.model}, {len(prompts)} prompts x {args.rounds} rounds, "
          f"{args.max_new_tokens} new tokens, greedy, gamma {args.gamma}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} torch threads; outputs differing: {mismatches}\n")
    print("| method | median tok/s | median ratio to transformers plain (paired) |")
    print("|---|---:|---:|")
    for m in methods:
        all_rates = [r for (mm, _), rs in rates.items() if mm == m for r in rs]
        ratios = [r / b for pid, _ in prompts
                  for r, b in zip(rates[(m, pid)], rates[("transformers plain", pid)])]
        print(f"| {m} | {statistics.median(all_rates):.1f} | {statistics.median(ratios):.2f} |")
    for a, b in [("specdec plain", "transformers plain"), ("specdec lookup", "transformers lookup")]:
        ratios = [r / s for pid, _ in prompts for r, s in zip(rates[(a, pid)], rates[(b, pid)])]
        print(f"\n{a} / {b}: median paired ratio {statistics.median(ratios):.2f} "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
