#!/usr/bin/env bash
# The GPU test pass: every test binary of a `--features cuda` build (scripts/build-cuda.sh,
# unpacked by scripts/gpu-unpack.sh) run with its tensors and models on the GPU
# (SPECDEC_TEST_DEVICE=cuda) in f32, then the transformers parity tests again in bf16 at the
# bf16 tolerance. Writes a markdown report (date, device, every binary's result lines) to
# $1 (default gpu-test-pass.md) and exits non-zero when any binary failed.
#
# Usage (on the GPU machine, in the checkout): LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
#   scripts/gpu-tests.sh [REPORT]
# SPECDEC_GPU_TESTS_SKIP="bin ..." leaves those binaries out (each listed in the report as
# skipped, so a partial pass says so).
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-gpu-test-pass.md}
log=${report%.md}.log
run=.cuda/run/tests
export SPECDEC_TEST_DEVICE=${SPECDEC_TEST_DEVICE:-cuda}
# Property tests: every case is hundreds of tiny tensor operations, each a kernel launch and
# often a host round trip on the GPU; 100 cases per property (1000 on the CPU) and a bounded
# shrink keep the pass within minutes. Each binary gets at most $PER_BINARY_S seconds.
export SPECDEC_TEST_CASES=${SPECDEC_TEST_CASES:-100} PROPTEST_MAX_SHRINK_ITERS=${PROPTEST_MAX_SHRINK_ITERS:-64}
PER_BINARY_S=${PER_BINARY_S:-300}
# A build with NCCL (SPECDEC_NCCL=1) links libnccl.so.2 into every binary.
if ldd "$run"/* 2>/dev/null | grep -q "libnccl.so.2 => not found"; then
  export LD_LIBRARY_PATH=$(scripts/nccl-lib-dir.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} NCCL_NVLS_ENABLE=0
fi
status=0
{
  echo "# GPU test pass"
  echo
  echo "* date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "* device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo unknown)"
  echo "* build: \`scripts/build-cuda.sh\` (commit $(cat .cuda/run/commit 2>/dev/null || echo unknown)), run by \`scripts/gpu-tests.sh\`"
  echo "* SPECDEC_TEST_DEVICE=$SPECDEC_TEST_DEVICE, SPECDEC_TEST_CASES=$SPECDEC_TEST_CASES (property-test cases), at most ${PER_BINARY_S} s per binary"
  echo
  echo "| test binary | dtype | result |"
  echo "|---|---|---|"
} > "$report"
: > "$log"
one() {  # one <binary> <dtype> [filter...]
  local bin=$1 dtype=$2; shift 2
  # A build of part of the binaries (CUDA_TARGETS) runs the variants of those it has.
  if [ ! -x "$run/$bin" ]; then
    echo "| \`$bin\` ${*:+(\`$*\`)} | $dtype | not in this build |" >> "$report"
    return
  fi
  echo "== $bin (SPECDEC_TEST_DTYPE=$dtype) $*" | tee -a "$log"
  local out
  out=$(SPECDEC_TEST_DTYPE=$dtype timeout "$PER_BINARY_S" "$run/$bin" --test-threads 1 "$@" 2>&1)
  local rc=$?
  echo "$out" >> "$log"
  local line
  line=$(echo "$out" | grep -E "^test result:" | tail -1)
  [ -n "$line" ] || line="no result line (exit $rc$([ $rc -eq 124 ] && echo ": timed out"))"
  echo "$line" | tee -a "$log"
  echo "| ${SPECDEC_TREE_IN_PLACE:+SPECDEC_TREE_IN_PLACE=$SPECDEC_TREE_IN_PLACE }${SPECDEC_RING_IN_PLACE:+SPECDEC_RING_IN_PLACE=$SPECDEC_RING_IN_PLACE }${SPECDEC_FUSED_ROPE:+SPECDEC_FUSED_ROPE=$SPECDEC_FUSED_ROPE }${SPECDEC_ATTN_WIDE_MIN_LEN:+SPECDEC_ATTN_WIDE_MIN_LEN=$SPECDEC_ATTN_WIDE_MIN_LEN }${SPECDEC_ATTN_EARLY_VALUES:+SPECDEC_ATTN_EARLY_VALUES=$SPECDEC_ATTN_EARLY_VALUES }\`$bin\` ${*:+(\`$*\`)} | $dtype | $line |" >> "$report"
  if [ $rc -ne 0 ]; then
    status=1
    echo "$out" | grep -E "panicked at|^---- |relative error|assert" | head -20 | sed 's/^/    /' >> "$report.failures"
  fi
}
for path in "$run"/*; do
  bin=$(basename "$path")
  [ "$bin" = specdec ] && continue  # the library's unit tests are CPU kernels and masks
  if [[ " ${SPECDEC_GPU_TESTS_SKIP:-} " == *" $bin "* ]]; then
    echo "| \`$bin\` | f32 | skipped (SPECDEC_GPU_TESTS_SKIP) |" >> "$report"
    continue
  fi
  if [ "$bin" = tensor_parallel ]; then
    # A split target needs several GPUs and a build linking NCCL (SPECDEC_NCCL=1).
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$gpus" -lt 2 ] || ! ldd "$path" 2>/dev/null | grep -q libnccl; then
      echo "| \`$bin\` | f32 | skipped ($gpus GPU(s)$(ldd "$path" 2>/dev/null | grep -q libnccl || echo ', a build without NCCL'): see scripts/gpu-tensor-parallel.sh) |" >> "$report"
      continue
    fi
    SPECDEC_TEST_RANKS=$([ "$gpus" -ge 4 ] && echo 2,4 || echo 2) one "$bin" f32
    continue
  fi
  one "$bin" f32
done
one models bf16 logits_match_transformers
one models bf16 tiny_models_decode_incrementally_like_a_full_forward
# Recorded and ordinary steps in half precision (its tolerance), and a short prompt's steps
# on a fresh and on a reused cache (bitwise in any precision).
one decode_graphs bf16
# Recorded steps with RoPE's own kernel before the split attention (the default fuses them).
SPECDEC_FUSED_ROPE=0 one decode_graphs f32
SPECDEC_FUSED_ROPE=0 one decode_graphs bf16
# The four-warp split-attention kernels (eight warps a block is the default at every length).
SPECDEC_ATTN_WIDE_MIN_LEN=1000000000 one attention_kernels f32
SPECDEC_ATTN_WIDE_MIN_LEN=1000000000 one decode_graphs bf16
# Recorded steps without the early-value kernels (`_hv`, the default for d <= 64 where the
# grid is one wave).
SPECDEC_ATTN_EARLY_VALUES=0 one decode_graphs f32
SPECDEC_ATTN_EARLY_VALUES=0 one decode_graphs bf16
# Sliding-window layers on the masked product over the ring, without graph steps (the default
# attends over rings in place and records their steps).
SPECDEC_RING_IN_PLACE=0 one decode_graphs f32
SPECDEC_RING_IN_PLACE=0 one models f32
# Token trees on the masked product without graphs (the default records them in place).
SPECDEC_TREE_IN_PLACE=0 one tree_graphs f32
SPECDEC_TREE_IN_PLACE=0 one decode_graphs f32
if [ -f "$report.failures" ]; then
  { echo; echo "## Failures"; echo; echo '```'; cat "$report.failures"; echo '```'; } >> "$report"
  rm -f "$report.failures"
fi
echo "report: $report, full log: $log"
exit $status
