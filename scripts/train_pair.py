#!/usr/bin/env python3
"""Train the small default target/draft pair shipped in models/ (Hugging Face layout).

Command used for the committed models (one NVIDIA H200, Python 3.12.3, torch 2.11.0+cu130,
transformers 5.17.0, tokenizers 0.23.2):

    python3 scripts/train_pair.py --target-steps 1500 --draft-steps 4000 --max-seconds 200

(--max-seconds only guards against a slow machine; it did not shorten either run.)
Step counts: the corpus is only ~3.9M tokens, so the 3.3M-parameter target overfits when trained
longer: with 4000 steps (16.9 epochs) its held-out loss bottomed at 2.41 around step 1500 and ended
at 2.69, worse than the draft's, with draft/target agreement 0.509. 1500 steps with the cosine
schedule ending there gives held-out 2.36. The 0.5M draft keeps improving up to 4000 steps.

What it does:
  * corpus: the Python standard library of the interpreter running the script (`*.py` under
    sysconfig.get_paths()["stdlib"], skipping any path with a `test`, `tests`, `idle_test`,
    `idlelib` or `site-packages` component), files sorted by relative path and joined with
    `<|endoftext|>`. Held out (~1% of files): every 100th file (index % 100 == 50) in the sorted
    list of files outside `encodings/` (codec tables are near-duplicates of each other).
  * tokenizer: byte-level BPE (tokenizers), vocab 1024, `<|endoftext|>` = id 0, no BOS/EOS added by
    the post-processor, ByteLevel decoder (decode(encode(x)) == x is checked on the held-out text).
  * target: MistralForCausalLM, hidden 256, 4 layers, 8 heads / 2 KV heads, intermediate 768,
    sliding_window 64, rope_theta 1e4, tied embeddings, max_position_embeddings 4096.
    draft: LlamaForCausalLM, hidden 128, 2 layers, 4 heads / 2 KV heads, intermediate 384, tied.
  * training: next-token LM on random 256-token windows of the training stream, AdamW
    (betas 0.9/0.95, wd 0.1), bf16 autocast on CUDA, linear warmup + cosine decay to 10%, seeded.
  * evaluation (on the bf16 checkpoints as saved, loaded back like a download, f32 compute):
    held-out loss of both, teacher-forced greedy agreement (fraction of held-out positions where
    argmax draft == argmax target), plus greedy samples of the target.
  * outputs: models/{target,draft}/ (config.json, generation_config.json, model.safetensors in bf16,
    tokenizer.json, tokenizer_config.json), models/TRAINING.md, configs/prompts/code.jsonl.

Distillation mode (--distill-draft): re-trains only the draft, with the same architecture and config
(draft_config(): same hidden size, layers, heads, vocabulary, tied embeddings, so its per-token cost
does not change), to match the frozen target's next-token distributions, since speculative
decoding accepts a draft token only where the draft agrees with the target:

    python3 scripts/train_pair.py --distill-draft --distill-init draft --distill-steps 9400 --distill-lr 0.002
    python3 scripts/train_pair.py --distill-draft --distill-init draft --distill-steps 14600 --distill-lr 0.002

(the committed draft: run 1, 150 s on one H200, from the from-scratch draft; run 2, continuing from
run 1's draft, 395 s on one H200 shared with a second run). Settings of run 1 were chosen by held-out
agreement in ~170 s runs (four at once on one H200, so ~3800-4000 steps each): initialised from the
previous draft with peak lr 2e-3: 0.620; the same with lr 1e-3: 0.613; lr 1e-3 with 0.1 cross-entropy
mixed in: 0.609; from scratch, lr 2e-3: 0.596 (before: 0.561). Run 1 reached 0.635, still rising
slowly at the end; run 2 reached 0.649 (a continuation with peak lr 1e-3 for 14200 steps: 0.649 too,
but worse held-out KL and loss). models/TRAINING.md has the details.

  * reads models/target (frozen, f32 weights, bf16 autocast on CUDA), the current models/draft
    (the "before" model and, with --distill-init draft, the initialisation; --distill-init scratch
    starts from a fresh draft_config() model) and the tokenizer shipped in models/target (not
    retrained; it must equal the draft's). Same corpus, held-out split and random 256-token
    training windows as the from-scratch path.
  * loss per position: T^2 * KL(softmax(target/T) || softmax(draft/T)) (--distill-temp T), optionally
    mixed with cross-entropy on the data: (1 - w) * KL + w * CE (--distill-ce w).
  * evaluation before and after (bf16 checkpoints loaded back in f32): teacher-forced top-1 agreement
    of draft argmax with target argmax on all held-out windows, draft held-out loss (CE on the data),
    held-out KL(target || draft), and a simulation of greedy speculative decoding (gamma 4, 128 new
    tokens) on the target's greedy continuations of the default prompts (acceptance rate and
    acceptance per draft position; exact for greedy decoding up to numerics, since an accepted prefix
    is the target's own continuation).
  * writes models/draft (bf16 safetensors via save_pretrained, generation_config.json, tokenizer files
    copied byte for byte from models/target) and updates models/TRAINING.md in place (a "Draft
    distillation" section; the from-scratch sections are kept). models/target and the prompts file
    are not touched.
"""

