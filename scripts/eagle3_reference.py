#!/usr/bin/env python3
"""Tiny random EAGLE-3 draft heads and reference outputs from the `speculators` package.

The Rust EAGLE-3 drafter is checked against these files (tests/fixtures/eagle3/<case>/). The
reference numbers come from an implementation this project did not write: the `speculators`
package (vLLM project) version 0.9.0 from PyPI -- its model code `speculators/models/eagle3/`
(Eagle3DraftModel: fc, first decoder layer, rotary embedding, norms, lm_head) and its converter
`speculators/convert/eagle/eagle3_converter.py` (original EAGLE release layout -> speculators
layout). Every number is additionally re-derived in plain torch inside this script (independent
of speculators and of transformers' modules) and the two are asserted to agree to < 1e-5.

Environment (what worked; CPU only, float32). speculators 0.9.0 pins torch<=2.14.1 and
transformers<=5.19.0, but the modules used here import and run with the project's reference
venv (torch 2.15.0, transformers 5.23.0; see scripts/requirements-compare.txt), so the
speculators venv layers on top of that venv with a .pth file and adds only speculators and the
pure-python / small packages its imports need (all from PyPI):

    python3 -m venv venv-spec
    echo $(python3 -c 'import site; print(site.getsitepackages()[0])') \
        > venv-spec/lib/python3.*/site-packages/_venv_ref.pth
    venv-spec/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    venv-spec/bin/pip install openai loguru pydantic-settings "datasets>=4.0.0,<=5.1.0"

(`import speculators` pulls in its training data modules, hence openai / datasets /
hs-connectors; torchaudio and torchvision from its requirements are never imported.)

Command used to produce the committed fixtures (speculators 0.9.0, torch 2.15.0,
transformers 5.23.0, CPU):

    venv-spec/bin/python scripts/eagle3_reference.py --out tests/fixtures/eagle3

Cases (see tests/fixtures/eagle3/README.md for the full description and observed tolerances):
  original         the EAGLE authors' release layout (config.json LlamaConfig with
                   architectures ["LlamaForCausalLMEagle3"] + pytorch_model.bin with midlayer.*,
                   fc, norm, lm_head, d2t, t2d; no embed_tokens).
  speculators      what speculators' Eagle3Converter writes from `original` (same weights).
  speculators-nbr  a head built by speculators' Eagle3DraftModel.from_training_args with
                   norm_before_residual=True (other random weights and vocab map), saved with its
                   save_pretrained (carries embed_tokens.weight).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

INSTALL_HINT = """\
speculators 0.9.0 is not importable from this interpreter. Create its venv on top of the
reference venv and run the script with it:

    python3 -m venv venv-spec
    echo $(python3 -c 'import site; print(site.getsitepackages()[0])') \\
        > venv-spec/lib/python3.*/site-packages/_venv_ref.pth
    venv-spec/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    venv-spec/bin/pip install openai loguru pydantic-settings "datasets>=4.0.0,<=5.1.0"
    venv-spec/bin/python scripts/eagle3_reference.py --out tests/fixtures/eagle3
