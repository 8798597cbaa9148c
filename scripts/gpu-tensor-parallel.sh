#!/usr/bin/env bash
# On a machine with several GPUs: tensor parallelism's tests and measurements (docs/tensor-parallel.md).
#
# Build here with `SPECDEC_NCCL=1 CUDA_TARGETS="--bin exp --test tensor_parallel --bench gpu_decode"
# scripts/build-cuda.sh`, carry .cuda/dist, then there:
#
#   scripts/gpu-tensor-parallel.sh OUT [STEPS] [RANKS]
#
# STEPS (comma-separated, default tests,bench,oracle):
#   tests   tests/tensor_parallel on CUDA in f32 at RANKS (default 2,4; the GPUs must exist),
#           one test at a time (NCCL groups of concurrent tests over the same GPUs can
#           deadlock), then its split_forwards test in bf16
#   big     an 8B-shaped checkpoint written by transformers (random bf16), split at RANKS in
#           f32: its greedy tokens against the whole model's (the ignored test)
#   bench   gpu_decode on random bf16 weights at 128 tokens: the 8B shape on one GPU and at
#           the largest of RANKS, the 70B shape at each of RANKS with graphs and at the
#           largest without, the 1B shape (for the cost ratio)
#   oracle  exp: the oracle drafter (alpha 0.8 and 0.6, gamma 4, the 1B and the 8B shape's
#           forwards for their cost) on the 70B shape at each of RANKS, the draft beside
#           rank 0; with the 1B shape at alpha
#           0.8 also on a GPU of its own (the first past the ranks) where the machine has one,
#           else beside the last rank
# Each step's output goes to OUT/<step>*.log as it runs (a call cut short keeps what it has).
# NCCL comes from the Python environment's nvidia-nccl-cu13 wheel; NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-tensor-parallel.sh OUT [STEPS] [RANKS]}
steps=",${2:-tests,bench,oracle},"
ranks=${3:-2,4}
top=$(echo "$ranks" | tr ',' '\n' | sort -n | tail -1)
count=$(echo "$ranks" | tr ',' '\n' | wc -l)
l70s=$(printf '/tmp/shapes/l70,%.0s' $(seq "$count"))
mkdir -p "$out"
nccl=$(scripts/nccl-lib-dir.sh) || exit 1
export LD_LIBRARY_PATH=$nccl:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} NCCL_NVLS_ENABLE=0
{ date -u; nvidia-smi --query-gpu=index,name,memory.total --format=csv; nvidia-smi topo -m | head -6; } | tee "$out/machine.log"
[ -d .cuda/run ] || scripts/gpu-unpack.sh
run=.cuda/run
echo "build: $(cat $run/commit)" | tee -a "$out/machine.log"

# Configs of the published shapes (random weights are drawn from them), with the shipped
# tokenizer (ids below 1,024 fit any vocabulary) for exp.
python3 - <<'PY'
import json, os, shutil
def llama(hidden, inter, layers, heads, kv, tied):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": hidden // heads, "vocab_size": 128256,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
            "tie_word_embeddings": tied, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
shapes = {"l70": llama(8192, 28672, 80, 64, 8, False), "l8": llama(4096, 14336, 32, 32, 8, False),
          "l1": llama(2048, 8192, 16, 32, 8, True)}
for name, cfg in shapes.items():
    d = f"/tmp/shapes/{name}"
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(f"{d}/config.json", "w"))
    shutil.copy("models/target/tokenizer.json", d)
PY

if [[ $steps == *,tests,* ]]; then
  SPECDEC_TEST_DEVICE=cuda SPECDEC_TEST_DTYPE=f32 SPECDEC_TEST_RANKS=$ranks timeout 300 \
    $run/tests/tensor_parallel --test-threads=1 2>&1 | tee "$out/tests-f32.log"
  SPECDEC_TEST_DEVICE=cuda SPECDEC_TEST_DTYPE=bf16 SPECDEC_TEST_RANKS=$ranks timeout 120 \
    $run/tests/tensor_parallel --test-threads=1 split_forwards 2>&1 | tee "$out/tests-bf16.log"
