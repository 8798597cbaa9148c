#!/usr/bin/env python3
"""Side-by-side CPU benchmark: specdec against Hugging Face transformers, greedy, same models.

One invocation runs four greedy generations of the same prompts with the same number of new
tokens, all in f32 on the CPU of this machine, one after the other:

  1. HF plain      transformers `generate` with the target (models/target, Mistral, window 64);
  2. HF assisted   transformers assisted generation, assistant_model = the draft
                   (models/draft, Llama), 4 draft tokens per step, constant schedule, no
                   confidence early stop (see `assistant_generation_config`);
  3. specdec AR    `exp` (src/bin/exp.rs), method "autoregressive";
  4. specdec spec  `exp`, method "speculative", drafter = the draft model, gamma = 4.

It prints tokens/s of each, the ratios, and checks that the four produced exactly the same
token ids for every prompt (exit status 1 naming the prompt and the first differing position
otherwise; 2 for a usage or setup error).

Setup and usage (from the repository root):

    python3 -m venv ~/venv-hf && . ~/venv-hf/bin/activate
    pip install -r scripts/requirements-compare.txt
    python scripts/compare_transformers.py                      # 8 code prompts x 128 tokens
    python scripts/compare_transformers.py --limit 2 --max-new-tokens 32 --json /tmp/cmp.json
    python scripts/compare_transformers.py --threads 2 --skip-build

Options: --prompts PATH (default configs/prompts/code.jsonl), --limit N (8), --max-new-tokens
N (128), --threads N (torch.set_num_threads, and RAYON_NUM_THREADS / CANDLE_NUM_THREADS for
exp; default: each library's own default, printed), --skip-build (use the existing
target/release/exp, or --exp-bin PATH), --stop-at-eos (see below), --cache staged|slack
(specdec's rotating-cache rollback), --json PATH (all figures and per-prompt records),
--keep-specdec-out DIR (keep exp's result folder).

What is compared, and how it is kept identical:
  * Prompt tokens: exp encodes the first turn of each JSONL record (`prompt`, or Spec-Bench
    `turns[0]`) with models/target/tokenizer.json through the Rust `tokenizers` crate,
    `encode(text, add_special_tokens=false)`, no chat template (dataset.chat_template is false
    by default and is left so here), no BOS (the tokenizer has none and adds none). This
    script does the same with the Python `tokenizers` package (the same Rust library) on the
    same file, and checks every prompt's length against exp's `prompt_tokens`.
  * New tokens: by default neither side stops at EOS (exp: `stop_at_eos = false`; HF:
    `eos_token_id = None` on both generation configs), so every generation has exactly
    --max-new-tokens tokens and EOS (id 0) is an ordinary token. `min_new_tokens` is NOT used:
    it works by setting the EOS logit to -inf, which would change the greedy choice wherever
    EOS is the argmax and so break the token-for-token comparison. With --stop-at-eos both sides
    stop after emitting EOS (the EOS is counted as a new token on both sides).
  * Timing: specdec tokens/s = sum(new_tokens) / sum(wall_s) over the prompts, per method,
    from exp's results.jsonl (wall_s covers prefill + decoding of one generation, not model
    loading; exp runs its own short untimed warm-up first). HF tokens/s = sum(new tokens) /
    sum(time of the `generate` call) over the same prompts: loading and tokenisation are not
    timed, and one untimed warm-up `generate` (first prompt, full length) precedes each HF
    configuration. Every `generate` runs under torch.inference_mode().
  * Threads: candle uses RAYON_NUM_THREADS, else the CPUs it may run on; torch uses its own
    default (usually the physical cores). Both are printed; --threads N sets both to N. On a
    busy machine torch's multi-threaded kernels suffer far more than candle's from sharing
    the cores (seen here: HF plain 25-46 tok/s with 2 threads next to a compiler, 220 with 1),
    so measure on an idle machine; a warning is printed when the load average is high.
"""

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GAMMA = 4
TARGETS = (
    ("specdec AR >= 2x HF plain", "specdec_ar", "hf_plain", 2.0),
    ("specdec spec >= 3x HF plain", "specdec_spec", "hf_plain", 3.0),
    ("specdec spec >= 1.3x specdec AR", "specdec_spec", "specdec_ar", 1.3),
)
RUNS = (
    ("hf_plain", "HF plain"),
    ("hf_assisted", "HF assisted"),
    ("specdec_ar", "specdec AR"),
    ("specdec_spec", "specdec spec"),
)


