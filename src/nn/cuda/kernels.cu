// specdec's own CUDA kernels, compiled by build.rs (a fat binary: SASS and PTX) when the
// `cuda` feature is on and launched through candle's custom-op interface (src/nn/cuda/).
// Every kernel has a device-generic fallback made of candle ops; these exist where a
// measurement showed candle's op sequence costing us (docs/gpu.md; the history in docs/kernel-notes.md).
//
// Layout conventions (batch 1):
//   q:      [heads, t, d] with element (h, i, e) at q[h * q_head_stride + i * q_row_stride + e]
//   k, v:   a cache buffer [kv_heads, capacity, d]; element (g, j, e) at
//           k[g * kv_head_stride + j * d + e] (the views handed out by the KV cache)
//   out:    [t, heads * d] row-major, ready for the output projection.
//
// The kernels by family, one translation unit (so one module to load and one set of
// diagnostics globals; build.rs compiles this file):
//   common.cuh      conversions, loads, warp sums, pdl_begin, L2 prefetch, mma helpers
//   attn_split.cu   split attention of decode and verification steps
//   attn_combine.cuh  its combine of the splits' partial rows (global memory or a cluster)
//   prefill.cu      causal softmax of prefill chunks, flash attention
//   gemv.cu         GEMVs (CUDA cores, tensor cores with folds)
//   elementwise.cu  RoPE + K/V store, SiLU·up, add + RMSNorm, row argmax, staged commits
#include "common.cuh"
#include "attn_split.cu"
#include "prefill.cu"
#include "gemv.cu"
#include "elementwise.cu"
