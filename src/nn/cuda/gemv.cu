// GEMVs of decode and verification steps (`dense.rs`): the CUDA-core kernel, and the
// tensor-core kernel with its folds (norm before, residual add after, SiLU gate).
#pragma once
#include "common.cuh"

// y[r, o] = sum_i x[r, i] w[o, i] for a few rows r < R: the product of decode and
// verification steps, where reading w once is the whole cost. One warp per OUTS consecutive
// outputs (each slice of x a lane loads, small and cached, serves OUTS rows of w); lanes
// walk the rows of w in 16-byte loads, UNROLL chunks deep so several are in flight; sums in
// f32. Every lane adds its chunks in increasing order and the warp sum is the same tree, so
// a row's result does not depend on R, OUTS or UNROLL: a 1-row decode and a verification
// block give bitwise the same logits for the same row.
// Grid: x = out / (OUTS * GEMV_WARPS) (rounded up). Block: GEMV_WARPS warps.
constexpr int GEMV_WARPS = 4;
template <typename T, int R, int OUTS, int UNROLL>
__device__ void gemv(const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y,
                     int in, int out) {
  constexpr int V = 16 / sizeof(T);
  constexpr int STEP = 32 * V;
  const int lane = threadIdx.x % 32;
  const int o0 = (blockIdx.x * GEMV_WARPS + threadIdx.x / 32) * OUTS;
  if (o0 >= out) return;
  float acc[OUTS][R];
#pragma unroll
  for (int k = 0; k < OUTS; ++k)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[k][r] = 0.f;
  int c = lane * V;
  for (; c + (UNROLL - 1) * STEP < in; c += UNROLL * STEP) {
    float wv[UNROLL][OUTS][V];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int k = 0; k < OUTS; ++k)
        load_vec<T, V>(w + (long)(o0 + k) * in + c + u * STEP, wv[u][k]);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xv[V];
        load_vec<T, V>(x + (long)r * in + c + u * STEP, xv);
#pragma unroll
        for (int k = 0; k < OUTS; ++k)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[k][r] += wv[u][k][e] * xv[e];
      }
  }
  for (; c < in; c += STEP) {
    float wv[OUTS][V];
#pragma unroll
    for (int k = 0; k < OUTS; ++k) load_vec<T, V>(w + (long)(o0 + k) * in + c, wv[k]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float xv[V];
      load_vec<T, V>(x + (long)r * in + c, xv);
#pragma unroll
      for (int k = 0; k < OUTS; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[k][r] += wv[k][e] * xv[e];
    }
  }
#pragma unroll
  for (int k = 0; k < OUTS; ++k)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = warp_sum(acc[k][r]);
      if (lane == 0) y[(long)r * out + o0 + k] = from_f32<T>(s);
    }
}

// One and two rows: one output per warp, 4 chunks deep (the most loads in flight); more
// rows: 2 outputs per warp, 4 deep (each x slice loaded serves two rows of w).
#define GEMV(NAME, T, R)                                                                       \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                \
      NAME(const T *x, const T *w, T *y, int in, int out) {                                    \
    pdl_begin();                                                                               \
    if (R <= 2)                                                                                \
      gemv<T, R, 1, 4>(x, w, y, in, out);                                                      \
    else                                                                                       \
      gemv<T, R, 2, 4>(x, w, y, in, out);                                                      \
  }