"""

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    import speculators
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
except ImportError as exc:  # pragma: no cover - environment problem
    sys.stderr.write(f"error: {exc}\n\n{INSTALL_HINT}")
    sys.exit(2)

# ---------------------------------------------------------------------------------------------
# Dimensions (tiny; the fixture directory must stay well under 2 MB).
H = 64  # head hidden size (= target hidden size: speculators' Eagle3DraftModel has no other)
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = H // NUM_HEADS  # 16
INTERMEDIATE = 128
VOCAB = 512  # target vocabulary
DRAFT_VOCAB = 128
ROPE_THETA = 10000.0
EPS = 1e-5
N = 12  # positions of the one-shot forward
K = 5  # greedy draft steps
VERIFIER_LAYERS = 8
AUX_LAYER_IDS = [2, VERIFIER_LAYERS // 2, VERIFIER_LAYERS - 3]  # EAGLE's default, [2, 4, 5]
VERIFIER_DIR = "tiny-llama-verifier"  # relative: this is what the converted config records
SEED = 20250611
TOL = 1e-5

ATTN_IMPL = "eager"  # speculators' default is flex attention (a training kernel); eager on CPU


# ---------------------------------------------------------------------------------------------
# Random weights


def randn(gen: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32) * std


def norm_weight(gen: torch.Generator, n: int) -> torch.Tensor:
    return 1.0 + randn(gen, n, std=0.1)


def vocab_map(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t (draft id -> offset; target = draft + d2t[draft]) and t2d (target id in draft vocab)."""
    chosen = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
    d2t = (chosen - torch.arange(DRAFT_VOCAB)).to(torch.int64)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def head_weights(gen: torch.Generator, layer_prefix: str) -> dict[str, torch.Tensor]:
    """All float weights of a one-layer EAGLE-3 head; `layer_prefix` is 'midlayer.' (release
    layout) or 'layers.0.' (speculators layout). Scales give attention scores of std ~2 and
    logits of std ~3."""
    p = layer_prefix
    w = {
        "fc.weight": randn(gen, H, 3 * H, std=(3 * H) ** -0.5),
        f"{p}hidden_norm.weight": norm_weight(gen, H),
        f"{p}input_layernorm.weight": norm_weight(gen, H),
        f"{p}post_attention_layernorm.weight": norm_weight(gen, H),
        f"{p}self_attn.q_proj.weight": randn(gen, NUM_HEADS * HEAD_DIM, 2 * H, std=1.5 * (2 * H) ** -0.5),
        f"{p}self_attn.k_proj.weight": randn(gen, NUM_KV_HEADS * HEAD_DIM, 2 * H, std=1.5 * (2 * H) ** -0.5),
        f"{p}self_attn.v_proj.weight": randn(gen, NUM_KV_HEADS * HEAD_DIM, 2 * H, std=(2 * H) ** -0.5),
        f"{p}self_attn.o_proj.weight": randn(gen, H, NUM_HEADS * HEAD_DIM, std=(NUM_HEADS * HEAD_DIM) ** -0.5),
        f"{p}mlp.gate_proj.weight": randn(gen, INTERMEDIATE, H, std=H**-0.5),
        f"{p}mlp.up_proj.weight": randn(gen, INTERMEDIATE, H, std=H**-0.5),
        f"{p}mlp.down_proj.weight": randn(gen, H, INTERMEDIATE, std=INTERMEDIATE**-0.5),
        "norm.weight": norm_weight(gen, H),
        "lm_head.weight": randn(gen, DRAFT_VOCAB, H, std=3.0 * H**-0.5),
    }
    return w


def make_verifier(path: Path, gen: torch.Generator) -> torch.Tensor:
    """A tiny random LlamaForCausalLM standing in for the target model (only its config, its
    embedding table and its lm_head are read by speculators). Returns the embedding table."""
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=VERIFIER_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        rms_norm_eps=EPS,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(randn(gen, VOCAB, H))
        model.lm_head.weight.copy_(randn(gen, VOCAB, H, std=H**-0.5))
    model.save_pretrained(str(path))
    return model.model.embed_tokens.weight.detach().clone()


# ---------------------------------------------------------------------------------------------
# Reference computation with speculators' own modules


def load_speculators_model(path: Path, attn_impl: str = ATTN_IMPL) -> Eagle3DraftModel:
    """Load a speculators-format checkpoint the way speculators' training CLI does
    (config first, attention implementation set explicitly, then from_pretrained, which also
    pulls the embedding from the verifier and resolves the aux layer ids)."""
    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = Eagle3DraftModel.from_pretrained(str(path), config=config)
    return model.eval()


