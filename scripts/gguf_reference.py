#!/usr/bin/env python3
"""Record transformers' outputs on the real GGUF checkpoints as test fixtures (tests/fixtures/gguf/).

The Rust GGUF loader and models are checked against these files on the very checkpoints that
scripts/fetch-models.sh installs into models/real/. transformers dequantizes every GGUF tensor to
f32 (numpy, gguf-py) when it loads the file, so the reference is "the quantized weights, dequantized,
run in f32 on the CPU".

Command used to produce the committed fixtures (run from the repository root, after
scripts/fetch-models.sh; torch 2.15.0 on the CPU, transformers 5.23.0, tokenizers 0.23.3,
gguf 0.19.0, accelerate 1.15.0 (transformers requires it to load a GGUF file), numpy 2.4.6):

    /work/venv-ref/bin/python scripts/gguf_reference.py --models models/real --out tests/fixtures/gguf

Models (directory names):
  smollm2  SmolLM2-135M-Instruct.Q4_1.gguf (LlamaForCausalLM). Prompts go through the chat template
           stored in the GGUF: tokenizer.apply_chat_template([{"role": "user", "content": ...}],
           add_generation_prompt=True); the template adds SmolLM's default system message.
  gemma3   gemma-3-270m-q4_k_m.gguf (Gemma3ForCausalLM, gemma3_text), a base model: raw text, the
           tokenizer adds <bos>. The third prompt is long (> 600 tokens) so that the 512-token sliding
           window of the local layers matters; the script checks that it does (window_effect below).
           It ends with a question whose answer is only in its first sentence, > 512 tokens back.

Loading: AutoTokenizer.from_pretrained(dir, gguf_file=name) and
AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32,
attn_implementation="eager"), CPU, eval mode, no grad.

reference.json per model:
  file, sha256, size, versions {python, torch, transformers, tokenizers, gguf, numpy, accelerate},
  command, model_class, tokenizer_class, attn_implementation, dtype, device;
  config             model.config.to_dict() exactly as transformers built it from the GGUF metadata
                     (plus its own defaults for whatever the GGUF does not say);
  gguf_metadata      the GGUF file's own key/values (gguf.GGUFReader; arrays of more than 64 items as
                     {"array_len": n}), to tell what came from the file and what from those defaults;
  generation_config  the non-null entries of model.generation_config.to_dict();
  tokenizer          bos/eos/pad/unk tokens and ids, add_bos_token, chat_template (or null);
  eos_ids            union of config.eos_token_id, generation_config.eos_token_id and the tokenizer's
                     eos_token_id: what counts as EOS for greedy_first_eos;
  rounding           logits and logsumexp rounded to 6 significant digits (margins to 4);
  prompts            list of
    name, messages (chat prompts; null for raw text), text (the rendered text that was tokenized),
    input_ids        the ids transformers used (chat: apply_chat_template(..., tokenize=True), checked
                     equal to tokenizing the rendered text without special tokens);
    logits_from      first position whose logits rows are stored (0 unless the prompt is long: then
                     only the last 32 positions);
    ids              sorted token ids of the stored logit columns: the union over the stored positions
                     of transformers' top-16 ids, plus 256 ids drawn without replacement by
                     numpy.random.default_rng([seed, prompt index]).choice(vocab_size, 256);
    logits           [position logits_from.. len-1][len(ids)]: the logits of one full forward over
                     input_ids (use_cache=False) at those ids;
    logsumexp, argmax, margin
                     for EVERY position 0..len-1 of that forward: logsumexp of the full row (computed
                     in float64), argmax of the full row, top1 - top2 logit gap;
    greedy_new_ids   the 32 new ids of model.generate(input_ids, do_sample=False, max_new_tokens=32,
                     min_new_tokens=32) with EOS disabled (generation_config.eos_token_id = None): the
                     plain argmax path, no stop and no EOS masking (with EOS enabled, min_new_tokens
                     would set the EOS logits to -inf instead). Checked equal to an argmax loop of full
                     forwards without a cache;
    greedy_first_eos index into greedy_new_ids of the first id in eos_ids, or null;
    greedy_margins   top1 - top2 gap of the raw logits at each greedy step (from that no-cache loop);
    window_effect    (gemma3 long prompt only) max |logit| change over the stored positions when
                     config.sliding_window is set to 1e9 (every layer sees the whole prompt): > 0.1 is
                     asserted, i.e. the sliding window matters there.
"""

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import platform
import sys

