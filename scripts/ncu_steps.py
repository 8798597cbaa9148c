#!/usr/bin/env python3
"""Kernels per decode step from `ncu --csv --metrics gpu__time_duration.sum[,dram__bytes_read.sum]` of
`gpu_decode` with SPECDEC_BENCH_KERNELS=n (n decode steps, then n 5-token verifications):
every step ends with the argmax of its logits, so the kernels between two argmax launches are
one step. Prints, per step, the kernel count and the summed device time, then the kernels of
the steps named on the command line (1-based; default the last decode step and the last
verification, steps n and 2n) grouped by name (with the DRAM bytes read and the bandwidth they
imply when that metric was collected).
Usage: ncu_steps.py CSV [step ...]"""
import csv
import sys
from collections import defaultdict


def main(path, picks):
    # Launches in order (by ncu's ID), each with its duration (µs) and, when measured, the
    # DRAM bytes it read.
    launches = {}
    with open(path, newline="") as fh:
        lines = [l for l in fh if l.startswith('"')]
    for r in csv.DictReader(lines):
        metric = r.get("Metric Name")
        value = float(r["Metric Value"].replace(",", ""))
        entry = launches.setdefault(int(r["ID"]), {"name": r["Kernel Name"]})
        if metric == "gpu__time_duration.sum":
            unit = r.get("Metric Unit", "nsecond")
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
            entry["us"] = value * scale
        elif metric == "dram__bytes_read.sum":
            unit = r.get("Metric Unit", "byte")
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)
            entry["bytes"] = value * scale
    rows = [(e["name"], e.get("us", 0.0), e.get("bytes")) for _, e in sorted(launches.items())]
    ends = [i for i, (name, _, _) in enumerate(rows) if "argmax" in name]
    if len(ends) < 2:
        print(f"{path}: {len(rows)} kernels, no decode steps found")
        return
    steps = [rows[a + 1 : b + 1] for a, b in zip(ends, ends[1:])]
    print("| step | kernels | device time µs |")
    print("|---:|---:|---:|")
    for i, s in enumerate(steps, 1):
        print(f"| {i} | {len(s)} | {sum(t for _, t, _ in s):.1f} |")
    # The kernels of the chosen steps (default the last), grouped by name.
    for k in picks or sorted({max(1, len(steps) // 2), len(steps)}):
        if not 1 <= k <= len(steps):
            print(f"\nstep {k}: only {len(steps)} steps")
            continue
        by = defaultdict(lambda: [0, 0.0, 0.0])
        for name, t, nbytes in steps[k - 1]:
            key = name.split("(")[0].split("<")[0][:60]
            by[key][0] += 1
            by[key][1] += t
            by[key][2] += nbytes or 0.0
        print(f"\n| kernel (step {k}) | launches | µs | DRAM read MB | GB/s |")
        print("|---|---:|---:|---:|---:|")
        for name, (n, t, nbytes) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            bw = f"{nbytes / (t * 1e3):.0f}" if nbytes and t else "—"
            print(f"| {name} | {n} | {t:.1f} | {nbytes / 1e6:.1f} | {bw} |")

if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[2:]])
