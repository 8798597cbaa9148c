#!/usr/bin/env python3
"""Train an EAGLE-3 draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test") for a Hugging Face causal LM target, on the target's own
generations, with training-time-test (TTT) unrolling. Writes the original EAGLE-3 release layout
(config.json with architectures ["LlamaForCausalLMEagle3"], model.safetensors with fc / midlayer.* /
norm / lm_head / d2t / t2d, no embed_tokens) plus TRAINING.md with the numbers this script measured.

Command used for models/eagle3 (one NVIDIA H200, Python 3.12.3, torch 2.11.0+cu130, transformers
5.17.0; 412 s in all, 259 s of training; models/eagle3/TRAINING.md has the numbers):

    python3 scripts/train_eagle3.py --device cuda --intermediate 1536 --max-seconds 240

The default device is the CPU, where the same settings take far longer (on the 2-core development
machine about 1 s per training step of 32 sequences and a few sequences a second of generation, so
1.5-2 hours; the budget flag --max-seconds only shortens training). A saved head is re-measured on
the CPU in about a minute (self-test and acceptance simulation, no training):

    python3 scripts/train_eagle3.py --eval-only --out models/eagle3

Commands used for models/eagle3-smollm2 (the real SmolLM2-135M-Instruct Q4_1 GGUF file, which transformers
dequantizes to float32 with the `gguf` package, as the Rust engine does; one NVIDIA H200, two 10-minute calls:
generation 537 s, training 575 s): the instructions of models/eagle3-smollm2/prompts.jsonl (made by make_prompts.py
there) and the requests the target wrote itself in an earlier run (--self-prompts, kept in self_prompts.jsonl.gz),
each through the target's chat template, continued by the target; the set saved, then trained on; generation and
training each cut by a time budget (models/eagle3-smollm2/TRAINING.md has the numbers):

    python3 scripts/train_eagle3.py --device cuda \
        --target models/real/SmolLM2-135M-Instruct.Q4_1.gguf \
        --prompts-jsonl models/eagle3-smollm2/prompts.jsonl \
        --extra-prompts models/eagle3-smollm2/self_prompts.jsonl.gz --chat-template --layers 2,15,27 \
        --draft-vocab 12288 --intermediate 1536 --save-dtype float16 --recompute-features \
        --heldout-prompts 64 --heldout-seqs 64 --seq-len 352 --baseline-draft= --sample-frac 0.2 \
        --gen-batch 1024 --num-seqs 100000 --gen-seconds 495 --gen-only --data-out /tmp/keep/big.pt \
        --out /tmp/keep/head
    python3 scripts/train_eagle3.py --device cuda \
        --target models/real/SmolLM2-135M-Instruct.Q4_1.gguf \
        --prompts-jsonl models/eagle3-smollm2/prompts.jsonl \
        --extra-prompts models/eagle3-smollm2/self_prompts.jsonl.gz --chat-template --layers 2,15,27 \
        --draft-vocab 12288 --intermediate 1536 --save-dtype float16 --recompute-features \
        --heldout-prompts 64 --heldout-seqs 64 --seq-len 352 --baseline-draft= --num-seqs 0 \
        --data-in /tmp/keep/big.pt --ttt-steps 5 --anchors 64 --batch 64 --epochs 20 --eval-every 400 \
        --max-seconds 440 --gamma 4 --sim-new-tokens 128 --sim-heldout-prompts 2 \
        --sim-prompts configs/prompts/spec_bench_question.jsonl --sim-limit 8 --out /tmp/keep/head

Generation can be split over several runs, each within a time limit (a GPU machine's call, say): --data-out
saves a run's generated set (ids, recorded states, masks; about 4.6 kB a token for SmolLM2 in float16), and a
later run trains on the sets named by --data-in beside its own generations (same target, --layers, --seq-len;
each run its own --seed, or its sampled prompts and continuations repeat). The target's states are recorded
through hooks on the fused layers and the final norm (not output_hidden_states, which keeps every layer's
states of every generation step), so --gen-batch is limited by the KV cache, not by those states.

With --chat-template each prompt is one whole user turn through the chat template (generation batches of
prompts of similar length, left-padded with the attention mask, rows stored left-aligned); the
simulation's --sim-prompts go through the template too (Spec-Bench's first turn). The target's logits in
the loss are its lm_head rows of the draft vocabulary; whether the target's choice lies in the draft
vocabulary is decided by the argmax over the whole vocabulary, recorded while generating.

Larger targets on a GPU (the prompt source, the number of sequences and the lengths are flags):

    python3 scripts/train_eagle3.py --target /path/to/hf-model --device cuda --target-dtype bfloat16 \
        --prompts-jsonl my_prompts.jsonl --draft-vocab 32000 --layers 2,16,29 --out out/eagle3

The head (one Llama decoder layer), as the Rust drafter runs it. Head position j takes the fused
target feature f_j = concat(hidden_states[k][j] for k in --layers) (hidden_states[k] = the residual
stream entering target decoder layer k, as transformers' output_hidden_states gives it for
k < num_layers) and the token t_{j+1} (the token after position j), RoPE position j + 1 (the input
token's position; only differences matter):

    g    = fc(f_j)                                        [3*H -> H], no bias
    x    = concat(input_layernorm(embed(t_{j+1})), hidden_norm(g))       [2H], embed = target's, frozen
    q,k,v= q_proj(x), k_proj(x), v_proj(x)                 no bias, GQA, Llama RoPE (rotate_half), target's theta
    y    = g + o_proj(causal_attention(q, k, v))           residual = the un-normed g
    out  = y + down_proj(silu(gate_proj(post_attention_layernorm(y))) * up_proj(post_attention_layernorm(y)))
    logits = lm_head(norm(out))                            [draft vocab]; target id = d + d2t[d]

predicting t_{j+2}. Drafting: the first draft token comes from the last committed pair's logits;
draft step s >= 1 feeds (out of the previous step, the previous draft token) -- out is width H and
does NOT go through fc -- at the next position, attending to every committed pair's key/value and
to the earlier draft steps of the same chain. RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w.

Training (TTT, as speculators' Eagle3DraftModel.forward and the EAGLE-3 reference): step 0 runs the
head on all positions from target features; step s >= 1 feeds, at query j, the head's own `out` of
step s - 1 at j and the ground-truth token t_{j+1+s} (RoPE position j+1+s); query j attends to the
step-0 keys of positions <= j (causal) plus its own keys of steps 1..s (the diagonal blocks of
speculators' extend_mask_for_draft_tokens) -- exactly the cache a chain drafted from pair j sees.
The step-s logits at j are trained against the target's distribution at position j+1+s (predicting
t_{j+2+s}) restricted to the draft vocabulary: loss = sum_s decay^s * mean forward KL. Gradients flow
through the unrolled steps.

Data: prompts are random token windows of text disjoint from every evaluation set (default: the
Python standard library of the running interpreter minus the target's held-out files and minus the
sources of the evaluation prompt files; the script checks that no evaluation prompt occurs verbatim
in the training text); each is continued by the target (greedy or T=1 sampling, per --sample-frac)
to a fixed total length; the target's pass over prompt + generation (prefill, then cached decode
steps; one extra token is generated so that every kept position is processed) records the hidden
states at --layers and the final normed hidden state (the target's logits are lm_head of it).
Held-out sequences come the same way from the target's held-out files. Each training batch unrolls
the chains of --anchors random positions per sequence (every position's step-0 key/value is still
computed, so a chain's context is exact); --anchors 0 unrolls all positions, as speculators does.

Evaluation: per-step top-1 accuracy on held-out generations during training; after training, the
saved weights are loaded back and a greedy chain speculation (gamma 4 and 8) is run with the real target
in torch on held-out prompts and on the default experiment's prompts (evaluation only): the head
drafts autoregressively with its own KV cache, the target verifies with a full forward, the longest
matching prefix plus the target's token is committed, and the head then consumes the target's
fresh features for the committed positions. The shipped draft model (models/draft) is measured in
the same simulation for comparison.
"""

import argparse
import collections
import contextlib
import copy
import glob
import gzip
import importlib.metadata
import json
import math
import os
import platform
import random
import re
import shlex
import sys
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import (AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList,
                          StoppingCriteria, StoppingCriteriaList)

EXCLUDE_DIRS = {"test", "tests", "idle_test", "idlelib", "site-packages"}
# The shipped target's held-out files (models/TRAINING.md) are also read from that file when present.
DEFAULT_HELDOUT = ["asyncio/subprocess.py", "getopt.py", "platform.py", "weakref.py"]
# Sources of configs/prompts/context.jsonl (see context.NOTICE.md): excluded from training prompts.
EVAL_SOURCE_FILES = ["argparse.py", "textwrap.py"]


def log(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# The head


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()


class SelfAttn(nn.Module):
    def __init__(self, h, nh, nkv, hd):
        super().__init__()
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)


class MLP(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, h, inter, nh, nkv, hd, eps):
        super().__init__()
        self.hidden_norm = RMSNorm(h, eps)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn = SelfAttn(h, nh, nkv, hd)
        self.mlp = MLP(h, inter)


class Eagle3Head(nn.Module):
    """State-dict keys are the EAGLE-3 release names (fc, midlayer.*, norm, lm_head, d2t, t2d)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        h = c["hidden_size"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.fc = nn.Linear(len(c["eagle_aux_hidden_state_layer_ids"]) * c["target_hidden_size"], h, bias=False)
        self.midlayer = MidLayer(h, c["intermediate_size"], self.nh, self.nkv, self.hd, c["rms_norm_eps"])
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c["vocab_size"], dtype=torch.bool))
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def rope(self, pos):
        """cos, sin for integer positions pos [..., n] -> [..., 1, n, hd] (Llama, rotate_half)."""
        fr = pos.float()[..., None] * self.inv_freq
        emb = torch.cat([fr, fr], -1)
        return emb.cos().unsqueeze(-3), emb.sin().unsqueeze(-3)

    @staticmethod
    def rot(x, cos, sin):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def qkv(self, g, emb, pos):
        """g [B,n,H] (fc output or a previous step's out), emb [B,n,H], pos [B,n] -> q [B,nh,n,hd], k, v [B,nkv,n,hd]."""
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], -1)
        B, n, _ = x.shape
        q = m.self_attn.q_proj(x).view(B, n, self.nh, self.hd).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(B, n, self.nkv, self.hd).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(B, n, self.nkv, self.hd).transpose(1, 2)
        cos, sin = self.rope(pos)
        return self.rot(q.float(), cos, sin), self.rot(k.float(), cos, sin), v

    def rep(self, t):  # GQA: query head i uses kv head i // (nh / nkv)
        return t.repeat_interleave(self.nh // self.nkv, dim=1) if self.nh != self.nkv else t

    def post(self, g, attn):
        """attn [B,nh,n,hd] -> out [B,n,H]."""
        m = self.midlayer
        B, _, n, _ = attn.shape
        y = g + m.self_attn.o_proj(attn.transpose(1, 2).reshape(B, n, self.nh * self.hd).to(g.dtype))
        return y + m.mlp(m.post_attention_layernorm(y).to(y.dtype))

    def logits(self, out):
        return self.lm_head(self.norm(out).to(out.dtype))


def ttt_forward(head, embed, feats, tokens, steps, anchors):
    """Training-time test unrolled over `steps` steps.

    feats [B,L,3*TH] (target features at positions 0..L-1), tokens [B,L], anchors [B,M]: the query
    positions j (0..L-2) whose chains are unrolled (all positions, or a random subset: every
    position's step-0 key/value is computed either way, so a chain sees exactly the context it
    would see with all positions unrolled). Query j at step s takes token t_{j+1+s} (clamped past the
    end; the caller masks those) at RoPE position j+1+s and attends to the step-0 keys of positions
    <= j and to its own keys of steps 1..s. Returns per-step logits [B,M,Vd]; step s at query j is
    scored against the target distribution at position j+1+s."""
    B, L = tokens.shape
    T = L - 1
    M = anchors.shape[1]
    H = head.c["hidden_size"]
    m = head.midlayer
    at = m.self_attn
    scale = 1.0 / math.sqrt(head.hd)
    dev = tokens.device
    g_all = head.fc(feats[:, :T])
    with torch.no_grad():
        emb0 = embed(tokens[:, 1:])
    x_all = torch.cat([m.input_layernorm(emb0), m.hidden_norm(g_all)], -1)
    cos, sin = head.rope(torch.arange(1, L, device=dev))
    k0 = head.rot(at.k_proj(x_all).view(B, T, head.nkv, head.hd).transpose(1, 2).float(), cos, sin)
    v0 = at.v_proj(x_all).view(B, T, head.nkv, head.hd).transpose(1, 2)
    k0, v0 = head.rep(k0), head.rep(v0)  # [B,nh,T,hd]
    keymask = torch.arange(T, device=dev)[None, None, :] <= anchors[:, :, None]  # [B,M,T]
    bias = torch.zeros(B, 1, M, T, device=dev).masked_fill(~keymask[:, None], float("-inf"))
    g = g_all.gather(1, anchors[..., None].expand(B, M, H))
    x = x_all.gather(1, anchors[..., None].expand(B, M, 2 * H))
    chain_k, chain_v = [], []
    out_logits = []
    for s in range(steps):
        if s > 0:
            with torch.no_grad():
                emb = embed(tokens.gather(1, (anchors + 1 + s).clamp(max=L - 1)))
            x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], -1)
        cos, sin = head.rope(anchors + 1 + s)  # [B,1,M,hd]
        q = head.rot(at.q_proj(x).view(B, M, head.nh, head.hd).transpose(1, 2).float(), cos, sin)
        sc0 = (q @ k0.transpose(-1, -2)).float() * scale + bias
        if s == 0:
            attn = torch.softmax(sc0, -1).to(v0.dtype) @ v0
        else:
            k = head.rot(at.k_proj(x).view(B, M, head.nkv, head.hd).transpose(1, 2).float(), cos, sin)
            v = at.v_proj(x).view(B, M, head.nkv, head.hd).transpose(1, 2)
            chain_k.append(head.rep(k))
            chain_v.append(head.rep(v))
            dg = torch.stack([(q * kk).sum(-1) for kk in chain_k], -1) * scale  # [B,nh,M,s]
            w = torch.softmax(torch.cat([sc0, dg], -1), -1)
            attn = w[..., :T].to(v0.dtype) @ v0
            for i, vv in enumerate(chain_v):
                attn = attn + w[..., T + i:T + i + 1] * vv.float()
        out = head.post(g, attn)
        out_logits.append(head.logits(out))
        g = out
    return out_logits