import gguf
import numpy as np
import torch

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

TOPK = 16
RANDOM_IDS = 256
NEW_TOKENS = 32
LONG_KEEP = 32  # logits rows kept for a long prompt (the last LONG_KEEP positions)
LONG_FROM = 200  # a prompt longer than this keeps only the last LONG_KEEP rows
SIG = 6

SMOLLM2_PROMPTS = [
    ("question", "What is the capital of France? Answer in one short sentence."),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    (
        "summary",
        "Summarize in one sentence: The Industrial Revolution began in Britain in the late 18th "
        "century. It replaced hand tools with machines, brought steam power and factories, and moved "
        "millions of people from farms into growing cities. Over the next hundred years it spread to "
        "Europe and North America, raising output and living standards but also causing pollution and "
        "harsh working conditions.",
    ),
]

LONG_TEXT = (
    "The lighthouse on the northern cape of Vesterholm was kept for forty-one years by a woman named "
    "Ingrid Solheim, who climbed its one hundred and twelve steps every evening to light the lamp. "
    "Vesterholm itself is a small fishing town built on three islands joined by stone bridges. Its "
    "harbour faces west, towards the open sea, and in winter the waves break over the outer wall so "
    "often that the fishermen tie their boats twice. The oldest house in the town is the customs "
    "office, a red wooden building from 1742 that now holds a museum of nets, anchors and old maps. "
    "Every spring the town holds a market where farmers from the mainland sell cheese, wool and "
    "smoked lamb, and where children race small boats carved from pine bark across the inner basin.\n\n"
    "The school of Vesterholm has only four classrooms. Mathematics is taught by Mr. Arne Dahl, who "
    "also runs the choir, and geography by Mrs. Liv Berg, who once sailed to Iceland in a boat she had "
    "built herself. The pupils learn to read the tide tables before they learn long division, because "
    "the ferry to the mainland leaves at a different hour every day. In the library there is a globe "
    "from 1910 on which several countries still carry names that no longer exist, and the children "
    "like to find them and ask their grandparents about them.\n\n"
    "Fishing has always been the heart of the local economy. In the nineteenth century the boats "
    "brought in herring by the ton, and the salting houses along the quay employed half of the town. "
    "When the herring disappeared in the 1950s, the fishermen turned to cod and later to farmed "
    "salmon, raised in round pens anchored in the sheltered sound between the islands. Today a "
    "cooperative of eleven families owns the pens, and they sell most of the fish to buyers in "
    "Bergen and Rotterdam. A small factory freezes and packs the fillets, and in summer it hires "
    "students from the university who come for the long light evenings as much as for the wages.\n\n"
    "The weather decides almost everything in Vesterholm. Autumn storms can close the ferry for "
    "three or four days, and then the shop runs out of fresh milk and bread, and people borrow flour "
    "from their neighbours. In January the sun rises after ten in the morning and sets before three "
    "in the afternoon, but on clear nights the northern lights move across the sky in green and "
    "violet curtains, and visitors from the south stand on the bridges for hours with their cameras. "
    "In June the opposite happens: the sun barely touches the horizon, the gulls never stop calling, "
    "and nobody in town seems to sleep before midnight.\n\n"
    "The church stands on the highest rock of the middle island. It was rebuilt after a fire in 1888, "
    "and its bell was cast in Germany and carried across the sea on a cargo ship that nearly sank in "
    "a gale off the Danish coast. The organ is older than the building: it was saved from the fire "
    "by the sexton and six fishermen, who carried it out piece by piece while the roof burned above "
    "them. On the wall near the door there is a wooden board with the names of every sailor from the "
    "town who was lost at sea, the earliest from 1703 and the latest from 1979.\n\n"
    "In recent years the town has tried to attract tourists. A former salting house has become a "
    "guest house with nine rooms, the old school gymnasium hosts a jazz festival every August, and "
    "a path with wooden stairs now leads along the cliffs from the harbour to the northern cape. "
    "The town council argued for two years about whether to build a bridge to the mainland, and in "
    "the end decided against it, because most people liked the ferry and feared that a bridge would "
    "change the character of the place.\n\n"
    "Years later, a journalist from Oslo came to write about the town and asked the people at the "
    "market who had kept the lighthouse on the northern cape for forty-one years. An old fisherman "
    "put down his coffee and answered that the keeper's name was"
)

