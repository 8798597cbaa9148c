#!/usr/bin/env bash
# The GPU headline of two builds side by side on one machine, interleaved: the 8B-shaped
# target's decode step (gpu_decode at a 128-token context) and the oracle drafter at
# alpha = 0.8, gamma = 4 with the 1B-shaped draft (scripts/bench_gpu.py), each build's figure
# beside the other's, A, B, A, B.
#
# On the GPU machine, after scripts/build-cuda.sh here for each build, the second build's
# archive in .cuda/dist/ (or NEW_DIST) and the first's copied to .cuda/dist-base/ (carry both):
#   LD_LIBRARY_PATH=/usr/local/cuda/lib64 [NEW_DIST=DIR] scripts/gpu-ab.sh OUT_DIR [PAIRS]
# Writes OUT_DIR/{gpu_decode,oracle}-{base,new}-N.* and OUT_DIR/ab.md (a summary).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-ab.sh OUT_DIR [PAIRS]}
pairs=${2:-2}
mkdir -p "$out"
# NEW_DIST: a folder holding the second build's archive instead of .cuda/dist (a slim one of
# exp and gpu_decode travels beside the first build's where both would not fit).
if [ -n "${NEW_DIST:-}" ]; then
  mkdir -p .cuda/dist && cp "$NEW_DIST/specdec-cuda.tar.xz" .cuda/dist/
fi
scripts/gpu-unpack.sh
rm -rf .cuda/base-run && mkdir -p .cuda/base-run
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
  .cuda/dist-base/specdec-cuda.tar.xz .cuda/base-run
echo "base: $(cat .cuda/base-run/commit)  new: $(cat .cuda/run/commit)" | tee "$out/builds.txt"
models=/tmp/specdec-bench-models-v${SPECDEC_BENCH_VOCAB:-1024}
python3 - "$models" <<'PY'
import os, sys
sys.path.insert(0, "scripts")
import torch
import bench_gpu as b
for name in ("target-8b", "draft-1b"):
    b.make_random_llama(torch, os.path.join(sys.argv[1], name), b.SHAPES[name])
PY
bw=$(python3 scripts/copy_bandwidth.py)
echo "copy bandwidth (torch clone of 1 GiB): $bw bytes/s" | tee -a "$out/builds.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$out/builds.txt"
decode() {  # decode <base|new> <n>
  local dir=.cuda/run
  [ "$1" = base ] && dir=.cuda/base-run
  SPECDEC_BENCH_BANDWIDTH=$bw SPECDEC_BENCH_MODEL=$models/target-8b SPECDEC_BENCH_DTYPE=bf16 \
    SPECDEC_BENCH_CONTEXTS=128 SPECDEC_BENCH_ROUNDS=${ROUNDS:-6} \
    SPECDEC_BENCH_JSON=$out/gpu_decode-$1-$2.json "$dir/benches/gpu_decode" > "$out/gpu_decode-$1-$2.md"
}
oracle() {  # oracle <base|new> <n>
  local dir=.cuda/run
  [ "$1" = base ] && dir=.cuda/base-run
  python3 scripts/bench_gpu.py --case llama8b --skip-hf --rounds 2 --prompts 8 \
    --max-new-tokens 512 --alphas 0.8 --gammas 4 --exp "$dir/bin/exp" \
    --models-dir "$models" --out "$out/oracle-$1-$2" > "$out/oracle-$1-$2.log" 2>&1
}
for n in $(seq 1 "$pairs"); do
  for b in base new; do echo "== decode $b $n"; decode "$b" "$n"; done
  for b in new base; do echo "== oracle $b $n"; oracle "$b" "$n"; done
done
python3 - "$out" "$pairs" <<'PY' | tee "$out/ab.md"
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
print("| build | pair | 8B decode ms at 128 | oracle tok/s | AR tok/s | oracle speedup (paired median) |")
print("|---|---:|---:|---:|---:|---:|")
per = {"base": [], "new": []}
for n in range(1, pairs + 1):
    for b in ("base", "new"):
        d = json.load(open(f"{out}/gpu_decode-{b}-{n}.json"))
        ms = next(c["decode_ms"] for c in d["models"][0]["contexts"] if c["context"] == 128)
        rows = json.load(open(f"{out}/oracle-{b}-{n}/llama8b-bf16.json"))["rows"]
        oracle = next(r for m, r in rows.items() if "oracle" in m)
        ar = rows["specdec_ar"]
        per[b].append((ms, oracle["speedup"]))
        print(f"| {b} | {n} | {ms:.3f} | {oracle['median']:.1f} | {ar['median']:.1f} | {oracle['speedup']:.3f} |")
med = {b: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for b, v in per.items()}
print()
print(f"new / base: decode ms {med['new'][0] / med['base'][0]:.4f}, oracle speedup {med['new'][1] / med['base'][1]:.4f} (medians over pairs)")
PY
