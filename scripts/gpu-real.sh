#!/usr/bin/env bash
# On the GPU machine: the real GGUF checkpoints (models/real/, as scripts/fetch-models.sh
# installs them) through the CUDA build (scripts/build-cuda.sh, unpacked by
# scripts/gpu-unpack.sh):
#   1. tests/gguf_models on CUDA in f32 (logits within 1e-4 of transformers' CPU fixtures, greedy
#      continuations token for token) and in bf16 (logits within 1e-1), the quantized option
#      against the dequantized model on CUDA;
#   2. `exp` on configs/smollm2-135m.toml and configs/gemma3-270m.toml on CUDA: f32 (its greedy
#      outputs are compared with the CPU's by the caller), bf16, and SmolLM2 with
#      quantized = true beside its dequantized f32 run.
# Results go to OUT_DIR/runs/<name>/ (exp's result folders) and OUT_DIR/*.log.
#   LD_LIBRARY_PATH=/usr/local/cuda/lib64 scripts/gpu-real.sh OUT_DIR [LIMIT]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-real.sh OUT_DIR [LIMIT]}
limit=${2:-8}
mkdir -p "$out/runs"
run=.cuda/run
exp=$run/bin/exp
for f in models/real/SmolLM2-135M-Instruct.Q4_1.gguf models/real/gemma-3-270m-q4_k_m.gguf; do
  [ -f "$f" ] || { echo "error: $f missing (scripts/fetch-models.sh)" >&2; exit 1; }
done
status=0
step() { # name, command...
  local name=$1; shift
  echo "== $name: $*"
  local start=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then echo "   ok ($((SECONDS - start)) s)"; else
    echo "   FAILED ($((SECONDS - start)) s), tail of $out/$name.log:"; tail -n 30 "$out/$name.log"; status=1; fi
}
export REQUIRE_REAL_MODELS=1
step tests-f32 env SPECDEC_TEST_DEVICE=cuda SPECDEC_TEST_DTYPE=f32 "$run/tests/gguf_models" --test-threads 1
step tests-bf16 env SPECDEC_TEST_DEVICE=cuda SPECDEC_TEST_DTYPE=bf16 "$run/tests/gguf_models" --test-threads 1 matches_transformers
common=(--no-progress --set device=cuda --set repeats=1 --set dataset.limit="$limit")
step exp-smollm2-f32 "$exp" configs/smollm2-135m.toml "${common[@]}" --set dtype=f32 --out "$out/runs/smollm2-f32"
step exp-smollm2-f32-quantized "$exp" configs/smollm2-135m.toml "${common[@]}" --set dtype=f32 --set target.quantized=true --out "$out/runs/smollm2-f32-quantized"
step exp-smollm2-bf16 "$exp" configs/smollm2-135m.toml "${common[@]}" --set dtype=bf16 --out "$out/runs/smollm2-bf16"
gemma=(--no-progress --set device=cuda --set repeats=1)
step exp-gemma3-f32 "$exp" configs/gemma3-270m.toml "${gemma[@]}" --set dtype=f32 --out "$out/runs/gemma3-f32"
step exp-gemma3-bf16 "$exp" configs/gemma3-270m.toml "${gemma[@]}" --set dtype=bf16 --out "$out/runs/gemma3-bf16"
exit $status