@torch.no_grad()
def speculators_reference(model: Eagle3DraftModel, hidden, ids, positions, k: int) -> dict:
    """One causal forward over all N positions, then k-1 more single-position greedy steps with
    a DynamicCache, each calling speculators' modules exactly as Eagle3DraftModel.forward does
    for one TTT step (fc, embed_tokens, rotary_emb, layers, norm, lm_head; no TTT masks)."""
    n = hidden.shape[0]
    cache = DynamicCache()
    d2t = model.d2t

    fused = model.fc(hidden[None])  # [1, n, h]
    embeds = model.embed_tokens(ids[None])  # [1, n, h]
    x = torch.cat([embeds, fused], dim=-1)  # [1, n, 2h]
    pos = positions[None]
    pe = model.rotary_emb(x, pos)
    mask = model._build_attn_mask(torch.zeros(n, dtype=torch.long), n, x.device)  # noqa: SLF001
    for layer in model.layers:
        x = layer(
            x,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            cache_position=torch.arange(n),
            position_embeddings=pe,
        )
    out_hidden = x[0]
    logits = model.lm_head(model.norm(x))[0]

    draft_ids, draft_logits, draft_out = [], [logits[-1]], [out_hidden[-1]]
    prev_hidden = out_hidden[-1]
    prev_logits = logits[-1]
    next_pos = int(positions[-1]) + 1
    for step in range(k):
        d = int(torch.argmax(prev_logits))
        t = d + int(d2t[d])
        draft_ids.append(t)
        if step == k - 1:
            break
        # Later steps: the previous step's pre-norm output (width h) replaces fc(h) -- fc is not
        # applied -- and the token just drafted is embedded from the target vocabulary.
        e = model.embed_tokens(torch.tensor([[t]]))
        x = torch.cat([e, prev_hidden[None, None]], dim=-1)
        p = torch.tensor([[next_pos]])
        pe = model.rotary_emb(x, p)
        for layer in model.layers:
            x = layer(
                x,
                attention_mask=None,  # one query attends to every cached position
                position_ids=p,
                past_key_values=cache,
                cache_position=torch.tensor([cache.get_seq_length()]),
                position_embeddings=pe,
            )
        prev_hidden = x[0, -1]
        prev_logits = model.lm_head(model.norm(x))[0, -1]
        draft_logits.append(prev_logits)
        draft_out.append(prev_hidden)
        next_pos += 1
    return {
        "logits": logits.contiguous(),
        "out_hidden": out_hidden.contiguous(),
        "draft_ids": torch.tensor(draft_ids, dtype=torch.int64),
        "draft_logits": torch.stack(draft_logits).contiguous(),
        "draft_out_hidden": torch.stack(draft_out).contiguous(),
    }


@torch.no_grad()
def speculators_forward_tokens(model: Eagle3DraftModel, hidden, ids, positions) -> torch.Tensor:
    """Eagle3DraftModel.forward itself (ttt_steps=1, inference mode): its argmax tokens."""
    toks = model(
        hidden_states=hidden[None],
        input_ids=ids[None],
        document_ids=torch.zeros(1, hidden.shape[0], dtype=torch.long),
        position_ids=positions[None],
        ttt_steps=1,
    )
    return toks[0][0]


# ---------------------------------------------------------------------------------------------
# Independent plain-torch re-derivation (no transformers / speculators modules)