GEMMA3_PROMPTS = [
    ("short", "The capital of France is"),
    ("code", 'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n'),
    ("long", LONG_TEXT),
]

MODELS = {
    "smollm2": dict(file="SmolLM2-135M-Instruct.Q4_1.gguf", chat=True, prompts=SMOLLM2_PROMPTS),
    "gemma3": dict(file="gemma-3-270m-q4_k_m.gguf", chat=False, prompts=GEMMA3_PROMPTS),
}


def rnd(x, sig=SIG):
    return float(f"{x:.{sig - 1}e}")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def version(pkg):
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def gguf_metadata(path):
    """The GGUF file's metadata (what it says itself), arrays of more than 64 items as their length."""
    reader = gguf.GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) > 64:
            meta[key] = {"array_len": len(field.data)}
            continue
        v = field.contents()
        meta[key] = v.item() if hasattr(v, "item") else v
    return meta


def as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


@torch.no_grad()
def greedy_generate(model, input_ids):
    gc = model.generation_config
    gc.eos_token_id = None
    gc.do_sample = False
    ids = torch.tensor([input_ids])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        eos_token_id=None,
        pad_token_id=model.config.pad_token_id,
        num_beams=1,
    )[0].tolist()
    assert out[: len(input_ids)] == input_ids, "generate did not echo the prompt"
    new = out[len(input_ids):]
    assert len(new) == NEW_TOKENS, f"generate stopped early: {len(new)} tokens"
    return new


@torch.no_grad()
def greedy_nocache(model, input_ids):
    seq = list(input_ids)
    margins = []
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([seq]), use_cache=False, logits_to_keep=1).logits[0, -1].float()
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        seq.append(int(torch.argmax(logits)))
    return seq[len(input_ids):], margins


