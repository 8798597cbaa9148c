#!/usr/bin/env bash
# Splits the real checkpoints in models/real/ into pieces small enough to travel to the GPU
# machine beside the working tree (a call carries 64 MiB in all, the tree included), one
# git-ignored folder per piece: .gpu/c_<model>.<n>/<model>.<n>. Carry one folder per call and
# copy it to /tmp/parts there; then join them there with
#   cat /tmp/parts/smol.* > models/real/SmolLM2-135M-Instruct.Q4_1.gguf
#   cat /tmp/parts/gemma.* > models/real/gemma-3-270m-q4_k_m.gguf
# and check them with `sha256sum` against scripts/fetch-models.sh's pinned hashes (the
# pieces sort in order: one-digit suffixes).
#   scripts/gpu-split-models.sh [PIECE_BYTES]   (default 44000000)
set -euo pipefail
cd "$(dirname "$0")/.."
piece=${1:-44000000}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
rm -rf .gpu; mkdir -p .gpu
for pair in smol:SmolLM2-135M-Instruct.Q4_1.gguf gemma:gemma-3-270m-q4_k_m.gguf; do
  name=${pair%%:*}; file=models/real/${pair#*:}
  [ -f "$file" ] || { echo "error: $file missing (scripts/fetch-models.sh)" >&2; exit 1; }
  split -b "$piece" -d -a 1 "$file" ".gpu/$name."
done
for f in .gpu/*.*; do
  d=".gpu/c_$(basename "$f")"; mkdir -p "$d"; mv "$f" "$d/"
done
du -sh .gpu/c_* | sed 's/^/  /'
echo "carry each folder above in its own call (with .cuda/dist or a slim archive in the first)"