class SetupError(Exception):
    """A problem with the environment or the inputs (exit status 2)."""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring (head of this file) for what is compared and how.",
    )
    ap.add_argument("--prompts", default="configs/prompts/code.jsonl", help="JSONL prompts (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=8, help="use the first N prompts (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per generation (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N), RAYON_NUM_THREADS=N and CANDLE_NUM_THREADS=N for exp "
                         "(default: leave both libraries' defaults)")
    ap.add_argument("--skip-build", action="store_true", help="do not run `cargo build --release --bin exp`")
    ap.add_argument("--exp-bin", default=None, help="exp binary to run (default: the one cargo builds, or target/release/exp)")
    ap.add_argument("--target", default="models/target", help="target model directory (default: %(default)s)")
    ap.add_argument("--draft", default="models/draft", help="draft model directory (default: %(default)s)")
    ap.add_argument("--cache", choices=("staged", "slack"), default="staged",
                    help="specdec rotating-cache rollback strategy (default: %(default)s)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="let both sides stop at EOS (default: never stop early, exactly --max-new-tokens each)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write all figures and per-prompt records to PATH")
    ap.add_argument("--keep-specdec-out", default=None, metavar="DIR",
                    help="keep exp's result folder at DIR (must not exist; default: a temporary folder, deleted)")
    args = ap.parse_args(argv)
    if args.limit < 1:
        ap.error("--limit must be >= 1")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    return args


def repo_path(p):
    return p if os.path.isabs(p) else os.path.join(REPO, p)


# ---------------------------------------------------------------------------------------------
# Machine


def cpu_model():
    names, fallback = [], None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key, value = key.strip().lower(), value.strip()
                if key in ("model name", "cpu model") and value:
                    names.append(value)
                elif key in ("hardware", "processor") and value and not value.isdigit() and fallback is None:
                    fallback = value
    except OSError:
        pass
    if names:
        return names[0]
    return fallback or platform.processor() or platform.machine() or "unknown"


def core_counts():
    logical = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    physical = set()
    try:
        with open("/proc/cpuinfo") as fh:
            phys = core = None
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    phys = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not line.strip():
                    if core is not None:
                        physical.add((phys, core))
                    phys = core = None
            if core is not None:
                physical.add((phys, core))
    except OSError:
        pass
    return {"logical": logical, "usable": usable, "physical": len(physical) or None}


# ---------------------------------------------------------------------------------------------
# Prompts (the same rules as src/experiment/dataset.rs and chat.rs)


def load_prompts(path, limit):
    """Blank lines skipped; {"id", "prompt"} (id defaults to the 1-based line number) or
    Spec-Bench {"question_id", "turns"} (first turn used); the first `limit` records."""
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SetupError(f"{path} line {number}: not valid JSON: {e}")
            if not isinstance(obj, dict):
                raise SetupError(f"{path} line {number}: expected a JSON object")
            if "turns" in obj:
                turns = obj["turns"]
                if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                    raise SetupError(f"{path} line {number}: `turns` must be a non-empty list of strings")
                pid, text = obj.get("question_id"), turns[0]
                if pid is None:
                    raise SetupError(f"{path} line {number}: Spec-Bench lines need a `question_id`")
            elif isinstance(obj.get("prompt"), str):
                pid, text = obj.get("id"), obj["prompt"]
                if pid is None:
                    pid = number
            else:
                raise SetupError(f"{path} line {number}: expected {{\"id\", \"prompt\"}} or Spec-Bench's "
                                 "{\"question_id\", \"category\", \"turns\"}")
            prompts.append({"id": str(pid), "text": text})
    if not prompts:
        raise SetupError(f"{path}: no prompts")
    return prompts[:limit]


def encode_prompts(prompts, target_dir):
    from tokenizers import Tokenizer

    tok_path = os.path.join(target_dir, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tok_path)
    for p in prompts:
        ids = tokenizer.encode(p["text"], add_special_tokens=False).ids
        if not ids:
            raise SetupError(f"prompt {p['id']}: encodes to no tokens")
        p["ids"] = ids
    # Cross-check with transformers' own fast tokenizer (the path a transformers user takes).
    try:
        from transformers import AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(target_dir)
        for p in prompts:
            hf_ids = hf_tok(p["text"], add_special_tokens=False)["input_ids"]
            if hf_ids != p["ids"]:
                print(f"warning: AutoTokenizer encodes prompt {p['id']} differently from tokenizer.json "
                      f"({len(hf_ids)} vs {len(p['ids'])} tokens); the tokenizer.json ids (exp's) are used",
                      file=sys.stderr)
    except Exception as e:  # informative only
        print(f"note: AutoTokenizer cross-check skipped: {e}", file=sys.stderr)
    return tokenizer


# ---------------------------------------------------------------------------------------------
# specdec (exp)


def build_exp(args):
    if args.exp_bin:
        return os.path.abspath(args.exp_bin)
    target_dir = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    default_bin = os.path.join(repo_path(target_dir), "release", "exp")
    if args.skip_build:
        if not os.path.isfile(default_bin):
            raise SetupError(f"--skip-build: {default_bin} does not exist (build it, or pass --exp-bin)")
        return default_bin
    cmd = ["cargo", "build", "--release", "--bin", "exp", "--message-format=json-render-diagnostics"]
    print("$ " + " ".join(cmd[:5]), flush=True)
    try:
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise SetupError("cargo not found (install Rust, or pass --skip-build / --exp-bin)")
    if proc.returncode != 0:
        raise SetupError(f"cargo build failed (exit {proc.returncode}); see the messages above")
    exe = None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "exp" \
                and msg.get("executable"):
            exe = msg["executable"]
    return exe or default_bin


def toml_str(s):
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(str(s))


def specdec_config(args, prompts_path, target_dir, draft_dir):
    return "\n".join([
        "# written by scripts/compare_transformers.py",
        'name = "compare-transformers"',
        "seed = 0",
        f"max_new_tokens = {args.max_new_tokens}",
        f"stop_at_eos = {'true' if args.stop_at_eos else 'false'}",
        "warmup = true",
        'device = "cpu"',
        'dtype = "f32"',
        "",
        "[target]",
        f"path = {toml_str(target_dir)}",
        "",
        "[drafters.draft]",
        'kind = "model"',
        f"path = {toml_str(draft_dir)}",
        "",
        "[dataset]",
        f"path = {toml_str(prompts_path)}",
        f"limit = {args.limit}",
        "chat_template = false",
        "",
        "[sweep]",
        'method = ["autoregressive", "speculative"]',
        'drafter = ["draft"]',
        f"gamma = [{GAMMA}]",
        "temperature = [0.0]",
        "top_k = [0]",
        "top_p = [1.0]",
        f'cache = ["{args.cache}"]',
        "",
    ])


def run_specdec(args, exe, prompts_path, target_dir, draft_dir):
    tmp = tempfile.mkdtemp(prefix="compare-transformers-")
    try:
        config_path = os.path.join(tmp, "config.toml")
        with open(config_path, "w") as fh:
            fh.write(specdec_config(args, prompts_path, target_dir, draft_dir))
        out = os.path.abspath(args.keep_specdec_out) if args.keep_specdec_out else os.path.join(tmp, "run")
        env = dict(os.environ)
        if args.threads is not None:
            env["RAYON_NUM_THREADS"] = str(args.threads)
            env["CANDLE_NUM_THREADS"] = str(args.threads)
        cmd = [exe, "run", config_path, "--out", out, "--no-progress"]
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SetupError(f"exp failed (exit {proc.returncode})")
        if proc.stderr.strip():
            sys.stderr.write(proc.stderr)
        records = []
        with open(os.path.join(out, "results.jsonl")) as fh:
            for line in fh:
                if line.strip():
                    records.append(json.loads(line))
        return records, out if args.keep_specdec_out else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def specdec_runs(records, prompts):
    """{"specdec_ar": per-prompt list, "specdec_spec": per-prompt list} in prompt order."""
    by_method = {"autoregressive": {}, "speculative": {}}
    for r in records:
        if r["method"] not in by_method:
            raise SetupError(f"exp produced an unexpected method {r['method']!r}")
        if r["prompt_id"] in by_method[r["method"]]:
            raise SetupError(f"exp produced two {r['method']} records for prompt {r['prompt_id']}")
        by_method[r["method"]][r["prompt_id"]] = r
    runs = {}
    for method, key in (("autoregressive", "specdec_ar"), ("speculative", "specdec_spec")):
        got = by_method[method]
        if [p["id"] for p in prompts] != [pid for pid in got]:
            raise SetupError(f"exp's {method} prompts {list(got)} differ from this script's "
                             f"{[p['id'] for p in prompts]}")
        runs[key] = []
        for p in prompts:
            r = got[p["id"]]
            if r["prompt_tokens"] != len(p["ids"]):
                raise SetupError(f"prompt {p['id']}: exp encoded {r['prompt_tokens']} prompt tokens, this script "
                                 f"{len(p['ids'])}: the prompt ids cannot be reproduced")
            if method == "speculative" and (r.get("drafter") != "draft" or r.get("gamma") != GAMMA):
                raise SetupError(f"unexpected speculative record: drafter {r.get('drafter')} gamma {r.get('gamma')}")
            runs[key].append({
                "prompt_id": p["id"],
                "output_ids": list(r["output_ids"]),
                "new_tokens": r["new_tokens"],
                "seconds": r["wall_s"],
                "target_forwards": r["target_forwards"],
                "draft_forwards": r["draft_forwards"],
                "accepted": sum(r["accepted"]),
                "proposed": sum(r["proposed"]),
                "stop_reason": r.get("stop_reason"),
            })
    return runs


# ---------------------------------------------------------------------------------------------
# transformers


def quiet_transformers():
    import transformers

    transformers.utils.logging.disable_progress_bar()

    class DropAssistantKwargsWarning(logging.Filter):
        # Assisted generation calls the assistant's generate with a generation_config plus
        # max/min_new_tokens internally; transformers then warns about its own call.
        def filter(self, record):
            return "together with generation-related" not in record.getMessage()

    logging.getLogger("transformers.generation.utils").addFilter(DropAssistantKwargsWarning())


def load_hf(path, torch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def plain_generation_config(args, eos_ids):
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=eos_ids if args.stop_at_eos else None,
        pad_token_id=eos_ids[0] if eos_ids else 0,
        use_cache=True,
    )


def assistant_generation_config(args, eos_ids):
    """transformers reads the draft settings from `assistant_model.generation_config`
    (AssistedCandidateGenerator.__init__ deep-copies it; passing them to `generate` sets them on
    the target's config, which the candidate generator does not read)."""
    gc = plain_generation_config(args, eos_ids)
    gc.num_assistant_tokens = GAMMA
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0  # default 0.4: stop drafting below that probability
    return gc


class ForwardCounter:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def take(self):
        n, self.n = self.n, 0
        return n


def run_hf(args, prompts, target, draft, torch):
    eos_ids = target.generation_config.eos_token_id
    if eos_ids is None:
        eos_ids = target.config.eos_token_id
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    target.generation_config = plain_generation_config(args, eos_ids)
    draft.generation_config = assistant_generation_config(args, eos_ids)
    t_count, d_count = ForwardCounter(target), ForwardCounter(draft)

    def generate(ids, assisted):
        input_ids = torch.tensor([ids], dtype=torch.long)
        kwargs = dict(attention_mask=torch.ones_like(input_ids), generation_config=target.generation_config)
        if assisted:
            kwargs["assistant_model"] = draft
        with torch.inference_mode():
            start = time.perf_counter()
            out = target.generate(input_ids, **kwargs)
            seconds = time.perf_counter() - start
        out = out[0].tolist()
        if out[:len(ids)] != ids:
            raise SetupError("transformers' generate did not echo the prompt")
        return out[len(ids):], seconds

    runs = {}
    for key, assisted in (("hf_plain", False), ("hf_assisted", True)):
        generate(prompts[0]["ids"], assisted)  # untimed warm-up
        t_count.take(), d_count.take()
        runs[key] = []
        for p in prompts:
            new, seconds = generate(p["ids"], assisted)
            runs[key].append({
                "prompt_id": p["id"],
                "output_ids": new,
                "new_tokens": len(new),
                "seconds": seconds,
                "target_forwards": t_count.take(),
                "draft_forwards": d_count.take(),
            })
        print(f"  {key}: done", flush=True)
    t_count.handle.remove()
    d_count.handle.remove()
    return runs, eos_ids


# ---------------------------------------------------------------------------------------------
# Comparison and report


def compare_outputs(prompts, runs):
    """Mismatches against HF plain: [{prompt_id, run, position, ...}]."""
    problems = []
    for i, p in enumerate(prompts):
        ref = runs["hf_plain"][i]["output_ids"]
        for key, name in RUNS[1:]:
            got = runs[key][i]["output_ids"]
            if got == ref:
                continue
            pos = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            problems.append({
                "prompt_id": p["id"], "prompt_index": i, "run": key, "run_name": name, "position": pos,
                "hf_plain_token": ref[pos] if pos < len(ref) else None,
                "run_token": got[pos] if pos < len(got) else None,
                "hf_plain_len": len(ref), "run_len": len(got),
            })
    return problems


def near_tie_note(problem, prompts, runs, target, torch):
    """The target's top-2 logits at the first differing position (a full forward over prompt +
    the common prefix, no cache): a tiny margin points at f32 rounding, a large one at a bug."""
    p = prompts[problem["prompt_index"]]
    prefix = runs["hf_plain"][problem["prompt_index"]]["output_ids"][:problem["position"]]
    with torch.inference_mode():
        logits = target(torch.tensor([p["ids"] + prefix]), use_cache=False).logits[0, -1].float()
    top = torch.topk(logits, 2)
    info = {"top1": int(top.indices[0]), "top2": int(top.indices[1]),
            "margin": float(top.values[0] - top.values[1])}
    tok = problem["run_token"]
    if tok is not None:
        info["run_token_gap"] = float(top.values[0] - logits[tok])
    return info


def summarize(runs):
    out = {}
    for key, _ in RUNS:
        recs = runs[key]
        tokens = sum(r["new_tokens"] for r in recs)
        seconds = sum(r["seconds"] for r in recs)
        out[key] = {
            "new_tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
            "target_forwards": sum(r["target_forwards"] for r in recs),
            "draft_forwards": sum(r["draft_forwards"] for r in recs),
        }
    return out


def ratio(summary, a, b):
    return summary[a]["tokens_per_s"] / summary[b]["tokens_per_s"]


def main(argv=None):
    args = parse_args(argv)
    os.chdir(REPO)
    prompts_path = os.path.abspath(repo_path(args.prompts))
    target_dir = os.path.abspath(repo_path(args.target))
    draft_dir = os.path.abspath(repo_path(args.draft))

    import torch
    import transformers
    import tokenizers

    quiet_transformers()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    cores = core_counts()
    env = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cores": cores,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch_threads": torch.get_num_threads(),
        # candle: RAYON_NUM_THREADS, else the CPUs of the affinity mask (its barrier pool also
        # reads CANDLE_NUM_THREADS); --threads sets both variables for exp.
        "specdec_threads": int(args.threads if args.threads is not None
                               else os.environ.get("RAYON_NUM_THREADS") or cores["usable"]),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    settings = {
        "prompts": os.path.relpath(prompts_path, REPO), "limit": args.limit,
        "max_new_tokens": args.max_new_tokens, "stop_at_eos": args.stop_at_eos, "gamma": GAMMA,
        "cache": args.cache, "target": os.path.relpath(target_dir, REPO), "draft": os.path.relpath(draft_dir, REPO),
        "dtype": "f32", "device": "cpu", "greedy": True,
    }
    print(f"date:         {env['date']}")
    print(f"cpu:          {env['cpu_model']}")
    print(f"cores:        {cores['logical']} logical ({cores['usable']} usable"
          + (f", {cores['physical']} physical)" if cores["physical"] else ")"))
    print(f"versions:     python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
          f"tokenizers {env['tokenizers']}")
    print(f"threads:      torch {env['torch_threads']}, specdec (candle) {env['specdec_threads']}"
          + ("" if args.threads is not None else " (defaults)"))
    if env["load_average_at_start"] is not None:
        load1 = env["load_average_at_start"][0]
        busy = load1 > 0.5 * max(1, cores["usable"])
        print(f"load average: {load1:.2f} (1 min)"
              + ("  WARNING: the machine is busy; timings (torch's above all) will be distorted" if busy else ""))
    prompts = load_prompts(prompts_path, args.limit)
    print(f"settings:     {settings['prompts']} x {len(prompts)} prompts, "
          f"{args.max_new_tokens} new tokens, greedy, f32 CPU, gamma {GAMMA}, "
          f"{'stop at EOS' if args.stop_at_eos else 'EOS not a stop'}, specdec cache {args.cache}")

    encode_prompts(prompts, target_dir)

    exe = build_exp(args)
    print("specdec: running exp ...", flush=True)
    records, kept = run_specdec(args, exe, prompts_path, target_dir, draft_dir)
    runs = specdec_runs(records, prompts)
    if kept:
        print(f"  exp results kept in {kept}")

    print("transformers: loading models ...", flush=True)
    target, draft = load_hf(target_dir, torch), load_hf(draft_dir, torch)
    attn = getattr(target.config, "_attn_implementation", None)
    settings["hf_attn_implementation"] = attn
    settings["hf_target_class"] = type(target).__name__
    settings["hf_draft_class"] = type(draft).__name__
    hf, eos_ids = run_hf(args, prompts, target, draft, torch)
    runs.update(hf)
    settings["eos_token_ids"] = eos_ids

    summary = summarize(runs)
    ratios = {
        "specdec_ar/hf_plain": ratio(summary, "specdec_ar", "hf_plain"),
        "specdec_spec/hf_plain": ratio(summary, "specdec_spec", "hf_plain"),
        "specdec_spec/specdec_ar": ratio(summary, "specdec_spec", "specdec_ar"),
        "hf_assisted/hf_plain": ratio(summary, "hf_assisted", "hf_plain"),
    }
    targets = [{"target": label, "ratio": ratio(summary, a, b), "threshold": t, "met": ratio(summary, a, b) >= t}
               for label, a, b, t in TARGETS]

    print()
    print(f"{'run':<14}{'new tokens':>11}{'seconds':>10}{'tokens/s':>10}{'target fwd':>12}{'draft fwd':>11}")
    for key, name in RUNS:
        s = summary[key]
        print(f"{name:<14}{s['new_tokens']:>11}{s['seconds']:>10.3f}{s['tokens_per_s']:>10.1f}"
              f"{s['target_forwards']:>12}{s['draft_forwards']:>11}")
    spec = runs["specdec_spec"]
    proposed = sum(r["proposed"] for r in spec)
    if proposed:
        accepted = sum(r["accepted"] for r in spec)
        print(f"specdec spec: {accepted}/{proposed} drafts accepted ({accepted / proposed:.1%})")
    print()
    print("ratios (tokens/s):")
    for k, v in ratios.items():
        print(f"  {k:<26}{v:>7.2f}x")
    print("targets: " + "; ".join(f"{t['target']}: {'met' if t['met'] else 'not met'} ({t['ratio']:.2f}x)"
                                  for t in targets))

    problems = compare_outputs(prompts, runs)
    for pr in problems:
        try:
            pr["target_logits_at_position"] = near_tie_note(pr, prompts, runs, target, torch)
        except Exception as e:  # diagnostics only
            pr["target_logits_at_position"] = {"error": str(e)}
    counts = {key: [r["new_tokens"] for r in runs[key]] for key, _ in RUNS}
    if not args.stop_at_eos:
        short = [(key, prompts[i]["id"], n) for key, ns in counts.items() for i, n in enumerate(ns)
                 if n != args.max_new_tokens]
        for key, pid, n in short:
            problems.append({"prompt_id": pid, "run": key, "position": None,
                             "message": f"{n} new tokens instead of {args.max_new_tokens}"})

    if args.json:
        doc = {"environment": env, "settings": settings, "summary": summary, "ratios": ratios, "targets": targets,
               "identical_outputs": not problems, "mismatches": problems,
               "prompts": [{"id": p["id"], "prompt_ids": p["ids"]} for p in prompts], "runs": runs}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        print(f"json: {args.json}")

    print()
    if problems:
        print(f"OUTPUT MISMATCH: {len(problems)} problem(s) (reference: HF plain)")
        for pr in problems:
            if pr.get("position") is None:
                print(f"  prompt {pr['prompt_id']!r}: {pr['run']}: {pr['message']}")
                continue
            tl = pr.get("target_logits_at_position", {})
            detail = ""
            if "margin" in tl:
                detail = (f"; HF target top-2 there: {tl['top1']}, {tl['top2']} (margin {tl['margin']:.4g}"
                          + (f", gap to {pr['run_token']}: {tl['run_token_gap']:.4g}" if "run_token_gap" in tl else "")
                          + ")")
            print(f"  prompt {pr['prompt_id']!r}: {pr['run_name']} differs from HF plain at new-token position "
                  f"{pr['position']}: {pr['run_token']} vs {pr['hf_plain_token']} "
                  f"(lengths {pr['run_len']} vs {pr['hf_plain_len']}){detail}")
        return 1
    print(f"outputs: identical token ids in all four runs for all {len(prompts)} prompts "
          f"({counts['hf_plain']} new tokens)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
