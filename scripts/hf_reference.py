#!/usr/bin/env python3
"""Build tiny random Hugging Face models and record transformers' outputs as test fixtures.

The Rust model implementations are checked against these files (tests/fixtures/hf/<case>/).
Every case is a seeded, randomly initialised f32 model small enough to commit; weights are
re-drawn with a larger spread than the library's default init (std 0.02 would make every
logit ~0 and hide bugs), and all norm weights / attention biases are made non-trivial.

Command used to produce the committed fixtures (transformers 5.17.0, torch 2.11.0, CPU):

    python3 scripts/hf_reference.py --out tests/fixtures/hf

Cases (directory names); all: vocab 256, hidden 64, intermediate 96 (gemma: 64), rms_norm_eps 1e-6:
  llama            LlamaForCausalLM, 2 layers, GQA 4q/2kv, head_dim 16, Llama-3 rope scaling (rope_type
                   "llama3", factor 8, low 1, high 4, original_max_position_embeddings 64 so that with
                   theta 10000 there are unscaled, smoothed and /8 frequencies), untied lm_head,
                   saved SHARDED (model-0000x-of-0000N.safetensors + model.safetensors.index.json).
  llama_tied       LlamaForCausalLM, tie_word_embeddings, no rope scaling, saved in bf16; the reference
                   logits/greedy come from the saved dir loaded back with dtype=float32.
  mistral          MistralForCausalLM, GQA, sliding_window 8, untied.
  qwen2            Qwen2ForCausalLM, GQA, non-zero random q/k/v biases, untied.
  qwen3            Qwen3ForCausalLM, head_dim 32 != hidden/heads (16), random q_norm/k_norm weights, tied.
  gemma3           Gemma3ForCausalLM (gemma3_text), 6 layers 5 sliding : 1 full, sliding_window 8,
                   4 query heads / 1 KV head, head_dim 24, query_pre_attn_scalar 32 != head_dim,
                   local rope base 10000 vs global 1e6, final_logit_softcapping 30, tied.
                   attn_logit_softcapping stays null: Gemma3Attention in transformers 5.17 stores the
                   value but never passes it to the attention function, so it has no effect there.
  gemma3_nosoftcap same as gemma3 (other random weights) without any softcapping (both null).
  gemma3_linear    same shape as gemma3, linear rope scaling (factor 8) on the full-attention layer,
                   max_position_embeddings 4096; reference.json also has long_input_ids (2064 ids),
                   long_logits_from (2040) and long_logits (positions 2040..2063 of one forward), so
                   decoding crosses position 2048 (where the Rust RoPE table grows).
  qwen2_sliding    Qwen2ForCausalLM, 3 layers, use_sliding_window, sliding_window 8, max_window_layers 1:
                   layer 0 full attention, layers 1-2 sliding.
  gemma3_attn_softcap same shape as gemma3, attn_logit_softcapping 2.0 applied in the reference by
                   patching Gemma3Attention to pass it to eager_attention_forward as `softcap` (Gemma 2's
                   semantics; unpatched transformers ignores it for Gemma 3, and so does our loader).
  (gemma3_linear, qwen2_sliding and gemma3_attn_softcap were added later with the same script and
   versions: python3 scripts/hf_reference.py --out tests/fixtures/hf \
       --only gemma3_linear qwen2_sliding gemma3_attn_softcap)

Files per case:
  config.json, generation_config.json, *.safetensors[, model.safetensors.index.json]
      exactly as `save_pretrained` of transformers 5.x writes them;
  config.v4.json
      the same config in the transformers 4.x spelling (see `to_v4_config`):
        dtype                                  -> torch_dtype
        rope_parameters {rope_type: default, rope_theta: T}
                                               -> rope_theta: T, rope_scaling: null
        rope_parameters {rope_type: llama3, rope_theta: T, factor, low_freq_factor, high_freq_factor,
                         original_max_position_embeddings}
                                               -> rope_theta: T, rope_scaling: {rope_type: llama3, factor,
                                                  low_freq_factor, high_freq_factor,
                                                  original_max_position_embeddings}
        gemma3: rope_parameters {full_attention: {rope_type: default, rope_theta: G},
                                 sliding_attention: {rope_type: default, rope_theta: L}}
                                               -> rope_theta: G, rope_local_base_freq: L, rope_scaling: null
                                                  (a non-default full_attention rope would go to rope_scaling)
                _sliding_window_pattern: P, layer_types [...]
                                               -> sliding_window_pattern: P (layer i is full iff (i+1) % P == 0),
                                                  layer_types dropped (as in the original Gemma 3 releases)
        qwen2/qwen3: layer_types (all full_attention, derivable from use_sliding_window=false)
                                               -> dropped
                     sliding_window: null (5.x nulls it when use_sliding_window is false)
                                               -> sliding_window: 4096 with use_sliding_window: false, as 4.x
                                                  checkpoints carry it (it must be ignored)
        transformers_version                   -> "4.57.1" (the file is a conversion, not written by 4.x)
      The script checks that transformers 5.17 loads config.v4.json into an identical config
      (same rope parameters, layer types, window) and identical logits.
  reference.json
      {"case", "model_class", "input_ids": [40 ids], "logits": [[vocab f32] x 40],
       "prompt": [6 ids], "greedy": [30 ids], "greedy_min_margin", "notes"}
      logits: one full forward over input_ids, f32 on CPU, rounded to 7 significant digits.
      greedy: model.generate(prompt, do_sample=False, max_new_tokens=min_new_tokens=30, eos disabled),
      i.e. the 30 new tokens only (not the prompt); cross-checked against an argmax loop of full
      forwards without a cache. greedy_min_margin: smallest top1-top2 logit gap along the greedy path
      (prompts are redrawn until it is >= 0.01 and the path has >= 10 distinct tokens, >= 4 in the
      last 15).

Semantics worth knowing (transformers 5.17, eager attention):
  * sliding window: key j is visible to query i iff i - window < j <= i, i.e. the query sees itself and
    window-1 past tokens (masking_utils.sliding_window_overlay: kv_idx > q_idx - sliding_window); the
    DynamicSlidingWindowLayer cache keeps the last window-1 keys.
  * gemma3: embeddings are multiplied by sqrt(hidden_size) cast to the weight dtype; RMSNorm is
    x * rsqrt(mean(x^2)+eps) * (1 + w) computed in f32; attention scaling is query_pre_attn_scalar**-0.5;
    final softcap: logits = tanh(logits / cap) * cap; attn_logit_softcapping is IGNORED by Gemma3 (only
    Gemma2 applies it);
    q_norm/k_norm over head_dim before rope; sandwich norms (post_attention / pre_feedforward /
    post_feedforward); MLP gelu_pytorch_tanh(gate) * up.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch

import transformers
from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 256
SEQ_LEN = 40
PROMPT_LEN = 6
NEW_TOKENS = 30
V4_VERSION = "4.57.1"
MIN_MARGIN = 0.01  # smallest accepted top1-top2 logit gap on the greedy path

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)


def case_specs():
    # Gemma-3-1b-like shape: 4 query heads sharing 1 KV head, head_dim 24 != hidden/heads (16).
    # The 5:1 sliding/full pattern is Gemma3TextConfig's default (written as `_sliding_window_pattern`: 6
    # plus `layer_types`); passing `sliding_window_pattern=` would add a second, redundant key to config.json.
    gemma_common = dict(
        COMMON,
        num_hidden_layers=6,
        num_key_value_heads=1,
        head_dim=24,
        intermediate_size=64,
        sliding_window=8,
        query_pre_attn_scalar=32,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    return {
        "llama": dict(
            cls=LlamaForCausalLM,
            cfg=LlamaConfig(
                **COMMON,
                num_hidden_layers=2,
                tie_word_embeddings=False,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
            save_dtype=torch.float32,
            shard="150KB",
            norm="mul",
            notes="Llama, GQA 4/2, head_dim 16, llama3 rope scaling (factor 8, low 1, high 4, "
            "original_max_position_embeddings 64, theta 1e4: frequency 0 unscaled, 1-2 smoothed, 3-7 divided by 8), "
            "untied lm_head, f32 weights saved in several shards with model.safetensors.index.json.",
        ),
        "llama_tied": dict(
            cls=LlamaForCausalLM,
            cfg=LlamaConfig(
                **COMMON,
                num_hidden_layers=2,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            save_dtype=torch.bfloat16,
            shard=None,
            norm="mul",
            notes="Llama, tied embeddings (no lm_head.weight in the file), no rope scaling, weights saved in bf16; "
            "reference computed by transformers from the bf16 file loaded with dtype=float32 (exact upcast).",
        ),
        "mistral": dict(
            cls=MistralForCausalLM,
            cfg=MistralConfig(
                **COMMON,
                num_hidden_layers=2,
                sliding_window=8,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            save_dtype=torch.float32,
            shard=None,
            norm="mul",
            notes="Mistral, GQA 4/2, sliding_window 8 on every layer: query i attends keys j with i-8 < j <= i "
            "(itself + 7 previous).",
        ),
        "qwen2": dict(
            cls=Qwen2ForCausalLM,
            cfg=Qwen2Config(
                **COMMON,
                num_hidden_layers=2,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            save_dtype=torch.float32,
            shard=None,
            norm="mul",
            notes="Qwen2, GQA 4/2, random non-zero q/k/v biases (o_proj has none), no sliding window.",
        ),
        "qwen3": dict(
            cls=Qwen3ForCausalLM,
            cfg=Qwen3Config(
                **COMMON,
                num_hidden_layers=2,
                head_dim=32,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            save_dtype=torch.float32,
            shard=None,
            norm="mul",
            notes="Qwen3, GQA 4/2, explicit head_dim 32 (hidden/heads would be 16, q_proj is 64->128), "
            "q_norm/k_norm RMSNorm over head_dim applied per head before rope, random norm weights, no biases, "
            "tied embeddings (as the small Qwen3 checkpoints).",
        ),
        "gemma3": dict(
            cls=Gemma3ForCausalLM,
            cfg=Gemma3TextConfig(**gemma_common, final_logit_softcapping=30.0, attn_logit_softcapping=None),
            save_dtype=torch.float32,
            shard=None,
            norm="gemma",
            notes="Gemma3 text, 6 layers (0-4 sliding window 8, 5 full), 4 query heads / 1 KV head, head_dim 24, "
            "intermediate 64, query_pre_attn_scalar 32 (scale 32**-0.5), local rope 1e4 / global 1e6, "
            "final_logit_softcapping 30 (attn_logit_softcapping null: transformers' Gemma3 ignores it anyway), "
            "(1+w) RMSNorm with random w, tied embeddings, "
            "embeddings scaled by sqrt(64)=8 (embedding std 1/32, so the scaled RMS is 0.25), final norm w ~ U(20, 40) "
            "so that logits are O(10) and the softcap bends them.",
        ),
        "gemma3_nosoftcap": dict(
            cls=Gemma3ForCausalLM,
            cfg=Gemma3TextConfig(**gemma_common, final_logit_softcapping=None, attn_logit_softcapping=None),
            save_dtype=torch.float32,
            shard=None,
            norm="gemma",
            notes="Same shape as gemma3 (different random weights) with final_logit_softcapping null.",
        ),
        # Cases below were added later; appended so that the seeds (seed + index) of the ones
        # above, and hence their committed fixtures, stay the same.
        "gemma3_linear": dict(
            cls=Gemma3ForCausalLM,
            cfg=Gemma3TextConfig(
                **dict(
                    gemma_common,
                    max_position_embeddings=4096,
                    rope_parameters={
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    },
                ),
                final_logit_softcapping=30.0,
                attn_logit_softcapping=None,
            ),
            save_dtype=torch.float32,
            shard=None,
            norm="gemma",
            long=True,
            notes="Same shape as gemma3 with linear rope scaling (factor 8) on the full-attention layer, "
            "as Gemma 3 4B+ checkpoints; reference.json also holds logits past position 2048 (long_*).",
        ),
        "qwen2_sliding": dict(
            cls=Qwen2ForCausalLM,
            cfg=Qwen2Config(
                **dict(COMMON, num_hidden_layers=3),
                use_sliding_window=True,
                sliding_window=8,
                max_window_layers=1,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            save_dtype=torch.float32,
            shard=None,
            norm="mul",
            notes="Qwen2 with use_sliding_window, sliding_window 8, max_window_layers 1: layer 0 full "
            "attention, layers 1-2 sliding (layer_types in 5.x; derived from max_window_layers in 4.x).",
        ),
        "gemma3_attn_softcap": dict(
            cls=Gemma3ForCausalLM,
            cfg=Gemma3TextConfig(**gemma_common, final_logit_softcapping=30.0, attn_logit_softcapping=2.0),
            save_dtype=torch.float32,
            shard=None,
            norm="gemma",
            attn_softcap=True,
            notes="Same shape as gemma3 with attn_logit_softcapping 2.0 APPLIED: transformers' Gemma3Attention "
            "ignores it, so the reference runs with its forward patched to pass softcap to Gemma's own "
            "eager_attention_forward (tanh(scores / cap) * cap after scaling, before the mask: Gemma 2's "
            "semantics). The Rust loader ignores the key like transformers; the test enables the softcap.",
        ),
    }


def randomize(model, norm_kind, gen):
    """Re-draw every parameter so that nothing is zero/one by construction.

    Embeddings of tied models are drawn small (std 0.1; Gemma: RMS 0.25 after its sqrt(hidden)
    scaling): with lm_head == embed_tokens the current token's own embedding in the residual stream
    boosts its logit by ~sqrt(hidden) * rms(embedding) / rms(residual), and a large boost makes the
    model greedily repeat its last token, which would make the greedy test blind to cache bugs.
    """
    tied = model.config.tie_word_embeddings
    hidden = model.config.hidden_size
    if norm_kind == "gemma":
        embed_std = 0.25 * hidden ** -0.5
    else:
        embed_std = 0.1 if tied else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight" and norm_kind == "gemma":
                # large final-norm gain so that logits reach O(10) and the softcap (30) really bends them
                v = torch.empty(p.shape).uniform_(20.0, 40.0, generator=gen)
            elif name.endswith("norm.weight"):
                if norm_kind == "gemma":  # used as (1 + w)
                    v = torch.empty(p.shape).uniform_(-0.5, 0.5, generator=gen)
                else:
                    v = torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen)
            elif name.endswith(".bias"):
                v = torch.randn(p.shape, generator=gen) * 0.5
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=gen) * embed_std
            elif p.dim() == 2:  # Linear weight [out, in]
                v = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1])
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))


def round_sig(x, sig=7):
    return float(f"{x:.{sig - 1}e}")


def disable_eos(model):
    gc = model.generation_config
    gc.eos_token_id = None
    gc.do_sample = False
    gc.pad_token_id = 0


@torch.no_grad()
def greedy_generate(model, prompt):
    disable_eos(model)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        eos_token_id=None,
        pad_token_id=0,
        num_beams=1,
    )
    out = out[0].tolist()
    assert out[:PROMPT_LEN] == prompt, "generate did not echo the prompt"
    new = out[PROMPT_LEN:]
    assert len(new) == NEW_TOKENS, f"generate stopped early: {len(new)} tokens"
    return new


@torch.no_grad()
def greedy_nocache(model, prompt):
    """Reference greedy path by full recomputation (no KV cache), plus the min top1-top2 margin."""
    seq = list(prompt)
    margin = float("inf")
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
        top2 = torch.topk(logits, 2).values
        margin = min(margin, float(top2[0] - top2[1]))
        seq.append(int(torch.argmax(logits)))
    return seq[PROMPT_LEN:], margin


def to_v4_config(cfg5: dict) -> dict:
    """Rewrite a transformers-5.x config.json dict into the 4.x spelling (see module docstring)."""
    c = dict(cfg5)
    out = {}
    mt = c["model_type"]
    rp = c.pop("rope_parameters", None)
    layer_types = c.pop("layer_types", None)
    pattern = c.pop("_sliding_window_pattern", None)
    dtype = c.pop("dtype", None)
    c.pop("transformers_version", None)
    if mt == "gemma3_text":
        full = dict(rp["full_attention"])
        slide = dict(rp["sliding_attention"])
        assert slide.get("rope_type", "default") == "default", slide
        c["rope_theta"] = full.pop("rope_theta")
        c["rope_local_base_freq"] = slide.pop("rope_theta")
        c["rope_scaling"] = None if full.get("rope_type", "default") == "default" and len(full) == 1 else full
        assert pattern is not None
        derived = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(c["num_hidden_layers"])]
        assert derived == layer_types, (derived, layer_types)
        c["sliding_window_pattern"] = pattern
    else:
        assert "rope_type" in rp, rp
        rp = dict(rp)
        c["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type", "default") == "default" and len(rp) == 1:
            c["rope_scaling"] = None
        else:
            c["rope_scaling"] = rp
        if layer_types is not None and c.get("use_sliding_window"):
            # 4.x derives the sliding layers from max_window_layers.
            first = c["max_window_layers"]
            derived = ["sliding_attention" if i >= first else "full_attention" for i in range(c["num_hidden_layers"])]
            assert derived == layer_types, (derived, layer_types)
        elif layer_types is not None:
            assert all(t == "full_attention" for t in layer_types), layer_types
        if c.get("use_sliding_window") is False and c.get("sliding_window") is None:
            # 4.x Qwen configs carried a window size even with use_sliding_window=false
            # (e.g. Qwen2.5: "sliding_window": 131072); a loader must ignore it then.
            c["sliding_window"] = 4096
    for k in sorted(c):
        out[k] = c[k]
    out["torch_dtype"] = dtype
    out["transformers_version"] = V4_VERSION
    return dict(sorted(out.items()))


def check_v4_roundtrip(case_dir, v4, ref_logits, input_ids):
    """transformers 5.x must read config.v4.json into the same effective config and logits."""
    tmp = tempfile.mkdtemp()
    try:
        for f in os.listdir(case_dir):
            if f.endswith(".safetensors") or f.endswith(".index.json"):
                shutil.copy(os.path.join(case_dir, f), tmp)
        with open(os.path.join(tmp, "config.json"), "w") as fh:
            json.dump(v4, fh, indent=2)
        a = AutoConfig.from_pretrained(case_dir)
        b = AutoConfig.from_pretrained(tmp)
        for key in ("rope_parameters", "layer_types", "sliding_window", "head_dim", "tie_word_embeddings",
                    "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
                    "attention_bias", "num_key_value_heads", "rms_norm_eps"):
            va, vb = getattr(a, key, None), getattr(b, key, None)
            assert va == vb, f"v4 round trip changed {key}: {va!r} vs {vb!r}"
        m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            lg = m(torch.tensor([input_ids]), use_cache=False).logits[0]
        assert torch.equal(lg, ref_logits), f"v4 config gives different logits: {float((lg - ref_logits).abs().max())}"
    finally:
        shutil.rmtree(tmp)


LONG_LEN = 2064  # past 2048, the first RoPE table size of the Rust implementation
LONG_FROM = 2040  # logits are kept for positions [LONG_FROM, LONG_LEN) only (fixture size)


@torch.no_grad()
def long_reference(ref, gen):
    """Logits of the last LONG_LEN - LONG_FROM positions of one forward over LONG_LEN tokens,
    cross-checked against a cached prefill of LONG_FROM tokens followed by one-token steps."""
    ids = torch.randint(0, VOCAB, (LONG_LEN,), generator=gen).tolist()
    full = ref(torch.tensor([ids]), use_cache=False).logits[0, LONG_FROM:].float()
    out = ref(torch.tensor([ids[:LONG_FROM]]), use_cache=True)
    pkv, steps = out.past_key_values, []
    for t in range(LONG_FROM, LONG_LEN):
        o = ref(torch.tensor([[ids[t]]]), past_key_values=pkv, use_cache=True)
        pkv = o.past_key_values
        steps.append(o.logits[0])
    err = float((torch.cat(steps, 0) - full).abs().max())
    assert err < 1e-4, f"long incremental decode differs from full forward by {err}"
    return {
        "long_input_ids": ids,
        "long_logits_from": LONG_FROM,
        "long_logits": [[round_sig(v) for v in row] for row in full.tolist()],
    }


class attention_softcap:
    """Within this context Gemma3Attention applies config.attn_logit_softcapping (as Gemma 2
    does) by passing it as `softcap` to the attention function; transformers 5.x ignores it."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            self.orig = Gemma3Attention.forward
            orig = self.orig

            def forward(module, *args, **kwargs):
                kwargs["softcap"] = module.attn_logit_softcapping
                return orig(module, *args, **kwargs)

            Gemma3Attention.forward = forward

    def __exit__(self, *exc):
        if self.enabled:
            Gemma3Attention.forward = self.orig


