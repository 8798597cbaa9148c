#!/usr/bin/env python3
"""Kernels per decode step from `ncu --csv --metrics gpu__time_duration.sum` of
`gpu_decode` with SPECDEC_BENCH_KERNELS=n: every step ends with the argmax of its logits, so
the kernels between two argmax launches are one decode step. Prints, per step, the kernel
count and the summed device time, then the step's kernels grouped by name."""
import csv
import sys
from collections import defaultdict


def main(path):
    rows = []
    with open(path, newline="") as fh:
        lines = [l for l in fh if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        value = float(r["Metric Value"].replace(",", ""))
        rows.append((r["Kernel Name"], value * scale))  # microseconds
    ends = [i for i, (name, _) in enumerate(rows) if "argmax" in name]
    if len(ends) < 2:
        print(f"{path}: {len(rows)} kernels, no decode steps found")
        return
    steps = [rows[a + 1 : b + 1] for a, b in zip(ends, ends[1:])]
    print("| step | kernels | device time µs |")
    print("|---:|---:|---:|")
    for i, s in enumerate(steps, 1):
        print(f"| {i} | {len(s)} | {sum(t for _, t in s):.1f} |")
    by = defaultdict(lambda: [0, 0.0])
    for name, t in steps[-1]:
        key = name.split("(")[0].split("<")[0][:60]
        by[key][0] += 1
        by[key][1] += t
    print("\n| kernel (last step) | launches | µs |")
    print("|---|---:|---:|")
    for name, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {n} | {t:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
