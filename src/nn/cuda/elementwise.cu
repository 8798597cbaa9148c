// Elementwise and row-wise steps: RoPE with the K/V store at device-side positions, the
// gated MLP's SiLU, residual add + RMSNorm, a post-norm's residual add, row argmax (`attention.rs`, `dense.rs`).
#pragma once
#include "common.cuh"

// RoPE of the new block's queries and keys at the positions of a replayed step, with the
// keys and values written into the KV cache buffers — what a captured CUDA graph needs,
// since every launch argument is fixed at capture and the positions are not.
//
// q: [t, heads, d], k, v: [t, kv_heads, d] (rows `*_row` elements apart, heads d apart);
// cos, sin: [P, d / 2] tables; the block's row i sits at position len - t + i with
// len = *len_ptr (the cache's length after the step). Writes q_out [heads, t, d] rotated,
// and the rotated k and the plain v at slot len - t + i of the caches [kv_heads, cap, d]
// (`cache_head_stride` elements per head). Non-interleaved (half-split) RoPE, as
// transformers' Llama: out[e] = x[e] cos - x[e + d/2] sin, out[e + d/2] = x[e] sin + x[e + d/2] cos.
// Grid: x = t, y = heads + kv_heads. Block: d / 2 threads.
template <typename T>
__device__ void rope_store(const T *__restrict__ q, long q_row, const T *__restrict__ k,
                           long k_row, const T *__restrict__ v, long v_row,
                           const T *__restrict__ cos, const T *__restrict__ sin,
                           T *__restrict__ q_out, T *__restrict__ kc, T *__restrict__ vc,
                           long cache_head_stride, const uint32_t *__restrict__ len_ptr, int t,
                           int heads, int d) {
  const int i = blockIdx.x, hh = blockIdx.y, e = threadIdx.x, half = d / 2;
  const long pos = (long)*len_ptr - t + i;
  const float c = to_f32(cos[pos * half + e]), s = to_f32(sin[pos * half + e]);
  if (hh < heads) {
    const T *x = q + i * q_row + (long)hh * d;
    const float x1 = to_f32(x[e]), x2 = to_f32(x[e + half]);
    T *o = q_out + ((long)hh * t + i) * d;
    o[e] = from_f32<T>(x1 * c - x2 * s);
    o[e + half] = from_f32<T>(x1 * s + x2 * c);
  } else {
    const int g = hh - heads;
    const T *x = k + i * k_row + (long)g * d;
    const float x1 = to_f32(x[e]), x2 = to_f32(x[e + half]);
    T *o = kc + g * cache_head_stride + pos * d;
    o[e] = from_f32<T>(x1 * c - x2 * s);
    o[e + half] = from_f32<T>(x1 * s + x2 * c);
    const T *y = v + i * v_row + (long)g * d;
    T *w = vc + g * cache_head_stride + pos * d;
    w[e] = y[e];
    w[e + half] = y[e + half];
  }
}

// The prologue prefetches [pf0, pf0 + pf0_n) and [pf1, pf1 + pf1_n) (`prefetch_l2`; lengths 0
// for none).
#define ROPE_STORE(NAME, T)                                                                    \
  extern "C" __global__ void NAME(const T *q, long q_row, const T *k, long k_row, const T *v, \
                                  long v_row, const T *cos, const T *sin, T *q_out, T *kc,     \
                                  T *vc, long cache_head_stride, const uint32_t *len_ptr,      \
                                  int t, int heads, int d, const char *pf0, long pf0_n,        \
                                  const char *pf1, long pf1_n) {                               \
    prefetch_l2(pf0, pf0_n, pf1, pf1_n);                                                       \
    pdl_begin();                                                                               \
    rope_store<T>(q, q_row, k, k_row, v, v_row, cos, sin, q_out, kc, vc, cache_head_stride,   \
                  len_ptr, t, heads, d);                                                       \
  }

ROPE_STORE(rope_store_f32, float)
ROPE_STORE(rope_store_bf16, __nv_bfloat16)
ROPE_STORE(rope_store_f16, __half)

// Gated MLP activation: y[r, i] = act(g[r, i]) * u[r, i] where the fused product is
// gu = [g | u], [t, 2 * inter] row-major, act SiLU (GELU = false) or GELU with the tanh
// approximation (transformers' gelu_pytorch_tanh, candle's gelu), in f32, rounded once. One
// pass instead of candle's strided activation and mul.
template <typename T, bool GELU>
__device__ void gate_mul(const T *__restrict__ gu, T *__restrict__ y, int inter, long n) {
  for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
       idx += (long)gridDim.x * blockDim.x) {
    const long r = idx / inter, i = idx % inter;
    const float g = to_f32(gu[r * 2 * inter + i]), u = to_f32(gu[r * 2 * inter + inter + i]);
    const float a = GELU ? 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)))
                         : g / (1.f + __expf(-g));
    y[idx] = from_f32<T>(a * u);
  }
}

