#!/usr/bin/env python3
"""Prints the GPU's device-to-device copy bandwidth in bytes/s (read + write): torch's clone
of 1 GiB, the median of 9 timed copies after one warm-up. The memory bound's reference for
scripts/gpu-decode.sh and scripts/gpu-ab.sh."""
import time

import torch

a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
ts = []
for _ in range(10):
    torch.cuda.synchronize()
    t = time.perf_counter()
    b = a.clone()
    torch.cuda.synchronize()
    ts.append(time.perf_counter() - t)
    del b
print(2 * a.numel() * 4 / sorted(ts[1:])[4])