def load_saved_head(out_dir):
    """A head this script saved (config.json and model.safetensors of `out_dir`), in float32, eval mode."""
    with open(os.path.join(out_dir, "config.json")) as fh:
        hc = json.load(fh)
    cfg = {k: hc[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                              "head_dim", "rms_norm_eps", "rope_theta", "vocab_size", "draft_vocab_size",
                              "eagle_aux_hidden_state_layer_ids")}
    cfg["target_hidden_size"] = hc.get("target_hidden_size", hc["hidden_size"])
    head = Eagle3Head(cfg)
    head.load_state_dict(load_file(os.path.join(out_dir, "model.safetensors")), strict=True)
    return head.float().eval()


# Incremental inference (what the Rust drafter does), used by the simulation and the self-test.

class HeadCache:
    def __init__(self):
        self.k = None  # [1, nh, n, hd] after GQA expansion
        self.v = None

    def cat(self, k, v):
        if self.k is None:
            return k, v
        return torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)


@torch.no_grad()
def head_step(head, embed, cache, g, tokens, pos, commit):
    """Run n new head positions on top of `cache` (causal among themselves, attending to all of it).
    g [n,H] (fc(features) or previous outs), tokens [n], pos [n]. Appends to the cache if commit."""
    q, k, v = head.qkv(g[None], embed(tokens)[None], pos[None])
    k, v = head.rep(k), head.rep(v)
    K, V = cache.cat(k, v)
    n, tot = q.shape[2], K.shape[2]
    mask = torch.ones(n, tot, dtype=torch.bool, device=q.device)
    mask[:, tot - n:] = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    sc = (q @ K.transpose(-1, -2)).float() / math.sqrt(head.hd)
    sc = sc.masked_fill(~mask, float("-inf"))
    attn = torch.softmax(sc, -1).to(V.dtype) @ V
    out = head.post(g[None], attn)[0]
    if commit:
        cache.k, cache.v = K, V
    return out, head.logits(out[None])[0].float()


# ----------------------------------------------------------------------------------------------
# Target


def target_parts(target):
    base = target.get_base_model() if hasattr(target, "get_base_model") else target.model
    return base.embed_tokens, base.norm, target.get_output_embeddings()


# ----------------------------------------------------------------------------------------------
# Data


def parse_heldout(target_dir):
    md = os.path.join(os.path.dirname(os.path.abspath(target_dir)), "TRAINING.md")
    files = list(DEFAULT_HELDOUT)
    if os.path.exists(md):
        for line in open(md):
            m = re.match(r"\s*-\s*held-out files:\s*(.*)", line)
            if m:
                files = [f.strip() for f in m.group(1).split(",") if f.strip()]
    return files


def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, root)
        if any(p in EXCLUDE_DIRS for p in rel.split(os.sep)[:-1]):
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append((rel.replace(os.sep, "/"), text))
    out.sort()
    return root, out


def eval_prompt_texts(prompt_files):
    """Every prompt text of the evaluation prompt files (fields 'prompt' or 'turns')."""
    texts = []
    for path in prompt_files:
        with open(path) as fh:
            for line in fh:
                if not line.strip():
                    continue
                d = json.loads(line)
                if "prompt" in d:
                    texts.append((path, d["prompt"]))
                for t in d.get("turns", []) or []:
                    texts.append((path, t))
    return texts


def check_disjoint(train_texts, eval_texts):
    joined = "\x00".join(train_texts)
    bad = []
    for path, t in eval_texts:
        probe = t.strip()[:300]
        if len(probe) >= 16 and probe in joined:
            bad.append((path, probe[:60]))
    return bad


def encode(tok, text, special=False):
    return tok.encode(text, add_special_tokens=special).ids


class HFTokenizer:
    """A transformers tokenizer (e.g. read from a GGUF file) with the `tokenizers` encode interface."""

    class Enc:
        def __init__(self, ids):
            self.ids = ids

    def __init__(self, t):
        self.t = t

    def encode(self, text, add_special_tokens=False):
        return self.Enc(self.t(text, add_special_tokens=add_special_tokens).input_ids)


def sample_windows(streams, n, plen_min, plen_max, total_len, rng):
    """n prompt windows (token lists); lengths drawn per group later. Files weighted by length."""
    weights = [max(0, len(s) - plen_max - 1) for s in streams]
    tot = sum(weights)
    out = []
    for _ in range(n):
        r = rng.random() * tot
        for s, w in zip(streams, weights):
            if r < w:
                break
            r -= w
        st = rng.randrange(0, len(s) - plen_max - 1)
        out.append(s[st:st + plen_max])
    return out


def no_eos_config(target):
    """The target's generation config without a stop token: generations run to full length with the
    target's unmodified distribution (tokens after an EOS are left out of the loss)."""
    gc = copy.deepcopy(target.generation_config)
    gc.eos_token_id = None
    if gc.pad_token_id is None:
        gc.pad_token_id = 0
    return gc


# Long-context requests (--context-prompts) built from the target's own answers: the shapes of
# Spec-Bench's summarization, extraction and retrieval-augmented questions (a long passage, then a
# task over it) without any of their text. Wording written here.
CONTEXT_TEMPLATES = {
    "summarize": ["Summarize the following text in a few sentences.\n\n{doc}",
                  "Write a concise summary of the article below.\n\n{doc}",
                  "{doc}\n\nSummarize the text above in one paragraph.",
                  "Give a brief summary of the main ideas in this passage:\n\n{doc}"],
    "key points": ["Read the following text and list its key points.\n\n{doc}",
                   "{doc}\n\nWhat are the most important facts mentioned in the text above?",
                   "Extract the main facts from the passage below as a bulleted list.\n\nPassage:\n{doc}"],
    "passage question": ["Answer the question using the passage below.\n\nPassage:\n{doc}\n\nQuestion: {q}",
                         "{doc}\n\nBased on the text above, respond to this request: {q}",
                         "Context:\n{doc}\n\nUsing only the context, respond to the following: {q}"],
    "documents question": ["Use the documents below to answer the question.\n\n{docs}\n\nQuestion: {q}",
                           "{docs}\n\nAnswer using the information in the documents above: {q}",
                           "Here are some retrieved passages:\n\n{docs}\n\nWith their help, answer: {q}"],
}


def context_requests(data, questions, hf_tok, eos_id, n, rng, min_doc_tokens=64):
    """n long-context user requests (text, kind): passages are the generated answers of `data`'s rows
    (decoded up to their first EOS, at least min_doc_tokens long); a question is the request that
    produced one of them (`questions[row]`). A "documents question" holds 2-3 answers, the one to its
    question among them at a random place. Kinds in equal shares."""
    docs = []
    for r in range(data["ids"].shape[0]):
        p0, v = int(data["plen"][r]), int(data["valid"][r])
        row = data["ids"][r, p0:v].tolist()
        if eos_id is not None and eos_id in row:
            row = row[:row.index(eos_id)]
        if len(row) >= min_doc_tokens:
            docs.append((r, hf_tok.decode(row, skip_special_tokens=True).strip()))
    assert len(docs) >= 3, f"only {len(docs)} generated answers of >= {min_doc_tokens} tokens to build passages from"
    kinds = list(CONTEXT_TEMPLATES)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        tpl = rng.choice(CONTEXT_TEMPLATES[kind])
        r, doc = rng.choice(docs)
        if kind == "documents question":
            picked = [doc] + [rng.choice(docs)[1] for _ in range(rng.randint(1, 2))]
            rng.shuffle(picked)
            body = "\n\n".join(f"Document {k + 1}:\n{d}" for k, d in enumerate(picked))
            out.append((tpl.format(docs=body, q=questions[r]), kind))
        else:
            out.append((tpl.format(doc=doc, q=questions[r]), kind))
    return out


def widen(t, L):
    """[N, l, ...] -> [N, L, ...], zeros after column l (ids 0, masks False: out of the loss)."""
    if t.shape[1] >= L:
        return t
    z = t.new_zeros((t.shape[0], L) + tuple(t.shape[2:]))
    z[:, :t.shape[1]] = t
    return z


def concat_sets(a, b):
    """b's rows after a's; per-position tensors right-padded to the wider set's length."""
    L = max(a["ids"].shape[1], b["ids"].shape[1])
    out = {}
    for k, v in a.items():
        w = b.get(k)
        if v is None or w is None:
            assert v is None and w is None, f"set field {k}: present in one set only"
            out[k] = None
        elif isinstance(v, list):
            out[k] = v + w
        elif v.dim() >= 2:
            out[k] = torch.cat([widen(v, L), widen(w, L)])
        else:
            out[k] = torch.cat([v, w])
    return out


def length_batches(perm, valid, bs, gen):
    """perm regrouped so that each batch of bs holds rows of similar kept length (a set mixing short
    and long rows: each batch is cut to its longest row): runs of 32 batches sorted by length, then
    the batches shuffled. Every row still comes once per epoch."""
    batches = []
    for i in range(0, len(perm), 32 * bs):
        run = perm[i:i + 32 * bs]
        run = run[torch.sort(valid[run], stable=True).indices]
        batches += [run[j:j + bs] for j in range(0, len(run) - bs + 1, bs)]
    order = torch.randperm(len(batches), generator=gen)
    return torch.cat([batches[k] for k in order]) if batches else perm[:0]


