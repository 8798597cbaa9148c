#!/usr/bin/env bash
# One build's gpu_decode under two sets of engine options, alternated on one GPU machine, after
# scripts/gpu-unpack.sh: for each shape (random bf16 checkpoints at full published shapes,
# scripts/sliding_shapes.py), ROUNDS_AB times (default 2) set A then set B, all against the
# same bound (torch's clone of 1 GiB, measured once at the start, as SPECDEC_BENCH_BANDWIDTH).
# A set is a space-separated list of SPECDEC_<OPTION>=VALUE overrides ("" for the defaults).
# Usage: scripts/gpu-options-ab.sh OUT_DIR "A" "B" [NAMES (gemma3-4b qwen3-8b)]
#        [CONTEXTS (128,8000)]   (LD_LIBRARY_PATH must reach the CUDA libraries)
# Env:   SPECDEC_BENCH_STRATEGY (rotating strategy, default slack), ROUNDS (gpu_decode's, 8).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-options-ab.sh OUT_DIR "A" "B" [NAMES] [CONTEXTS]}
set_a=${2?the first set of SPECDEC_ overrides}
set_b=${3?the second set of SPECDEC_ overrides}
names=${4:-gemma3-4b qwen3-8b}
contexts=${5:-128,8000}
models=${SPECDEC_SLIDING_DIR:-/tmp/specdec-sliding}
mkdir -p "$out"
# shellcheck disable=SC2086 # one word per shape name
python3 scripts/sliding_shapes.py make "$models" $names
bw=$(python3 scripts/copy_bandwidth.py)
echo "== $(date -u '+%F %T UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); build $(cat .cuda/run/commit); torch clone $bw bytes/s"
for name in $names; do
  for round in $(seq "${ROUNDS_AB:-2}"); do
    for which in a b; do
      overrides=$set_a
      [ "$which" = b ] && overrides=$set_b
      echo "== $name, set $which ($overrides), round $round"
      # shellcheck disable=SC2086 # one word per override
      env $overrides SPECDEC_BENCH_BANDWIDTH="$bw" SPECDEC_BENCH_MODEL="$models/$name" \
        SPECDEC_BENCH_DTYPE=bf16 SPECDEC_BENCH_CONTEXTS="$contexts" \
        SPECDEC_BENCH_ROUNDS="${ROUNDS:-8}" SPECDEC_BENCH_STRATEGY="${SPECDEC_BENCH_STRATEGY:-slack}" \
        .cuda/run/benches/gpu_decode | tee "$out/$name-$which-$round.md"
    done
  done
done
