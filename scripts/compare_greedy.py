#!/usr/bin/env python3
"""Compare the greedy (temperature 0) generations of two `exp` runs of the same config, e.g.
the CPU and the CUDA run of the default experiment in f32:

    python3 scripts/compare_greedy.py experiments/default/<cpu-run> experiments/default/<cuda-run>

Pairs records by (sweep point label, prompt id), prints how many greedy generations have
identical token ids and, for each that differs, the first differing position. Exit status 1
when any greedy pair differs or a record has no partner; sampled points (T > 0) are counted
but not compared (their random streams depend on rounding)."""
import json
import sys


def load(folder):
    path = folder.rstrip("/") + "/results.jsonl"
    with open(path) as fh:
        return {(r["label"], r["prompt_id"]): r for r in map(json.loads, filter(str.strip, fh))}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    if a.keys() != b.keys():
        print(f"records differ: only in first {sorted(a.keys() - b.keys())[:5]}, "
              f"only in second {sorted(b.keys() - a.keys())[:5]}")
        sys.exit(1)
    same = differ = sampled = 0
    for key in sorted(a):
        if a[key]["temperature"] != 0:
            sampled += 1
            continue
        x, y = a[key]["output_ids"], b[key]["output_ids"]
        if x == y:
            same += 1
        else:
            differ += 1
            at = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            print(f"differs: {key[0]} / {key[1]}: first at token {at}")
    print(f"greedy generations identical: {same} of {same + differ} "
          f"({sampled} sampled generations not compared)")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