#define GATE_MUL(NAME, T, GELU)                                                                \
  extern "C" __global__ void NAME(const T *gu, T *y, int inter, long n) {                     \
    pdl_begin();                                                                               \
    gate_mul<T, GELU>(gu, y, inter, n);                                                        \
  }
GATE_MUL(silu_mul_f32, float, false)
GATE_MUL(silu_mul_bf16, __nv_bfloat16, false)
GATE_MUL(silu_mul_f16, __half, false)
GATE_MUL(gelu_mul_f32, float, true)
GATE_MUL(gelu_mul_bf16, __nv_bfloat16, true)
GATE_MUL(gelu_mul_f16, __half, true)

constexpr int NORM_VECS = 8;
// Thread i's 16-byte vectors i, i + blockDim.x, ... (at most NORM_VECS, below nvec) of the
// norm weight w, into wv.
template <typename T>
__device__ __forceinline__ void load_norm_weight(const T *__restrict__ w, int nvec,
                                                 uint4 (&wv)[NORM_VECS]) {
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) wv[k] = reinterpret_cast<const uint4 *>(w)[i];
  }
}
// The sum of every thread's v over the block (each warp's, then the warps' in order), for
// every thread. Once per kernel: its shared buffer is not reused.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float red[32];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < (int)blockDim.x / 32; ++i) s += red[i];
  return s;
}
// Residual add then RMSNorm of the sum, one block per row: s = x + y (rounded to T, as the
// separate add would), out = s / sqrt(mean(s^2) + eps) * w. Writes s to out[0] and the norm
// to out[1] of a [2, t, h] output. 16-byte vectors: thread i holds vectors i,
// i + blockDim.x, ... (at most NORM_VECS of them) in registers; the norm's weights load
// before `pdl_begin`. h is a multiple of the vector and rows start 16-byte aligned
// (`AddRmsNorm` checks).
template <typename T>
__device__ void add_rmsnorm(const T *__restrict__ x, const T *__restrict__ y,
                            const T *__restrict__ w, T *__restrict__ out, int t, int h,
                            float eps) {
  constexpr int VEC = 16 / sizeof(T);
  const int nvec = h / VEC;
  uint4 wv[NORM_VECS], sv[NORM_VECS];
  load_norm_weight(w, nvec, wv);
  pdl_begin();
  const long row = blockIdx.x;
  const uint4 *xr = reinterpret_cast<const uint4 *>(x + row * h);
  const uint4 *yr = reinterpret_cast<const uint4 *>(y + row * h);
  uint4 *sr = reinterpret_cast<uint4 *>(out + row * h);
  uint4 *nr = reinterpret_cast<uint4 *>(out + ((long)t + row) * h);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      const uint4 a = xr[i], b = yr[i];
      const T *pa = reinterpret_cast<const T *>(&a), *pb = reinterpret_cast<const T *>(&b);
      T *ps = reinterpret_cast<T *>(&sv[k]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        ps[e] = from_f32<T>(to_f32(pa[e]) + to_f32(pb[e]));
        const float f = to_f32(ps[e]);
        ss += f * f;
      }
      sr[i] = sv[k];
    }
  }
  const float scale = rsqrtf(block_sum(ss) / h + eps);
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      const T *ps = reinterpret_cast<const T *>(&sv[k]), *pw = reinterpret_cast<const T *>(&wv[k]);
      uint4 o;
      T *po = reinterpret_cast<T *>(&o);
#pragma unroll
      for (int e = 0; e < VEC; ++e) po[e] = from_f32<T>(to_f32(ps[e]) * scale * to_f32(pw[e]));
      nr[i] = o;
    }
  }
}

#define ADD_RMSNORM(NAME, T)                                                                   \
  extern "C" __global__ void NAME(const T *x, const T *y, const T *w, T *out, int t, int h,   \
                                  float eps) {                                                 \
    add_rmsnorm<T>(x, y, w, out, t, h, eps);                                                   \
  }
ADD_RMSNORM(add_rmsnorm_f32, float)
ADD_RMSNORM(add_rmsnorm_bf16, __nv_bfloat16)
ADD_RMSNORM(add_rmsnorm_f16, __half)

