#!/usr/bin/env python3
"""Reference ids for `specdec::gguf::tokenizer` (tests/gguf_tokenizer.rs): what transformers'
tokenizer read from a GGUF file gives, so the Rust tokenizer built from the same file can be
compared id for id.

Run from the repository root with the reference venv (transformers 5.23.0, tokenizers 0.23.3,
gguf 0.19.0, torch 2.15.0, Python 3.11):

    /work/venv-ref/bin/python scripts/gguf_tokenizer_reference.py            # fixtures only
    /work/venv-ref/bin/python scripts/gguf_tokenizer_reference.py --synthetic  # + rewrite the .gguf

What it writes, under tests/fixtures/gguf/tokenizer/:

  <name>.gguf   (--synthetic only) small GGUF files holding nothing but tokenizer metadata, for
                the tokenizers no real file here has: a byte-level BPE vocabulary trained on
                CORPUS below with pre-tokenizer `llama-bpe` (Llama 3) and `qwen2` (Qwen2), and a
                SentencePiece BPE vocabulary (byte fallback, scores) as architecture `llama`
                and as `gemma3` (merges rebuilt from the vocabulary, whitespace-run tokens).
                Training is deterministic, but the committed files are the reference: rewrite
                them only to change what they cover, and then rewrite the fixtures too.
  <name>.json   for every GGUF present (the synthetic ones and the real checkpoints in
                models/real/: SmolLM2-135M-Instruct.Q4_1.gguf -> smollm2.json,
                gemma-3-270m-q4_k_m.gguf -> gemma3.json; a missing real file is skipped):
                  - `cases`: for each string of TEXTS, the ids of
                    `AutoTokenizer.from_pretrained(dir, gguf_file=name)` with
                    add_special_tokens=True and False, and its decode of each
                    (skip_special_tokens=False);
                  - `backend`: the backend tokenizer transformers built (normalizer,
                    pre-tokenizer, decoder and post-processor as tokenizers serializes them,
                    the BPE model's flags, and FNV-1a 64 hashes of the vocabulary, the merges
                    and the added tokens, see `fnv1a64`), so the Rust side checks how the
                    tokenizer is built and not only what it does to TEXTS;
                  - `special`: bos/eos ids and add_bos/add_eos as transformers reads them.
  pre_splits.json  transformers' table of `tokenizer.ggml.pre` names and split regexes
                (`GGUF_PRE_TOKENIZER_SPLITS`), and for one name of each regex (and `smollm`,
                GPT-2's byte-level split) the pre-tokenizer's splits of TEXTS, so the names no
                GGUF here uses are checked too.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import gguf  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "tokenizer")
REAL = os.path.join(ROOT, "models", "real")
REAL_FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
SYNTHETIC = ["llama-bpe", "qwen2", "spm-llama", "spm-gemma3"]

# The strings every fixture covers: code, whitespace runs, numbers, punctuation, scripts,
# emoji, the special tokens of each family written out as text, and edge cases.
TEXTS = [
    "",
    "Hello world",
    " Hello world",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "\tfn main() {\n\t\tprintln!(\"{}\", 1 << 3);\n\t}\r\n",
    "\n",
    "   ",
    "\n\n\n  \t \n",
    "1234567890 3.14159 -42 1,000,000 0x1F 2024-06-01 007",
    "Hello, world! What's up? I'm fine; you'd've known... (yes) [no] {maybe} <tag/> #1 @u $9.99 50%",
    "SHOUTING: DON'T, I'LL, WE'VE, IT'S",
    "中文分词测试：你好，世界！",
    "日本語のテキスト、カタカナとひらがな。",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Привет, мир! Ёжик",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🇫🇷 heart ❤️",
    "naïve café Ωmega straße ﬁ ①② e\u0301 x\u00a0y\u2003z",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<|endoftext|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <pad><unk>",
    "<s>[INST] hi [/INST]</s>",
    "<think>reasoning</think> answer",
    "\u2581already\u2581metaspace",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!!!! ----------",
]

# Training text for the synthetic vocabularies: enough English, code, numbers and other
# scripts that the merges matter for every string of TEXTS.
CORPUS = [
    "Hello world. Hello there, world! The quick brown fox jumps over the lazy dog.",
    "What's up? I'm fine, you're late, we've been, they'll go, he'd know. IT'S DON'T.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "\tfn main() {\n\t\tprintln!(\"{}\", 1 << 3);\n\t}\n",
    "for i in range(10):\n    print(i)\n\n\n",
    "1234567890 123 456 789 2024 1000 3.14159 42 100 2023-06-01 0x1F 007",
    "the the the and and and of of to to in in is is it it that that",
    "中文分词测试你好世界 日本語のテキスト Привет мир مرحبا नमस्ते",
    "reasoning answer assistant user model text system",
    "   spaces    and\ttabs\t\tand\n\nnewlines  ",
]


def fnv1a64(text):
    """FNV-1a, 64 bits, over the UTF-8 bytes of `text`, as 16 hex digits (the Rust test
    computes the same)."""
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---------------------------------------------------------------------------------------------
# Synthetic GGUF files


def byte_level_vocab():
    """A byte-level BPE vocabulary and its merges, trained on CORPUS: the 256 byte symbols,
    then the merges in order (GPT-2 split, so numbers merge into multi-digit tokens, which
    `qwen2`'s one-digit split and `llama-bpe`'s three-digit split then treat differently)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return tokens, merges