def build_case(name, spec, out_root, seed):
    with attention_softcap(spec.get("attn_softcap", False)):
        size = build_case_inner(name, spec, out_root, seed)
    if spec.get("attn_softcap"):
        # The patch must matter: the same weights without it give other logits.
        ref = AutoModelForCausalLM.from_pretrained(os.path.join(out_root, name), dtype=torch.float32,
                                                   attn_implementation="eager").eval()
        with open(os.path.join(out_root, name, "reference.json")) as fh:
            refj = json.load(fh)
        with torch.no_grad():
            plain = ref(torch.tensor([refj["input_ids"]]), use_cache=False).logits[0].float()
        effect = float((plain - torch.tensor(refj["logits"])).abs().max())
        assert effect > 0.5, f"attention softcap changes logits by only {effect}"
        print(f"{name}: the attention softcap changes logits by up to {effect:.2f}")
    return size


def build_case_inner(name, spec, out_root, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cfg = spec["cfg"]
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).to(torch.float32).eval()
    randomize(model, spec["norm"], gen)

    case_dir = os.path.join(out_root, name)
    if os.path.exists(case_dir):
        shutil.rmtree(case_dir)
    os.makedirs(case_dir)

    save_model = model.to(spec["save_dtype"]) if spec["save_dtype"] != torch.float32 else model
    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    save_model.save_pretrained(case_dir, safe_serialization=True, **kw)
    if spec["shard"]:
        assert os.path.exists(os.path.join(case_dir, "model.safetensors.index.json")), "not sharded"
        n = len([f for f in os.listdir(case_dir) if f.endswith(".safetensors")])
        assert n >= 2, f"only {n} shard(s)"

    # Reference model: always the saved directory loaded back in f32 (bf16 case: exact upcast).
    ref = AutoModelForCausalLM.from_pretrained(case_dir, dtype=torch.float32, attn_implementation="eager").eval()
    assert type(ref) is spec["cls"], type(ref)
    if spec["save_dtype"] == torch.float32:
        for (na, pa), (nb, pb) in zip(model.state_dict().items(), ref.state_dict().items()):
            assert na == nb and torch.equal(pa, pb), f"reload changed {na}"

    input_ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=gen).tolist()
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen).tolist()
    with torch.no_grad():
        logits = ref(torch.tensor([input_ids]), use_cache=False).logits[0].float()
        # the cached path (prefill + one-token steps) must agree with the full forward
        out = ref(torch.tensor([input_ids[:20]]), use_cache=True)
        pkv, steps = out.past_key_values, [out.logits[0]]
        for t in range(20, SEQ_LEN):
            o = ref(torch.tensor([[input_ids[t]]]), past_key_values=pkv, use_cache=True)
            pkv = o.past_key_values
            steps.append(o.logits[0])
        inc = torch.cat(steps, 0)
        inc_err = float((inc - logits).abs().max())
        assert inc_err < 1e-4, f"incremental decode differs from full forward by {inc_err}"

    # Draw prompts until the greedy path has no near tie (so a correct f32 reimplementation with a
    # different summation order cannot flip an argmax).
    # Also require a varied continuation (a model stuck repeating one token tests little).
    for attempt in range(100):
        greedy2, margin = greedy_nocache(ref, prompt)
        if margin >= MIN_MARGIN and len(set(greedy2)) >= 10 and len(set(greedy2[-15:])) >= 4:
            break
        prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen).tolist()
    else:
        raise RuntimeError("no prompt with a clear, varied greedy path found")
    extra = ""
    cap = getattr(ref.config, "final_logit_softcapping", None)
    if cap:
        ref.config.final_logit_softcapping = None
        with torch.no_grad():
            raw = ref(torch.tensor([input_ids]), use_cache=False).logits[0].float()
        ref.config.final_logit_softcapping = cap
        effect = float((raw - logits).abs().max())
        assert effect > 0.5, f"softcap changes logits by only {effect}"
        extra = f" Without the final softcap the logits would differ by up to {effect:.2f} (max |raw logit| {float(raw.abs().max()):.1f})."
    greedy = greedy_generate(ref, prompt)
    assert greedy == greedy2, f"generate {greedy} != no-cache argmax loop {greedy2}"

    with open(os.path.join(case_dir, "config.json")) as fh:
        cfg5 = json.load(fh)
    v4 = to_v4_config(cfg5)
    with open(os.path.join(case_dir, "config.v4.json"), "w") as fh:
        json.dump(v4, fh, indent=2, sort_keys=True)
        fh.write("\n")
    check_v4_roundtrip(case_dir, v4, logits, input_ids)

    notes = (
        f"{spec['notes']} Generated by scripts/hf_reference.py with transformers {transformers.__version__}, "
        f"torch {torch.__version__}, seed {seed}, eager attention, f32 on CPU. logits: one forward over input_ids "
        f"(all {SEQ_LEN} positions, rounded to 7 significant digits). greedy: the {NEW_TOKENS} new tokens of "
        f"model.generate(prompt, do_sample=False) with eos disabled (prompt not included)." + extra
    )
    long = long_reference(ref, gen) if spec.get("long") else {}
    refj = {
        "case": name,
        "model_class": spec["cls"].__name__,
        "input_ids": input_ids,
        "logits": [[round_sig(v) for v in row] for row in logits.tolist()],
        "prompt": prompt,
        "greedy": greedy,
        "greedy_min_margin": round_sig(margin, 4),
        "notes": notes,
        **long,
    }
    with open(os.path.join(case_dir, "reference.json"), "w") as fh:
        json.dump(refj, fh, separators=(",", ":"))
        fh.write("\n")
    size = sum(os.path.getsize(os.path.join(case_dir, f)) for f in os.listdir(case_dir))
    print(f"{name:18s} files={sorted(os.listdir(case_dir))} bytes={size} "
          f"logit_std={float(logits.std()):.3f} greedy_margin={margin:.4f} incr_err={inc_err:.2e}")
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    print(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__}")
    total = 0
    for i, (name, spec) in enumerate(case_specs().items()):
        if args.only and name not in args.only:
            continue
        total += build_case(name, spec, args.out, args.seed + i)
    print(f"total bytes {total}")


if __name__ == "__main__":
    main()