@torch.no_grad()
def prompt_reference(model, tok, spec, k, name, content, seed, eos_ids):
    vocab = model.config.vocab_size
    if spec["chat"]:
        messages = [{"role": "user", "content": content}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        input_ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        if input_ids and isinstance(input_ids[0], list):
            input_ids = input_ids[0]
        plain = tok(text, add_special_tokens=False).input_ids
        assert plain == input_ids, "chat template ids differ from tokenizing the rendered text"
    else:
        messages = None
        text = content
        input_ids = tok(text).input_ids
    n = len(input_ids)
    logits = model(torch.tensor([input_ids]), use_cache=False).logits[0].float()
    assert logits.shape == (n, vocab), logits.shape
    lse = torch.logsumexp(logits.double(), dim=-1)
    top2 = torch.topk(logits, 2, dim=-1)
    argmax = top2.indices[:, 0]
    margin = top2.values[:, 0] - top2.values[:, 1]
    start = n - LONG_KEEP if n > LONG_FROM else 0
    top = torch.topk(logits[start:], TOPK, dim=-1).indices
    rng = np.random.default_rng([seed, k])
    drawn = rng.choice(vocab, RANDOM_IDS, replace=False)
    ids = sorted(set(top.flatten().tolist()) | set(int(i) for i in drawn))
    sub = logits[start:, ids]

    greedy = greedy_generate(model, input_ids)
    greedy2, gmargins = greedy_nocache(model, input_ids)
    assert greedy == greedy2, f"generate {greedy} != no-cache argmax loop {greedy2}"
    first_eos = next((i for i, t in enumerate(greedy) if t in eos_ids), None)

    ref = {
        "name": name,
        "messages": messages,
        "text": text,
        "input_ids": input_ids,
        "logits_from": start,
        "ids": ids,
        "logits": [[rnd(v) for v in row] for row in sub.tolist()],
        "logsumexp": [rnd(v) for v in lse.tolist()],
        "argmax": argmax.tolist(),
        "margin": [rnd(v, 4) for v in margin.tolist()],
        "greedy_new_ids": greedy,
        "greedy_first_eos": first_eos,
        "greedy_margins": [rnd(v, 4) for v in gmargins],
    }
    extra = ""
    if start > 0 and getattr(model.config, "sliding_window", None):
        sw = model.config.sliding_window
        model.config.sliding_window = 10**9
        try:
            full = model(torch.tensor([input_ids]), use_cache=False).logits[0, start:].float()
        finally:
            model.config.sliding_window = sw
        effect = float((full - logits[start:]).abs().max())
        assert effect > 0.1, f"the sliding window changes the logits by only {effect}"
        ref["window_effect"] = rnd(effect, 4)
        extra = f" window_effect={effect:.3f}"
    print(
        f"  {name:8s} tokens={n} logits_from={start} ids={len(ids)} first_eos={first_eos} "
        f"min_greedy_margin={min(gmargins):.4f}{extra}\n    greedy: {tok.decode(greedy)!r}",
        flush=True,
    )
    return ref


def model_reference(name, spec, models_dir, out_dir, seed, command):
    path = os.path.join(models_dir, spec["file"])
    print(f"== {name}: {path}", flush=True)
    sha = sha256_of(path)
    tok = AutoTokenizer.from_pretrained(models_dir, gguf_file=spec["file"])
    model = AutoModelForCausalLM.from_pretrained(
        models_dir, gguf_file=spec["file"], dtype=torch.float32, attn_implementation="eager"
    ).eval()
    config = model.config.to_dict()
    gen = {k: v for k, v in model.generation_config.to_dict().items() if v is not None}
    eos_ids = sorted(
        set(as_list(model.config.eos_token_id))
        | set(as_list(model.generation_config.eos_token_id))
        | set(as_list(tok.eos_token_id))
    )
    tokinfo = {
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "pad_token": tok.pad_token,
        "pad_token_id": tok.pad_token_id,
        "unk_token": tok.unk_token,
        "unk_token_id": tok.unk_token_id,
        "add_bos_token": getattr(tok, "add_bos_token", None),
        "chat_template": tok.chat_template or None,
    }
    prompts = [
        prompt_reference(model, tok, spec, k, pname, content, seed, eos_ids)
        for k, (pname, content) in enumerate(spec["prompts"])
    ]
    ref = {
        "model": name,
        "file": spec["file"],
        "sha256": sha,
        "size": os.path.getsize(path),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": version("tokenizers"),
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "accelerate": version("accelerate"),
        },
        "command": command,
        "model_class": type(model).__name__,
        "tokenizer_class": type(tok).__name__,
        "attn_implementation": "eager",
        "dtype": "float32",
        "device": "cpu",
        "config": config,
        "gguf_metadata": gguf_metadata(path),
        "generation_config": gen,
        "tokenizer": tokinfo,
        "eos_ids": eos_ids,
        "rounding": f"logits and logsumexp: {SIG} significant digits; margins: 4",
        "notes": (
            "logits: one full forward (use_cache=False) per prompt; rows for positions logits_from.. "
            "at the columns `ids` (top-16 union of those positions + 256 seeded random ids); "
            "logsumexp/argmax/margin for every position. greedy_new_ids: 32 new ids of "
            "model.generate(do_sample=False, max_new_tokens=32, min_new_tokens=32) with EOS disabled "
            "(plain argmax path, EOS neither stops nor is masked), equal to a no-cache argmax loop. "
            "See scripts/gguf_reference.py."
        ),
        "prompts": prompts,
    }
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    out = os.path.join(case_dir, "reference.json")
    with open(out, "w") as fh:
        json.dump(ref, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"  wrote {out}: {os.path.getsize(out)} bytes", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/real", help="folder holding the GGUF files")
    ap.add_argument("--out", default="tests/fixtures/gguf")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(MODELS))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    command = " ".join([sys.executable, "scripts/gguf_reference.py"] + sys.argv[1:])
    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        model_reference(name, spec, args.models, args.out, args.seed, command)


if __name__ == "__main__":
    main()