def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, pos):
    # x [heads, T, d]; NeoX / HF rotate-half layout over the full head dim.
    d = x.shape[-1]
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    f = pos.float()[:, None] * inv[None]
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def plain_layer(w, p, embeds, fused, pos, norm_before_residual):
    """One EAGLE-3 midlayer over a whole sequence with a causal mask. `fused` is the width-h
    hidden input (fc output at target positions, previous out hidden at draft positions)."""
    T = embeds.shape[0]
    e = rms(embeds, w[f"{p}input_layernorm.weight"])
    hn = rms(fused, w[f"{p}hidden_norm.weight"])
    residual = hn if norm_before_residual else fused
    a = torch.cat([e, hn], -1)
    q = (a @ w[f"{p}self_attn.q_proj.weight"].T).view(T, NUM_HEADS, HEAD_DIM).transpose(0, 1)
    kk = (a @ w[f"{p}self_attn.k_proj.weight"].T).view(T, NUM_KV_HEADS, HEAD_DIM).transpose(0, 1)
    v = (a @ w[f"{p}self_attn.v_proj.weight"].T).view(T, NUM_KV_HEADS, HEAD_DIM).transpose(0, 1)
    q, kk = rope(q, pos), rope(kk, pos)
    rep = NUM_HEADS // NUM_KV_HEADS
    kk, v = kk.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    s = (q @ kk.transpose(1, 2)) / HEAD_DIM**0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, NUM_HEADS * HEAD_DIM)
    x = residual + o @ w[f"{p}self_attn.o_proj.weight"].T
    m = rms(x, w[f"{p}post_attention_layernorm.weight"])
    g = m @ w[f"{p}mlp.gate_proj.weight"].T
    u = m @ w[f"{p}mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(g) * u) @ w[f"{p}mlp.down_proj.weight"].T


@torch.no_grad()
def plain_reference(w, p, embed, d2t, hidden, ids, positions, k, norm_before_residual) -> dict:
    """Same outputs as speculators_reference, without a KV cache: every draft step re-runs the
    whole sequence (target positions + the draft positions so far) with a causal mask."""

    def head(x):
        return rms(x, w["norm.weight"]) @ w["lm_head.weight"].T

    fused = hidden @ w["fc.weight"].T
    tokens = ids.clone()
    pos = positions.clone()
    out = plain_layer(w, p, embed[tokens], fused, pos, norm_before_residual)
    logits = head(out)
    first_logits, first_out = logits, out
    draft_ids, draft_logits, draft_out = [], [logits[-1]], [out[-1]]
    for step in range(k):
        d = int(torch.argmax(logits[-1]))
        t = d + int(d2t[d])
        draft_ids.append(t)
        if step == k - 1:
            break
        fused = torch.cat([fused, out[-1:]], 0)  # fc skipped: width h already
        tokens = torch.cat([tokens, torch.tensor([t])])
        pos = torch.cat([pos, pos[-1:] + 1])
        out = plain_layer(w, p, embed[tokens], fused, pos, norm_before_residual)
        logits = head(out)
        draft_logits.append(logits[-1])
        draft_out.append(out[-1])
    return {
        "logits": first_logits,
        "out_hidden": first_out,
        "draft_ids": torch.tensor(draft_ids, dtype=torch.int64),
        "draft_logits": torch.stack(draft_logits),
        "draft_out_hidden": torch.stack(draft_out),
    }


def max_diff(a: dict, b: dict) -> dict:
    out = {}
    for key in ("logits", "out_hidden", "draft_logits", "draft_out_hidden"):
        out[key] = float((a[key] - b[key]).abs().max())
    return out


def check_close(what: str, a: dict, b: dict, tol: float = TOL) -> dict:
    diffs = max_diff(a, b)
    assert torch.equal(a["draft_ids"], b["draft_ids"]), (
        f"{what}: draft ids differ {a['draft_ids'].tolist()} vs {b['draft_ids'].tolist()}"
    )
    worst = max(diffs.values())
    assert worst < tol, f"{what}: max abs diff {diffs} >= {tol}"
    print(f"  {what}: max |diff| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    return diffs


def min_margin(ref: dict) -> float:
    """Smallest top-1 vs top-2 gap among the argmaxes the greedy draft took."""
    top2 = ref["draft_logits"].topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def drop_remote_code(case_dir: Path) -> None:
    """save_pretrained also copies speculators' own source file models/eagle3/config.py next to
    config.json (because of "auto_map"); it is not checkpoint data, so it is not kept."""
    (case_dir / "config.py").unlink(missing_ok=True)


def write_reference(case_dir: Path, embed, hidden, ids, positions, ref: dict) -> None:
    tensors = {
        "embed": embed.contiguous(),
        "hidden": hidden.contiguous(),
        "ids": ids.to(torch.int64).contiguous(),
        "positions": positions.to(torch.int64).contiguous(),
        "logits": ref["logits"].contiguous(),
        "out_hidden": ref["out_hidden"].contiguous(),
        "draft_ids": ref["draft_ids"].to(torch.int64).contiguous(),
        "draft_logits": ref["draft_logits"].contiguous(),
        "draft_out_hidden": ref["draft_out_hidden"].contiguous(),
    }
    save_file(tensors, str(case_dir / "reference.safetensors"), metadata={"format": "pt"})


def original_config() -> dict:
    """config.json in the EAGLE authors' release format (cf. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": 1,
        "draft_vocab_size": DRAFT_VOCAB,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": 256,
        "model_type": "llama",
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": 1,
        "num_key_value_heads": NUM_KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/eagle3", help="fixture root directory")
    args = ap.parse_args()
    out_root = Path(args.out).resolve()
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    print(
        f"speculators {speculators.__version__ if hasattr(speculators, '__version__') else '?'}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )

    gen = torch.Generator().manual_seed(SEED)
    work = Path(tempfile.mkdtemp(prefix="eagle3-ref-"))
    observed: dict[str, dict] = {}
    try:
        embed = make_verifier(work / VERIFIER_DIR, gen)

        # Shared random inputs (the same for every case).
        hidden = randn(gen, N, 3 * H, std=2.0)
        ids = torch.randint(0, VOCAB, (N,), generator=gen, dtype=torch.int64)
        positions = torch.arange(N, dtype=torch.int64)  # 0-based (speculators' default is 1-based)

        # ---------------- case: original (EAGLE release layout) ----------------
        print("case original / speculators")
        d2t, t2d = vocab_map(gen)
        w_orig = head_weights(gen, "midlayer.")
        orig_dir = out_root / "original"
        if orig_dir.exists():
            shutil.rmtree(orig_dir)
        orig_dir.mkdir(parents=True)
        (orig_dir / "config.json").write_text(json.dumps(original_config(), indent=2) + "\n")
        # An OrderedDict, as torch.save(model.state_dict()) writes it (float32 here; the real
        # releases are float16).
        sd = collections.OrderedDict((k, v.contiguous().clone()) for k, v in w_orig.items())
        sd["d2t"] = d2t.clone()
        sd["t2d"] = t2d.clone()
        torch.save(sd, orig_dir / "pytorch_model.bin")
        save_file({"embed_tokens.weight": embed.contiguous()}, str(orig_dir / "embedding.safetensors"))

        # ---------------- case: speculators (converter output) ----------------
        spec_dir = out_root / "speculators"
        if spec_dir.exists():
            shutil.rmtree(spec_dir)
        warnings: list[str] = []
        from loguru import logger

        sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
        with chdir(work):
            Eagle3Converter().convert(
                input_path=orig_dir,
                output_path=spec_dir,
                base_model=VERIFIER_DIR,
                validate=True,
                norm_before_residual=False,
                eagle_aux_hidden_state_layer_ids=AUX_LAYER_IDS,
            )
            logger.remove(sink)
            assert not warnings, f"converter warnings (missing/unexpected keys?): {warnings}"
            spec_model = load_speculators_model(spec_dir)
        converted = load_file(str(spec_dir / "model.safetensors"))
        expected_keys = {k.replace("midlayer.", "layers.0.") for k in sd}
        assert set(converted) == expected_keys, sorted(set(converted) ^ expected_keys)
        for key, value in sd.items():
            assert torch.equal(converted[key.replace("midlayer.", "layers.0.")], value), key
        assert torch.equal(spec_model.embed_tokens.weight, embed), "embedding not the verifier's"
        assert spec_model.config.eagle_aux_hidden_state_layer_ids == AUX_LAYER_IDS
        assert not spec_model.config.norm_before_residual
        # core.py builds the rotary embedding from a copy of the layer config with hidden_size
        # doubled; LlamaConfig always sets head_dim (= hidden / heads when absent), and the
        # rotary embedding prefers head_dim, so the rotation covers head_dim = 16, not 32.
        assert spec_model.rotary_emb.inv_freq.numel() == HEAD_DIM // 2
        drop_remote_code(spec_dir)
        save_file({"embed_tokens.weight": embed.contiguous()}, str(spec_dir / "embedding.safetensors"))

        ref = speculators_reference(spec_model, hidden, ids, positions, K)
        assert torch.equal(
            speculators_forward_tokens(spec_model, hidden, ids, positions), ref["logits"].argmax(-1)
        ), "Eagle3DraftModel.forward(ttt_steps=1) argmax differs from the module-level forward"
        obs = {}
        # Converted checkpoint (speculators modules) vs the original-layout weights (plain torch).
        w_loaded = torch.load(orig_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
        plain_orig = plain_reference(
            w_loaded, "midlayer.", embed, w_loaded["d2t"], hidden, ids, positions, K, False
        )
        obs["speculators(converted) vs plain torch(original layout)"] = check_close(
            "speculators(converted) vs plain torch(original layout)", ref, plain_orig
        )
        plain_spec = plain_reference(
            converted, "layers.0.", embed, converted["d2t"], hidden, ids, positions, K, False
        )
        obs["speculators vs plain torch(speculators layout)"] = check_close(
            "speculators vs plain torch(speculators layout)", ref, plain_spec
        )
        # RoPE is relative: 1-based positions (speculators' default) give the same outputs.
        ref1 = speculators_reference(spec_model, hidden, ids, positions + 1, K)
        obs["positions 0.. vs 1.. (speculators)"] = check_close(
            "positions 0.. vs 1.. (speculators)", ref, ref1
        )
        # Other attention implementations of speculators agree too.
        for impl in ("sdpa", "simple_flex_attention"):
            with chdir(work):
                other = load_speculators_model(spec_dir, attn_impl=impl)
            ref_other = speculators_reference(other, hidden, ids, positions, K)
            obs[f"eager vs {impl} attention (speculators)"] = check_close(
                f"eager vs {impl} attention (speculators)", ref, ref_other
            )
        obs["min top1-top2 logit gap of the drafts"] = min_margin(ref)
        obs["logits std"] = float(ref["logits"].std())
        print(f"  draft ids {ref['draft_ids'].tolist()}, min top-2 gap {min_margin(ref):.3f}, "
              f"logits std {float(ref['logits'].std()):.2f}")
        assert min_margin(ref) > 1e-3
        write_reference(orig_dir, embed, hidden, ids, positions, ref)
        write_reference(spec_dir, embed, hidden, ids, positions, ref)
        observed["original"] = obs
        observed["speculators"] = obs

        # ---------------- case: speculators-nbr (norm_before_residual) ----------------
        print("case speculators-nbr")
        nbr_dir = out_root / "speculators-nbr"
        if nbr_dir.exists():
            shutil.rmtree(nbr_dir)
        d2t_n, t2d_n = vocab_map(gen)
        w_nbr = head_weights(gen, "layers.0.")
        tl_config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=H,
            intermediate_size=INTERMEDIATE,
            num_hidden_layers=1,
            num_attention_heads=NUM_HEADS,
            num_key_value_heads=NUM_KV_HEADS,
            hidden_act="silu",
            max_position_embeddings=256,
            rms_norm_eps=EPS,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        )
        with chdir(work):
            model = Eagle3DraftModel.from_training_args(
                verifier_config=tl_config,
                t2d=t2d_n,
                d2t=d2t_n,
                verifier_name_or_path=VERIFIER_DIR,
                target_layer_ids=AUX_LAYER_IDS,
                draft_vocab_size=DRAFT_VOCAB,
                norm_before_residual=True,
                ttt_steps=K,
                draft_attn_impl=ATTN_IMPL,
            ).eval()
            missing, unexpected = model.load_state_dict(w_nbr, strict=False)
            assert not unexpected, unexpected
            assert set(missing) == {
                "embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight", "d2t", "t2d"
            }, missing
            assert torch.equal(model.embed_tokens.weight, embed)
            model.save_pretrained(str(nbr_dir))
            nbr_model = load_speculators_model(nbr_dir)  # round trip through its own loader
        drop_remote_code(nbr_dir)
        assert nbr_model.rotary_emb.inv_freq.numel() == HEAD_DIM // 2
        saved = load_file(str(nbr_dir / "model.safetensors"))
        for key, value in w_nbr.items():
            assert torch.equal(saved[key], value), key
        assert torch.equal(saved["d2t"], d2t_n) and torch.equal(saved["t2d"], t2d_n)
        assert torch.equal(saved["embed_tokens.weight"], embed)
        assert nbr_model.config.norm_before_residual

        ref_n = speculators_reference(nbr_model, hidden, ids, positions, K)
        ref_n_mem = speculators_reference(model, hidden, ids, positions, K)
        assert torch.equal(
            speculators_forward_tokens(nbr_model, hidden, ids, positions), ref_n["logits"].argmax(-1)
        )
        obs = {}
        obs["saved+reloaded vs in-memory (speculators)"] = check_close(
            "saved+reloaded vs in-memory (speculators)", ref_n, ref_n_mem, tol=1e-12
        )
        plain_n = plain_reference(
            saved, "layers.0.", saved["embed_tokens.weight"], saved["d2t"], hidden, ids, positions, K, True
        )
        obs["speculators vs plain torch"] = check_close("speculators vs plain torch", ref_n, plain_n)
        plain_wrong = plain_reference(
            saved, "layers.0.", saved["embed_tokens.weight"], saved["d2t"], hidden, ids, positions, K, False
        )
        obs["(sanity) same weights with norm_before_residual=False"] = max_diff(ref_n, plain_wrong)
        assert max(obs["(sanity) same weights with norm_before_residual=False"].values()) > 0.1
        obs["min top1-top2 logit gap of the drafts"] = min_margin(ref_n)
        obs["logits std"] = float(ref_n["logits"].std())
        print(f"  draft ids {ref_n['draft_ids'].tolist()}, min top-2 gap {min_margin(ref_n):.3f}, "
              f"logits std {float(ref_n['logits'].std()):.2f}")
        assert min_margin(ref_n) > 1e-3
        write_reference(nbr_dir, embed, hidden, ids, positions, ref_n)
        observed["speculators-nbr"] = obs
    finally:
        shutil.rmtree(work, ignore_errors=True)

    (out_root / "observed.json").write_text(json.dumps(observed, indent=2) + "\n")
    for f in out_root.rglob("*"):
        if f.is_file():
            f.chmod(0o644)  # safetensors writes 0600
    total = sum(f.stat().st_size for f in out_root.rglob("*") if f.is_file())
    print(f"wrote {out_root} ({total / 1024:.0f} KiB)")
    assert total < 2 * 1024 * 1024


if __name__ == "__main__":
    main()