import argparse
import glob
import json
import math
import os
import platform
import shutil
import sys
import sysconfig
import time

import torch
import torch.nn.functional as F

import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

EOT = "<|endoftext|>"
VOCAB = 1024
SEQ = 256
EXCLUDE_DIRS = {"test", "tests", "idle_test", "idlelib", "site-packages"}

# Prompts for the default experiment: written for this project in the style of the stdlib
# (not excerpts of it); the script checks that none occurs verbatim in the training text. Each ends
# on a non-blank character: a prompt ending in spaces or a newline splits the byte-level BPE
# whitespace tokens differently from the training text (e.g. "    " + " yield" vs "   " + " yield").
PROMPTS = [
    ("class_docstring", 'class RingLog:\n    """Keep the most recent log records in a fixed-size ring."""\n\n    def __init__(self,'),
    ("func_signature", "def split_header_fields(line, sep=':'):"),
    ("import_block", "import os, shutil, tempfile\n\n\ndef copy_tree_atomic("),
    ("method_repr", "class Interval:\n\n    def __repr__(self):"),
    ("try_import", "try:\n    import zlib_fastpath as _zfast\nexcept ImportError:"),
    ("loop_dict", "def invert_mapping(table):\n    result = {}\n    for key, value in table.items():"),
    ("property", "class Timeline:\n\n    @property\n    def frame_count(self):"),
    ("main_guard", "def main(argv=None):\n    args = parse_cli(argv)"),
]
SAMPLE_PROMPTS = ["def __init__(self, ", "import os\n\n\ndef ", "class Queue:\n\n    def "]


def log(msg):
    print(msg, flush=True)


def load_corpus(holdout_mod):
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, root)
        parts = rel.split(os.sep)
        if any(p in EXCLUDE_DIRS for p in parts[:-1]):
            continue
        files.append(rel)
    files.sort()
    if not files:
        sys.exit(f"no stdlib sources under {root}; refusing to substitute another corpus")
    # Codec tables (encodings/cp*.py, ...) are near-copies of one another: holding one out would
    # measure memorisation, so held-out files are picked among the other files only.
    candidates = [rel for rel in files if not rel.startswith("encodings" + os.sep)]
    held_set = {rel for j, rel in enumerate(candidates) if j % holdout_mod == holdout_mod // 2}
    train, held, skipped = [], [], []
    for rel in files:
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            skipped.append(rel)
            continue
        if EOT in text:
            skipped.append(rel)
            continue
        (held if rel in held_set else train).append((rel, text))
    info = {
        "python": platform.python_version(),
        "stdlib": root,
        "files_total": len(files),
        "files_train": len(train),
        "files_heldout": len(held),
        "files_skipped": skipped,
        "chars_train": sum(len(t) for _, t in train),
        "chars_heldout": sum(len(t) for _, t in held),
        "heldout_files": [r for r, _ in held],
    }
    return train, held, info


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOT) == 0, tok.token_to_id(EOT)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def encode_stream(tok, texts):
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(0)
    return torch.tensor(ids, dtype=torch.int32)


def target_config():
    return MistralConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, sliding_window=64,
        max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=0, pad_token_id=None,
    )