def spm_vocab(tmp):
    """A SentencePiece BPE model with byte fallback trained on CORPUS, converted the way
    llama.cpp's convert_hf_to_gguf.py does (pieces, scores, token types)."""
    import sentencepiece as spm

    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as fh:
        fh.write("\n".join(CORPUS * 3))
    prefix = os.path.join(tmp, "spm")
    spm.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=500,
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        user_defined_symbols=["<think>", "</think>"],
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif tokens[-1] in ("<think>", "</think>"):
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    return tokens, scores, types


def write_gguf(path, arch, model, pre, tokens, types, merges=None, scores=None, ids=None, flags=None):
    w = gguf.GGUFWriter(path, arch)
    # The shape keys transformers' config reader wants; there are no tensors.
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    for key, value in (ids or {}).items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    for key, value in (flags or {}).items():
        w.add_bool(f"tokenizer.ggml.{key}", value)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_synthetic():
    import tempfile

    T = gguf.TokenType
    tokens, merges = byte_level_vocab()
    normal = [T.NORMAL] * len(tokens)

    # Llama 3: control tokens after the vocabulary, BOS added; `<|fim pad|>` is marked control
    # but is not in the byte alphabet (a space), which transformers skips as a mislabel.
    llama = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eot_id|>", "<|fim pad|>"]
    n = len(tokens)
    write_gguf(
        os.path.join(OUT, "llama-bpe.gguf"), "llama", "gpt2", "llama-bpe",
        tokens + llama + ["<think>"], normal + [T.CONTROL] * len(llama) + [T.USER_DEFINED],
        merges=merges,
        ids={"bos_token_id": n, "eos_token_id": n + 1, "eot_token_id": n + 4},
        flags={"add_bos_token": True},
    )
    # Qwen2: `<|endoftext|>` is BOS and padding, `<|im_end|>` EOS, no BOS added.
    qwen = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    write_gguf(
        os.path.join(OUT, "qwen2.gguf"), "qwen2", "gpt2", "qwen2",
        tokens + qwen, normal + [T.CONTROL] * len(qwen),
        merges=merges,
        ids={"bos_token_id": n, "eos_token_id": n + 2, "padding_token_id": n},
        flags={"add_bos_token": False},
    )

    with tempfile.TemporaryDirectory() as tmp:
        sp_tokens, sp_scores, sp_types = spm_vocab(tmp)
    # SentencePiece as architecture `llama` (Llama 2 style): <unk> <s> </s>, merges from the
    # scores, no add_bos_token key (llama.cpp and transformers then add BOS).
    write_gguf(
        os.path.join(OUT, "spm-llama.gguf"), "llama", "llama", "default",
        sp_tokens, sp_types, scores=sp_scores,
        ids={"bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0},
    )
    # The same as Gemma 3 spells it: its special tokens first, runs of spaces stored as real
    # spaces and marked user-defined, merges rebuilt from the order of the vocabulary.
    gemma_special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    body = [(t, s, ty) for t, s, ty in zip(sp_tokens, sp_scores, sp_types) if t not in ("<unk>", "<s>", "</s>")]
    spaces = ["  ", "   ", "    ", "\t\t", " \t"]
    g_tokens = gemma_special + [t for t, _, _ in body] + spaces
    g_scores = [0.0] * len(gemma_special) + [s for _, s, _ in body] + [0.0] * len(spaces)
    g_types = ([T.CONTROL] * 3 + [T.UNKNOWN] + [T.CONTROL] * 3 + [ty for _, _, ty in body]
               + [T.USER_DEFINED] * len(spaces))
    write_gguf(
        os.path.join(OUT, "spm-gemma3.gguf"), "gemma3", "llama", "default",
        g_tokens, g_types, scores=g_scores,
        ids={"bos_token_id": 2, "eos_token_id": 1, "unknown_token_id": 3, "padding_token_id": 0,
             "eot_token_id": 6},
        flags={"add_bos_token": True, "add_eos_token": False, "add_space_prefix": False},
    )


# ---------------------------------------------------------------------------------------------
# Fixtures


def backend_summary(tok):
    """What the Rust tokenizer must equal, from tokenizers' own serialization."""
    j = json.loads(tok.backend_tokenizer.to_str())
    model = j["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    added = sorted(j["added_tokens"], key=lambda t: t["id"])
    return {
        "normalizer": j["normalizer"],
        "pre_tokenizer": j["pre_tokenizer"],
        "decoder": j["decoder"],
        "post_processor": j["post_processor"],
        "model": {k: v for k, v in model.items() if k not in ("vocab", "merges")},
        "vocab_len": len(vocab),
        "vocab_fnv1a64": fnv1a64("".join(f"{i}\t{t}\n" for t, i in vocab)),
        "merges_len": len(merges),
        "merges_fnv1a64": fnv1a64("".join(m + "\n" for m in merges)),
        "added_len": len(added),
        "added_fnv1a64": fnv1a64("".join(
            f"{t['id']}\t{t['content']}\t{int(t['special'])}\t{int(t['normalized'])}\t"
            f"{int(t['lstrip'])}\t{int(t['rstrip'])}\t{int(t['single_word'])}\n" for t in added)),
        "vocab_size_with_added": tok.backend_tokenizer.get_vocab_size(with_added_tokens=True),
    }


def fixture(path):
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    cases = []
    for text in TEXTS:
        with_special = tok(text, add_special_tokens=True)["input_ids"]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({
            "text": text,
            "ids_special": with_special,
            "ids_plain": plain,
            "decoded_special": tok.decode(with_special, skip_special_tokens=False),
            "decoded_plain": tok.decode(plain, skip_special_tokens=False),
        })
    return {
        "generator": "scripts/gguf_tokenizer_reference.py",
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "gguf": getattr(gguf, "__version__", "0.19.0")},
        "file": os.path.basename(path),
        "tokenizer_class": type(tok).__name__,
        "special": {"bos": tok.bos_token_id, "eos": tok.eos_token_id,
                    "add_bos": bool(tok.add_bos_token), "add_eos": bool(tok.add_eos_token)},
        "backend": backend_summary(tok),
        "cases": cases,
    }


def pre_splits():
    from tokenizers import Regex, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    def splits(pre):
        return [[[piece, list(span)] for piece, span in pre.pre_tokenize_str(t)] for t in TEXTS]

    out = {"table": dict(GGUF_PRE_TOKENIZER_SPLITS), "splits": {}}
    seen = set()
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        if regex in seen:
            continue
        seen.add(regex)
        # What `set_split_regex` installs.
        out["splits"][name] = splits(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]))
    # What `GPT2Tokenizer` installs, kept for every other name.
    out["splits"]["smollm"] = splits(pre_tokenizers.ByteLevel(add_prefix_space=False))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", action="store_true", help="rewrite the synthetic .gguf files first")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.synthetic:
        write_synthetic()
    files = {name: os.path.join(OUT, f"{name}.gguf") for name in SYNTHETIC}
    files.update({name: os.path.join(REAL, f) for name, f in REAL_FILES.items()})
    for name, path in files.items():
        if not os.path.isfile(path):
            print(f"skip {name}: {path} missing", file=sys.stderr)
            continue
        data = fixture(path)
        out = os.path.join(OUT, f"{name}.json")
        # One line per string keeps the file short and its diffs readable.
        cases = data.pop("cases")
        head = json.dumps(data, ensure_ascii=False, indent=1)
        lines = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
        with open(out, "w") as fh:
            fh.write(f'{head[:-2]},\n "cases": [\n{lines}\n ]\n}}\n')
        print(f"{out}: {len(cases)} strings, {data['tokenizer_class']}")
    out = os.path.join(OUT, "pre_splits.json")
    with open(out, "w") as fh:
        json.dump(pre_splits(), fh, ensure_ascii=False)
        fh.write("\n")
    print(out)


if __name__ == "__main__":
    main()
