#!/usr/bin/env bash
# Prints the folder holding libnccl.so* in the Python environment's nvidia packages (the
# nvidia-nccl-cu13 wheel on the GPU machine), for LD_LIBRARY_PATH where binaries built with
# `SPECDEC_NCCL=1 scripts/build-cuda.sh` run; fails when there is none.
set -euo pipefail
dir=$(python3 - <<'PY'
import glob, os, site, sys
for p in site.getsitepackages() + sys.path:
    hits = sorted(glob.glob(os.path.join(p, "nvidia", "**", "libnccl.so*"), recursive=True))
    if hits:
        print(os.path.dirname(hits[0]))
        break
PY
)
[ -n "$dir" ] || { echo "error: no libnccl.so* under the Python environment's nvidia packages" >&2; exit 1; }
echo "$dir"