def draft_config():
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=0, pad_token_id=None,
    )


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def make_batch(stream, batch, gen, device):
    starts = torch.randint(0, stream.numel() - SEQ - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(SEQ + 1)[None, :]
    chunk = stream[idx].long().to(device, non_blocking=True)
    return chunk[:, :-1], chunk[:, 1:]


def train(name, model, stream, held_stream, steps, args, device):
    gen = torch.Generator().manual_seed(args.seed + (1 if name == "draft" else 0))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
    )
    hx, hy = heldout_chunks(held_stream, 256)
    hx, hy = hx.to(device), hy.to(device)
    autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    @torch.no_grad()
    def heldout_loss():
        model.eval()
        with torch.autocast(**autocast):
            lg = model(input_ids=hx, use_cache=False).logits
        model.train()
        return F.cross_entropy(lg.float().view(-1, VOCAB), hy.reshape(-1)).item()

    model.train()
    curve = []
    t0 = time.time()
    t10 = None
    step = 0
    while step < steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, args.lr, args.warmup)
        x, y = make_batch(stream, args.batch, gen, device)
        with torch.autocast(**autocast):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 10:
            loss.item()
            t10 = time.time()
        if step == 30:
            loss.item()
            dt = (time.time() - t10) / 20
            log(f"[{name}] steps 10-30: {dt * 1000:.1f} ms/step -> ~{dt * steps:.0f} s for {steps} steps")
            # Still inside the warmup, so shortening the run here leaves the schedule consistent.
            if dt * steps > args.max_seconds and args.warmup >= 30:
                steps = max(args.warmup * 2, int(args.max_seconds / dt) // 100 * 100)
                log(f"[{name}] step budget {args.max_seconds}s: training for {steps} steps instead")
        if step % args.log_every == 0 or step == steps:
            cur = loss.item()
            hl = heldout_loss()
            curve.append((step, cur, hl))
            log(f"[{name}] step {step:5d}/{steps} loss {cur:.4f} held-out {hl:.4f} "
                f"lr {opt.param_groups[0]['lr']:.2e} elapsed {time.time() - t0:.0f}s")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.time() - t0
    model.eval()
    return curve, elapsed, steps


def heldout_chunks(held_stream, max_chunks):
    n = (held_stream.numel() - 1) // SEQ
    n = min(n, max_chunks)
    x = torch.stack([held_stream[i * SEQ:(i + 1) * SEQ] for i in range(n)]).long()
    y = torch.stack([held_stream[i * SEQ + 1:(i + 1) * SEQ + 1] for i in range(n)]).long()
    return x, y


@torch.no_grad()
def evaluate(target, draft, x, y, device, bs=64):
    tot_t = tot_d = tot_kl = 0.0
    agree = acc_t = acc_d = 0
    count = 0
    for i in range(0, x.shape[0], bs):
        xb, yb = x[i:i + bs].to(device), y[i:i + bs].to(device)
        lt = target(input_ids=xb, use_cache=False).logits.float()
        ld = draft(input_ids=xb, use_cache=False).logits.float()
        tot_t += F.cross_entropy(lt.view(-1, VOCAB), yb.reshape(-1), reduction="sum").item()
        tot_d += F.cross_entropy(ld.view(-1, VOCAB), yb.reshape(-1), reduction="sum").item()
        lpt, lpd = F.log_softmax(lt, -1), F.log_softmax(ld, -1)
        tot_kl += (lpt.exp() * (lpt - lpd)).sum().item()
        at, ad = lt.argmax(-1), ld.argmax(-1)
        agree += (at == ad).sum().item()
        acc_t += (at == yb).sum().item()
        acc_d += (ad == yb).sum().item()
        count += yb.numel()
    return {
        "positions": count,
        "target_loss": tot_t / count,
        "draft_loss": tot_d / count,
        "agreement": agree / count,
        "kl": tot_kl / count,
        "target_top1": acc_t / count,
        "draft_top1": acc_d / count,
    }


@torch.no_grad()
def train_loss(model, stream, device, n=32, seed=99):
    gen = torch.Generator().manual_seed(seed)
    x, y = make_batch(stream, n, gen, device)
    logits = model(input_ids=x, use_cache=False).logits.float()
    return F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1)).item()


def save_dir(model, tok, path, max_len, tok_src=None):
    os.makedirs(path, exist_ok=True)
    for f in os.listdir(path):
        os.remove(os.path.join(path, f))
    model.generation_config = GenerationConfig(eos_token_id=0, bos_token_id=None, pad_token_id=None)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    if tok_src is not None:  # distillation: ship the existing tokenizer files unchanged
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(tok_src, f), os.path.join(path, f))
        return
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as fh:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOT,
            "bos_token": None,
            "unk_token": None,
            "pad_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_len,
        }, fh, indent=2)
        fh.write("\n")


# ----------------------------------------------------------------------------------------------
# Distillation of the draft from the frozen target (--distill-draft)

ARCH_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
             "max_position_embeddings", "rms_norm_eps", "hidden_act")


def arch_of(cfg):
    return {k: getattr(cfg, k, None) for k in ARCH_KEYS}


def distill_loss(ld, lt, y, temp, ce_w):
    """(1 - ce_w) * T^2 * KL(softmax(lt/T) || softmax(ld/T)) + ce_w * CE(ld, y), mean per position."""
    lpd = F.log_softmax(ld / temp, -1)
    lpt = F.log_softmax(lt / temp, -1)
    kl = (lpt.exp() * (lpt - lpd)).sum(-1).mean() * (temp * temp)
    if ce_w > 0:
        ce = F.cross_entropy(ld.reshape(-1, VOCAB), y.reshape(-1))
        return (1 - ce_w) * kl + ce_w * ce, kl
    return kl, kl


