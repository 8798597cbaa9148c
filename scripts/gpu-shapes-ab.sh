#!/usr/bin/env bash
# Two builds' gpu_decode side by side on one GPU machine, after scripts/gpu-unpack.sh: this
# build's (.cuda/run/benches/gpu_decode) and another's (OLD: the path of its gpu_decode), on
# random bf16 checkpoints at full published shapes (scripts/sliding_shapes.py), the builds
# alternated model by model, both against the same bound (torch's clone of 1 GiB, measured
# once at the start, as SPECDEC_BENCH_BANDWIDTH).
# Usage: scripts/gpu-shapes-ab.sh OUT_DIR OLD [NAMES (llama3.1-8b qwen2.5-7b qwen3-8b)]
#        [CONTEXTS (128,8000)]   (LD_LIBRARY_PATH must reach the CUDA libraries)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-shapes-ab.sh OUT_DIR OLD [NAMES] [CONTEXTS]}
old=${2:?the gpu_decode of the other build}
names=${3:-llama3.1-8b qwen2.5-7b qwen3-8b}
contexts=${4:-128,8000}
models=${SPECDEC_SLIDING_DIR:-/tmp/specdec-sliding}
mkdir -p "$out"
# shellcheck disable=SC2086 # one word per shape name
python3 scripts/sliding_shapes.py make "$models" $names
bw=$(python3 scripts/copy_bandwidth.py)
echo "== $(date -u '+%F %T UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); this build $(cat .cuda/run/commit), other $old; torch clone $bw bytes/s"
for name in $names; do
  for which in new old; do
    bin=.cuda/run/benches/gpu_decode
    [ "$which" = old ] && bin=$old
    echo "== $name, $which build"
    SPECDEC_BENCH_BANDWIDTH=$bw SPECDEC_BENCH_MODEL=$models/$name SPECDEC_BENCH_DTYPE=bf16 \
      SPECDEC_BENCH_CONTEXTS=$contexts SPECDEC_BENCH_ROUNDS=${ROUNDS:-8} \
      "$bin" | tee "$out/$name-$which.md"
  done
done