@torch.no_grad()
def self_prompts(target, hf_tok, tok, n, max_tokens, batch, device, seed, eos_id, max_seconds):
    """Up to n user requests written by the target itself (Magpie, Xu et al. 2024: an instruction model
    continues its chat template from the opening of a user turn): the template is rendered up to where a
    user turn's text begins (the default system message included), and the target samples the turn at
    T = 1 with top-p 0.95 until its end-of-turn token (eos_id). Turns that end within max_tokens and hold
    at least 16 characters are kept, stripped, and deduplicated (case- and whitespace-insensitive).
    Returns (texts, batches run); stops after max_seconds or 4 n / batch batches."""
    mark = "\u2063SPECDEC-USER-TURN\u2063"
    rendered = hf_tok.apply_chat_template([{"role": "user", "content": mark}], add_generation_prompt=False,
                                          tokenize=False)
    prefix = encode(tok, rendered[:rendered.index(mark)])
    gc = copy.deepcopy(target.generation_config)
    gc.eos_token_id, gc.pad_token_id = eos_id, eos_id
    torch.manual_seed(seed)
    out, seen, t0, runs = [], set(), time.time(), 0
    while len(out) < n and runs < max(1, 4 * n // batch) and time.time() - t0 < max_seconds:
        ids = torch.tensor([prefix] * batch, device=device)
        seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              generation_config=gc, do_sample=True, temperature=1.0, top_k=0, top_p=0.95)
        runs += 1
        for row in seq[:, len(prefix):].tolist():
            if eos_id not in row:
                continue  # the turn did not end within max_tokens
            text = hf_tok.decode(row[:row.index(eos_id)], skip_special_tokens=True).strip()
            key = re.sub(r"\s+", " ", text).lower()
            if len(text) >= 16 and key not in seen:
                seen.add(key)
                out.append(text)
        log(f"  self-written prompts: {len(out)} after {runs} batches of {batch} ({time.time() - t0:.0f}s)")
    return out[:n], runs


class ArgmaxRecorder(LogitsProcessor):
    """Records the argmax over the whole vocabulary of the raw logits of every generation step (the
    target's greedy choice at that position, also for sampled sequences)."""

    def __init__(self):
        self.out = []

    def __call__(self, input_ids, scores):
        self.out.append(scores.argmax(-1))
        return scores


class AllEos(StoppingCriteria):
    """Stops once every row has generated `eos_id` (later tokens are out of the loss anyway)."""

    def __init__(self, eos_id, start):
        self.eos_id, self.start = eos_id, start

    def __call__(self, input_ids, scores, **kw):
        done = (input_ids[:, self.start:] == self.eos_id).any(1)
        return done.all().expand(input_ids.shape[0])