def train_distill(model, target, stream, held_stream, args, device):
    gen = torch.Generator().manual_seed(args.seed + 2)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.distill_lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
    )
    autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    hx, hy = heldout_chunks(held_stream, 256)
    hx, hy = hx.to(device), hy.to(device)
    with torch.no_grad(), torch.autocast(**autocast):
        h_lpt = F.log_softmax(target(input_ids=hx, use_cache=False).logits.float(), -1)
    h_at = h_lpt.argmax(-1)

    @torch.no_grad()
    def heldout():
        model.eval()
        with torch.autocast(**autocast):
            ld = model(input_ids=hx, use_cache=False).logits.float()
        model.train()
        lpd = F.log_softmax(ld, -1)
        kl = (h_lpt.exp() * (h_lpt - lpd)).sum(-1).mean().item()
        ce = F.cross_entropy(ld.view(-1, VOCAB), hy.reshape(-1)).item()
        agree = (ld.argmax(-1) == h_at).float().mean().item()
        return kl, ce, agree

    steps = args.distill_steps
    warmup = args.distill_warmup
    # Decide a shortened run inside the warmup (so the schedule stays consistent), late enough that
    # the pace is measured in steady state.
    check, mark = (250, 50) if warmup >= 300 else (30, 10)
    model.train()
    curve = []
    t0 = time.time()
    t_mark = None
    step = 0
    while step < steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, args.distill_lr, warmup)
        x, y = make_batch(stream, args.batch, gen, device)
        with torch.no_grad(), torch.autocast(**autocast):
            lt = target(input_ids=x, use_cache=False).logits
        with torch.autocast(**autocast):
            ld = model(input_ids=x, use_cache=False).logits
        loss, kl = distill_loss(ld.float(), lt.float(), y, args.distill_temp, args.distill_ce)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == mark:
            loss.item()
            t_mark = time.time()
        if step == check:
            loss.item()
            dt = (time.time() - t_mark) / (check - mark)
            log(f"[distill] steps {mark}-{check}: {dt * 1000:.1f} ms/step "
                f"-> ~{dt * steps:.0f} s for {steps} steps")
            if dt * steps > args.max_seconds and warmup > check:
                steps = max(warmup * 2, int(args.max_seconds / dt) // 100 * 100)
                log(f"[distill] step budget {args.max_seconds}s: training for {steps} steps instead")
        if step % args.log_every == 0 or step == steps:
            cur = loss.item()
            hkl, hce, hag = heldout()
            curve.append((step, cur, hkl, hce, hag))
            log(f"[distill] step {step:5d}/{steps} loss {cur:.4f} (KL {kl.item():.4f}) held-out KL {hkl:.4f} "
                f"CE {hce:.4f} agreement {hag:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"elapsed {time.time() - t0:.0f}s")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.time() - t0
    model.eval()
    return curve, elapsed, steps


@torch.no_grad()
def simulate_greedy_spec(target, draft, tok, device, gamma=4, max_new=128):
    """Greedy speculative decoding, simulated exactly: the target's greedy continuation of each
    default prompt is generated once; a block starting at position i accepts draft tokens while the
    draft's (teacher-forced) argmax matches that continuation, because every accepted prefix is the
    target's own output. Returns acceptance rate, acceptance per draft position and the fraction of
    continuation tokens the draft predicts."""
    blocks_at = [0] * gamma
    acc_at = [0] * gamma
    proposed = accepted = match_n = tokens = 0
    for _, p in PROMPTS:
        ids = torch.tensor([tok.encode(p).ids], device=device)
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                              eos_token_id=0, pad_token_id=0)
        seq = out[0]
        n0 = ids.shape[1]
        cont = seq[n0:]
        pred = draft(input_ids=seq[None], use_cache=False).logits[0, n0 - 1:-1].float().argmax(-1)
        match = (pred == cont).tolist()
        match_n += sum(match)
        tokens += len(match)
        i = 0
        while i < len(match) - 1:  # the last token needs no draft: nothing is left to generate after it
            g = min(gamma, len(match) - 1 - i)
            k = 0
            while k < g and match[i + k]:
                k += 1
            proposed += g
            accepted += k
            for j in range(g):
                blocks_at[j] += 1
                acc_at[j] += int(j < k)
            i += k + 1
    return {
        "alpha": accepted / max(1, proposed),
        "per_position": [a / max(1, b) for a, b in zip(acc_at, blocks_at)],
        "continuation_agreement": match_n / max(1, tokens),
        "tokens": tokens,
    }


def distill_main(args, device):
    t_start = time.time()
    src = args.distill_src or args.out
    tdir, ddir = os.path.join(src, "target"), os.path.join(src, "draft")
    train_files, held_files, info = load_corpus(100)
    log(f"corpus: Python {info['python']} stdlib {info['stdlib']}: {info['files_total']} files "
        f"({info['files_train']} train, {info['files_heldout']} held out, {len(info['files_skipped'])} skipped), "
        f"{info['chars_train']} train chars, {info['chars_heldout']} held-out chars")
    train_texts = [t for _, t in train_files]
    held_texts = [t for _, t in held_files]
    with open(os.path.join(tdir, "tokenizer.json"), "rb") as a, open(os.path.join(ddir, "tokenizer.json"), "rb") as b:
        assert a.read() == b.read(), "target and draft tokenizers differ"
    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id(EOT) == 0
    held_joined = EOT.join(held_texts)
    assert tok.decode(tok.encode(held_joined).ids, skip_special_tokens=False) == held_joined, "decode(encode(x)) != x"
    stream = encode_stream(tok, train_texts)
    held_stream = encode_stream(tok, held_texts)
    log(f"tokenizer (from {tdir}): train tokens {stream.numel()}, held-out tokens {held_stream.numel()} "
        f"({time.time() - t_start:.0f}s)")

    def load(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").to(device).eval()

    # Before: the checkpoints as shipped, f32 compute without TF32 (as the from-scratch evaluation).
    torch.backends.cuda.matmul.allow_tf32 = False
    target = load(tdir)
    for p in target.parameters():
        p.requires_grad_(False)
    old = load(ddir)
    assert arch_of(old.config) == arch_of(draft_config()), (arch_of(old.config), arch_of(draft_config()))
    x, y = heldout_chunks(held_stream, args.eval_chunks)
    before = evaluate(target, old, x, y, device)
    before["train_loss"] = train_loss(old, stream, device)
    before["sim"] = simulate_greedy_spec(target, old, tok, device)
    log(f"before: {json.dumps(before)}")

    # The draft to train: a copy of the current one, or a fresh draft_config() model.
    if args.distill_init == "draft":
        draft = old
    else:
        del old
        torch.manual_seed(args.seed + 1)
        cfg = draft_config()
        cfg._attn_implementation = "sdpa"
        draft = LlamaForCausalLM(cfg).to(device)
    npar = n_params(draft)
    log(f"[distill] {type(draft).__name__}: {npar} parameters (init: {args.distill_init}), "
        f"{args.distill_steps} steps of {args.batch}x{SEQ} tokens, T={args.distill_temp}, CE weight {args.distill_ce}, "
        f"lr {args.distill_lr}, warmup {args.distill_warmup}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    curve, elapsed, steps = train_distill(draft, target, stream, held_stream, args, device)

    out_dir = os.path.join(args.out, "draft")
    save_dir(draft, tok, out_dir, draft.config.max_position_embeddings, tok_src=tdir)
    del draft
    torch.backends.cuda.matmul.allow_tf32 = False
    new = load(out_dir)
    assert arch_of(new.config) == arch_of(draft_config())
    assert n_params(new) == npar
    after = evaluate(target, new, x, y, device)
    after["train_loss"] = train_loss(new, stream, device)
    after["sim"] = simulate_greedy_spec(target, new, tok, device)
    log(f"after: {json.dumps(after)}")
    log(f"held-out agreement {before['agreement']:.4f} -> {after['agreement']:.4f}, draft held-out loss "
        f"{before['draft_loss']:.4f} -> {after['draft_loss']:.4f}, simulated greedy gamma=4 acceptance "
        f"{before['sim']['alpha']:.3f} -> {after['sim']['alpha']:.3f}")

    res = {"params": npar, "steps": steps, "seconds": elapsed, "curve": curve, "before": before, "after": after,
           "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"}
    if args.metrics_json:
        with open(args.metrics_json, "w") as fh:
            json.dump({"args": vars(args), **res}, fh, indent=1)
    write_distill_report(args, src, info, stream, held_stream, res)
    log(f"total {time.time() - t_start:.0f}s")
    if after["agreement"] < args.min_agreement:
        sys.exit(f"greedy agreement {after['agreement']:.3f} < {args.min_agreement}")


DISTILL_NOTE = "The draft in `models/draft` was then re-trained by distillation"


def split_sections(text):
    """[(heading or None, lines)] split at level-2 headings."""
    out = [(None, [])]
    for line in text.split("\n"):
        if line.startswith("## "):
            out.append((line[3:].strip(), []))
        else:
            out[-1][1].append(line)
    return out


def write_distill_report(args, src, info, stream, held_stream, res):
    b, a = res["before"], res["after"]
    src_md = os.path.join(src, "TRAINING.md")
    try:
        with open(src_md) as fh:
            base = fh.read()
    except OSError:
        base = "# Default model pair\n"
    sections = split_sections(base.rstrip("\n"))
    secs = {h: lines for h, lines in sections}
    order = [h for h, _ in sections]

    # Intro: the original text plus a note that the draft was replaced (replaced on a re-run).
    intro = [ln for ln in secs[None]]
    cut = next((i for i, ln in enumerate(intro) if ln.startswith(DISTILL_NOTE)), None)
    if cut is not None:
        intro = intro[:cut]
    while intro and intro[-1] == "":
        intro.pop()
    intro += ["", f"{DISTILL_NOTE} from the frozen",
              "target (`--distill-draft`, same architecture and config, so the same per-token cost); see",
              "*Draft distillation*. The *Models and training* section describes the original from-scratch",
              "run (its draft column: the replaced draft).", ""]
    secs[None] = intro

    dev = res["device"]
    L = []
    w = L.append
    w("")
    w(f"`models/draft` was re-trained to match the target's next-token distributions (the target is frozen;")
    w(f"same corpus windows and held-out split). Loss per position:")
    w((f"(1 - {args.distill_ce}) * " if args.distill_ce > 0 else "")
      + f"T² · KL(softmax(target/T) ‖ softmax(draft/T)) with T = {args.distill_temp}"
      + (f" + {args.distill_ce} * cross-entropy on the data" if args.distill_ce > 0 else "") + ".")
    w(f"Initialisation: {'the previous (from-scratch) draft' if args.distill_init == 'draft' else 'random (seed ' + str(args.seed + 1) + ')'}; "
      f"{res['steps']} steps of {args.batch} x {SEQ} tokens "
      f"({res['steps'] * args.batch * SEQ / stream.numel():.1f} epochs), {res['seconds']:.0f} s on {dev}")
    w(f"(including a target forward per step); AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak lr")
    w(f"{args.distill_lr}, {args.distill_warmup} warmup steps, cosine decay to 10%, gradient clipping 1.0, bf16 autocast, seed {args.seed}.")
    w(f"Parameters: {res['params']:,} (unchanged: same config as before).")
    w("")
    w(f"Measured on the bf16 checkpoints loaded back in f32, before (the previous draft) and after:")
    w("")
    w("| draft | before | after |")
    w("| --- | --- | --- |")
    w(f"| held-out top-1 agreement with the target's argmax (teacher forced, {a['positions']:,} positions) "
      f"| {b['agreement']:.4f} | **{a['agreement']:.4f}** |")
    w(f"| held-out KL(target ‖ draft) (nats/token) | {b['kl']:.4f} | {a['kl']:.4f} |")
    w(f"| held-out loss on the data (nats/token) | {b['draft_loss']:.4f} | {a['draft_loss']:.4f} |")
    w(f"| held-out top-1 accuracy on the data | {b['draft_top1']:.4f} | {a['draft_top1']:.4f} |")
    w(f"| train loss on the data (32 random windows) | {b['train_loss']:.4f} | {a['train_loss']:.4f} |")
    bs, as_ = b["sim"], a["sim"]
    w(f"| greedy γ=4 acceptance, simulated on the target's continuations of the default prompts | "
      f"{bs['alpha']:.3f} | {as_['alpha']:.3f} |")
    w(f"| ... acceptance per draft position 1-4 | {' / '.join(f'{v:.2f}' for v in bs['per_position'])} | "
      f"{' / '.join(f'{v:.2f}' for v in as_['per_position'])} |")
    w(f"| ... draft agreement on those {as_['tokens']} continuation tokens | {bs['continuation_agreement']:.4f} | "
      f"{as_['continuation_agreement']:.4f} |")
    w("")
    w(f"For reference, the target's own held-out loss is {a['target_loss']:.4f} and top-1 accuracy {a['target_top1']:.4f}.")
    w("The simulation generates the target's greedy continuation (128 new tokens) of each prompt in")
    w("`configs/prompts/code.jsonl` with transformers and lets a γ=4 block accept draft tokens while the")
    w("draft's teacher-forced argmax matches it; for greedy decoding this is what speculative decoding")
    w("does, up to numerical differences between implementations. It was not used to choose settings")
    w("(the held-out agreement was).")
    w("")
    w("Distillation curve (current batch's loss; held-out KL / cross-entropy / agreement on (up to 256)")
    w("held-out windows, bf16 autocast, during training):")
    w("")
    w("| step | train loss | held-out KL | held-out CE | held-out agreement |")
    w("| --- | --- | --- | --- | --- |")
    for s_, l_, k_, c_, g_ in res["curve"]:
        w(f"| {s_} | {l_:.3f} | {k_:.3f} | {c_:.3f} | {g_:.4f} |")
    w("")
    secs["Draft distillation"] = L
    if "Draft distillation" not in order:
        pos = order.index("Draft/target agreement") if "Draft/target agreement" in order else len(order)
        order.insert(pos, "Draft distillation")

    secs["Draft/target agreement"] = [
        "",
        f"Teacher-forced greedy agreement on all {a['positions']:,} held-out positions (fraction where the draft's",
        f"argmax equals the target's argmax): **{a['agreement']:.4f}** (distilled draft; {b['agreement']:.4f} before).",
        "",
    ]
    if "Draft/target agreement" not in order:
        order.insert(order.index("Draft distillation") + 1, "Draft/target agreement")

    # Reproduce: the from-scratch command (from the previous report) followed by this command.
    old_cmds = [ln for ln in secs.get("Reproduce", []) if ln.startswith("python3 ")]
    scratch = [c for c in old_cmds if "--distill-draft" not in c][:1]
    cmd = ["python3", "scripts/train_pair.py", "--distill-draft", "--distill-init", args.distill_init,
           "--distill-steps", str(res["steps"]), "--distill-lr", str(args.distill_lr),
           "--distill-warmup", str(args.distill_warmup), "--distill-temp", str(args.distill_temp),
           "--distill-ce", str(args.distill_ce)]
    if args.batch != 64:
        cmd += ["--batch", str(args.batch)]
    if args.seed != 0:
        cmd += ["--seed", str(args.seed)]
    rep = ["", "```"] + scratch + [" ".join(cmd), "```", ""]
    if scratch:
        rep += ["(the second command re-trains only the draft, from the first one's `models/`;"
                " it reads the previous draft", "as its initialisation and \"before\" model)." if args.distill_init == "draft"
                else "as its \"before\" model).", ""]
    rep += [f"Environment: Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__},",
            f"tokenizers {tokenizers.__version__}, {dev}. The corpus depends on the interpreter's standard library version."]
    secs["Reproduce"] = rep
    if "Reproduce" not in order:
        order.append("Reproduce")

    lines = []
    for h in order:
        if h is not None:
            lines.append(f"## {h}")
        lines.extend(secs[h])
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "TRAINING.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines).rstrip("\n") + "\n")
    log(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--draft-steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-chunks", type=int, default=100000)
    ap.add_argument("--out", default="models")
    ap.add_argument("--prompts-out", default="configs/prompts/code.jsonl")
    ap.add_argument("--min-agreement", type=float, default=0.5)
    ap.add_argument("--max-seconds", type=float, default=1e9,
                    help="shorten a run (decided at step 30, inside the warmup) whose measured pace exceeds this")
    ap.add_argument("--distill-draft", action="store_true",
                    help="only re-train the draft by distillation from the frozen target in --out (or --distill-src)")
    ap.add_argument("--distill-src", default=None, help="directory with target/, draft/, TRAINING.md (default: --out)")
    ap.add_argument("--distill-init", choices=("draft", "scratch"), default="draft")
    ap.add_argument("--distill-steps", type=int, default=9400)
    ap.add_argument("--distill-lr", type=float, default=2e-3)
    ap.add_argument("--distill-warmup", type=int, default=300)
    ap.add_argument("--distill-temp", type=float, default=1.0)
    ap.add_argument("--distill-ce", type=float, default=0.0, help="weight of cross-entropy on the data")
    ap.add_argument("--metrics-json", default=None, help="distillation: also write all measurements here")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    log(f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
        f"tokenizers {tokenizers.__version__} device {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}")
    log("command: " + " ".join([os.path.basename(sys.executable)] + sys.argv))
    if args.distill_draft:
        return distill_main(args, device)

    t_start = time.time()
    train_files, held_files, info = load_corpus(100)
    log(f"corpus: Python {info['python']} stdlib {info['stdlib']}: {info['files_total']} files "
        f"({info['files_train']} train, {info['files_heldout']} held out, {len(info['files_skipped'])} skipped), "
        f"{info['chars_train']} train chars, {info['chars_heldout']} held-out chars")
    log(f"held-out files: {info['heldout_files']}")
    train_texts = [t for _, t in train_files]
    held_texts = [t for _, t in held_files]
    train_joined = EOT.join(train_texts)
    for pid, p in PROMPTS:
        assert p not in train_joined, f"prompt {pid} occurs verbatim in the training text"
        assert p.count("\n") < 4 and p == p.rstrip(), pid

    tok = train_tokenizer(train_texts)
    held_joined = EOT.join(held_texts)
    enc = tok.encode(held_joined, add_special_tokens=True)
    assert tok.decode(enc.ids, skip_special_tokens=False) == held_joined, "decode(encode(x)) != x"
    stream = encode_stream(tok, train_texts)
    held_stream = encode_stream(tok, held_texts)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, train tokens {stream.numel()}, held-out tokens {held_stream.numel()}, "
        f"{info['chars_train'] / stream.numel():.2f} chars/token; round trip on held-out text OK "
        f"({time.time() - t_start:.0f}s)")

    results = {}
    trained = {}
    for name, cfg, cls, steps in (("target", target_config(), MistralForCausalLM, args.target_steps),
                                  ("draft", draft_config(), LlamaForCausalLM, args.draft_steps)):
        torch.manual_seed(args.seed + (1 if name == "draft" else 0))
        cfg._attn_implementation = "sdpa"
        model = cls(cfg).to(device)
        npar = n_params(model)
        log(f"[{name}] {cls.__name__}: {npar} parameters, {steps} steps of {args.batch}x{SEQ} tokens "
            f"({steps * args.batch * SEQ / stream.numel():.1f} epochs)")
        curve, elapsed, steps = train(name, model, stream, held_stream, steps, args, device)
        path = os.path.join(args.out, name)
        save_dir(model, tok, path, cfg.max_position_embeddings)
        results[name] = {"params": npar, "steps": steps, "curve": curve, "seconds": elapsed, "class": cls.__name__}
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # Evaluate the checkpoints exactly as shipped: bf16 files loaded back as a download would be.
    torch.backends.cuda.matmul.allow_tf32 = False
    for name in ("target", "draft"):
        path = os.path.join(args.out, name)
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        trained[name] = m
        results[name]["train_loss"] = train_loss(m, stream, device)
    x, y = heldout_chunks(held_stream, args.eval_chunks)
    ev = evaluate(trained["target"], trained["draft"], x, y, device)
    log(f"eval on {ev['positions']} held-out positions: target loss {ev['target_loss']:.4f}, "
        f"draft loss {ev['draft_loss']:.4f}, greedy agreement {ev['agreement']:.4f}, "
        f"target top-1 {ev['target_top1']:.4f}, draft top-1 {ev['draft_top1']:.4f}")
    for name in ("target", "draft"):
        log(f"[{name}] train loss (32 random windows, saved bf16 weights) {results[name]['train_loss']:.4f}")

    samples = []
    tgt = trained["target"]
    for p in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(p).ids], device=device)
        out = tgt.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=80,
                           eos_token_id=0, pad_token_id=0)
        text = tok.decode(out[0].tolist(), skip_special_tokens=False)
        samples.append((p, text))
        log(f"--- sample for {p!r}:\n{text}\n---")

    os.makedirs(os.path.dirname(args.prompts_out), exist_ok=True)
    with open(args.prompts_out, "w") as fh:
        for pid, p in PROMPTS:
            fh.write(json.dumps({"id": pid, "prompt": p}) + "\n")

    write_report(args, info, tok, stream, held_stream, results, ev, samples, device)
    log(f"total {time.time() - t_start:.0f}s")
    if ev["agreement"] < args.min_agreement:
        sys.exit(f"greedy agreement {ev['agreement']:.3f} < {args.min_agreement}: train longer")