fi
if [[ $steps == *,big,* ]]; then
  python3 - <<'PY'
import json, shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.for_model(**json.load(open("/tmp/shapes/l8/config.json")))
with torch.device("cuda"):
    m = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    for p in m.parameters():
        p.data.normal_(0, 0.02)
m.save_pretrained("/tmp/ckpt/l8")
shutil.copy("/tmp/shapes/l8/tokenizer.json", "/tmp/ckpt/l8")
PY
  SPECDEC_TEST_TP_MODEL=/tmp/ckpt/l8 SPECDEC_TEST_DEVICE=cuda SPECDEC_TEST_DTYPE=f32 SPECDEC_TEST_RANKS=$ranks \
    timeout 300 $run/tests/tensor_parallel --ignored a_large --nocapture 2>&1 | tee "$out/big.log"
  rm -rf /tmp/ckpt
fi
if [[ $steps == *,bench,* ]]; then
  export SPECDEC_BENCH_RANDOM=1 SPECDEC_BENCH_DTYPE=bf16 SPECDEC_BENCH_CONTEXTS=128 SPECDEC_BENCH_ROUNDS=6
  SPECDEC_BENCH_MODEL=/tmp/shapes/l8,/tmp/shapes/l8 SPECDEC_BENCH_TP=1,$top SPECDEC_BENCH_JSON=$out/decode-8b.json \
    timeout 200 $run/benches/gpu_decode 2>&1 | tee "$out/decode-8b.log"
  SPECDEC_BENCH_MODEL=${l70s}/tmp/shapes/l1 SPECDEC_BENCH_TP=$ranks,1 SPECDEC_BENCH_JSON=$out/decode-70b.json \
    timeout 200 $run/benches/gpu_decode 2>&1 | tee "$out/decode-70b.log"
  SPECDEC_CUDA_GRAPHS=0 SPECDEC_BENCH_MODEL=/tmp/shapes/l70 SPECDEC_BENCH_TP=$top \
    timeout 200 $run/benches/gpu_decode 2>&1 | tee "$out/decode-70b-nographs.log"
fi
if [[ $steps == *,oracle,* ]]; then
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  for n in ${ranks//,/ }; do
  dgpu=$(( n < gpus ? n : n - 1 ))
  cat > /tmp/oracle70.toml <<TOML
name = "tp-oracle-70b"
seed = 0
max_new_tokens = 96
stop_at_eos = false
device = "cuda"
dtype = "bf16"
random_weights = true
repeats = 1
[target]
path = "/tmp/shapes/l70"
tensor_parallel = $n
[drafters.oracle80]
kind = "oracle"
alpha = 0.8
path = "/tmp/shapes/l1"
[drafters.oracle60]
kind = "oracle"
alpha = 0.6
path = "/tmp/shapes/l1"
[drafters.oracle80_8b]
kind = "oracle"
alpha = 0.8
path = "/tmp/shapes/l8"
[drafters.oracle60_8b]
kind = "oracle"
alpha = 0.6
path = "/tmp/shapes/l8"
[drafters.oracle80_gpu$dgpu]
kind = "oracle"
alpha = 0.8
path = "/tmp/shapes/l1"
gpu = $dgpu
[dataset]
path = "configs/prompts/code.jsonl"
limit = 3
[sweep]
method = ["autoregressive", "speculative"]
drafter = ["oracle80", "oracle60", "oracle80_8b", "oracle60_8b", "oracle80_gpu$dgpu"]
gamma = [4]
temperature = [0.0]
cache = ["slack"]
TOML
  rm -rf /tmp/oracle70
  timeout 300 $run/bin/exp run /tmp/oracle70.toml --out /tmp/oracle70 --no-progress 2>&1 | tee "$out/oracle-tp$n.log"
  cp /tmp/oracle70/summary.md "$out/oracle-tp$n-summary.md" 2>/dev/null || true
  done
fi
