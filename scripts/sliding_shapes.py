#!/usr/bin/env python3
"""Random-weight checkpoints at the full shapes of published models (sliding-window ones, and
full-attention ones to compare), made on the GPU with transformers (no download: the configs
below are the published `config.json`s' text parts), and transformers' own decode speed on them.

    python3 scripts/sliding_shapes.py make OUT_DIR [NAME ...]
    python3 scripts/sliding_shapes.py hf-decode DIR [--prompt 128] [--new 256]

`make` writes OUT_DIR/NAME (config.json + model.safetensors, bf16, N(0, 0.02) weights, and
the shipped tokenizer) for each NAME (default: all of SHAPES), skipping those already there. `hf-decode` prints one JSON
line: transformers `generate` with its static cache and compiled decode step (greedy, a
random prompt), median tokens per second of 3 timed runs after a warm-up.
"""
import json
import os
import statistics
import sys
import time

# The text parts of the published configs (google/gemma-3-4b-it, google/gemma-3-270m,
# mistralai/Mistral-7B-v0.1 and the three below), as transformers 5 reads them.
def gemma3(hidden, inter, layers, heads, kv, vocab, window, context, **extra):
    """A Gemma 3 text config: five sliding-window layers to one global, head width 256."""
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 256,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "sliding_window": window,
        "sliding_window_pattern": 6,
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                        for i in range(layers)],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        **extra,
    }


SHAPES = {
    "gemma3-4b": gemma3(2560, 10240, 34, 8, 4, 262208, 1024, 131072,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}),
    "gemma3-270m": gemma3(640, 2048, 18, 4, 1, 262144, 512, 32768),
    # Full-attention shapes beside them (meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B,
    # Qwen/Qwen3-8B), for the same benchmark.
    "llama3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    },
}


def make(out_dir, names):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for name in names or SHAPES:
        path = os.path.join(out_dir, name)
        if os.path.isfile(os.path.join(path, "config.json")):
            continue
        t0 = time.perf_counter()
        spec = dict(SHAPES[name])
        cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(path, safe_serialization=True, max_shard_size="100GB")
        del model
        # The shipped tokenizer (1,024 ids, inside every vocabulary here), so that exp can
        # encode prompts for these checkpoints.
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for name_ in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(repo, "models/target", name_)
            if os.path.isfile(src):
                with open(src, "rb") as a, open(os.path.join(path, name_), "wb") as b:
                    b.write(a.read())
        torch.cuda.empty_cache()
        print(f"{name}: made in {time.perf_counter() - t0:.0f} s", flush=True)


def hf_decode(path, prompt, new):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt), device="cuda", generator=gen)
    # The static cache makes generate compile the decode step (transformers' default).
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
              cache_implementation="static")
    rates = []
    with torch.no_grad():
        for run in range(4):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            assert out.shape[1] == prompt + new, out.shape
            if run > 0:
                rates.append(new / dt)
    print(json.dumps({"model": os.path.basename(path), "prompt": prompt, "new": new,
                      "transformers_static_tok_s": statistics.median(rates),
                      "runs": rates, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "hf-decode":
        args = sys.argv[3:]
        opt = {args[i].lstrip("-"): int(args[i + 1]) for i in range(0, len(args), 2)}
        hf_decode(sys.argv[2], opt.get("prompt", 128), opt.get("new", 256))
    else:
        sys.exit(__doc__)
