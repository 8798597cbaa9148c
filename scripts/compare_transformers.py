#!/usr/bin/env python3
"""Side-by-side CPU benchmark: specdec against Hugging Face transformers, greedy, same models.

One invocation runs four greedy generations of the same prompts with the same number of new
tokens, all in f32 on the CPU of this machine:

  1. HF plain      transformers `generate` with the target (models/target, Mistral, window 64);
  2. HF assisted   transformers assisted generation, assistant_model = the draft
                   (models/draft, Llama), 4 draft tokens per step, constant schedule, no
                   confidence early stop (see `assistant_generation_config`);
  3. specdec AR    `exp` (src/bin/exp.rs), method "autoregressive";
  4. specdec spec  `exp`, method "speculative", drafter = the draft model, gamma = 4.

Run-to-run throughput on a shared or virtual machine easily varies by 2x, and the speed drifts
on a scale of seconds, so the four are measured close together in time on the same prompt:
the whole set is measured --repeats N times (default 5 rounds), and within a round prompt by
prompt. For round r and prompt p three units run back to back: (a) one `exp run` on a dataset
holding just prompt p (a one-record JSONL, in the source file's format, written to a temporary
folder) whose sweep holds both specdec methods, (b) HF plain on p, (c) HF assisted on p. The
order of the three units rotates by one per prompt and per round (round 1: prompt 1 a b c,
prompt 2 b c a, prompt 3 c a b, ...; round 2 starts at b c a), so no unit always runs first or
last. Inside (a) the order is fixed: exp always runs the autoregressive sweep point before the
speculative one (src/experiment/sweep.rs, `sweep_points`; the config cannot change it), so
specdec AR always runs just before specdec spec of the same prompt, in the same process. The
HF models are loaded once, before round 1, and each HF configuration gets one untimed warm-up
`generate` before round 1 only; exp is a fresh process for every (round, prompt), with its own
untimed warm-up (a few tokens per model on that prompt) and model loading (about 0.1 s, not
timed), so a full default run makes 8 prompts x 5 rounds = 40 exp invocations.

It prints one line per (round, prompt) with the unit order and the four generation times; per
round the tokens/s of each method and specdec's paired spec/AR ratio; then per method the
median tokens/s over the rounds with the min-max range; the ratios between methods as ratios
of those medians; specdec spec/AR as the median of the per-round paired ratios; and specdec
spec/AR pooled over all rounds and prompts, sum(AR seconds) / sum(spec seconds) for the same
tokens. The targets "specdec AR >= 2x HF plain" and "specdec spec >= 3x HF plain" are judged
on the ratio of medians, "specdec spec >= 1.3x specdec AR" on the median of the per-round
paired ratios (each target line names the figure it uses; the pooled ratio is printed for
information and not judged). It checks that the four produced exactly the same token ids for
every prompt in every round (reference: HF plain of round 1), exiting with status 1 naming the
round, the prompt and the first differing position otherwise; 2 for a usage or setup error.

Setup and usage (from the repository root):

    python3 -m venv ~/venv-hf && . ~/venv-hf/bin/activate
    pip install -r scripts/requirements-compare.txt
    python scripts/compare_transformers.py                      # 8 code prompts x 128 tokens, 5 rounds
    python scripts/compare_transformers.py --limit 2 --max-new-tokens 32 --repeats 2 --json /tmp/cmp.json
    python scripts/compare_transformers.py --threads 2 --skip-build

Options: --prompts PATH (default configs/prompts/code.jsonl), --limit N (8), --max-new-tokens
N (128), --repeats N (5 rounds), --threads N (torch.set_num_threads, and RAYON_NUM_THREADS /
CANDLE_NUM_THREADS for exp; default: each library's own default, printed), --skip-build (use
the existing target/release/exp, or --exp-bin PATH), --stop-at-eos (see below), --cache
staged|slack (specdec's rotating-cache rollback), --json PATH (all figures: per round, every
method's per-prompt records and timings, the unit order of each prompt, tokens/s and ratios;
then the medians, ranges, the pooled spec/AR ratio and the targets), --keep-specdec-out DIR
(keep exp's result folders, DIR/round-R/prompt-I for round R and the I-th prompt, each with the
one-record dataset it ran on as dataset.jsonl).

What is compared, and how it is kept identical:
  * Prompt tokens: exp encodes the first turn of each JSONL record (`prompt`, or Spec-Bench
    `turns[0]`) with models/target/tokenizer.json through the Rust `tokenizers` crate,
    `encode(text, add_special_tokens=false)`, no chat template (dataset.chat_template is false
    by default and is left so here), no BOS (the tokenizer has none and adds none). This
    script does the same with the Python `tokenizers` package (the same Rust library) on the
    same text, and checks every prompt's length against exp's `prompt_tokens`. Each one-record
    dataset is the source line's JSON object unchanged, except that a simple-format record
    without an `id` gets its source line number as `id` (exp's default id), so exp reports the
    same prompt id as it would for the whole file.
  * New tokens: by default neither side stops at EOS (exp: `stop_at_eos = false`; HF:
    `eos_token_id = None` on both generation configs), so every generation has exactly
    --max-new-tokens tokens and EOS (id 0) is an ordinary token. `min_new_tokens` is NOT used:
    it works by setting the EOS logit to -inf, which would change the greedy choice wherever
    EOS is the argmax and so break the token-for-token comparison. With --stop-at-eos both sides
    stop after emitting EOS (the EOS is counted as a new token on both sides).
  * Timing: specdec seconds per prompt = `wall_s` of that prompt's record in its exp
    results.jsonl (prefill + decoding of one generation, not model loading, not exp's warm-up);
    HF seconds per prompt = the time of the `generate` call (loading and tokenisation are not
    timed; every `generate` runs under torch.inference_mode()). Per round and method: tokens/s
    = sum(new tokens) / sum(seconds) over the prompts. Over the rounds: median (and min, max)
    of each method's per-round tokens/s; method ratios = ratio of the medians; paired specdec
    spec/AR = median over rounds of (spec tokens/s / AR tokens/s of the same round); pooled
    specdec spec/AR = (sum of spec tokens / sum of spec seconds) / (sum of AR tokens / sum of
    AR seconds) over all rounds and prompts, which is sum(AR seconds) / sum(spec seconds)
    when the token counts agree (they must; see above).
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
import statistics
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
    ap.add_argument("--repeats", type=int, default=5,
                    help="measurement rounds; in each, every prompt runs exp (AR, spec), HF plain and HF "
                         "assisted back to back in a rotating order; medians are reported (default: %(default)s)")
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
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="write all figures (every round's per-prompt records and timings, unit orders, "
                         "tokens/s, ratios) to PATH")
    ap.add_argument("--keep-specdec-out", default=None, metavar="DIR",
                    help="keep exp's result folders at DIR/round-R/prompt-I (round R, I-th prompt; DIR must "
                         "not exist; default: temporary folders, deleted)")
    args = ap.parse_args(argv)
    if args.limit < 1:
        ap.error("--limit must be >= 1")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
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
            prompts.append({"id": str(pid), "text": text, "record": obj})
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


def single_prompt_line(prompt):
    """The prompt's source JSONL object as one line; a simple-format record without an `id` gets
    its source line number (exp's default id, kept in prompt["id"]) so the id does not change."""
    obj = dict(prompt["record"])
    if "turns" not in obj and obj.get("id") is None:
        obj["id"] = prompt["id"]
    return json.dumps(obj, ensure_ascii=False) + "\n"


def specdec_config(args, dataset_path, target_dir, draft_dir):
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
        f"path = {toml_str(dataset_path)}",
        "limit = 1",
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


def run_specdec(args, exe, prompt, target_dir, draft_dir, keep_dir=None, echo=True):
    """One `exp run` of both specdec methods (AR, then spec: exp's fixed order) on a one-record
    dataset holding just `prompt`; returns (results.jsonl records, keep_dir or None)."""
    tmp = tempfile.mkdtemp(prefix="compare-transformers-")
    try:
        dataset_path = os.path.join(tmp, "dataset.jsonl")
        with open(dataset_path, "w", encoding="utf-8") as fh:
            fh.write(single_prompt_line(prompt))
        config_path = os.path.join(tmp, "config.toml")
        with open(config_path, "w") as fh:
            fh.write(specdec_config(args, dataset_path, target_dir, draft_dir))
        out = keep_dir or os.path.join(tmp, "run")
        env = dict(os.environ)
        if args.threads is not None:
            env["RAYON_NUM_THREADS"] = str(args.threads)
            env["CANDLE_NUM_THREADS"] = str(args.threads)
        cmd = [exe, "run", config_path, "--out", out, "--no-progress"]
        if echo:
            print("$ " + " ".join(cmd) + "   (and likewise for every round and prompt)", flush=True)
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as e:  # e.g. the binary vanished while cargo relinks it
            raise SetupError(f"cannot run {exe}: {e}")
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
        if keep_dir:
            shutil.copyfile(dataset_path, os.path.join(keep_dir, "dataset.jsonl"))
        return records, keep_dir
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


class HFRunner:
    """transformers side: both generation configs set once; `warm_up` (untimed, once per
    configuration, before round 1) and `run_one` (one timed generation of one prompt)."""

    CONFIGS = (("hf_plain", False), ("hf_assisted", True))

    def __init__(self, args, prompts, target, draft, torch):
        self.prompts, self.target, self.draft, self.torch = prompts, target, draft, torch
        eos_ids = target.generation_config.eos_token_id
        if eos_ids is None:
            eos_ids = target.config.eos_token_id
        self.eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
        target.generation_config = plain_generation_config(args, self.eos_ids)
        draft.generation_config = assistant_generation_config(args, self.eos_ids)
        self.t_count, self.d_count = ForwardCounter(target), ForwardCounter(draft)

    def _generate(self, ids, assisted):
        torch = self.torch
        input_ids = torch.tensor([ids], dtype=torch.long)
        kwargs = dict(attention_mask=torch.ones_like(input_ids), generation_config=self.target.generation_config)
        if assisted:
            kwargs["assistant_model"] = self.draft
        with torch.inference_mode():
            start = time.perf_counter()
            out = self.target.generate(input_ids, **kwargs)
            seconds = time.perf_counter() - start
        out = out[0].tolist()
        if out[:len(ids)] != ids:
            raise SetupError("transformers' generate did not echo the prompt")
        return out[len(ids):], seconds

    def warm_up(self):
        for _, assisted in self.CONFIGS:
            self._generate(self.prompts[0]["ids"], assisted)  # untimed
        self.t_count.take(), self.d_count.take()

    def run_one(self, key, p):
        assisted = dict(self.CONFIGS)[key]
        self.t_count.take(), self.d_count.take()
        new, seconds = self._generate(p["ids"], assisted)
        return {
            "prompt_id": p["id"],
            "output_ids": new,
            "new_tokens": len(new),
            "seconds": seconds,
            "target_forwards": self.t_count.take(),
            "draft_forwards": self.d_count.take(),
        }

    def close(self):
        self.t_count.handle.remove()
        self.d_count.handle.remove()


# ---------------------------------------------------------------------------------------------
# Comparison and report


def compare_outputs(prompts, runs, reference, round_no):
    """Mismatches of one round against the reference (HF plain of round 1):
    [{round, prompt_id, run, position, ...}]. In round 1 HF plain is the reference itself."""
    problems = []
    for i, p in enumerate(prompts):
        ref = reference[i]["output_ids"]
        for key, name in RUNS:
            if key == "hf_plain" and round_no == 1:
                continue
            got = runs[key][i]["output_ids"]
            if got == ref:
                continue
            pos = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            problems.append({
                "round": round_no, "prompt_id": p["id"], "prompt_index": i, "run": key, "run_name": name,
                "position": pos,
                "hf_plain_token": ref[pos] if pos < len(ref) else None,
                "run_token": got[pos] if pos < len(got) else None,
                "hf_plain_len": len(ref), "run_len": len(got),
            })
    return problems


def near_tie_note(problem, prompts, reference, target, torch):
    """The target's top-2 logits at the first differing position (a full forward over prompt +
    the common prefix, no cache): a tiny margin points at f32 rounding, a large one at a bug."""
    p = prompts[problem["prompt_index"]]
    prefix = reference[problem["prompt_index"]]["output_ids"][:problem["position"]]
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
    """One round: per method, sums over the prompts and tokens/s = sum(tokens) / sum(seconds)."""
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
        if key == "specdec_spec":
            out[key]["accepted"] = sum(r["accepted"] for r in recs)
            out[key]["proposed"] = sum(r["proposed"] for r in recs)
    return out


RATIOS = (
    ("specdec_ar/hf_plain", "specdec_ar", "hf_plain"),
    ("specdec_spec/hf_plain", "specdec_spec", "hf_plain"),
    ("specdec_spec/specdec_ar", "specdec_spec", "specdec_ar"),
    ("hf_assisted/hf_plain", "hf_assisted", "hf_plain"),
)
PAIRED = "specdec_spec/specdec_ar"  # both from one exp process per prompt: judged on the median paired ratio


def ratio_of(tps, a, b):
    return tps[a] / tps[b] if tps[b] > 0 else float("nan")


def pooled_spec_over_ar(rounds):
    """specdec spec/AR over all rounds and prompts together: (sum spec tokens / sum spec seconds)
    / (sum AR tokens / sum AR seconds), i.e. sum(AR seconds) / sum(spec seconds) for equal tokens."""
    ar_s = sum(r["summary"]["specdec_ar"]["seconds"] for r in rounds)
    spec_s = sum(r["summary"]["specdec_spec"]["seconds"] for r in rounds)
    ar_t = sum(r["summary"]["specdec_ar"]["new_tokens"] for r in rounds)
    spec_t = sum(r["summary"]["specdec_spec"]["new_tokens"] for r in rounds)
    ratio = (spec_t / spec_s) / (ar_t / ar_s) if spec_s > 0 and ar_s > 0 and ar_t > 0 else float("nan")
    return {"ratio": PAIRED, "value": ratio, "ar_seconds": ar_s, "spec_seconds": spec_s,
            "ar_new_tokens": ar_t, "spec_new_tokens": spec_t,
            "generations_per_method": sum(len(r["runs"]["specdec_ar"]) for r in rounds)}


def aggregate(rounds):
    """Over the rounds: per method median/min/max tokens/s; ratios of the medians; per-round
    paired specdec spec/AR ratios and their median; the pooled spec/AR ratio; the targets."""
    methods = {}
    for key, _ in RUNS:
        per_round = [r["summary"][key]["tokens_per_s"] for r in rounds]

        def span(field):
            vals = sorted({r["summary"][key][field] for r in rounds})
            return vals[0] if len(vals) == 1 else vals

        methods[key] = {
            "median_tokens_per_s": statistics.median(per_round),
            "min_tokens_per_s": min(per_round),
            "max_tokens_per_s": max(per_round),
            "per_round_tokens_per_s": per_round,
            "per_round_seconds": [r["summary"][key]["seconds"] for r in rounds],
            # identical every round when the outputs are (a list of the distinct values otherwise)
            "new_tokens": span("new_tokens"),
            "target_forwards": span("target_forwards"),
            "draft_forwards": span("draft_forwards"),
        }
    medians = {key: m["median_tokens_per_s"] for key, m in methods.items()}
    ratios = {name: ratio_of(medians, a, b) for name, a, b in RATIOS}
    paired_per_round = [r["ratios"][PAIRED] for r in rounds]
    paired = {"ratio": PAIRED, "per_round": paired_per_round,
              "median": statistics.median(paired_per_round),
              "min": min(paired_per_round), "max": max(paired_per_round)}
    pooled = pooled_spec_over_ar(rounds)
    targets = []
    for label, a, b, t in TARGETS:
        if f"{a}/{b}" == PAIRED:
            value, basis = paired["median"], "uses the median of the per-round paired spec/AR ratios"
        else:
            value, basis = ratio_of(medians, a, b), "uses the ratio of the median tokens/s"
        targets.append({"target": label, "ratio": value, "basis": basis, "threshold": t, "met": value >= t})
    return methods, ratios, paired, pooled, targets


def fmt_span(v):
    return f"{v}" if not isinstance(v, list) else f"{v[0]}..{v[-1]}"


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
        "dtype": "f32", "device": "cpu", "greedy": True, "repeats": args.repeats,
        "schedule": "per round, per prompt: one exp run on that prompt alone (AR, then spec: exp's fixed "
                    "order), HF plain, HF assisted; the unit order rotates by one per prompt and per round",
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
          f"{'stop at EOS' if args.stop_at_eos else 'EOS not a stop'}, specdec cache {args.cache}, "
          f"{args.repeats} round(s)")

    encode_prompts(prompts, target_dir)

    keep_root = None
    if args.keep_specdec_out:
        keep_root = os.path.abspath(args.keep_specdec_out)
        if os.path.exists(keep_root):
            raise SetupError(f"--keep-specdec-out {keep_root} already exists")
    exe = build_exp(args)

    print("transformers: loading models ...", flush=True)
    target, draft = load_hf(target_dir, torch), load_hf(draft_dir, torch)
    attn = getattr(target.config, "_attn_implementation", None)
    settings["hf_attn_implementation"] = attn
    settings["hf_target_class"] = type(target).__name__
    settings["hf_draft_class"] = type(draft).__name__
    hf = HFRunner(args, prompts, target, draft, torch)
    settings["eos_token_ids"] = hf.eos_ids
    print("transformers: untimed warm-up (one generate per configuration) ...", flush=True)
    hf.warm_up()
    if keep_root:
        os.makedirs(keep_root)

    units = ("specdec", "hf_plain", "hf_assisted")
    letters = {"specdec": "S", "hf_plain": "P", "hf_assisted": "A"}
    print("units per (round, prompt): S = specdec exp run (AR, then spec), P = HF plain, A = HF assisted; "
          "seconds are generation times")
    rounds = []
    echo = True
    for r in range(args.repeats):
        round_no = r + 1
        load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        print(f"round {round_no}/{args.repeats}" + (f"  (load {load[0]:.2f})" if load else ""), flush=True)
        if keep_root:
            os.makedirs(os.path.join(keep_root, f"round-{round_no}"))
        runs = {key: [] for key, _ in RUNS}
        orders, per_prompt = [], []
        for i, p in enumerate(prompts):
            shift = (r + i) % len(units)
            order = units[shift:] + units[:shift]
            got = {}
            for unit in order:
                if unit == "specdec":
                    keep_dir = (os.path.join(keep_root, f"round-{round_no}", f"prompt-{i + 1}")
                                if keep_root else None)
                    records, _ = run_specdec(args, exe, p, target_dir, draft_dir, keep_dir, echo=echo)
                    echo = False
                    for key, recs in specdec_runs(records, [p]).items():
                        got[key] = recs[0]
                else:
                    got[unit] = hf.run_one(unit, p)
            for key, _ in RUNS:
                runs[key].append(got[key])
            orders.append(list(order))
            secs = {key: got[key]["seconds"] for key, _ in RUNS}
            toks = {key: got[key]["new_tokens"] for key, _ in RUNS}
            pair = ((toks["specdec_spec"] / secs["specdec_spec"]) / (toks["specdec_ar"] / secs["specdec_ar"])
                    if secs["specdec_spec"] > 0 and secs["specdec_ar"] > 0 and toks["specdec_ar"] else float("nan"))
            per_prompt.append({"prompt_id": p["id"], "order": list(order), "seconds": secs, "new_tokens": toks,
                               "specdec_spec/specdec_ar": pair})
            print(f"  {i + 1}/{len(prompts)} {p['id']:<18.18} {''.join(letters[u] for u in order)}  "
                  + ", ".join(f"{name} {secs[key]:.3f} s" for key, name in RUNS)
                  + f"; spec/AR {pair:.2f}x", flush=True)
        summary = summarize(runs)
        tps = {key: summary[key]["tokens_per_s"] for key, _ in RUNS}
        rounds.append({
            "round": round_no, "orders": orders, "load_average_at_start": load,
            "summary": summary, "ratios": {name: ratio_of(tps, a, b) for name, a, b in RATIOS},
            "per_prompt": per_prompt, "runs": runs,
        })
        print("  tokens/s: " + ", ".join(f"{name} {tps[key]:.1f}" for key, name in RUNS)
              + f"; specdec spec/AR {rounds[-1]['ratios'][PAIRED]:.2f}x", flush=True)
    if keep_root:
        print(f"exp results kept in {keep_root}/round-R/prompt-I")
    hf.close()

    methods, ratios, paired, pooled, targets = aggregate(rounds)

    print()
    print("tokens/s per round (sum of new tokens / sum of generation seconds over the prompts; order = the "
          "units' order for the round's first prompt, rotating by one per prompt):")
    print(f"{'round':<7}{'order':<7}" + "".join(f"{name:>14}" for _, name in RUNS) + f"{'spec/AR':>10}")
    for rd in rounds:
        print(f"{rd['round']:<7}{''.join(letters[u] for u in rd['orders'][0]):<7}"
              + "".join(f"{rd['summary'][key]['tokens_per_s']:>14.1f}" for key, _ in RUNS)
              + f"{rd['ratios'][PAIRED]:>9.2f}x")
    print()
    print(f"over {len(rounds)} round(s):")
    print(f"{'run':<14}{'new tokens':>11}{'median tok/s':>14}{'min-max tok/s':>17}{'target fwd':>12}{'draft fwd':>11}")
    for key, name in RUNS:
        m = methods[key]
        rng = f"{m['min_tokens_per_s']:.1f}-{m['max_tokens_per_s']:.1f}"
        print(f"{name:<14}{fmt_span(m['new_tokens']):>11}{m['median_tokens_per_s']:>14.1f}{rng:>17}"
              f"{fmt_span(m['target_forwards']):>12}{fmt_span(m['draft_forwards']):>11}")
    spec1 = rounds[0]["summary"]["specdec_spec"]
    if spec1["proposed"]:
        print(f"specdec spec: {spec1['accepted']}/{spec1['proposed']} drafts accepted "
              f"({spec1['accepted'] / spec1['proposed']:.1%}, round 1)")
    print()
    print("ratios of the median tokens/s:")
    for k, v in ratios.items():
        print(f"  {k:<26}{v:>7.2f}x")
    print(f"specdec spec/AR paired per round (AR and spec back to back per prompt, same exp process): "
          + ", ".join(f"{v:.2f}x" for v in paired["per_round"])
          + f"; median {paired['median']:.2f}x (min {paired['min']:.2f}x, max {paired['max']:.2f}x)")
    print(f"specdec spec/AR pooled over all {len(rounds)} round(s) x {len(prompts)} prompt(s): "
          f"sum(AR s) {pooled['ar_seconds']:.3f} / sum(spec s) {pooled['spec_seconds']:.3f} "
          f"= {pooled['value']:.2f}x (tokens: AR {pooled['ar_new_tokens']}, spec {pooled['spec_new_tokens']}; "
          "informational, not a target basis)")
    print("targets:")
    for t in targets:
        print(f"  {t['target']}: {'met' if t['met'] else 'not met'} ({t['ratio']:.2f}x; {t['basis']})")

    reference = rounds[0]["runs"]["hf_plain"]
    problems = []
    notes = {}
    for rd in rounds:
        round_problems = compare_outputs(prompts, rd["runs"], reference, rd["round"])
        for pr in round_problems:
            note_key = (pr["prompt_index"], pr["position"], pr["run_token"])
            if note_key not in notes:
                try:
                    notes[note_key] = near_tie_note(pr, prompts, reference, target, torch)
                except Exception as e:  # diagnostics only
                    notes[note_key] = {"error": str(e)}
            pr["target_logits_at_position"] = notes[note_key]
        problems.extend(round_problems)
        if not args.stop_at_eos:
            for key, _ in RUNS:
                for i, rec in enumerate(rd["runs"][key]):
                    if rec["new_tokens"] != args.max_new_tokens:
                        problems.append({"round": rd["round"], "prompt_id": prompts[i]["id"], "run": key,
                                         "position": None,
                                         "message": f"{rec['new_tokens']} new tokens instead of "
                                                    f"{args.max_new_tokens}"})

    if args.json:
        doc = {"environment": env, "settings": settings,
               "summary": methods, "ratios": ratios, "paired_specdec_spec_over_ar": paired,
               "pooled_specdec_spec_over_ar": pooled, "targets": targets,
               "identical_outputs": not problems, "mismatches": problems,
               "prompts": [{"id": p["id"], "prompt_ids": p["ids"]} for p in prompts], "rounds": rounds}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        print(f"json: {args.json}")

    print()
    if problems:
        print(f"OUTPUT MISMATCH: {len(problems)} problem(s) (reference: HF plain, round 1)")
        for pr in problems:
            if pr.get("position") is None:
                print(f"  round {pr['round']}: prompt {pr['prompt_id']!r}: {pr['run']}: {pr['message']}")
                continue
            tl = pr.get("target_logits_at_position", {})
            detail = ""
            if "margin" in tl:
                detail = (f"; HF target top-2 there: {tl['top1']}, {tl['top2']} (margin {tl['margin']:.4g}"
                          + (f", gap to {pr['run_token']}: {tl['run_token_gap']:.4g}" if "run_token_gap" in tl else "")
                          + ")")
            print(f"  round {pr['round']}: prompt {pr['prompt_id']!r}: {pr['run_name']} differs from HF plain "
                  f"(round 1) at new-token position {pr['position']}: {pr['run_token']} vs {pr['hf_plain_token']} "
                  f"(lengths {pr['run_len']} vs {pr['hf_plain_len']}){detail}")
        return 1
    counts = [r["new_tokens"] for r in reference]
    print(f"outputs: identical token ids in all four runs for all {len(prompts)} prompts in all "
          f"{len(rounds)} round(s) ({counts} new tokens)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