#define GEMV_ROWS(T, NAME)                                                                     \
  GEMV(gemv_##NAME##_r1, T, 1)                                                                 \
  GEMV(gemv_##NAME##_r2, T, 2)                                                                 \
  GEMV(gemv_##NAME##_r3, T, 3)                                                                 \
  GEMV(gemv_##NAME##_r4, T, 4)                                                                 \
  GEMV(gemv_##NAME##_r5, T, 5)                                                                 \
  GEMV(gemv_##NAME##_r6, T, 6)                                                                 \
  GEMV(gemv_##NAME##_r7, T, 7)                                                                 \
  GEMV(gemv_##NAME##_r8, T, 8)                                                                 \
  GEMV(gemv_##NAME##_r9, T, 9)                                                                 \
  GEMV(gemv_##NAME##_r10, T, 10)                                                               \
  GEMV(gemv_##NAME##_r11, T, 11)                                                               \
  GEMV(gemv_##NAME##_r12, T, 12)                                                               \
  GEMV(gemv_##NAME##_r13, T, 13)                                                               \
  GEMV(gemv_##NAME##_r14, T, 14)                                                               \
  GEMV(gemv_##NAME##_r15, T, 15)                                                               \
  GEMV(gemv_##NAME##_r16, T, 16)
GEMV_ROWS(float, f32)
GEMV_ROWS(__nv_bfloat16, bf16)
GEMV_ROWS(__half, f16)

// The same product on tensor cores for bf16 / f16 and up to 16 rows: the weight is the mma's
// A operand (16 outputs x 16 inputs), the rows its B operand (16 inputs x 8 rows, one n-tile
// per 8 rows, NT of them). Each lane loads 16 bytes of two weight rows (outputs grp and
// grp + 8) and of one x row per 32-input chunk: the mma's k order is a permutation of the
// chunk's inputs, the same for A and B, so the dot products are exact sums of the chunk.
// Block: WARPS warps on 16 outputs (more warps where there are few outputs, so enough loads
// are in flight), warp w taking chunks w, w + WARPS, ... (the block reads 512 contiguous
// bytes of each row per step), GEMV_TC_UNROLL chunks in flight per warp. Each warp adds its
// chunks in order,
// then the warps' partial sums are added in warp order: nothing in a row's sums depends on
// how many rows there are, so a decode step and a verification row compute bitwise the
// same outputs.
// GATE (the gated MLP's activation inside the gate/up product: GATE_SILU or GATE_GELU, GELU
// with the tanh approximation): w is the fused [2 out, in]
// gate/up weight (gate rows, then up rows) and y[r, o] = act(g) * u of the rounded products
// g = x w[o], u = x w[out + o], exactly what `gate_mul` computes from the plain product: the
// block takes 8 gate rows as the mma's A rows 0-7 and the matching up rows as rows 8-15, so
// one thread holds both sums of an output.
// MODE folds the layer's residual stream into the product, so that no norm kernel runs
// between them (each such kernel costs a launch and a chain of round trips, ~2 us a call):
// - GEMV_NORM: x is the residual stream s before its RMSNorm (weight `aux`, epsilon `eps`)
//   and the product is taken of norm(s) = s r g with the row's scalar r = rsqrt(mean(s^2) +
//   eps) pulled out of the sum: y = r (w . round(s g)) (g staged in dynamic shared memory,
//   `in` elements, before the PDL wait). Each warp takes s^2 over the chunks
//   it loads anyway on the tensor cores (the diagonal of s s^T: one more mma per two), then
//   the warps add in order, so r, like every product, depends on the row alone. Not bitwise
//   the unfused norm-then-product (that rounds s r g, this rounds s g): one rounding either
//   way (docs/kernel-notes.md, "GEMV folds").
// - GEMV_RESID: y = round(aux + round(w . x)), the residual add after the product, in the
//   arithmetic of `add_rmsnorm`'s sum (aux: [rows, out], the residual stream).
// `bias` ([out], or null; not gated): added to each rounded product as a separate add of
// two 16-bit tensors adds (`__hadd`): y = round(w . x) + b, Qwen2's q/k/v biases.
// `in` is a multiple of 32. Grid: x = ceil(out / 16) (GATED: ceil(out / 8)). Block:
// WARPS * 32.
constexpr int GEMV_PLAIN = 0, GEMV_NORM = 1, GEMV_RESID = 2;
constexpr int GATE_NONE = 0, GATE_SILU = 1, GATE_GELU = 2;
// Eight elements times eight, each product rounded once (as from_f32(to_f32(a) * to_f32(b)):
// the product of two 16-bit floats is exact in f32).
template <typename T> __device__ __forceinline__ uint4 mul8(uint4 a, uint4 b);
template <> __device__ __forceinline__ uint4 mul8<__nv_bfloat16>(uint4 a, uint4 b) {
  uint4 r;
  const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a),
                       *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
  __nv_bfloat162 *pr = reinterpret_cast<__nv_bfloat162 *>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) pr[i] = __hmul2(pa[i], pb[i]);
  return r;
}
template <> __device__ __forceinline__ uint4 mul8<__half>(uint4 a, uint4 b) {
  uint4 r;
  const __half2 *pa = reinterpret_cast<const __half2 *>(&a), *pb = reinterpret_cast<const __half2 *>(&b);
  __half2 *pr = reinterpret_cast<__half2 *>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) pr[i] = __hmul2(pa[i], pb[i]);
  return r;
}
constexpr int GEMV_TC_UNROLL = 4;
// V: 16-byte loads per lane and weight row per chunk (chunks of 32 V inputs; a row's four
// lanes read 64 V contiguous bytes, more bytes in flight a request). (No L2 prefetch of each
// warp's first chunks before `pdl_begin`: it was slower. docs/kernel-notes.md, "GEMV".)
template <typename T, int NT, int WARPS, int GATE, int V, int MODE>
__device__ void gemv_tc(const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y,
                        int rows, int in, int out, const T *__restrict__ aux, float eps,
                        const T *__restrict__ bias) {
  constexpr bool GATED = GATE != GATE_NONE;
  constexpr int U = GEMV_TC_UNROLL / V;  // chunks in flight per warp
  constexpr int CH = 32 * V;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, grp = lane / 4, tig = lane % 4;
  const int o0 = blockIdx.x * (GATED ? 8 : 16);
  const long row_a = min(o0 + grp, out - 1);
  const long row_b = GATED ? out + row_a : min(o0 + grp + 8, out - 1);
  const T *wa = w + row_a * in + 8 * V * tig;
  const T *wb = w + row_b * in + 8 * V * tig;
  // This warp's chunks (of CH inputs): first, first + step, ... below end.
  const int first = warp, end = in / CH, step = WARPS;
  // A chunk this warp may always read (a warp past the end has none of its own).
  const int safe = first < end ? first : 0;
  uint4 a0[U][V], a1[U][V];
  // Loads of the weight chunks from `ch` on (unconditional: a chunk past the end reads a safe
  // one again and is skipped), all in flight before the first mma.
  auto load_w = [&](int ch) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = ch + u * step;
      const int k = (cu < end ? cu : safe) * CH;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        a0[u][j] = __ldg(reinterpret_cast<const uint4 *>(wa + k) + j);
        a1[u][j] = __ldg(reinterpret_cast<const uint4 *>(wb + k) + j);
      }
    }
  };
  // The first chunks are weights, which no kernel writes: they load before `pdl_begin`, while
  // the kernel ahead (a norm, the attention) finishes. So does GEMV_NORM's norm weight, into
  // shared memory (`in` elements, dynamic: registers holding it beside the weight chunks cost
  // a block per SM).
  extern __shared__ uint4 gsm[];
  if (MODE == GEMV_NORM)
    for (int i = threadIdx.x; i < in / 8; i += blockDim.x)
      gsm[i] = __ldg(reinterpret_cast<const uint4 *>(aux) + i);
  load_w(first);
  if (MODE == GEMV_NORM) __syncthreads();
  pdl_begin();
  const T *xr[NT];
  bool xlive[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    xlive[n] = n * 8 + grp < rows;
    xr[n] = x + (long)min(n * 8 + grp, rows - 1) * in + 8 * V * tig;
  }
  float c[NT][4];
  // GEMV_NORM: s s^T of the n-tile's rows over this warp's chunks (its diagonal: sum s^2).
  float ss[MODE == GEMV_NORM ? NT : 1][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
  for (int n = 0; n < (MODE == GEMV_NORM ? NT : 1); ++n) ss[n][0] = ss[n][1] = ss[n][2] = ss[n][3] = 0.f;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int ch = first; ch < end; ch += step * U) {
    if (ch != first) load_w(ch);
    uint4 b[NT][U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = ch + u * step;
      const int k = (cu < end ? cu : safe) * CH;
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int n = 0; n < NT; ++n) b[n][u][j] = reinterpret_cast<const uint4 *>(xr[n] + k)[j];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (ch + u * step >= end) break;  // warp-uniform
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          uint4 bb = xlive[n] ? b[n][u][j] : zero;
          if (MODE == GEMV_NORM) {
            // s^2 on the tensor cores: with s's own fragment as A's rows 0-7 (rows 8-15
            // zero), C[i][i] = s_i . s_i over this chunk; then bb = round(s g), one rounding
            // of the exact product as `from_f32(to_f32(s) * to_f32(g))`.
            mma16816<T>(ss[n], bb.x, 0u, bb.y, 0u, bb.x, bb.y);
            mma16816<T>(ss[n], bb.z, 0u, bb.w, 0u, bb.z, bb.w);
            bb = mul8<T>(bb, gsm[((ch + u * step) * CH + 8 * V * tig) / 8 + j]);
          }
          const uint4 &p = a0[u][j], &q = a1[u][j];
          mma16816<T>(c[n], p.x, q.x, p.y, q.y, bb.x, bb.y);
          mma16816<T>(c[n], p.z, q.z, p.w, q.w, bb.z, bb.w);
        }
    }
  }
  __shared__ float red[WARPS][NT][32][4];
  __shared__ float rss[MODE == GEMV_NORM ? WARPS : 1][NT][8];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][n][lane][e] = c[n][e];
    // C[i][i] sits at lane 4 i + i / 2, element i % 2; the warps add in order below.
    if (MODE == GEMV_NORM && tig == grp / 2) rss[warp][n][grp] = ss[n][grp % 2];
  }
  __syncthreads();
  // GEMV_NORM: the row's 1 / rms (else 1).
  auto scale = [&](int r) {
    if (MODE != GEMV_NORM) return 1.f;
    float t = 0.f;
#pragma unroll
    for (int wi = 0; wi < WARPS; ++wi) t += rss[wi][r / 8][r % 8];
    return rsqrtf(t / in + eps);
  };
  // c's layout: A row a (0-15) and row r (0-15) of n-tile r / 8 sit at lane
  // 4 * (a % 8) + (r % 8) / 2, element 2 * (a / 8) + r % 2.
  auto sum = [&](int a, int r) {
    const int n = r / 8, col = r % 8;
    const int l = (a % 8) * 4 + col / 2, e = (a / 8) * 2 + col % 2;
    float s = 0.f;
#pragma unroll
    for (int wi = 0; wi < WARPS; ++wi) s += red[wi][n][l][e];
    return s;
  };
  if (GATED) {
    // Thread i < 128 takes output o0 + i / 16 of row i % 16.
    const int o = threadIdx.x / 16, r = threadIdx.x % 16;
    if (threadIdx.x < 128 && r / 8 < NT && r < rows && o0 + o < out) {
      const float sc = scale(r);
      const float g = to_f32(from_f32<T>(sum(o, r) * sc));
      const float u = to_f32(from_f32<T>(sum(o + 8, r) * sc));
      // `gate_mul`'s arithmetic (elementwise.cu).
      const float a = GATE == GATE_GELU
                          ? 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)))
                          : g / (1.f + __expf(-g));
      y[(long)r * out + o0 + o] = from_f32<T>(a * u);
    }
  } else {
    // Thread i < 256 takes output o0 + i / 16 of row i % 16.
    const int o = threadIdx.x / 16, r = threadIdx.x % 16;
    if (threadIdx.x < 256 && r / 8 < NT && r < rows && o0 + o < out) {
      const long at = (long)r * out + o0 + o;
      T p = from_f32<T>(sum(o, r) * scale(r));
      if (bias != nullptr) p = __hadd(p, bias[o0 + o]);
      y[at] = MODE == GEMV_RESID ? from_f32<T>(to_f32(aux[at]) + to_f32(p)) : p;
    }
  }
}

// One-tile blocks of 8 or 16 warps are held to 64 registers a thread (two 16-warp blocks or
// four 8-warp blocks an SM): GEMV_NORM took ~90 unasked, and the plain and residual kernels
// 68-70 once GEMV_NORM's norm weight moved to shared memory, which ran the 8B-shaped target's
// 256-block products in two waves (docs/kernel-notes.md, "GEMV: register cap").
#define GEMV_TC1(NAME, T, NT, W, GATE, V, MODE)                                               \
  extern "C" __global__ void __launch_bounds__(W * 32, NT == 1 && W < 32 ? 1024 / (W * 32) : 1) \
      NAME(const T *x, const T *w, T *y, int rows, int in, int out, const T *aux, float eps,   \
           const T *bias) {                                                                    \
    gemv_tc<T, NT, W, GATE, V, MODE>(x, w, y, rows, in, out, aux, eps, bias);                  \
  }
// Kernel names: gemv_tc_[silu_|gelu_][norm_|resid_]<dtype>_n<NT>_w<W>_v<V> (GELU-gated with
// the norm folded only: Gemma's MLP in a folded step).
#define GEMV_TC_M(T, NAME, NT, W, V)                                                           \
  GEMV_TC1(gemv_tc_##NAME##_n##NT##_w##W##_v##V, T, NT, W, GATE_NONE, V, GEMV_PLAIN)           \
  GEMV_TC1(gemv_tc_norm_##NAME##_n##NT##_w##W##_v##V, T, NT, W, GATE_NONE, V, GEMV_NORM)       \
  GEMV_TC1(gemv_tc_resid_##NAME##_n##NT##_w##W##_v##V, T, NT, W, GATE_NONE, V, GEMV_RESID)     \
  GEMV_TC1(gemv_tc_silu_##NAME##_n##NT##_w##W##_v##V, T, NT, W, GATE_SILU, V, GEMV_PLAIN)      \
  GEMV_TC1(gemv_tc_silu_norm_##NAME##_n##NT##_w##W##_v##V, T, NT, W, GATE_SILU, V, GEMV_NORM)  \
  GEMV_TC1(gemv_tc_gelu_norm_##NAME##_n##NT##_w##W##_v##V, T, NT, W, GATE_GELU, V, GEMV_NORM)
#define GEMV_TC_W(T, NAME, NT, V)                                                              \
  GEMV_TC_M(T, NAME, NT, 8, V) GEMV_TC_M(T, NAME, NT, 16, V) GEMV_TC_M(T, NAME, NT, 32, V)
#define GEMV_TC(T, NAME, NT) GEMV_TC_W(T, NAME, NT, 1) GEMV_TC_W(T, NAME, NT, 2)
GEMV_TC(__nv_bfloat16, bf16, 1)
GEMV_TC(__nv_bfloat16, bf16, 2)
GEMV_TC(__half, f16, 1)
GEMV_TC(__half, f16, 2)