// A post-norm's residual add (Gemma's sandwich norms in a folded step), one block per row:
// out = x + n with n = y / sqrt(mean(y^2) + eps) * w rounded to T (as candle's rms_norm
// rounds it) and the sum rounded once (as the separate add would). [t, h] rows; vectors and
// alignment as `add_rmsnorm`'s.
template <typename T>
__device__ void add_normed(const T *__restrict__ x, const T *__restrict__ y,
                           const T *__restrict__ w, T *__restrict__ out, int h, float eps) {
  constexpr int VEC = 16 / sizeof(T);
  const int nvec = h / VEC;
  uint4 wv[NORM_VECS], xv[NORM_VECS], yv[NORM_VECS];
  load_norm_weight(w, nvec, wv);
  pdl_begin();
  const long row = blockIdx.x;
  const uint4 *xr = reinterpret_cast<const uint4 *>(x + row * h);
  const uint4 *yr = reinterpret_cast<const uint4 *>(y + row * h);
  uint4 *orow = reinterpret_cast<uint4 *>(out + row * h);
  float ss = 0.f;
  // x loads beside y (one round trip before the reduction, none after it).
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      xv[k] = xr[i];
      yv[k] = yr[i];
      const T *py = reinterpret_cast<const T *>(&yv[k]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float f = to_f32(py[e]);
        ss += f * f;
      }
    }
  }
  const float scale = rsqrtf(block_sum(ss) / h + eps);
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      const T *pa = reinterpret_cast<const T *>(&xv[k]), *py = reinterpret_cast<const T *>(&yv[k]),
              *pw = reinterpret_cast<const T *>(&wv[k]);
      uint4 o;
      T *po = reinterpret_cast<T *>(&o);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float n = to_f32(from_f32<T>(to_f32(py[e]) * scale * to_f32(pw[e])));
        po[e] = from_f32<T>(to_f32(pa[e]) + n);
      }
      orow[i] = o;
    }
  }
}

#define ADD_NORMED(NAME, T)                                                                    \
  extern "C" __global__ void NAME(const T *x, const T *y, const T *w, T *out, int h,          \
                                  float eps) {                                                 \
    add_normed<T>(x, y, w, out, h, eps);                                                       \
  }
ADD_NORMED(add_normed_f32, float)
ADD_NORMED(add_normed_bf16, __nv_bfloat16)
ADD_NORMED(add_normed_f16, __half)

// Argmax of each row of a contiguous [rows, n]: one block per row; the first index of the
// largest value on ties (as the host's argmax and torch's), NaN never wins. out: u32. Half
// precision rows compare as their exact f32 values, so a bf16 row's argmax is its f32 cast's.
template <typename T>
__device__ void argmax_rows(const T *__restrict__ x, uint32_t *__restrict__ out, int n) {
  pdl_begin();
  const T *r = x + (long)blockIdx.x * n;
  float best = -INFINITY;
  int idx = n;  // past the end: "none yet"
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = to_f32(r[j]);
    if (v > best || (idx == n && v == best)) {
      best = v;
      idx = j;
    }
  }
  // Reduce (best, idx): larger value, then smaller index.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (b2 > best || (b2 == best && i2 < idx)) {
      best = b2;
      idx = i2;
    }
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sb[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x + 31) / 32; ++w)
      if (sb[w] > best || (sb[w] == best && si[w] < idx)) {
        best = sb[w];
        idx = si[w];
      }
    out[blockIdx.x] = idx < n ? (uint32_t)idx : 0u;
  }
}
#define ARGMAX_ROWS(NAME, T)                                                                   \
  extern "C" __global__ void NAME(const T *x, uint32_t *out, int n) { argmax_rows<T>(x, out, n); }
ARGMAX_ROWS(argmax_rows_f32, float)
ARGMAX_ROWS(argmax_rows_bf16, __nv_bfloat16)
ARGMAX_ROWS(argmax_rows_f16, __half)