def write_report(args, info, tok, stream, held_stream, results, ev, samples, device):
    dev = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    lines = []
    a = lines.append
    a("# Default model pair")
    a("")
    a("`models/target` (MistralForCausalLM) and `models/draft` (LlamaForCausalLM) are tiny models trained from")
    a("scratch by `scripts/train_pair.py` to give the default experiment a real, *trained* target/draft pair")
    a("that runs on a laptop CPU. They are saved with `save_pretrained` in bf16 (safetensors) with a shared")
    a("byte-level BPE tokenizer, i.e. in the same layout as a checkpoint downloaded from the Hugging Face Hub.")
    a("All numbers below were measured by the script itself.")
    a("")
    a("## Corpus")
    a("")
    a(f"Python {info['python']} standard library sources (`*.py` under `sysconfig.get_paths()['stdlib']`, without")
    a("`test/`, `tests/`, `idle_test/`, `idlelib/`, `site-packages/`), files sorted and joined with `<|endoftext|>`.")
    a(f"- files: {info['files_total']} ({info['files_train']} train, {info['files_heldout']} held out, "
      f"{len(info['files_skipped'])} skipped as non-UTF-8); held out = every 100th file (index % 100 == 50) of the")
    a("  sorted files outside `encodings/` (the codec tables there are near-duplicates of one another)")
    a(f"- characters: {info['chars_train']:,} train, {info['chars_heldout']:,} held out")
    a(f"- tokens: {stream.numel():,} train, {held_stream.numel():,} held out "
      f"({info['chars_train'] / stream.numel():.2f} characters per token)")
    a(f"- held-out files: {', '.join(info['heldout_files'])}")
    a("")
    a("## Tokenizer")
    a("")
    a(f"Byte-level BPE (`tokenizers` {tokenizers.__version__}), vocabulary {tok.get_vocab_size()}, `<|endoftext|>` = id 0")
    a("(also the EOS id), no BOS and nothing added by the post-processor, ByteLevel decoder;")
    a("`decode(encode(x)) == x` holds on the held-out text.")
    a("")
    a("## Models and training")
    a("")
    a("| | target | draft |")
    a("| --- | --- | --- |")
    a(f"| class | {results['target']['class']} | {results['draft']['class']} |")
    a("| hidden / layers / heads / KV heads / head_dim | 256 / 4 / 8 / 2 / 32 | 128 / 2 / 4 / 2 / 32 |")
    a("| intermediate | 768 | 384 |")
    a("| attention | sliding window 64 | full |")
    a("| embeddings | tied | tied |")
    a(f"| parameters | {results['target']['params']:,} | {results['draft']['params']:,} |")
    a(f"| steps (batch {args.batch} x {SEQ} tokens) | {results['target']['steps']} | {results['draft']['steps']} |")
    a(f"| training time ({dev}) | {results['target']['seconds']:.0f} s | {results['draft']['seconds']:.0f} s |")
    a(f"| final train loss (nats/token) | {results['target']['train_loss']:.4f} | {results['draft']['train_loss']:.4f} |")
    a(f"| held-out loss (nats/token) | {ev['target_loss']:.4f} | {ev['draft_loss']:.4f} |")
    a(f"| held-out top-1 accuracy | {ev['target_top1']:.4f} | {ev['draft_top1']:.4f} |")
    a("")
    a(f"AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak lr {args.lr}, {args.warmup} warmup steps, cosine")
    a(f"decay to 10%, gradient clipping 1.0, bf16 autocast, random 256-token windows, seed {args.seed}.")
    a("Train loss: mean over 32 random training windows; both losses are computed from the saved bf16 weights")
    a("(loaded back in f32).")
    a("")
    a("Loss curve: training loss of the current batch / held-out loss on (up to 256) held-out windows")
    a("(bf16 autocast, during training):")
    a("")
    a("| step | target train | target held-out | draft train | draft held-out |")
    a("| --- | --- | --- | --- | --- |")
    tc = {s: (l, h) for s, l, h in results["target"]["curve"]}
    dc = {s: (l, h) for s, l, h in results["draft"]["curve"]}
    for s in sorted(set(tc) | set(dc)):
        t = tc.get(s)
        d = dc.get(s)
        ts = f"{t[0]:.3f} | {t[1]:.3f}" if t else " | "
        ds = f"{d[0]:.3f} | {d[1]:.3f}" if d else " | "
        a(f"| {s} | {ts} | {ds} |")
    a("")
    a("## Draft/target agreement")
    a("")
    a(f"Teacher-forced greedy agreement on all {ev['positions']:,} held-out positions (fraction where the draft's")
    a(f"argmax equals the target's argmax): **{ev['agreement']:.4f}**.")
    a("")
    a("## Greedy samples of the target")
    a("")
    for p, text in samples:
        a(f"Prompt `{json.dumps(p)}`:")
        a("")
        a("```python")
        a(text)
        a("```")
        a("")
    a("## Reproduce")
    a("")
    a("```")
    a("python3 " + " ".join(["scripts/train_pair.py"] + sys.argv[1:]))
    a("```")
    a("")
    a(f"Environment: Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__},")
    a(f"tokenizers {tokenizers.__version__}, {dev}. The corpus depends on the interpreter's standard library version.")
    path = os.path.join(args.out, "TRAINING.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
