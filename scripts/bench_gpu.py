#!/usr/bin/env python3
"""GPU side-by-side benchmark: specdec (`exp`, a `--features cuda` build) against transformers.

Run on the GPU machine, from the repository root, after scripts/build-cuda.sh (here) and
scripts/gpu-unpack.sh (there):

    LD_LIBRARY_PATH=/usr/local/cuda/lib64 python3 scripts/bench_gpu.py --case default --dtype bf16
    LD_LIBRARY_PATH=/usr/local/cuda/lib64 python3 scripts/bench_gpu.py --case llama8b

Cases
  default   the shipped pair (models/target: Mistral, 64-token sliding window; models/draft:
            Llama). Methods, all greedy with EOS ignored, the same prompts and token count:
              hf_plain     transformers `generate`
              hf_assisted  transformers assisted generation (the draft, 4 tokens per step,
                           constant schedule, no confidence cut-off)
              hf_static    `generate` with cache_implementation="static" (transformers then
                           compiles its decode step itself)
              specdec_ar   exp, method "autoregressive"
              specdec_spec exp, method "speculative", the draft model, gamma = 4
  llama8b   random bf16 weights in the shapes of Llama-3.1-8B (target) and Llama-3.2-1B
            (draft), written once to --models-dir with the shipped tokenizer. The vocabulary
            is the shipped tokenizer's 1,024 ids (6.99B parameters / 13.98 GB target, 0.98B /
            1.95 GB draft: the shapes the GPU issue measured), or SPECDEC_BENCH_VOCAB=128256
            for the real models' (8.03B / 16.06 GB and 1.24B / 2.47 GB). Methods: hf_plain,
            hf_static, specdec_ar, specdec draft-model AR (for the cost ratio c), and the oracle
            drafter (kind = "oracle", forwards of the 1B-shaped draft run for their cost) at
            alpha in {0.6, 0.8, 0.9} x gamma in {2, 4, 8} (--alphas, --gammas). Each oracle
            row shows tau (tokens per target forward) beside its expectation (1 - a^(g+1)) /
            (1 - a) (the oracle's seed is fixed: a small run's tau is one draw), the measured speedup over specdec_ar of the same round, the
            Leviathan et al. prediction (1 - a^(g+1)) / ((1 - a)(g c + 1)) with the measured c
            (it assumes a verification costs one decode step) and the time-accounting
            prediction tau / (g c + v), v = seconds per verification / seconds per AR step.
            With --eagle3, also the oracle running a random EAGLE-3 head of the 8B shape
            (fusing layers 2, 16, 29; draft vocabulary 32,000) for its cost: rows
            oracle<alpha>_eagle3, c = the head's seconds per forward over the AR step's.
  gemma4b   the same methods on random bf16 weights in the shapes of Gemma-3-4B (text,
            target) and Gemma-3-270M (draft), both with sliding-window layers (vocabularies
            262,208 and 262,144), made once by scripts/sliding_shapes.py in --sliding-dir.

exp's sliding-window layers use the rotating-cache strategy of --cache (slack by default, or
staged).

Measurement: --rounds N rounds (default 3); in each, every method runs every prompt, the
methods in an order rotated by one per round (exp runs all its points in one process per
round: models loaded and warmed up untimed). transformers generations are timed around
`generate` with CUDA synchronisation; specdec's from exp's per-generation `wall_s` (prefill +
decode, no loading). Tokens/s per method and round = sum(tokens) / sum(seconds); reported:
the median over rounds (min-max) and, for specdec's speculative rows, the median of the
per-round paired ratios to specdec_ar. Outputs: every method's token ids are compared with
hf_plain's of round 1 (f32: must be identical; bf16: different kernels may break near-ties,
so the number of prompts with identical ids is reported). Writes --out DIR/<case>-<dtype>.md
and .json.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHAS = (0.6, 0.8, 0.9)
GAMMAS = (2, 4, 8)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=["default", "llama8b", "gemma4b", "smollm2"], required=True)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--exp", default=os.path.join(REPO, ".cuda/run/bin/exp"))
    p.add_argument("--models-dir", default=f"/tmp/specdec-bench-models-v{VOCAB}")
    p.add_argument("--sliding-dir", default="/tmp/specdec-sliding",
                   help="gemma4b: where scripts/sliding_shapes.py keeps its checkpoints")
    p.add_argument("--out", default=os.path.join(REPO, "bench-gpu-out"))
    p.add_argument("--skip-hf", action="store_true", help="specdec rows only")
    p.add_argument("--eagle3", action="store_true",
                   help="llama8b: also the oracle with a random Llama-3.1-8B-shaped EAGLE-3 head "
                        "(draft vocabulary 32,000 or the target's if smaller) run for its cost")
    p.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS),
                   help="llama8b: the oracle's acceptance rates")
    p.add_argument("--gammas", type=int, nargs="+", default=list(GAMMAS),
                   help="llama8b: the draft lengths")
    p.add_argument("--cache", choices=["slack", "staged"], default="slack",
                   help="exp's rotating-cache strategy (sliding-window layers: default and gemma4b)")
    return p.parse_args()


# ---------------------------------------------------------------- models


def llama_config(hidden, inter, layers, heads, kv, tied):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hidden // heads,
        "vocab_size": VOCAB, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": tied, "bos_token_id": 0, "eos_token_id": 0,
        "torch_dtype": "bfloat16",
    }


# The shipped tokenizer's ids are 0..1023: any vocabulary from 1,024 up lets exp encode prompts.
VOCAB = int(os.environ.get("SPECDEC_BENCH_VOCAB", "1024"))

SHAPES = {  # name -> (hidden, intermediate, layers, heads, kv heads, tied embeddings)
    "target-8b": (4096, 14336, 32, 32, 8, False),
    "draft-1b": (2048, 8192, 16, 32, 8, True),
    "target-smollm2": (576, 1536, 30, 9, 3, True),
}


def make_random_llama(torch, out_dir, shape):
    """Random N(0, 0.02) bf16 weights of a Llama checkpoint, made on the GPU; skipped when
    `out_dir` already holds one."""
    if os.path.isfile(os.path.join(out_dir, "model.safetensors")):
        return
    from safetensors.torch import save_file

    hidden, inter, layers, heads, kv, tied = shape
    cfg = llama_config(hidden, inter, layers, heads, kv, tied)
    d = hidden // heads
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        return (torch.randn(*s, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02).cpu()

    t = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], hidden),
         "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    if not tied:
        t["lm_head.weight"] = rnd(cfg["vocab_size"], hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rnd(heads * d, hidden)
        t[p + "self_attn.k_proj.weight"] = rnd(kv * d, hidden)
        t[p + "self_attn.v_proj.weight"] = rnd(kv * d, hidden)
        t[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * d)
        t[p + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        t[p + "mlp.up_proj.weight"] = rnd(inter, hidden)
        t[p + "mlp.down_proj.weight"] = rnd(hidden, inter)
        t[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    os.makedirs(out_dir, exist_ok=True)
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(REPO, "models/target", name)
        if os.path.isfile(src):
            with open(src, "rb") as a, open(os.path.join(out_dir, name), "wb") as b:
                b.write(a.read())


def make_random_eagle3(torch, out_dir, target_shape, draft_vocab=32000, layers_fused=None):
    """A random EAGLE-3 head for a Llama target of `target_shape`, in the EAGLE authors'
    release layout (config.json + model.safetensors: fc, midlayer.*, norm, lm_head, d2t, t2d;
    no embedding: the target's); N(0, 0.02) bf16 weights, norms 1, a seeded draft vocabulary
    of min(draft_vocab, VOCAB) target ids, fusing `layers_fused` (default: 2, the middle one
    and the third from last). Skipped when `out_dir` already holds one."""
    if os.path.isfile(os.path.join(out_dir, "model.safetensors")):
        return
    from safetensors.torch import save_file

    hidden, inter, layers, heads, kv, _ = target_shape
    d = hidden // heads
    draft_vocab = min(draft_vocab, VOCAB)
    cfg = llama_config(hidden, inter, 1, heads, kv, False)
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab,
               eagle_aux_hidden_state_layer_ids=layers_fused or [2, layers // 2, layers - 3])
    gen = torch.Generator(device="cuda").manual_seed(1)

    def rnd(*s):
        return (torch.randn(*s, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02).cpu()

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(2))[:draft_vocab].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    t = {"fc.weight": rnd(hidden, 3 * hidden), "norm.weight": ones(hidden),
         "lm_head.weight": rnd(draft_vocab, hidden),
         "d2t": ids - torch.arange(draft_vocab), "t2d": t2d,
         "midlayer.hidden_norm.weight": ones(hidden),
         "midlayer.input_layernorm.weight": ones(hidden),
         "midlayer.post_attention_layernorm.weight": ones(hidden),
         "midlayer.self_attn.q_proj.weight": rnd(heads * d, 2 * hidden),
         "midlayer.self_attn.k_proj.weight": rnd(kv * d, 2 * hidden),
         "midlayer.self_attn.v_proj.weight": rnd(kv * d, 2 * hidden),
         "midlayer.self_attn.o_proj.weight": rnd(hidden, heads * d),
         "midlayer.mlp.gate_proj.weight": rnd(inter, hidden),
         "midlayer.mlp.up_proj.weight": rnd(inter, hidden),
         "midlayer.mlp.down_proj.weight": rnd(hidden, inter)}
    os.makedirs(out_dir, exist_ok=True)
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)


def model_bytes(path):
    return os.path.getsize(os.path.join(path, "model.safetensors"))


# ---------------------------------------------------------------- prompts


def load_prompts(n):
    out = []
    with open(os.path.join(REPO, "configs/prompts/code.jsonl")) as fh:
        for line in fh:
            if line.strip():
                out.append(json.loads(line))
            if len(out) == n:
                break
    return out


def encode(prompts, tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    return [tok.encode(p["prompt"], add_special_tokens=False).ids for p in prompts]


# ---------------------------------------------------------------- specdec


def toml(v):
    return json.dumps(v) if isinstance(v, str) else ("true" if v is True else "false" if v is False else str(v))


def exp_config(args, dataset, target, drafters, methods, gammas):
    lines = ['name = "bench-gpu"', "seed = 0", f"max_new_tokens = {args.max_new_tokens}",
             "stop_at_eos = false", 'device = "cuda"', f'dtype = "{args.dtype}"', "",
             "[target]", f"path = {toml(target)}", ""]
    for name, d in drafters.items():
        lines.append(f"[drafters.{name}]")
        lines += [f"{k} = {toml(v)}" for k, v in d.items()]
        lines.append("")
    lines += ["[dataset]", f"path = {toml(dataset)}", f"limit = {args.prompts}", "",
              "[sweep]", "method = [" + ", ".join(toml(m) for m in methods) + "]",
              f"gamma = {list(gammas)}", "temperature = [0.0]", f'cache = ["{args.cache}"]', ""]
    if drafters:
        lines.insert(-1, "drafter = [" + ", ".join(toml(n) for n in drafters) + "]")
    return "\n".join(lines)


def run_exp(args, config_text, tag):
    tmp = tempfile.mkdtemp(prefix=f"bench-gpu-{tag}-")
    cfg = os.path.join(tmp, "config.toml")
    with open(cfg, "w") as fh:
        fh.write(config_text)
    out = os.path.join(tmp, "run")
    cmd = [args.exp, "run", cfg, "--out", out, "--no-progress"]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # SPECDEC_BENCH_EXP_STDERR=path collects every exp run's stderr (e.g. the graph census of
    # SPECDEC_GRAPH_CENSUS=1), each under a line naming the run.
    if os.environ.get("SPECDEC_BENCH_EXP_STDERR"):
        with open(os.environ["SPECDEC_BENCH_EXP_STDERR"], "a") as fh:
            fh.write(f"== exp {tag}\n{proc.stderr}")
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"exp failed ({tag}, exit {proc.returncode}); config {cfg}")
    # exp's warnings (an oracle whose reference the target did not follow, a failed graph
    # recording, ...) change what the figures mean: pass them on.
    for line in proc.stderr.splitlines():
        if line.startswith("warning:"):
            sys.stderr.write(f"exp {tag}: {line}\n")
    with open(os.path.join(out, "results.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def dataset_file(prompts):
    fd, path = tempfile.mkstemp(suffix=".jsonl", prefix="bench-gpu-prompts-")
    with os.fdopen(fd, "w") as fh:
        for p in prompts:
            fh.write(json.dumps(p) + "\n")
    return path


def method_key(r):
    if r["method"] == "autoregressive":
        return "specdec_ar"
    return f"specdec_{r['drafter']}_g{r['gamma']}"


def collect(records, into):
    """Per-method lists of (tokens, seconds, ids, record) in prompt order."""
    for r in records:
        into.setdefault(method_key(r), []).append(r)


# ---------------------------------------------------------------- transformers


class HF:
    def __init__(self, torch, target_dir, draft_dir, dtype, max_new):
        from transformers import AutoModelForCausalLM, GenerationConfig
        import transformers

        transformers.utils.logging.disable_progress_bar()
        self.torch = torch
        tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
        load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=tdt).to("cuda").eval()
        self.target = load(target_dir)
        self.draft = load(draft_dir) if draft_dir else None
        common = dict(do_sample=False, num_beams=1, max_new_tokens=max_new, min_new_tokens=None,
                      eos_token_id=None, pad_token_id=0, use_cache=True)
        self.plain = GenerationConfig(**common)
        self.static = GenerationConfig(**common, cache_implementation="static")
        if self.draft is not None:
            gc = GenerationConfig(**common)
            gc.num_assistant_tokens = 4
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
            self.draft.generation_config = gc

    def generate(self, method, ids):
        torch = self.torch
        x = torch.tensor([ids], dtype=torch.long, device="cuda")
        kw = dict(attention_mask=torch.ones_like(x))
        if method == "hf_static":
            kw["generation_config"] = self.static
        else:
            kw["generation_config"] = self.plain
        if method == "hf_assisted":
            kw["assistant_model"] = self.draft
        with torch.inference_mode():
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = self.target.generate(x, **kw)
            torch.cuda.synchronize()
            s = time.perf_counter() - t
        return out[0, len(ids):].tolist(), s


# ---------------------------------------------------------------- the benchmark


def run_case(args, torch):
    prompts = load_prompts(args.prompts)
    dataset = dataset_file(prompts)
    if args.case == "default":
        target, draft = os.path.join(REPO, "models/target"), os.path.join(REPO, "models/draft")
        drafters = {"draft": {"kind": "model", "path": draft}}
        spec_units = [("specdec", exp_config(args, dataset, target, drafters,
                                             ["autoregressive", "speculative"], [4]))]
        hf_methods = ["hf_plain", "hf_assisted", "hf_static"]
    elif args.case == "smollm2":
        target = os.path.join(args.models_dir, "target-smollm2")
        head = os.path.join(args.models_dir, "eagle3-smollm2")
        draft = None
        make_random_llama(torch, target, SHAPES["target-smollm2"])
        make_random_eagle3(torch, head, SHAPES["target-smollm2"], 12288, [2, 15, 27])
        drafters = {f"oracle{int(a * 100)}_eagle3": {"kind": "oracle", "alpha": a, "path": head}
                    for a in args.alphas}
        spec_units = [("specdec", exp_config(args, dataset, target, drafters,
                                             ["autoregressive", "speculative"], args.gammas))]
        hf_methods = ["hf_plain", "hf_static"]
    else:
        t0 = time.perf_counter()
        if args.case == "gemma4b":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import sliding_shapes
            sliding_shapes.make(args.sliding_dir, ["gemma3-4b", "gemma3-270m"])
            target = os.path.join(args.sliding_dir, "gemma3-4b")
            draft = os.path.join(args.sliding_dir, "gemma3-270m")
        else:
            target = os.path.join(args.models_dir, "target-8b")
            draft = os.path.join(args.models_dir, "draft-1b")
            make_random_llama(torch, target, SHAPES["target-8b"])
            make_random_llama(torch, draft, SHAPES["draft-1b"])
        print(f"random checkpoints ready in {time.perf_counter() - t0:.0f} s", flush=True)
        drafters = {f"oracle{int(a * 100)}": {"kind": "oracle", "alpha": a, "path": draft}
                    for a in args.alphas}
        if args.eagle3 and args.case == "llama8b":
            head = os.path.join(args.models_dir, "eagle3-8b")
            make_random_eagle3(torch, head, SHAPES["target-8b"])
            drafters.update({f"oracle{int(a * 100)}_eagle3": {"kind": "oracle", "alpha": a,
                                                              "path": head}
                             for a in args.alphas})
        spec_units = [
            ("specdec", exp_config(args, dataset, target, drafters,
                                   ["autoregressive", "speculative"], args.gammas)),
            ("draft_ar", exp_config(args, dataset, draft, {}, ["autoregressive"], [1])),
        ]
        hf_methods = ["hf_plain", "hf_static"]
    if args.skip_hf:
        hf_methods = []
    ids = encode(prompts, target)
    hf = HF(torch, target, draft if "hf_assisted" in hf_methods else None, args.dtype,
            args.max_new_tokens) if hf_methods else None
    if hf:  # untimed warm-up (and transformers' own compilation for the static cache)
        for m in hf_methods:
            hf.generate(m, ids[0])
    units = [u for u, _ in spec_units] + hf_methods
    rounds = []
    for r in range(args.rounds):
        order = units[r % len(units):] + units[:r % len(units)]
        per = {}
        for unit in order:
            if unit in dict(spec_units):
                recs = run_exp(args, dict(spec_units)[unit], f"{unit}-r{r}")
                bucket = {}
                collect(recs, bucket)
                for k, v in bucket.items():
                    per["draft_model_ar" if unit == "draft_ar" else k] = [
                        {"ids": x["output_ids"], "seconds": x["wall_s"], "record": x} for x in v]
            else:
                per[unit] = []
                for p in ids:
                    out, s = hf.generate(unit, p)
                    per[unit].append({"ids": out, "seconds": s})
        rounds.append({"order": order, "runs": per})
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {tps(v):.1f}" for k, v in sorted(per.items())) + " tok/s", flush=True)
    return prompts, ids, target, draft, rounds


def tps(runs):
    return sum(len(x["ids"]) for x in runs) / sum(x["seconds"] for x in runs)


def spec_terms(runs, ar_runs):
    """tau, v and c from exp's records: v = seconds per verification / seconds per AR step;
    c = drafting seconds per draft forward / seconds per AR step (the drafter's own cost as
    it drafts: greedy drafts chained on the device, one read-back per proposal)."""
    recs = [x["record"] for x in runs]
    tokens = sum(len(r["output_ids"]) for r in recs)
    verifies = sum(r["target_forwards"] - 1 for r in recs)
    ar = [x["record"] for x in ar_runs]
    ar_step = sum(r["verify_s"] for r in ar) / sum(r["target_forwards"] - 1 for r in ar)
    v = sum(r["verify_s"] for r in recs) / verifies / ar_step
    tau = (tokens - len(recs)) / verifies  # the prefill's token is not from a verification
    # Less one forward per generation: the drafter's pass over the prompt (booked as prefill).
    forwards = sum(r.get("draft_forwards", 0) for r in recs) - len(recs)
    c = sum(r["draft_s"] for r in recs) / forwards / ar_step if forwards > 0 else None
    return tau, v, c


def summarize(args, torch, prompts, ids, target, draft, rounds):
    methods = sorted(rounds[0]["runs"])
    ref = rounds[0]["runs"].get("hf_plain") or rounds[0]["runs"]["specdec_ar"]
    rows = {}
    for m in methods:
        per_round = [tps(r["runs"][m]) for r in rounds]
        same = sum(all(x["ids"] == y["ids"] for x, y in zip(r["runs"][m], ref))
                   for r in rounds)
        identical = [sum(x["ids"] == y["ids"] for x, y in zip(r["runs"][m], ref)) for r in rounds]
        rows[m] = {"tps": per_round, "median": statistics.median(per_round),
                   "identical_prompts": identical, "rounds_all_identical": same}
    ar_key = "specdec_ar"
    # The draft model's decode step (read back each) over the target's: c of plain decoding.
    c_ar = None
    if "draft_model_ar" in rows:
        c_ar = rows[ar_key]["median"] / rows["draft_model_ar"]["median"]
    for m in methods:
        if not m.startswith("specdec_"):
            continue
        # Where the last round's wall time went (s, summed over prompts): the cost model's
        # terms, and what lies outside them (sampling, bookkeeping).
        recs = [x["record"] for x in rounds[-1]["runs"][m]]
        split = {k: sum(r[k + "_s"] for r in recs) for k in ("wall", "prefill", "draft", "verify")}
        split["other"] = split["wall"] - split["prefill"] - split["draft"] - split["verify"]
        rows[m]["seconds"] = split
        if m == ar_key:
            continue
        paired = [tps(r["runs"][m]) / tps(r["runs"][ar_key]) for r in rounds]
        tau, v, c = spec_terms(rounds[-1]["runs"][m], rounds[-1]["runs"][ar_key])
        row = rows[m]
        row.update(paired=paired, speedup=statistics.median(paired), tau=tau, v=v, c=c)
        recs = [x["record"] for x in rounds[-1]["runs"][m]]
        row["gamma"] = g = recs[0]["gamma"]
        if m.startswith("specdec_oracle") and c is not None:
            a = int(m.split("oracle")[1].split("_")[0]) / 100
            row["alpha"] = a
            # tau's expectation for untruncated steps: the measured tau falls short of it by
            # the sampling spread (a fixed seed) and the shorter last steps of a generation.
            row["tau_expected"] = (1 - a ** (g + 1)) / (1 - a)
            row["leviathan"] = (1 - a ** (g + 1)) / ((1 - a) * (g * c + 1))
            row["time_accounting"] = tau / (g * c + v)
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "case": args.case,
        "dtype": args.dtype, "cache": args.cache, "rounds": args.rounds, "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "c_draft_ar": c_ar,
        "prompt_tokens": [len(p) for p in ids],
        "command": "python3 scripts/bench_gpu.py " + " ".join(sys.argv[1:]),
    }
    if args.case in ("llama8b", "gemma4b"):
        info["target_bytes"], info["draft_bytes"] = model_bytes(target), model_bytes(draft)
        info["copy_tb_s"] = copy_bandwidth(torch)
        info["bound_tok_s"] = info["copy_tb_s"] * 1e12 / info["target_bytes"]
    return info, rows


def copy_bandwidth(torch):
    """Device-to-device copy bandwidth (read + write), TB/s, median of 10."""
    x = torch.empty(int(4e9), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    times = []
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        y.copy_(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    del x, y
    return 2 * 4e9 / statistics.median(times) / 1e12


def markdown(info, rows):
    lines = [f"# GPU benchmark: {info['case']} ({info['dtype']})", ""]
    lines += [f"* {k}: {v}" for k, v in info.items()]
    lines += ["", "| method | tok/s median (min-max) | identical ids (prompts per round) | "
              "speedup vs specdec AR (paired median) | tau | tau expected | v | c | "
              "predicted: Leviathan (v = 1) | predicted: tau/(g c + v) |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m, r in rows.items():
        fmt = lambda k: f"{r[k]:.2f}" if r.get(k) is not None else ""
        lines.append(
            f"| {m} | {r['median']:.1f} ({min(r['tps']):.1f}-{max(r['tps']):.1f}) | "
            f"{r['identical_prompts']} | {fmt('speedup')} | {fmt('tau')} | {fmt('tau_expected')} | "
            f"{fmt('v')} | {fmt('c')} | "
            f"{fmt('leviathan')} | {fmt('time_accounting')} |")
    split = [(m, r["seconds"]) for m, r in rows.items() if r.get("seconds")]
    if split:
        lines += ["", "Wall time of the last round (s, all prompts): | method | wall | prefill | "
                  "draft | verify | other |", "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {m} | " + " | ".join(f"{t[k]:.3f}" for k in
                  ("wall", "prefill", "draft", "verify", "other")) + " |" for m, t in split]
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prompts, ids, target, draft, rounds = run_case(args, torch)
    info, rows = summarize(args, torch, prompts, ids, target, draft, rounds)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{args.case}-{args.dtype}")
    text = markdown(info, rows)
    with open(stem + ".md", "w") as fh:
        fh.write(text)
    with open(stem + ".json", "w") as fh:
        json.dump({"info": info, "rows": rows}, fh, indent=1)
    print(text)


if __name__ == "__main__":
    main()