// The same argmax with each row split over gridDim.x blocks (a large vocabulary: one block
// per row read a 262k-entry row at ~10 GB/s, 0.11 ms of a Gemma-3-4B step). Block b of row
// blockIdx.y takes the columns [b * chunk, (b + 1) * chunk) and writes its (largest value,
// first index) to part[row * gridDim.x + b]; the last block of the row to finish (a count in
// argmax_done, reset for the next launch) combines the partials in block order under the
// same rule. Larger value, then smaller index, is a total order on the candidates (NaN never
// wins), so the result is exactly the one-block kernel's. Rows ≤ ARGMAX_COUNTERS.
constexpr int ARGMAX_COUNTERS = 64;
__device__ unsigned int argmax_done[ARGMAX_COUNTERS];
template <typename T>
__device__ void argmax_rows_split(const T *__restrict__ x, uint32_t *__restrict__ out, int n,
                                  int chunk, int2 *__restrict__ part) {
  pdl_begin();
  const int row = blockIdx.y, b = blockIdx.x;
  const T *r = x + (long)row * n;
  const int lo = b * chunk, hi = min(n, lo + chunk);
  float best = -INFINITY;
  int idx = n;  // past the end: "none yet"
  for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
    const float v = to_f32(r[j]);
    if (v > best || (idx == n && v == best)) {
      best = v;
      idx = j;
    }
  }
  const auto take = [&](float b2, int i2) {
    if (i2 < n && (idx == n || b2 > best || (b2 == best && i2 < idx))) {
      best = b2;
      idx = i2;
    }
  };
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    take(b2, i2);
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  __shared__ bool last;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sb[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x + 31) / 32; ++w) take(sb[w], si[w]);
    part[(long)row * gridDim.x + b] = make_int2(__float_as_int(best), idx);
    __threadfence();
    last = atomicAdd(&argmax_done[row], 1u) + 1 == gridDim.x;
    if (last) argmax_done[row] = 0u;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  best = -INFINITY;
  idx = n;
  for (int p = 0; p < (int)gridDim.x; ++p) {
    const int2 v = __ldcg(part + (long)row * gridDim.x + p);
    take(__int_as_float(v.x), v.y);
  }
  out[row] = idx < n ? (uint32_t)idx : 0u;
}
#define ARGMAX_ROWS_SPLIT(NAME, T)                                                             \
  extern "C" __global__ void NAME(const T *x, uint32_t *out, int n, int chunk, int2 *part) {   \
    argmax_rows_split<T>(x, out, n, chunk, part);                                              \
  }
ARGMAX_ROWS_SPLIT(argmax_rows_split_f32, float)
ARGMAX_ROWS_SPLIT(argmax_rows_split_bf16, __nv_bfloat16)
ARGMAX_ROWS_SPLIT(argmax_rows_split_f16, __half)

// Copies row `src` of head h of the k and v buffers of table entry `e` (addresses e[0], e[1],
// head stride e[4] bytes) to row `dst` of head h of e[2], e[3] (head stride e[5]): rows of
// `chunks` 16-byte vectors, the block's threads taking every blockDim.x-th vector.
__device__ __forceinline__ void commit_row(const long long *e, int h, long long src,
                                           long long dst, int chunks) {
  const long long row = (long long)chunks * 16;
  const uint4 *sk = reinterpret_cast<const uint4 *>((const char *)e[0] + h * e[4] + src * row);
  const uint4 *sv = reinterpret_cast<const uint4 *>((const char *)e[1] + h * e[4] + src * row);
  uint4 *dk = reinterpret_cast<uint4 *>((char *)e[2] + h * e[5] + dst * row);
  uint4 *dv = reinterpret_cast<uint4 *>((char *)e[3] + h * e[5] + dst * row);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    dk[c] = sk[c];
    dv[c] = sv[c];
  }
}

// The commit of a speculation's accepted K/V from the side buffers of a model's staged rings
// into the rings, every layer in one launch (`commit.rs`): layer l's entry of `table` (eight
// 64-bit values) is the side buffer's k and v, the ring's k and v (byte addresses), their head
// strides in bytes, the ring slot of the first row and the ring's slots; row i of head h goes
// from side slot i to ring slot (first + i) % slots. A row is `chunks` 16-byte vectors.
// Grid: x = layers, y = heads, z = rows kept. Block: any width.
extern "C" __global__ void staged_commit(const long long *__restrict__ table, int chunks) {
  pdl_begin();
  const long long *e = table + blockIdx.x * 8;
  const int i = blockIdx.z;
  commit_row(e, blockIdx.y, i, (e[6] + i) % e[7], chunks);
}

// The commit of a token tree's accepted path in every layer in one launch (`commit.rs`):
// layer l's entry of `table` (ten 64-bit values) is the source's k and v, the destination's k
// and v (byte addresses; the same buffers for a KV cache or a slack ring), their head strides
// in bytes, the source's slot of node 0 and its slots, the destination's slot of the first
// kept row and its slots; `path` (n entries, after the layers' entries) lists the kept nodes.
// Row i of head h goes from source slot (src0 + path[i]) % src_slots to destination slot
// (dst0 + i) % dst_slots, rows in increasing i: a path increases strictly, so with one buffer
// a row is read before any later row is written over it (path[i] >= i), and the block's
// barrier between rows orders them. Grid: x = layers, y = heads. Block: any width.
extern "C" __global__ void path_commit(const long long *__restrict__ table, int layers, int n,
                                       int chunks) {
  pdl_begin();
  const long long *e = table + blockIdx.x * 10;
  const long long *path = table + (long long)layers * 10;
  for (int i = 0; i < n; ++i) {
    const long long src = (e[6] + path[i]) % e[7], dst = (e[8] + i) % e[9];
    if (e[0] != e[2] || src != dst) commit_row(e, blockIdx.y, src, dst, chunks);
    __syncthreads();
  }
}
