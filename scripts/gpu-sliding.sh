#!/usr/bin/env bash
# Sliding-window targets on the GPU, after scripts/gpu-unpack.sh: random bf16 checkpoints at the
# full shapes of Gemma-3-4B (text: five 1,024-token sliding layers to one global) and
# Mistral-7B-v0.1 (4,096-token window), made here by scripts/sliding_shapes.py, then
#   bw:     torch's clone of 1 GiB (scripts/copy_bandwidth.py) beside gpu_decode's own copy;
#   decode: gpu_decode (bf16) on both shapes at 128 and 8,000 tokens of context (both rings
#           wrapped at 8,000), with the slack and the staged strategy, and the slack one with
#           the engine option ring_in_place off (VARIANTS="strategy:0|1 ..." to choose);
#   hf:     transformers' generate with its static cache on both (128-token prompt, 256 new
#           tokens), scripts/sliding_shapes.py hf-decode.
# Usage: scripts/gpu-sliding.sh OUT_DIR [STEPS (bw,decode,hf)]   (LD_LIBRARY_PATH must reach
#        the CUDA libraries). Checkpoints go to $SPECDEC_SLIDING_DIR (default
#        /tmp/specdec-sliding) and are kept for later calls on the same machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-sliding.sh OUT_DIR [bw,decode,hf]}
steps=${2:-bw,decode,hf}
models=${SPECDEC_SLIDING_DIR:-/tmp/specdec-sliding}
mkdir -p "$out" "$models"
has() { [[ ",$steps," == *",$1,"* ]]; }
python3 scripts/sliding_shapes.py make "$models" gemma3-4b mistral-7b
echo "== $(date -u '+%F %T UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), commit $(cat .cuda/run/commit)"
if has bw; then
  echo "== torch clone of 1 GiB (bytes/s, read + write): $(python3 scripts/copy_bandwidth.py)" | tee "$out/bandwidth.txt"
fi
if has decode; then
  # strategy:ring_in_place — the slack strategy also with the engine option off (the masked
  # product over the ring, no graph steps for these models) as the same build's baseline.
  for variant in ${VARIANTS:-slack:1 staged:1 slack:0}; do
    strategy=${variant%:*} in_place=${variant#*:}
    echo "== gpu_decode, bf16, $strategy, ring_in_place=$in_place"
    SPECDEC_RING_IN_PLACE=$in_place \
      SPECDEC_BENCH_MODEL=$models/gemma3-4b,$models/mistral-7b SPECDEC_BENCH_DTYPE=bf16 \
      SPECDEC_BENCH_CONTEXTS=${CONTEXTS:-128,8000} SPECDEC_BENCH_ROUNDS=${ROUNDS:-8} \
      SPECDEC_BENCH_STRATEGY=$strategy SPECDEC_BENCH_JSON=$out/gpu_decode_${strategy}_$in_place.json \
      .cuda/run/benches/gpu_decode | tee "$out/gpu_decode_${strategy}_$in_place.md"
  done
fi
if has hf; then
  for name in gemma3-4b mistral-7b; do
    echo "== transformers static-cache generate: $name"
    python3 scripts/sliding_shapes.py hf-decode "$models/$name" | tee -a "$out/hf_static.jsonl"
  done
fi
