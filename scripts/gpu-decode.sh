#!/usr/bin/env bash
# Where GPU decode time goes, on 8B/1B-shaped Llama checkpoints with random bf16 weights (made
# here with torch, no download; the vocabulary is SPECDEC_BENCH_VOCAB, default the shipped
# tokenizer's 1,024 ids, see scripts/bench_gpu.py), after scripts/gpu-unpack.sh:
#   1. the gpu_decode benchmark (bandwidth, per-context prefill/decode/verify, stage times);
#   2. transformers' prefill of the same weights at the same lengths (SDPA, logits of the
#      last position only, as specdec's prefill computes);
#   3. kernel launches and device time per decode step, from ncu when it is installed.
# Usage: scripts/gpu-decode.sh OUT_DIR [contexts]   (LD_LIBRARY_PATH must reach the CUDA libs)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-decode.sh OUT_DIR [contexts]}
contexts=${2:-128,1024,4096,8000}
models=${SPECDEC_BENCH_MODELS_DIR:-/tmp/specdec-bench-models-v${SPECDEC_BENCH_VOCAB:-1024}}
mkdir -p "$out"
python3 - "$models" <<'PY'
import os, sys, time
sys.path.insert(0, "scripts")
import torch
import bench_gpu as b
t0 = time.perf_counter()
for name in ("target-8b", "draft-1b"):
    b.make_random_llama(torch, os.path.join(sys.argv[1], name), b.SHAPES[name])
print(f"random checkpoints ready in {time.perf_counter() - t0:.0f} s", flush=True)
PY
target=$models/target-8b draft=$models/draft-1b
# The copy bandwidth of torch's clone (cudaMemcpy-class kernels), as the bound's reference.
bw=$(python3 scripts/copy_bandwidth.py)
echo "== device-to-device copy (torch clone of 1 GiB): $bw bytes/s"
echo "== gpu_decode (bf16)"
SPECDEC_BENCH_BANDWIDTH=$bw SPECDEC_BENCH_MODEL=$target,$draft SPECDEC_BENCH_DTYPE=bf16 SPECDEC_BENCH_CONTEXTS=$contexts \
  SPECDEC_BENCH_ROUNDS=${ROUNDS:-8} SPECDEC_BENCH_JSON=$out/gpu_decode.json \
  .cuda/run/benches/gpu_decode | tee "$out/gpu_decode.md"
echo "== gpu_decode without CUDA graphs (bf16, context 128)"
SPECDEC_CUDA_GRAPHS=0 SPECDEC_BENCH_BANDWIDTH=$bw SPECDEC_BENCH_MODEL=$target,$draft \
  SPECDEC_BENCH_DTYPE=bf16 SPECDEC_BENCH_CONTEXTS=128 SPECDEC_BENCH_ROUNDS=${ROUNDS:-8} \
  SPECDEC_BENCH_JSON=$out/gpu_decode_eager.json .cuda/run/benches/gpu_decode \
  | tee "$out/gpu_decode_eager.md"
echo "== transformers prefill (bf16, sdpa)"
python3 - "$target" "$contexts" "$out/hf_prefill.json" <<'PY'
import json, sys, time, torch
from transformers import AutoModelForCausalLM
path, contexts, out = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], sys.argv[3]
m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
rows = []
with torch.no_grad():
    for L in contexts:
        ids = torch.randint(0, m.config.vocab_size, (1, L), device="cuda")
        times = []
        for _ in range(4):
            torch.cuda.synchronize(); t = time.perf_counter()
            m(ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize(); times.append(time.perf_counter() - t)
        rows.append({"context": L, "prefill_s": sorted(times[1:])[1]})
        print(f"| {L} | {rows[-1]['prefill_s']:.3f} |", flush=True)
json.dump({"transformers_prefill": rows}, open(out, "w"), indent=1)
PY
if [ "${SKIP_NCU:-0}" = 1 ]; then
  echo "ncu: skipped (SKIP_NCU=1)"
elif command -v ncu >/dev/null || [ -x /usr/local/cuda/bin/ncu ]; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for name in draft-1b target-8b; do
    echo "== ncu: kernels of 3 decode steps and 3 five-token verifications of $name"
    SPECDEC_BENCH_MODEL=$models/$name SPECDEC_BENCH_DTYPE=bf16 SPECDEC_BENCH_KERNELS=3 \
      timeout 400 "$ncu" --csv --metrics gpu__time_duration.sum .cuda/run/benches/gpu_decode \
      > "$out/ncu-$name.csv" 2> "$out/ncu-$name.err" || echo "ncu failed: $(tail -3 "$out/ncu-$name.err")"
    python3 scripts/ncu_steps.py "$out/ncu-$name.csv" 3 6 | tee "$out/ncu-$name.md" || true
    [ "$name" = draft-1b ] && [ "${NCU_TARGET:-0}" = 0 ] && break
  done
else
  echo "ncu: not installed"
fi