class StateCapture:
    """While active, records for every forward of `target` the residual stream entering each
    decoder layer k of `layers` (what transformers' output_hidden_states gives as
    hidden_states[k]) and the final norm's output, through hooks: output_hidden_states would
    keep every layer's states of every generation step (31 layers of SmolLM2 where 3 are
    fused), which caps the generation batch by memory. `feats` / `fin` hold one
    [N, n, len(layers) * H] / [N, n, H] tensor per forward, in `dtype`."""

    def __init__(self, target, layers, dtype):
        base = target.get_base_model() if hasattr(target, "get_base_model") else target.model
        self.blocks, self.norm, self.layers, self.dtype = base.layers, base.norm, layers, dtype
        self.feats, self.fin, self._cur, self._hooks = [], [], {}, []

    def _pre(self, k):
        def hook(_module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self._cur[k] = h.to(self.dtype)
        return hook

    def _post(self, _module, _args, out):
        self.feats.append(torch.cat([self._cur.pop(k) for k in self.layers], -1))
        self.fin.append(out.to(self.dtype))

    def __enter__(self):
        for k in self.layers:
            self._hooks.append(self.blocks[k].register_forward_pre_hook(self._pre(k), with_kwargs=True))
        self._hooks.append(self.norm.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = []


@torch.no_grad()
def generate(target, prompts, gen_len, total_len, sample, device, seed, layers, cdt, eos_id, capture=True):
    """prompts: token lists of one batch (any lengths; left-padded for the batched generation, with
    the attention mask, so every row keeps RoPE positions 0..). Each row is continued by gen_len
    tokens (one more is generated and dropped so that every kept position has been processed; the
    generation stops early once every row has produced eos_id). Rows are returned left-aligned
    (prompt, then generation, then zero padding up to total_len): ids [N,total_len], the target's
    hidden states recorded while generating (one target pass: prefill, then one cached decode step
    per token) feats [N,total_len,len(layers)*H] (hidden_states[k] for k in layers), fin
    [N,total_len,H] (after the final norm), targmax [N,total_len] (argmax of the target's full
    logits at each generated-from position, 0 elsewhere) and valid [N] (rows' kept lengths).
    capture=False records no states (feats and fin are None: --recompute-features)."""
    lens = [len(p) for p in prompts]
    P = max(lens)
    ids = torch.tensor([[0] * (P - n) + list(p) for p, n in zip(prompts, lens)], device=device)
    am = torch.tensor([[0] * (P - n) + [1] * n for n in lens], device=device)
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    rec = ArgmaxRecorder()
    stop = StoppingCriteriaList([AllEos(eos_id, P)]) if eos_id is not None else None
    with (StateCapture(target, layers, cdt) if capture else contextlib.nullcontext()) as cap:
        seq = target.generate(ids, attention_mask=am, max_new_tokens=gen_len + 1,
                              generation_config=no_eos_config(target),
                              logits_processor=LogitsProcessorList([rec]), stopping_criteria=stop, **kw)
    if capture:
        feats = torch.cat(cap.feats, 1)  # [N, P + steps - 1, .]: the prefill, then one position a step
        fin = torch.cat(cap.fin, 1)
        del cap
    am_ = torch.stack(rec.out, 1)  # [N, steps]: argmax at padded positions P-1 ..
    N = seq.shape[0]
    n_proc = seq.shape[1] - 1  # positions processed by the target (the last token was not fed back)
    out_ids = torch.zeros(N, total_len, dtype=torch.long)
    out_f = torch.zeros(N, total_len, feats.shape[-1], dtype=cdt) if capture else None
    out_fi = torch.zeros(N, total_len, fin.shape[-1], dtype=cdt) if capture else None
    out_am = torch.zeros(N, total_len, dtype=torch.long)
    valid = []
    for b in range(N):
        pad = P - lens[b]
        keep = min(total_len, lens[b] + gen_len, n_proc - pad)
        out_ids[b, :keep] = seq[b, pad:pad + keep].cpu()
        if capture:
            out_f[b, :keep] = feats[b, pad:pad + keep].to(cdt).cpu()
            out_fi[b, :keep] = fin[b, pad:pad + keep].to(cdt).cpu()
        na = min(am_.shape[1], keep - (lens[b] - 1))
        out_am[b, lens[b] - 1:lens[b] - 1 + na] = am_[b, :na].cpu()
        valid.append(keep)
    return out_ids, out_f, out_fi, out_am, torch.tensor(valid)


def build_set(target, streams, n, args, rng, device, eos_id, layers, cdt, prompts=None, max_seconds=None):
    """n sequences. Without `prompts`: prompt windows of random length in [prompt_min, prompt_max]
    (one length per generation batch) of the token streams, continued to --seq-len tokens. With
    `prompts` (token lists, e.g. chat-templated instructions): the first n, sorted by length into
    generation batches (least padding), each continued by --seq-len minus the batch's longest
    prompt tokens. Greedy for a (1 - sample_frac) share of the batches, T=1 sampling for the rest.
    max_seconds: stop starting new batches once generation has taken that long."""
    if prompts is None:
        wins = sample_windows(streams, n, args.prompt_min, args.prompt_max, args.seq_len, rng)
    else:
        sel = sorted(range(min(n, len(prompts))), key=lambda k: len(prompts[k]))  # stable: ties keep file order
        wins = [prompts[k] for k in sel]
    ids_l, f_l, fi_l, am_l, v_l, plens, sampled, used = [], [], [], [], [], [], [], []
    nb = (len(wins) + args.gen_batch - 1) // args.gen_batch
    n_sample = round(nb * args.sample_frac)
    modes = [True] * n_sample + [False] * (nb - n_sample)
    rng.shuffle(modes)
    order = list(range(nb))
    if prompts is not None:
        rng.shuffle(order)  # batches of all prompt lengths early, should the time budget cut the set short
    t0 = time.time()
    for i, b in enumerate(order):
        if max_seconds is not None and time.time() - t0 > max_seconds:
            log(f"generation budget {max_seconds:.0f}s reached after {i} of {nb} batches")
            break
        chunk = wins[b * args.gen_batch:(b + 1) * args.gen_batch]
        if prompts is None:
            plen = rng.randint(args.prompt_min, args.prompt_max)
            chunk = [c[:plen] for c in chunk]
        lens = [len(c) for c in chunk]
        gen_len = args.seq_len - max(lens)
        assert gen_len > 0, f"prompts of {max(lens)} tokens leave nothing to generate in --seq-len {args.seq_len}"
        ids, f, fi, am, v = generate(target, chunk, gen_len, args.seq_len, modes[b], device, rng.randrange(1 << 30),
                                     layers, cdt, eos_id, capture=not args.recompute_features)
        if i == 0 and f is not None:  # the recorded states of the first and last rows equal a fresh unpadded full forward
            for r_ in (0, ids.shape[0] - 1):
                n_ = int(v[r_])
                fr, ar = target_forward_all(target, ids[r_, :n_].to(device), layers)
                d_ = (fr.cpu() - f[r_, :n_].float()).abs().max().item() / fr.abs().max().item()
                g0 = lens[r_] - 1
                agree = (ar[g0:n_].cpu() == am[r_, g0:n_]).float().mean().item()
                log(f"  check row {r_}: recorded features vs a fresh forward, max |diff| / max |h| {d_:.1e}; "
                    f"recorded argmax agrees on {agree:.4f} of generated positions")
                assert d_ < 1e-2, d_
        ids_l.append(ids)
        f_l.append(f)
        fi_l.append(fi)
        am_l.append(am)
        v_l.append(v)
        plens += lens
        if prompts is not None:
            used += sel[b * args.gen_batch:(b + 1) * args.gen_batch]
        sampled += [modes[b]] * ids.shape[0]
        if (i + 1) % 5 == 0 or i + 1 == nb or i < 2:
            log(f"  generated {len(plens)} sequences ({i + 1}/{nb} batches) in {time.time() - t0:.0f}s")
    if not ids_l:  # nothing generated (--num-seqs 0: a run training on --data-in sets only)
        z = torch.zeros(0, args.seq_len, dtype=torch.long)
        ids_l, am_l, v_l = [z], [z], [torch.zeros(0, dtype=torch.long)]
        H = target.config.get_text_config().hidden_size
        cap = not args.recompute_features
        f_l = [torch.zeros(0, args.seq_len, len(layers) * H, dtype=cdt) if cap else None]
        fi_l = [torch.zeros(0, args.seq_len, H, dtype=cdt) if cap else None]
    ids = torch.cat(ids_l)
    plen = torch.tensor(plens, dtype=torch.long)
    valid = torch.cat(v_l)
    # loss mask over target positions p (the distribution predicting token p+1): generated tokens
    # only (p + 1 >= plen), up to and including the first generated EOS, within the row's kept length.
    L = ids.shape[1]
    p = torch.arange(L)[None]
    mask = (p + 1 >= plen[:, None]) & (p + 1 < valid[:, None])
    if eos_id is not None:
        is_eos = (ids == eos_id) & (p >= plen[:, None]) & (p < valid[:, None])
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((ids.shape[0],), L))
        mask &= p + 1 <= first[:, None]
    return {"ids": ids, "plen": plen, "mask": mask, "sampled": torch.tensor(sampled, dtype=torch.bool), "valid": valid,
            "feats": torch.cat(f_l) if f_l and f_l[0] is not None else None,
            "fin": torch.cat(fi_l) if fi_l and fi_l[0] is not None else None,
            "targmax": torch.cat(am_l), "prompt_idx": used}


# ----------------------------------------------------------------------------------------------
# Training


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def pick_anchors(mask, n, gen):
    """[B,n] query positions j per sequence, uniformly among those whose step-0 target (position
    j+1) is in the loss; n = 0: all positions 0..L-2."""
    B, L = mask.shape
    if n <= 0 or n >= L - 1:
        return torch.arange(L - 1, device=mask.device).expand(B, L - 1)
    r = torch.rand(B, L - 1, generator=gen).to(mask.device)
    r = r.masked_fill(~mask[:, 1:], 2.0)  # invalid positions last
    return r.topk(n, -1, largest=False).indices.sort(-1).values


def ttt_loss(head, embed, tgt_head, feats, fin, ids, mask, steps, decay, draft_ids, t2d, autocast, anchors, targmax):
    """Returns the loss and per-step [loss, correct, chain-correct, count]. tgt_head: the target's
    lm_head restricted to the draft vocabulary (its rows draft_ids); targmax [B,L]: the target's
    argmax over the whole vocabulary at each position (recorded while generating): positions whose
    argmax is outside the draft vocabulary are left out of the loss and the accuracies."""
    B, L = ids.shape
    M = anchors.shape[1]
    with torch.autocast(**autocast):
        outs = ttt_forward(head, embed, feats, ids, steps, anchors)
    total = 0.0
    stats = []
    chain = torch.ones(B, M, dtype=torch.bool, device=ids.device)
    H = fin.shape[-1]
    for s, lg in enumerate(outs):
        tp = anchors + 1 + s  # target position
        valid = tp <= L - 1
        tpc = tp.clamp(max=L - 1)
        with torch.no_grad():
            tl = tgt_head(fin.gather(1, tpc[..., None].expand(B, M, H)).float())
            m = mask.gather(1, tpc) & valid
            if draft_ids is not None:
                m &= t2d[targmax.gather(1, tpc)]
            tlp = F.log_softmax(tl, -1)
            tp_ = tlp.exp()
            ent = (tp_ * tlp).sum(-1)
            targ = tlp.argmax(-1)
        lp = F.log_softmax(lg.float(), -1)
        kl = ent - (tp_ * lp).sum(-1)
        cnt = m.sum().clamp_min(1)
        ls = (kl * m).sum() / cnt
        total = total + (decay ** s) * ls
        corr = lp.detach().argmax(-1) == targ
        chain &= corr
        stats.append(torch.stack([ls.detach(), (corr & m).sum().float(), (chain & m).sum().float(),
                                  m.sum().float()]))
    return total, torch.stack(stats)


class Features:
    """The fused states and final-norm output of a set's rows, [B,L,len(layers)*H] and [B,L,H] in
    float32 on `device`: the states recorded while generating where the set holds them, else
    (--recompute-features) a forward of the base model over the rows' ids (right padding after a
    row's kept length changes nothing before it: causal attention), under bf16 autocast on a GPU."""

    def __init__(self, target, layers, device):
        self.target, self.layers, self.device = target, layers, device
        self.base = target.get_base_model() if hasattr(target, "get_base_model") else target.model

    @torch.no_grad()
    def __call__(self, data, rows, L=None):
        if data["feats"] is not None:
            return (data["feats"][rows, :L].to(self.device).float(),
                    data["fin"][rows, :L].to(self.device).float())
        ids = data["ids"][rows, :L].to(self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            with StateCapture(self.target, self.layers, torch.float32) as cap:
                self.base(input_ids=ids, use_cache=False)
        return cap.feats[0], cap.fin[0]


def iterate(data, idx, bs, device, features):
    """Batches of bs rows of idx, each cut to its longest kept row (what follows is out of the loss)."""
    for i in range(0, len(idx) - bs + 1, bs):
        b = idx[i:i + bs]
        L = int(data["valid"][b].max())
        f, fi = features(data, b, L)
        yield (f, fi, data["ids"][b, :L].to(device), data["mask"][b, :L].to(device),
               data["targmax"][b, :L].to(device))


@torch.no_grad()
def evaluate_heldout(head, embed, tgt_head, held, steps, decay, draft_ids, t2d, autocast, device, bs, features):
    head.eval()
    tot = None
    n = held["ids"].shape[0]
    for i in range(0, n, bs):
        f, fi = features(held, torch.arange(i, min(i + bs, n)))
        m = held["mask"][i:i + bs].to(device)
        _, st = ttt_loss(head, embed, tgt_head, f, fi, held["ids"][i:i + bs].to(device), m, steps, decay,
                         draft_ids, t2d, autocast, pick_anchors(m, 0, None), held["targmax"][i:i + bs].to(device))
        st = st.cpu().double()
        st[:, 0] *= st[:, 3]
        tot = st if tot is None else tot + st
    head.train()
    cnt = tot[:, 3].clamp_min(1)
    return {"loss": (tot[:, 0] / cnt).tolist(), "acc": (tot[:, 1] / cnt).tolist(), "chain": (tot[:, 2] / cnt).tolist()}


# ----------------------------------------------------------------------------------------------
# Acceptance simulation


@torch.no_grad()
def target_forward_all(target, ids, layers):
    o = target(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    hs = o.hidden_states
    return torch.cat([hs[k][0] for k in layers], -1).float(), o.logits[0].float().argmax(-1)


@torch.no_grad()
def simulate_head(target, head, embed, prompt_ids, layers, gamma, max_new, device, eos_id):
    """Greedy chain speculation with the real target: returns dict of counts and the generated ids."""
    d2t = head.d2t
    ids = torch.tensor(prompt_ids, device=device)
    P = ids.shape[0]
    feats, arg = target_forward_all(target, ids, layers)  # prefill
    toks = torch.cat([ids, arg[-1:]])
    if eos_id is not None and int(arg[-1]) == eos_id:
        return {"new": 1, "forwards": 1, "proposed": 0, "accepted": 0, "acc_at": [0] * gamma,
                "prop_at": [0] * gamma, "ids": toks[P:].tolist()}
    cache = HeadCache()
    # head consumes all committed pairs (f_j, t_{j+1}), j = 0..P-1
    j = torch.arange(0, P, device=device)
    out, lg = head_step(head, embed, cache, head.fc(feats[j]), toks[j + 1], j + 1, commit=True)
    last_out, last_lg = out[-1], lg[-1]
    forwards = 1
    acc_at, prop_at = [0] * gamma, [0] * gamma
    proposed = accepted = 0
    while toks.shape[0] - P < max_new:
        c = toks.shape[0] - 1  # index of the last committed token (the previous bonus)
        g_n = min(gamma, max_new - (toks.shape[0] - P) - 1)
        drafts = []
        if g_n > 0:
            d = int(last_lg.argmax()) + int(d2t[int(last_lg.argmax())])
            drafts.append(d)
            hid = last_out
            # chain cache: committed entries plus this chain's own steps (discarded afterwards)
            chain = HeadCache()
            chain.k, chain.v = cache.k, cache.v
            for s in range(1, g_n):
                o1, l1 = head_step(head, embed, chain, hid[None], torch.tensor([d], device=device),
                                   torch.tensor([c + s], device=device), commit=True)
                a = int(l1[0].argmax())
                d = a + int(d2t[a])
                drafts.append(d)
                hid = o1[0]
        seq = torch.cat([toks, torch.tensor(drafts, dtype=toks.dtype, device=device)])
        feats, arg = target_forward_all(target, seq, layers)
        forwards += 1
        tgt = arg[c:c + g_n + 1]  # target's greedy token after toks[c], d1, ..
        k = 0
        while k < g_n and drafts[k] == int(tgt[k]):
            k += 1
        proposed += g_n
        accepted += k
        for i in range(g_n):
            prop_at[i] += 1
            acc_at[i] += int(i < k)
        new = torch.cat([torch.tensor(drafts[:k], dtype=toks.dtype, device=device), tgt[k:k + 1]])
        toks = torch.cat([toks, new])
        if eos_id is not None and eos_id in new.tolist():  # generation stops at EOS
            toks = toks[:c + 1 + new.tolist().index(eos_id) + 1]
            break
        # the head consumes the committed pairs j = c .. c+k with the target's fresh features
        j = torch.arange(c, c + k + 1, device=device)
        out, lg = head_step(head, embed, cache, head.fc(feats[j]), toks[j + 1], j + 1, commit=True)
        last_out, last_lg = out[-1], lg[-1]
    new_tokens = toks.shape[0] - P
    return {"new": new_tokens, "forwards": forwards, "proposed": proposed, "accepted": accepted,
            "acc_at": acc_at, "prop_at": prop_at, "ids": toks[P:].tolist()}


@torch.no_grad()
def greedy_continuation(target, prompt_ids, max_new, device, eos_id):
    ids = torch.tensor([prompt_ids], device=device)
    o = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                        generation_config=no_eos_config(target))
    out = o[0, len(prompt_ids):].tolist()
    if eos_id is not None and eos_id in out:
        out = out[:out.index(eos_id) + 1]
    return out


@torch.no_grad()
def simulate_draft(target_cont, draft, prompt_ids, gamma, max_new, device):
    """Greedy chain speculation with an ordinary draft LM, exact for greedy decoding: every accepted
    prefix is the target's continuation, so the draft's chain from a block start equals its
    teacher-forced argmax along the continuation while it matches."""
    seq = torch.tensor(prompt_ids + target_cont, device=device)
    P = len(prompt_ids)
    pred = draft(input_ids=seq[None], use_cache=False).logits[0].float().argmax(-1)
    match = (pred[P - 1:-1] == seq[P:]).tolist()  # match[m]: token m of the continuation predicted
    match = match + [False] * (gamma + 1)
    n_cont = len(target_cont)  # max_new, or fewer when the continuation ends with EOS
    gen = 1
    forwards = 1
    acc_at, prop_at = [0] * gamma, [0] * gamma
    proposed = accepted = 0
    while gen < n_cont:
        g_n = min(gamma, max_new - gen - 1)
        k = 0
        while k < g_n and match[gen + k] and gen + k < n_cont:
            k += 1
        proposed += g_n
        accepted += k
        for i in range(g_n):
            prop_at[i] += 1
            acc_at[i] += int(i < k)
        gen = min(gen + k + 1, n_cont)
        forwards += 1
    return {"new": gen, "forwards": forwards, "proposed": proposed, "accepted": accepted,
            "acc_at": acc_at, "prop_at": prop_at}


def summarize(runs, gamma):
    new = sum(r["new"] for r in runs)
    fw = sum(r["forwards"] for r in runs)
    n = len(runs)
    prop = sum(r["proposed"] for r in runs)
    acc = sum(r["accepted"] for r in runs)
    acc_at = [sum(r["acc_at"][i] for r in runs) for i in range(gamma)]
    prop_at = [sum(r["prop_at"][i] for r in runs) for i in range(gamma)]
    return {"tau": (new - n) / max(1, fw - n), "alpha": acc / max(1, prop),
            "per_position": [a / max(1, p) for a, p in zip(acc_at, prop_at)],
            "new_tokens": new, "target_forwards": fw, "generations": n}


def heldout_sim_prompts(held_files, n, tok):
    """n prompts from the held-out files: 3 lines of context ending with a `def` line (no trailing
    blank), evenly spaced over the def lines of each file."""
    per = max(1, math.ceil(n / max(1, len(held_files))))
    out = []
    for rel, text in held_files:
        lines = text.split("\n")
        defs = [i for i, ln in enumerate(lines) if re.match(r"\s*def \w+\(.*\):\s*$", ln) and i >= 3]
        if not defs:
            continue
        pick = [defs[int((k + 0.5) * len(defs) / per)] for k in range(per)]
        for i in pick:
            p = "\n".join(lines[i - 3:i + 1]).rstrip()
            out.append((f"{rel}:{i + 1}", p))
    return out[:n]


def self_test(head, embed, ids, f, j0=40):
    """Max |logit difference| between the incremental inference path (head_step, as the Rust drafter
    runs the head) and the TTT training forward, for the chain drafted from position j0 (steps 0-2)."""
    dev = ids.device
    with torch.no_grad():
        outs = ttt_forward(head, embed, f[None], ids[None], 3, torch.tensor([[5, j0]], device=dev))
        cache = HeadCache()
        jj = torch.arange(0, j0 + 1, device=dev)
        o, lg = head_step(head, embed, cache, head.fc(f[jj]), ids[jj + 1], jj + 1, commit=True)
        diffs = [(lg[-1] - outs[0][0, 1].float()).abs().max().item()]
        hid = o[-1]
        for s in (1, 2):
            o, lg = head_step(head, embed, cache, hid[None], ids[j0 + 1 + s:j0 + 2 + s],
                              torch.tensor([j0 + 1 + s], device=dev), commit=True)
            diffs.append((lg[0] - outs[s][0, 1].float()).abs().max().item())
            hid = o[0]
    st = max(diffs)
    log(f"self-test: incremental head vs TTT forward, max |logit diff| over steps 0-2: {st:.2e}")
    assert st < 1e-3, diffs
    return st


def load_sim_prompts(path, limit):
    """(id, text) of a prompt file: {"id", "prompt"} or Spec-Bench's {"question_id", "turns"} (first turn)."""
    out = []
    for i, x in enumerate(open(path)):
        if x.strip():
            d = json.loads(x)
            out.append((str(d.get("id", d.get("question_id", i))), d["prompt"] if "prompt" in d else d["turns"][0]))
    return out[:limit] if limit else out


def simulate_all(args, target, head, embed, enc_prompt, layers, held_sim, eos_id, device):
    """Greedy chain speculation on the held-out prompts and the default experiment's prompts, for the
    head and (on the same target continuations) the baseline draft model. held_sim: (id, text) pairs;
    enc_prompt: text -> prompt token ids (through the chat template with --chat-template)."""
    sim = {}
    sets = []
    if held_sim:
        sets.append(("held-out", held_sim))
    if args.sim_prompts and os.path.exists(args.sim_prompts):
        sets.append(("default", load_sim_prompts(args.sim_prompts, args.sim_limit)))
    base = None
    if args.baseline_draft and os.path.exists(args.baseline_draft):
        base = AutoModelForCausalLM.from_pretrained(args.baseline_draft, dtype=torch.float32).to(device).eval()
    gammas = [int(x) for x in str(args.gamma).split(",")]
    for name, prompts in sets:
        conts = []
        for pid, p in prompts:
            pids = enc_prompt(p)
            conts.append((pids, greedy_continuation(target, pids, args.sim_new_tokens, device, eos_id)))
        for gamma in gammas:
            hr, br = [], []
            mism = 0
            for pids, cont in conts:
                r = simulate_head(target, head, embed, pids, layers, gamma, args.sim_new_tokens, device, eos_id)
                mism += int(r["ids"] != cont)
                hr.append(r)
                if base is not None:
                    br.append(simulate_draft(cont, base, pids, gamma, args.sim_new_tokens, device))
            key = f"{name} gamma={gamma}"
            sim[key] = {"set": name, "gamma": gamma, "head": summarize(hr, gamma),
                        "prompts": [pid for pid, _ in prompts], "mismatch": mism}
            if base is not None:
                sim[key]["draft"] = summarize(br, gamma)
            s = sim[key]
            log(f"simulation on {len(prompts)} {name} prompts (gamma {gamma}, {args.sim_new_tokens} new tokens): "
                f"head tau {s['head']['tau']:.3f} alpha {s['head']['alpha']:.3f} per position "
                + " ".join(f"{x:.3f}" for x in s["head"]["per_position"])
                + (f"; draft model tau {s['draft']['tau']:.3f} alpha {s['draft']['alpha']:.3f} per position "
                   + " ".join(f"{x:.3f}" for x in s["draft"]["per_position"]) if base is not None else "")
                + f"; outputs differing from transformers' greedy generate: {mism}")
    return sim


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--out", default="models/eagle3")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--target-dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--layers", default=None,
                    help="target layer ids whose input hidden states are fused (default: 1,2,3 for <= 6 layers, "
                         "else 2,N/2,N-3)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="0 = the target's whole vocabulary")
    ap.add_argument("--intermediate", type=int, default=0, help="head MLP width (0 = the target's)")
    ap.add_argument("--prompts-jsonl", default=None,
                    help="training prompt source (objects with 'text' or 'prompt'); default: the stdlib")
    ap.add_argument("--chat-template", action="store_true",
                    help="each --prompts-jsonl prompt is one whole user turn rendered through the target's chat "
                         "template (generation prompt appended, encoded without added special tokens), and so are "
                         "the --sim-prompts (their first turn); the last --heldout-prompts prompts are held out")
    ap.add_argument("--heldout-prompts", type=int, default=64,
                    help="with --chat-template: prompts held out of training (held-out accuracy and simulation)")
    ap.add_argument("--eval-prompt-files", default="configs/prompts/*.jsonl",
                    help="glob of evaluation prompt files that must not occur in the training text")
    ap.add_argument("--sim-prompts", default="configs/prompts/code.jsonl",
                    help="prompts of the default experiment (evaluation only): objects with 'prompt' or 'turns'")
    ap.add_argument("--sim-limit", type=int, default=0, help="simulate only the first N --sim-prompts (0 = all)")
    ap.add_argument("--num-seqs", type=int, default=16384, help="training sequences")
    ap.add_argument("--heldout-seqs", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256, help="prompt + generation tokens per sequence")
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=64)
    ap.add_argument("--self-prompts", type=int, default=0,
                    help="with --chat-template: add up to N user requests written by the target itself (Magpie)")
    ap.add_argument("--self-prompt-tokens", type=int, default=96, help="longest self-written request, in tokens")
    ap.add_argument("--self-prompt-seconds", type=float, default=120.0, help="time budget of the self-written requests")
    ap.add_argument("--extra-prompts", default=None,
                    help="JSON lines (.gz too) of more training requests, after --prompts-jsonl's (none held out): "
                         "e.g. the self-written requests an earlier run kept")
    ap.add_argument("--context-prompts", type=int, default=0,
                    help="long-context requests built from the generated answers (summaries, key points, questions "
                         "over one passage or several), generated after the main set (needs --chat-template)")
    ap.add_argument("--context-seq-len", type=int, default=1024, help="prompt + generation tokens of a long-context row")
    ap.add_argument("--context-min-gen", type=int, default=160,
                    help="long-context requests leave at least this many tokens of --context-seq-len to generate")
    ap.add_argument("--context-gen-batch", type=int, default=256)
    ap.add_argument("--context-seconds", type=float, default=None, help="time budget of the long-context generation")
    ap.add_argument("--data-out", default=None,
                    help="save the generated training set (token ids, recorded states, masks) to this file")
    ap.add_argument("--recompute-features", action="store_true",
                    help="record no states while generating: each training batch runs the target over its rows "
                         "(bf16 autocast on a GPU) for them, so a set costs its token ids only")
    ap.add_argument("--gen-only", action="store_true", help="stop after generating (and --data-out)")
    ap.add_argument("--data-in", default=None,
                    help="comma-separated files of earlier --data-out runs to train on beside this run's generations "
                         "(same target, --layers and --seq-len; give each run its own --seed, or its prompts repeat)")
    ap.add_argument("--sample-frac", type=float, default=0.25,
                    help="share of sequences generated with T=1 sampling (the rest greedy)")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--step-decay", type=float, default=0.8)
    ap.add_argument("--anchors", type=int, default=64,
                    help="chains unrolled per sequence and batch (random positions among the generated ones); "
                         "0 = every position, as speculators does")
    ap.add_argument("--epochs", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=512)
    ap.add_argument("--max-seconds", type=float, default=1e9,
                    help="shorten training (decided at step 30, inside the warmup) to fit this budget")
    ap.add_argument("--gen-seconds", type=float, default=None,
                    help="stop generating training sequences (between batches) after this many seconds")
    ap.add_argument("--gamma", default="4,8", help="draft lengths to simulate (comma-separated)")
    ap.add_argument("--sim-new-tokens", type=int, default=192)
    ap.add_argument("--sim-heldout-prompts", type=int, default=8)
    ap.add_argument("--baseline-draft", default="models/draft", help="'' to skip")
    ap.add_argument("--cache-dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--save-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="dtype of the saved weights (the simulation runs the saved weights, in float32)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-report", action="store_true", help="do not write TRAINING.md")
    ap.add_argument("--eval-only", action="store_true",
                    help="no training: load the head saved in --out and run the self-test and the acceptance simulation")
    ap.add_argument("--metrics-json", default=None)
    ap.add_argument("--report-from", default=None,
                    help="no run: write --out/TRAINING.md again from the --metrics-json file of an earlier run")
    args = ap.parse_args()
    if args.report_from:
        with open(args.report_from) as fh:
            res = json.load(fh)
        ra = argparse.Namespace(**res["args"])
        ra.out = args.out
        write_report(ra, res)
        return

    t_start = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    log(f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
        f"device {dev_name}")
    log("command: " + " ".join(["python3", "scripts/train_eagle3.py"] + sys.argv[1:]))
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        torch.set_flush_denormal(True)  # the KL's exp/mul on tiny probabilities: denormals are slow on x86

    # --- target
    tdtype = getattr(torch, args.target_dtype)
    if args.target.endswith(".gguf"):  # transformers dequantizes a GGUF file's tensors (needs the gguf package)
        src, load_kw = os.path.dirname(args.target) or ".", {"gguf_file": os.path.basename(args.target)}
    else:
        src, load_kw = args.target, {}
    target = AutoModelForCausalLM.from_pretrained(src, dtype=tdtype, attn_implementation="sdpa",
                                                  **load_kw).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = target.config
    tcfg = getattr(tcfg, "text_config", tcfg)
    NL, TH, V = tcfg.num_hidden_layers, tcfg.hidden_size, tcfg.vocab_size
    if args.layers:
        layers = [int(x) for x in args.layers.split(",")]
    else:
        layers = [1, 2, 3] if NL <= 6 else [2, NL // 2, NL - 3]
    assert all(0 <= k < NL for k in layers) and len(set(layers)) == len(layers), \
        f"layer ids must be distinct and in [0, {NL}) (hidden_states[{NL}] is after the final norm)"
    rope = getattr(tcfg, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(tcfg, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        log(f"warning: target RoPE type {rope.get('rope_type')}: the head uses plain RoPE with theta {rope_theta}")
    embed, t_norm, t_lm_head = target_parts(target)
    eos_id = tcfg.eos_token_id if isinstance(tcfg.eos_token_id, int) else None
    hf_tok = AutoTokenizer.from_pretrained(src, **load_kw) if (load_kw or args.chat_template) else None
    tok = HFTokenizer(hf_tok) if load_kw else Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))

    def chat_ids(text):
        """One user turn through the chat template, generation prompt appended, encoded without added
        special tokens (what the Rust experiment does with chat_template = true)."""
        r = hf_tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        return encode(tok, r)

    enc_prompt = chat_ids if args.chat_template else (lambda text: encode(tok, text, special=True))
    log(f"target {args.target}: {type(target).__name__}, {NL} layers, hidden {TH}, vocab {V}, rope theta {rope_theta}, "
        f"fused layers {layers}")

    # --- training / held-out text
    held_names = parse_heldout(args.target)
    eval_files = sorted(glob.glob(args.eval_prompt_files))
    chat = bool(args.prompts_jsonl and args.chat_template)
    held_chat = []  # (id, text) of the held-out chat prompts
    categories = []  # 'category' of each prompt of --prompts-jsonl (None where absent)
    self_info = None  # the self-written prompts: how many were kept, in how many batches and seconds
    if args.prompts_jsonl:
        texts = []
        for i, line in enumerate(open(args.prompts_jsonl)):
            if line.strip():
                d = json.loads(line)
                texts.append((str(d.get("id", i)), d.get("text", d.get("prompt"))))
                categories.append(d.get("category"))
        if chat:
            k = min(args.heldout_prompts, len(texts) // 2)
            texts, held_chat = texts[:len(texts) - k], texts[len(texts) - k:]
            categories = categories[:len(texts)]
        if chat and args.extra_prompts:  # after the file's prompts and its held-out split
            opener = gzip.open if args.extra_prompts.endswith(".gz") else open
            with opener(args.extra_prompts, "rt") as fh:
                extra = [json.loads(line) for line in fh if line.strip()]
            texts += [(str(d.get("id", f"extra-{i}")), d.get("text", d.get("prompt"))) for i, d in enumerate(extra)]
            categories += [d.get("category") for d in extra]
            log(f"{len(extra)} more training prompts from {args.extra_prompts}")
        if chat and args.self_prompts:  # after the file's prompts, so --num-seqs reaches them last
            t0 = time.time()
            own, n_runs = self_prompts(target, hf_tok, tok, args.self_prompts, args.self_prompt_tokens,
                                       args.gen_batch, device, args.seed + 7, eos_id, args.self_prompt_seconds)
            key = lambda x: re.sub(r"\s+", " ", x).strip().lower()  # noqa: E731
            file_keys = {key(t) for _, t in texts + held_chat}
            ev_probe = [(key(t), t.strip()[:300]) for _, t in eval_prompt_texts(eval_files)]
            ev_joined = "\x00".join(k for k, _ in ev_probe)
            n_own = len(own)
            # the checks below assert these two directions for every training prompt: here a
            # self-written request that meets an evaluation prompt is dropped instead
            own = [t for t in own if key(t) not in file_keys and key(t) not in ev_joined
                   and not any(len(p) >= 16 and p in t for _, p in ev_probe)]
            self_info = {"written": n_own, "kept": len(own), "batches": n_runs, "batch": args.gen_batch,
                         "max_tokens": args.self_prompt_tokens, "seconds": time.time() - t0}
            log(f"self-written prompts: {len(own)} of {n_own} kept (the others repeat a file prompt or meet an "
                f"evaluation prompt)")
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "self_prompts.jsonl"), "w") as fh:  # what was trained on, for reruns
                for i, t in enumerate(own):
                    fh.write(json.dumps({"id": f"self-{i}", "category": "self-written", "prompt": t}) + "\n")
            texts += [(f"self-{i}", t) for i, t in enumerate(own)]
            categories += ["self-written"] * len(own)
        train_files, held_files, src_desc = texts, [], f"`{args.prompts_jsonl}`"
        root = None
    else:
        root, files = stdlib_files()
        excl = set(held_names) | set(EVAL_SOURCE_FILES)
        train_files = [(r, t) for r, t in files if r not in excl]
        held_files = [(r, t) for r, t in files if r in held_names]
        src_desc = f"Python {platform.python_version()} standard library (`{root}`)"
        log(f"stdlib {root}: {len(files)} files, {len(train_files)} for training prompts; excluded: held-out "
            f"{held_names} (found {len(held_files)}), evaluation sources {EVAL_SOURCE_FILES}")
    ev_texts = eval_prompt_texts(eval_files)
    bad = check_disjoint([t for _, t in train_files] + [t for _, t in held_chat], ev_texts)
    assert not bad, f"evaluation prompts occur verbatim in the training text: {bad[:5]}"
    log(f"checked {len(ev_texts)} evaluation prompts of {len(eval_files)} files: none occurs in the training text")
    if chat:  # the other direction too: no training prompt equals or is contained in an evaluation prompt
        norm_ = lambda x: re.sub(r"\s+", " ", x).strip().lower()  # noqa: E731
        evn = "\x00".join(norm_(t) for _, t in ev_texts)  # one haystack: no normalized text holds \x00
        inside = [t for _, t in train_files + held_chat if norm_(t) in evn]
        assert not inside, f"training prompts equal to or contained in an evaluation prompt: {inside[:5]}"
        log(f"checked {len(train_files) + len(held_chat)} chat prompts: none equals or is contained in an "
            f"evaluation prompt (case- and whitespace-insensitive)")
    if chat:
        streams = held_streams = None
        train_prompts = [chat_ids(t) for _, t in train_files]
        held_prompts = [chat_ids(t) for _, t in held_chat]
        held_sim = held_chat[:args.sim_heldout_prompts]
        pl = [len(x) for x in train_prompts]
        log(f"chat prompts: {len(train_prompts)} for training, {len(held_prompts)} held out; "
            f"{min(pl)}-{max(pl)} tokens (mean {sum(pl) / len(pl):.1f}) through the chat template")
    else:
        bos = encode(tok, "", special=True)
        streams = [bos + encode(tok, t) for _, t in train_files]
        streams = [s for s in streams if len(s) > args.prompt_max + 2]
        held_streams = [bos + encode(tok, t) for _, t in held_files]
        held_streams = [s for s in held_streams if len(s) > args.prompt_max + 2]
        train_prompts = held_prompts = None
        held_sim = heldout_sim_prompts(held_files, args.sim_heldout_prompts, tok) if held_files else []

    if args.eval_only:  # re-measure a saved head: self-test and acceptance simulation only
        head = load_saved_head(args.out).to(device)
        assert head.c["eagle_aux_hidden_state_layer_ids"] == layers or args.layers is None
        layers = head.c["eagle_aux_hidden_state_layer_ids"]
        log(f"eval-only: {args.out} ({sum(p.numel() for p in head.parameters())} parameters)")
        if held_sim:
            pid, p = held_sim[0]
            pids = enc_prompt(p)
            ids = torch.tensor(pids + greedy_continuation(target, pids, 64, device, None), device=device)
            self_test(head, embed, ids, target_forward_all(target, ids, layers)[0])
        sim = simulate_all(args, target, head, embed, enc_prompt, layers, held_sim, eos_id, device)
        if args.metrics_json:
            with open(args.metrics_json, "w") as fh:
                json.dump({"args": vars(args), "sim": sim, "device": dev_name}, fh, indent=1)
        log(f"total {time.time() - t_start:.0f}s")
        return

    # --- data generation (the target's hidden states are recorded while it generates)
    t0 = time.time()
    cdt = getattr(torch, args.cache_dtype)
    train = build_set(target, streams, args.num_seqs, args, rng, device, eos_id, layers, cdt, prompts=train_prompts,
                      max_seconds=args.gen_seconds)
    t_gen = time.time() - t0
    # each sequence's prompt category (kept with a saved set, whose prompt lists are not)
    train["cats"] = [str(categories[k]) for k in train["prompt_idx"]] if chat and any(categories) \
        else ["-"] * train["ids"].shape[0]
    questions = [train_files[k][1] for k in train["prompt_idx"]] if chat else None
    del train["prompt_idx"]
    ctx_info = None  # the long-context requests: how many were built, kept, generated, their lengths
    if args.context_prompts:
        assert chat, "--context-prompts needs --prompts-jsonl with --chat-template"
        t1 = time.time()
        reqs = context_requests(train, questions, hf_tok, eos_id, args.context_prompts, rng)
        room = args.context_seq_len - args.context_min_gen
        kept = [(ids_, t, kind) for t, kind in reqs for ids_ in [chat_ids(t)] if len(ids_) <= room]
        assert kept, f"no long-context request fits {room} tokens (--context-seq-len - --context-min-gen)"
        bad = check_disjoint([t for _, t, _ in kept], ev_texts)
        assert not bad, f"evaluation prompts occur verbatim in the long-context requests: {bad[:5]}"
        inside = [t for _, t, _ in kept if norm_(t) in evn]
        assert not inside, f"long-context requests contained in an evaluation prompt: {inside[:2]}"
        saved = args.seq_len, args.gen_batch
        args.seq_len, args.gen_batch = args.context_seq_len, args.context_gen_batch
        ctx = build_set(target, None, len(kept), args, rng, device, eos_id, layers, cdt,
                        prompts=[x[0] for x in kept], max_seconds=args.context_seconds)
        args.seq_len, args.gen_batch = saved
        ctx["cats"] = [f"context: {kept[k][2]}" for k in ctx["prompt_idx"]]
        del ctx["prompt_idx"]
        pl = [len(x[0]) for x in kept]
        ctx_info = {"requests": len(reqs), "kept": len(kept), "seqs": int(ctx["ids"].shape[0]),
                    "prompt_tokens": [min(pl), max(pl), sum(pl) / len(pl)], "seq_len": args.context_seq_len,
                    "min_gen": args.context_min_gen, "gen_batch": args.context_gen_batch,
                    "tokens": int(ctx["valid"].sum()), "generated": int(ctx["mask"].sum()),
                    "sampled": int(ctx["sampled"].sum()), "seconds": time.time() - t1,
                    "budget": args.context_seconds}
        log(f"long-context requests: {len(kept)} of {len(reqs)} fit {room} tokens ({min(pl)}-{max(pl)}, mean "
            f"{sum(pl) / len(pl):.0f}); generated {ctx_info['seqs']} sequences of up to {args.context_seq_len} tokens "
            f"in {ctx_info['seconds']:.0f}s; every request checked disjoint from the evaluation prompts")
        train = concat_sets(train, ctx)
        t_gen += ctx_info["seconds"]
    if args.data_out:
        torch.save({"set": train, "layers": layers, "seq_len": args.seq_len, "target": args.target,
                    "command": command_args(), "seconds": t_gen, "self_prompts": self_info,
                    "context": ctx_info}, args.data_out)
        log(f"saved the generated set to {args.data_out}")
    if args.gen_only:
        log(f"--gen-only: total {time.time() - t_start:.0f}s")
        return
    loaded = []  # (path, sequences, command) of each --data-in file
    gen_args = None  # the arguments of the run that generated the whole set (one --data-in, no generation here)
    for path in filter(None, (args.data_in or "").split(",")):
        d = torch.load(path, weights_only=False)
        assert d["layers"] == layers and d["seq_len"] == args.seq_len, \
            f"{path}: layers {d['layers']} / seq-len {d['seq_len']}, this run {layers} / {args.seq_len}"
        if d["set"]["feats"] is None or train["feats"] is None:
            assert args.recompute_features, f"{path} holds no recorded states: train on it with --recompute-features"
            d["set"]["feats"] = d["set"]["fin"] = None
        train = concat_sets(train, d["set"])
        self_info = self_info or d.get("self_prompts")
        ctx_info = ctx_info or d.get("context")
        t_gen += d.get("seconds", 0.0)
        loaded.append((path, d["set"]["ids"].shape[0], " ".join(d["command"])))
        gen_args = vars(ap.parse_args(d["command"])) if args.num_seqs == 0 and len(loaded) == 1 else None
        log(f"loaded {d['set']['ids'].shape[0]} sequences from {path}")
    if train["feats"] is not None:
        mx = max(train["feats"].float().abs().max().item(), train["fin"].float().abs().max().item())
        assert math.isfinite(mx), "features overflow the cache dtype: use --cache-dtype bfloat16 or float32"
    features = Features(target, layers, device)
    held = build_set(target, held_streams, args.heldout_seqs, args, random.Random(args.seed + 1), device, eos_id,
                     layers, torch.float32, prompts=held_prompts) if (held_streams or held_prompts) else None
    n_gen = int(train["mask"].sum())
    ntok = int(train["valid"].sum())
    log(f"data: {train['ids'].shape[0]} sequences of up to {train['ids'].shape[1]} tokens ({ntok} tokens, {n_gen} in the loss, "
        f"{int(train['sampled'].sum())} sequences sampled at T=1), generation {t_gen:.0f}s "
        + (f"(states cached in {cdt}, max |h| {mx:.1f})" if train["feats"] is not None
           else "(states recomputed by each batch's target forward)"))

    # --- draft vocabulary
    counts = torch.bincount(train["ids"][train["mask"].roll(1, 1)].flatten(), minlength=V)  # generated tokens
    if args.draft_vocab and args.draft_vocab < V:
        Vd = args.draft_vocab
        draft_ids = counts.topk(Vd).indices.sort().values
        coverage = counts[draft_ids].sum().item() / counts.sum().item()
    else:
        Vd = V
        draft_ids = torch.arange(V)
        coverage = 1.0
    d2t = draft_ids - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    log(f"draft vocabulary {Vd} (covers {coverage:.4f} of the generated tokens)")

    # --- head
    cfg = {
        "hidden_size": TH, "target_hidden_size": TH,
        "intermediate_size": args.intermediate or tcfg.intermediate_size,
        "num_attention_heads": tcfg.num_attention_heads,
        "num_key_value_heads": getattr(tcfg, "num_key_value_heads", tcfg.num_attention_heads),
        "head_dim": getattr(tcfg, "head_dim", None) or TH // tcfg.num_attention_heads,
        "rms_norm_eps": tcfg.rms_norm_eps, "rope_theta": float(rope_theta),
        "vocab_size": V, "draft_vocab_size": Vd, "eagle_aux_hidden_state_layer_ids": layers,
    }
    torch.manual_seed(args.seed)
    head = Eagle3Head(cfg)
    for mod in head.modules():
        if isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, std=0.02)
    with torch.no_grad():  # lm_head / norm from the target's (speculators does the same for lm_head)
        head.lm_head.weight.copy_(t_lm_head.weight[draft_ids.to(t_lm_head.weight.device)].float().cpu())
        head.norm.weight.copy_(t_norm.weight.float().cpu())
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    head = head.to(device)
    n_par = sum(p.numel() for p in head.parameters())
    log(f"head: {n_par} parameters, config {json.dumps(cfg)}")
    d_ids_dev = draft_ids.to(device) if Vd < V else None
    w_tgt = t_lm_head.weight.float()
    w_tgt = w_tgt[d_ids_dev] if d_ids_dev is not None else w_tgt
    tgt_head = lambda x: F.linear(x, w_tgt)  # noqa: E731  the target's logits over the draft vocabulary
    t2d_dev = t2d.to(device)
    autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=True)

    # --- training
    N = train["ids"].shape[0]
    steps_per_epoch = N // args.batch
    total = max(1, int(args.epochs * steps_per_epoch))
    decay_p = [p for n_, p in head.named_parameters() if p.dim() >= 2]
    other_p = [p for n_, p in head.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay_p, "weight_decay": args.weight_decay},
                             {"params": other_p, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    log(f"training: {total} steps of {args.batch} sequences ({args.epochs} epochs), TTT steps {args.ttt_steps}, "
        f"decay {args.step_decay}, lr {args.lr}, warmup {args.warmup}")
    curve = []
    gen = torch.Generator().manual_seed(args.seed + 3)
    step = 0
    t_train0 = time.time()
    t_mark = None
    run_stats = None
    ev0 = evaluate_heldout(head, embed, tgt_head, held, args.ttt_steps, args.step_decay, d_ids_dev, t2d_dev,
                           autocast, device, args.batch, features) if held is not None else None
    head.train()
    while step < total:
        perm = torch.randperm(N, generator=gen)
        if train["ids"].shape[1] > args.seq_len:  # long-context rows in the set
            perm = length_batches(perm, train["valid"], args.batch, gen)
        for f, fi, ids, m, tam in iterate(train, perm, args.batch, device, features):
            if step >= total:
                break
            for gr in opt.param_groups:
                gr["lr"] = lr_at(step, total, args.lr, args.warmup)
            loss, st = ttt_loss(head, embed, tgt_head, f, fi, ids, m, args.ttt_steps, args.step_decay,
                                d_ids_dev, t2d_dev, autocast, pick_anchors(m, args.anchors, gen), tam)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), args.clip)
            opt.step()
            step += 1
            st = st.detach().cpu().double()
            st[:, 0] *= st[:, 3]
            run_stats = st if run_stats is None else run_stats + st
            if step == 10:
                t_mark = time.time()
            if step == 30:
                dt = (time.time() - t_mark) / 20
                log(f"steps 10-30: {dt * 1000:.0f} ms/step -> ~{dt * total:.0f} s for {total} steps")
                if dt * total > args.max_seconds and args.warmup > 30:
                    total = max(args.warmup * 2, int(args.max_seconds / dt) // 10 * 10)
                    log(f"budget {args.max_seconds:.0f}s: training for {total} steps instead")
            if step % args.eval_every == 0 or step == total:
                cnt = run_stats[:, 3].clamp_min(1)
                tr = {"loss": (run_stats[:, 0] / cnt).tolist(), "acc": (run_stats[:, 1] / cnt).tolist()}
                run_stats = None
                ev = evaluate_heldout(head, embed, tgt_head, held, args.ttt_steps, args.step_decay, d_ids_dev,
                                      t2d_dev, autocast, device, args.batch, features) if held is not None else None
                el = time.time() - t_train0
                curve.append({"step": step, "elapsed": el, "train": tr, "held": ev})
                log(f"step {step}/{total} {el:.0f}s train loss/step " + " ".join(f"{x:.3f}" for x in tr["loss"])
                    + (" | held-out acc/step " + " ".join(f"{x:.3f}" for x in ev["acc"])
                       + " chain " + " ".join(f"{x:.3f}" for x in ev["chain"]) if ev else ""))
    t_train = time.time() - t_train0

    # --- save (--save-dtype) and reload
    os.makedirs(args.out, exist_ok=True)
    sdt = getattr(torch, args.save_dtype)
    sd = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    sd = {k: (v.to(sdt) if v.is_floating_point() else v) for k, v in sd.items()}
    save_file(sd, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    rope_scaling = None if rope.get("rope_type", "default") == "default" else \
        {k: v for k, v in rope.items() if k != "rope_theta"}
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": TH,
        "intermediate_size": cfg["intermediate_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "num_hidden_layers": 1,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "rope_scaling": rope_scaling,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": getattr(tcfg, "max_position_embeddings", 4096),
        "vocab_size": V,
        "draft_vocab_size": Vd,
        "eagle_aux_hidden_state_layer_ids": layers,
        "bos_token_id": getattr(tcfg, "bos_token_id", None),
        "eos_token_id": tcfg.eos_token_id,
        "torch_dtype": args.save_dtype,
    }
    with open(os.path.join(args.out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    log(f"wrote {args.out}/model.safetensors and config.json")

    head = load_saved_head(args.out).to(device)  # what was saved, config included

    # --- self-test: the incremental (inference) path reproduces the TTT forward
    st_diff = self_test(head, embed, held["ids"][0].to(device), features(held, torch.tensor([0]))[0][0]) \
        if held is not None else None

    # --- acceptance simulation
    t0 = time.time()
    sim = simulate_all(args, target, head, embed, enc_prompt, layers, held_sim, eos_id, device)
    t_sim = time.time() - t0

    res = {"args": vars(args), "layers": layers, "config": config, "params": n_par, "draft_vocab": Vd,
           "coverage": coverage, "seqs": N, "tokens": ntok, "generated": n_gen,
           "sampled_seqs": int(train["sampled"].sum()), "steps": total, "curve": curve, "before": ev0,
           "t_gen": t_gen, "t_train": t_train, "t_sim": t_sim, "t_total": time.time() - t_start,
           "sim": sim, "self_test": st_diff, "device": dev_name, "src": src_desc, "held_names": held_names,
           "eval_files": eval_files, "n_eval_prompts": len(ev_texts),
           "n_train_files": len(train_files), "n_held_files": len(held_files), "chat": chat,
           "n_train_prompts": (len(train_prompts) + (self_info["kept"] if gen_args and self_info else 0))
           if chat else 0, "n_held_prompts": len(held_chat),
           # the prompts of the sequences trained on (a --data-in set's own prompts included)
           "prompt_tokens": [int(train["plen"].min()), int(train["plen"].max()), float(train["plen"].float().mean())]
           if chat else None, "gen_args": gen_args,
           "train_categories": dict(sorted(collections.Counter(train["cats"]).items()))
           if chat and any(categories) else None,
           "loaded": loaded,
           "self_prompts": self_info, "context": ctx_info, "command": command_args(),
           "held_seqs": held["ids"].shape[0] if held is not None else 0}
    if args.metrics_json:
        with open(args.metrics_json, "w") as fh:
            json.dump(res, fh, indent=1)
    if not args.no_report:
        write_report(args, res)
    log(f"total {time.time() - t_start:.0f}s")


def command_args():
    """sys.argv[1:] without the options that only say where extra output goes."""
    out, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a in ("--metrics-json", "--threads"):
            skip = True
            continue
        if a.startswith("--metrics-json=") or a.startswith("--threads="):
            continue
        out.append(a)
    return out


def write_report(args, r):
    L = []
    w = L.append
    c = r["config"]
    w("# EAGLE-3 draft head for `models/target`" if args.target.rstrip("/").endswith("models/target")
      else f"# EAGLE-3 draft head for `{args.target}`")
    w("")
    w("An EAGLE-3 draft head (Li et al. 2025) trained by `scripts/train_eagle3.py` on the target's own")
    w("generations with training-time-test unrolling. Layout of the original EAGLE-3 release: `config.json`")
    w(f"(`LlamaForCausalLMEagle3`) and `model.safetensors` ({args.save_dtype}: `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`,")
    w("`t2d`; no `embed_tokens`: the head uses the target's frozen embedding table). All numbers below were")
    w("measured by the script itself.")
    w("")
    w("## Head")
    w("")
    w(f"- fused target features: `eagle_aux_hidden_state_layer_ids` = {r['layers']}: the residual-stream hidden")
    w("  states *entering* those target decoder layers (transformers' `hidden_states[k]`; the last layer's")
    w("  output, which transformers only returns after the final norm, is not used), concatenated in that order")
    w(f"- hidden {c['hidden_size']}, intermediate {c['intermediate_size']}, heads {c['num_attention_heads']} / KV heads "
      f"{c['num_key_value_heads']} / head_dim {c['head_dim']}, RMSNorm eps {c['rms_norm_eps']}, RoPE theta "
      f"{c['rope_theta']} (the target's), full causal attention (no sliding window)")
    w(f"- draft vocabulary {c['draft_vocab_size']} of {c['vocab_size']}"
      + (" (the whole vocabulary: `d2t` all zero, `t2d` all true)" if c['draft_vocab_size'] == c['vocab_size'] else
         f" (the most frequent generated tokens, {r['coverage']:.4f} of them)"))
    w(f"- parameters: {r['params']:,} (lm_head and norm initialised from the target's lm_head rows and final norm)")
    w("")
    w("Per position j (input: fused feature f_j and the next token t_{j+1}, RoPE position j+1; predicts t_{j+2}):")
    w("")
    w("```")
    w("g      = fc(f_j)")
    w("x      = concat(input_layernorm(embed(t_{j+1})), hidden_norm(g))")
    w("y      = g + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))     # causal, GQA, RoPE on q and k")
    w("out    = y + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(y)")
    w("logits = lm_head(norm(out));  target id = draft id + d2t[draft id]")
    w("```")
    w("")
    w("Draft step s >= 1 feeds (out of step s-1, the step's draft token) at the next position, without fc,")
    w("attending to all committed pairs and to the earlier steps of its own chain.")
    w("")
    w("## Data")
    w("")
    a = r["args"]
    g = r.get("gen_args") or a  # the generating run's arguments
    for path, n, cmd in r.get("loaded") or []:
        if r.get("gen_args"):
            w(f"This run generated nothing: it trained on the {n} sequences an earlier run of this script generated")
            w(f"(`--data-in {path}`; that run: `python3 scripts/train_eagle3.py {cmd}`), described below.")
        else:
            w(f"Beside this run's generations, {n} sequences generated by an earlier run of this script")
            w(f"(`--data-in {path}`; that run: `python3 scripts/train_eagle3.py {cmd}`); the counts below include them.")
        w("")
    if r["chat"]:
        pt = r["prompt_tokens"]
        gen_py = os.path.join(os.path.dirname(a["prompts_jsonl"]), "make_prompts.py")
        if os.path.exists(gen_py):
            doc = open(gen_py).read().split('"""')[1].strip().split("\n\n")
            w(f"Prompt source: `{os.path.relpath(gen_py)}` wrote `{a['prompts_jsonl']}`. " + " ".join(doc[0].split("\n")[:1]))
            w(" ".join(" ".join(doc[1].split("\n")).split()))
            w("")
        if r.get("train_categories"):
            w("Categories of the prompts whose generations were trained on: "
              + ", ".join(f"{k} {v}" for k, v in r["train_categories"].items()) + ".")
            w("")
        sp = r.get("self_prompts")
        if sp:
            w(f"Self-written prompts (`--self-prompts {g['self_prompts']}`): {sp['kept']} user requests written by the target")
            w("itself (Magpie, Xu et al. 2024): its chat template rendered up to where a user turn's text begins, the")
            w(f"turn sampled at T = 1, top-p 0.95, until its end-of-turn token, at most {sp['max_tokens']} tokens; of {sp['written']}")
            w("distinct requests of at least 16 characters, those equal to a file prompt or meeting an evaluation prompt")
            w(f"(either contained in the other) were dropped ({sp['batches']} batches of {sp['batch']}, {sp['seconds']:.0f} s).")
            w("They follow the file's prompts in the training list.")
            w("")
        if a.get("extra_prompts") or g.get("extra_prompts"):
            ep = a.get("extra_prompts") or g.get("extra_prompts")
            w(f"More training requests (`--extra-prompts {ep}`) follow the file's prompts in the training list")
            w("(their categories are counted above).")
            w("")
        cx = r.get("context")
        if cx:
            pt_ = cx["prompt_tokens"]
            w(f"Long-context requests (`--context-prompts {cx['requests']}`): after the set below was generated, its")
            w("generated answers (up to their first EOS, at least 64 tokens) became passages of requests in the shapes")
            w("of Spec-Bench's summarization, extraction and retrieval questions, wording written in the script")
            w("(`CONTEXT_TEMPLATES`): a summary or the key points of one answer, a question over one answer (the request")
            w("that produced it), or that question over 2-3 answers, its own among them. Of those,")
            w(f"{cx['kept']} fit {cx['seq_len'] - cx['min_gen']} tokens through the chat template ({pt_[0]}-{pt_[1]}, mean {pt_[2]:.0f});")
            w(f"none contains or is contained in an evaluation prompt. In batches of {cx['gen_batch']}, each continued to")
            w(f"{cx['seq_len']} tokens minus the batch's longest prompt, the target generated {cx['seqs']} sequences")
            w(f"({cx['sampled']} sampled at T=1; {cx['tokens']:,} tokens, {cx['generated']:,} in the loss) in {cx['seconds']:.0f} s"
              + (f" (budget {cx['budget']:.0f} s)" if cx.get("budget") else "") + ". Training batches group rows of similar")
            w("length (runs of 32 batches sorted by kept length), each cut to its longest row.")
            w("")
        w(f"Prompts: the instructions of {r['src']}, each one user turn rendered through the target's own chat")
        w("template (its default system message included, generation prompt appended; encoded without added")
        w(f"special tokens); the prompts of the sequences trained on are {pt[0]}-{pt[1]} tokens (mean {pt[2]:.1f}). The last {r['n_held_prompts']} prompts of the file are held")
        w(f"out; the first {g['num_seqs']} of the other {r['n_train_prompts']} were offered to generation. The script checked that none of the "
          f"{r['n_eval_prompts']} evaluation prompts")
        w(f"of {', '.join('`' + os.path.relpath(e) + '`' for e in r['eval_files'])} occurs verbatim (first 300 characters) in")
        w("the training prompts, and that no training prompt equals or is contained in an evaluation prompt")
        w("(case- and whitespace-insensitive).")
        w(f"Generation batches of {g['gen_batch']} prompts of similar length (left-padded with the attention mask, so")
        w(f"every row has RoPE positions 0, 1, ...), continued by the target to {a['seq_len']} tokens minus the batch's longest")
        w(f"prompt: {r['seqs'] - r['sampled_seqs']} sequences greedily, {r['sampled_seqs']} with T=1 sampling ({r['seqs']} sequences,")
        w(f"{r['tokens']:,} tokens, {r['generated']:,} in the loss"
          + (f"; generation stopped after the batch that crossed its {g['gen_seconds']:.0f} s budget" if g.get("gen_seconds") else "")
          + "). A batch stops once every row has produced EOS.")
        if a.get("recompute_features"):
            w(f"While generating ({g['target_dtype']}) the argmax of the target's full logits was recorded at every")
            w("position; the hidden states at the fused layers and the final normed hidden state were not kept but")
            w("recomputed for each training batch by a forward of the target over its rows (bf16 autocast on a GPU;")
            w("`--recompute-features`), so a set costs only its token ids. Loss and accuracy cover generated tokens")
            w(f"only (up to the first EOS). Held-out: {r['held_seqs']} sequences made the same way from the held-out prompts.")
        else:
            w("While generating (float32), one token more than kept, so that every kept position went through the")
            w("target, the target's hidden states at the fused layers, its final normed hidden state and the argmax of")
            w(f"its full logits were recorded, the states cached in {a['cache_dtype']}. Loss and accuracy cover generated tokens only (up")
            w(f"to the first EOS). Held-out: {r['held_seqs']} sequences made the same way from the held-out prompts (features in float32).")
    else:
        w(f"Prompts: random token windows of the {r['src']}, {r['n_train_files']} files, without the target's held-out")
        w(f"files ({', '.join(r['held_names'])}) and without `{'`, `'.join(EVAL_SOURCE_FILES)}` (the sources of")
        w("`configs/prompts/context.jsonl`). The script checked that none of the "
          f"{r['n_eval_prompts']} evaluation prompts of {', '.join('`' + os.path.relpath(e) + '`' for e in r['eval_files'])}")
        w("occurs verbatim (first 300 characters) in the text the prompts were drawn from.")
        w(f"Each prompt ({a['prompt_min']}-{a['prompt_max']} tokens, one length per generation batch of {a['gen_batch']}) was continued")
        w(f"by the target to {a['seq_len']} tokens: {r['seqs'] - r['sampled_seqs']} sequences greedily, {r['sampled_seqs']} with T=1 sampling")
        w(f"({r['seqs']} sequences, {r['tokens']:,} tokens, {r['generated']:,} in the loss). While generating (float32, one")
        w("token more than kept, so that every kept position went through the target), the target's hidden states at")
        w("the fused layers and its final normed hidden state (its logits = lm_head of it) were recorded and cached")
        w(f"in {a['cache_dtype']}. Loss and accuracy cover generated tokens only (up to a first EOS). Held-out: "
          f"{r['held_seqs']} sequences made the same way from prompts in the held-out files (features in float32).")
    w("")
    w("## Training")
    w("")
    w(f"Training-time test with {a['ttt_steps']} steps (as speculators' `Eagle3DraftModel.forward`): step 0 runs every")
    w("position on target features; step s feeds at query j the head's own `out` of step s-1 at j and the")
    w("token t_{j+1+s}, RoPE position j+1+s, and query j attends to the step-0 keys of positions <= j plus")
    w("its own keys of steps 1..s. Loss = sum over steps s of "
      f"{a['step_decay']}^s x mean forward KL(target || head) over the draft")
    w("vocabulary at target position j+1+s; gradients flow through the steps."
      + (f" Each batch unrolls the chains of {a['anchors']} random" if a["anchors"] else ""))
    if a["anchors"]:
        w("positions per sequence (among those whose next token is generated; every position's step-0 key and value")
        w("are computed, so each chain sees the full context it would see with all positions unrolled; a fresh draw")
        w("each batch), which costs a fraction of unrolling every position for the same information per chain.")
    w(f"AdamW (betas 0.9/0.95, weight decay {a['weight_decay']} on matrices), peak lr {a['lr']}, {a['warmup']} warmup steps,")
    w(f"cosine decay to 10%, gradient clipping {a['clip']}, bf16 autocast (norms, softmax and loss in float32),")
    w(f"batches of {a['batch']} sequences, {r['steps']} steps ({r['steps'] * a['batch'] / r['seqs']:.2f} epochs), seed {a['seed']}.")
    w("")
    w(f"Timings ({r['device']}): generation{'' if a.get('recompute_features') else ' with feature capture'} "
      f"{r['t_gen']:.0f} s, training "
      f"{r['t_train']:.0f} s, acceptance simulation {r['t_sim']:.0f} s; whole run {r['t_total']:.0f} s.")
    if r["t_train"] > a["max_seconds"]:
        w(f"(Training overran its --max-seconds {a['max_seconds']:.0f}: the budget is applied at step 30 from the speed of")
        w("steps 10-30, which leaves out the held-out evaluations and was faster than the later steps.)")
    w("")
    K = a["ttt_steps"]
    dec = a["step_decay"]
    w("Loss curve: training loss (the weighted sum over the TTT steps, and step 0 alone; mean over the batches")
    w("since the previous row), held-out KL at step 0, and per TTT step s = 0, 1, ...: held-out top-1 accuracy")
    w("(the head's argmax equals the target's at that step, teacher-forced tokens) and chain accuracy (steps")
    w("0..s all correct, i.e. the chance that a chain drafted from that position gets s+1 tokens accepted):")
    w("")
    w("| step | seconds | train loss | train loss step 0 | held-out KL step 0 | held-out accuracy per step | held-out chain accuracy per step |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    if r["before"]:
        b = r["before"]
        w(f"| 0 | 0 | | | {b['loss'][0]:.3f} | " + " / ".join(f"{x:.3f}" for x in b["acc"]) + " | "
          + " / ".join(f"{x:.3f}" for x in b["chain"]) + " |")
    for e in r["curve"]:
        h = e["held"]
        tl = e["train"]["loss"]
        tot = sum(dec ** i * x for i, x in enumerate(tl))
        w(f"| {e['step']} | {e['elapsed']:.0f} | {tot:.3f} | {tl[0]:.3f} | "
          + (f"{h['loss'][0]:.3f} | " + " / ".join(f"{x:.3f}" for x in h["acc"]) + " | "
             + " / ".join(f"{x:.3f}" for x in h["chain"]) if h else " | |") + " |")
    last = r["curve"][-1]["held"] if r["curve"] else None
    if last:
        w("")
        w("Final held-out KL per step: " + ", ".join(f"{x:.3f}" for x in last["loss"]) + " nats.")
    w("")
    w("## Acceptance estimate")
    w("")
    w(f"Greedy chain speculation, γ = {' and '.join(str(a['gamma']).split(','))}, {a['sim_new_tokens']} new tokens per prompt, simulated in torch with")
    w(f"the real target: the head drafts autoregressively with its own KV cache (the saved {args.save_dtype} weights,")
    w("loaded back, run in float32), the target verifies each block with a full forward (float32), the longest matching prefix")
    w("plus the target's own token is committed, and the head then consumes the target's features of the")
    w("committed positions. τ = (new tokens − generations) / (target forwards − generations), as the Rust")
    w("experiment reports it (the prefill forward left out); α = accepted / proposed drafts; generation stops")
    w("at EOS." + (" The shipped draft model (`models/draft`) was simulated on the same target continuations (exact"
                   " for greedy decoding)." if any("draft" in x for x in r["sim"].values()) else ""))
    if r["self_test"] is not None:
        w(f"Self-test: the incremental inference path reproduces the TTT training forward (max |logit diff| {r['self_test']:.1e}).")
    w("")
    w("| prompts | γ | drafter | τ | α | acceptance per draft position |")
    w("| --- | --- | --- | --- | --- | --- |")
    for key, s in r["sim"].items():
        name = s["set"]
        if r["chat"]:
            desc = {"held-out": f"{len(s['prompts'])} held-out training-style prompts (chat template)",
                    "default": f"**evaluation prompts**: the first {len(s['prompts'])} of `{a['sim_prompts']}` "
                               f"(first turn, chat template; not used in training)"}.get(name, name)
        else:
            desc = {"held-out": f"{len(s['prompts'])} held-out (def lines of the held-out files)",
                    "default": f"{len(s['prompts'])} default (`{a['sim_prompts']}`, evaluation only)"}.get(name, name)
        for who in ("head", "draft"):
            if who in s:
                x = s[who]
                label = "**EAGLE-3 head**" if who == "head" else "models/draft"
                tau = f"**{x['tau']:.3f}**" if who == "head" else f"{x['tau']:.3f}"
                w(f"| {desc} | {s['gamma']} | {label} | {tau} | {x['alpha']:.3f} | "
                  + " / ".join(f"{v:.2f}" for v in x["per_position"]) + " |")
    w("")
    for key, s in r["sim"].items():
        if s["mismatch"]:
            w(f"({key}: {s['mismatch']} of the head's simulated outputs differ from transformers' cached greedy")
            w("generate, a numerical tie between a full forward and the cached one.)")
    w("")
    w("## Reproduce")
    w("")
    w("```")
    w(" ".join(["python3", "scripts/train_eagle3.py"] + [shlex.quote(x) for x in r.get("command", command_args())]))
    w("```")
    w("")
    try:
        gguf_v = f", gguf {importlib.metadata.version('gguf')}" if a["target"].endswith(".gguf") else ""
    except importlib.metadata.PackageNotFoundError:
        gguf_v = ""
    w(f"Environment: Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}{gguf_v}, "
      f"{r['device']}." + ("" if r.get("chat") else " The prompt text depends on the interpreter's standard library version."))
    path = os.path.join(args.out, "TRAINING.md")
    with open(path, "w") as fh:
        fh.write("\n".join(L).rstrip("\n") + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
