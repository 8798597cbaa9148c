#!/usr/bin/env python3
"""Teacher-forced first-step accuracy of an EAGLE-3 head on the target's own greedy continuations
of a prompt file, overall and conditioned on the previous position: how often the head's argmax
(step 0: the target's states of every earlier position, the committed tokens) is the target's
greedy token, and how often right after a position it got wrong -- where every speculation round
after a rejection begins. Reads heads in the layout scripts/train_eagle3.py writes (its model code).

    python3 scripts/eagle3_accuracy.py --head models/eagle3-smollm2 \\
        --target models/real/SmolLM2-135M-Instruct.Q4_1.gguf --chat-template \\
        --prompts configs/prompts/spec_bench_question.jsonl --limit 8 --new-tokens 128
"""
import argparse
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_eagle3 as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", required=True)
    ap.add_argument("--target", required=True, help="a Hugging Face model directory or a GGUF file")
    ap.add_argument("--prompts", required=True, help="JSON lines: {prompt} or Spec-Bench's {turns} (first turn)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--chat-template", action="store_true", help="each prompt as one user turn of the chat template")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    if args.target.endswith(".gguf"):
        src, kw = os.path.dirname(args.target) or ".", {"gguf_file": os.path.basename(args.target)}
    else:
        src, kw = args.target, {}
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kw).eval()
    tok = AutoTokenizer.from_pretrained(src, **kw)
    head = T.load_saved_head(args.head)
    layers = head.c["eagle_aux_hidden_state_layer_ids"]
    embed = T.target_parts(target)[0]
    n = {"all": [0, 0], "after a wrong position": [0, 0], "after a right position": [0, 0]}  # [right, total]
    for _, text in T.load_sim_prompts(args.prompts, args.limit):
        if args.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        p = tok(text, add_special_tokens=not args.chat_template).input_ids
        ids = torch.tensor(p + T.greedy_continuation(target, p, args.new_tokens, "cpu", None))
        feats, greedy = T.target_forward_all(target, ids, layers)
        L = ids.shape[0]
        logits = T.ttt_forward(head, embed, feats[None], ids[None], 1, torch.arange(L - 1)[None])[0][0]
        d = logits.argmax(-1)
        pred = d + head.d2t[d]
        prev = None
        # query j (pair: state j, token j+1) predicts the token after position j+1: greedy[j+1]
        for j in range(len(p) - 1, L - 2):
            ok = bool(pred[j] == greedy[j + 1])
            for key in ["all"] + ([] if prev is None else
                                  ["after a right position" if prev else "after a wrong position"]):
                n[key][0] += ok
                n[key][1] += 1
            prev = ok
    for key, (right, total) in n.items():
        print(f"{key}: {right / max(total, 1):.3f} ({right} of {total})")


if __name__ == "__main__":
    main()
