// Attention of long blocks (prefills, `prefill.rs`): the causal softmax of a prefill chunk's
// scores in place, and flash attention on tensor cores.
#pragma once
#include "common.cuh"

// Causal softmax of attention scores in place, for a prefill chunk's scores
// [kv_heads * group * rows, keys] (rows of one head consecutive): row r of its head is the
// query at key index `first + r` and sees key j iff j <= first + r and, with a sliding
// `window` > 0, j > first + r - window. Hidden keys get probability 0. Optional `tanh`
// softcap first. f32 arithmetic; one block per row.
template <typename T>
__device__ void causal_softmax(T *__restrict__ x, int rows, int keys, int first, int window,
                               float softcap) {
  const long row_id = blockIdx.x;
  const int r = (int)(row_id % rows);
  T *p = x + row_id * keys;
  const int hi = min(keys, first + r + 1);
  const int lo = window > 0 ? max(0, first + r + 1 - window) : 0;
  __shared__ float red[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  auto logit = [&](int j) {
    const float s = to_f32(p[j]);
    return softcap > 0.f ? tanhf(s / softcap) * softcap : s;
  };
  // One pass for the max and the sum (online: each thread rescales its running sum when
  // its max grows), then the threads' pairs combine.
  float m = -INFINITY, sum = 0.f;
  for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
    const float s = logit(j);
    if (s > m) {
      sum = sum * __expf(m - s) + 1.f;
      m = s;
    } else {
      sum += __expf(s - m);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, sum, o);
    const float mm = fmaxf(m, m2);
    sum = (m == -INFINITY ? 0.f : sum * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mm));
    m = mm;
  }
  __shared__ float red_s[32];
  if (lane == 0) {
    red[warp] = m;
    red_s[warp] = sum;
  }
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, red[w]);
  sum = 0.f;
  for (int w = 0; w < warps; ++w)
    if (red[w] > -INFINITY) sum += red_s[w] * __expf(red[w] - m);
  const float inv = 1.f / sum;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const float prob = (j >= lo && j < hi) ? __expf(logit(j) - m) * inv : 0.f;
    p[j] = from_f32<T>(prob);
  }
}

#define CAUSAL_SOFTMAX(NAME, T)                                                                \
  extern "C" __global__ void NAME(T *x, int rows, int keys, int first, int window,            \
                                  float softcap) {                                             \
    pdl_begin();                                                                               \
    causal_softmax<T>(x, rows, keys, first, window, softcap);                                  \
  }

CAUSAL_SOFTMAX(causal_softmax_f32, float)
CAUSAL_SOFTMAX(causal_softmax_bf16, __nv_bfloat16)
CAUSAL_SOFTMAX(causal_softmax_f16, __half)

// Flash attention of a long block of queries (a prefill): the t queries are the newest t of
// `len` keys (query i at key index len - t + i, seeing key j iff j <= len - t + i and, with
// a sliding `window` > 0, j > len - t + i - window), with an optional `tanh` softcap. The
// [t, len] scores never leave registers: per 64-query tile, key tiles of 64 stream through
// shared memory (cp.async, K of the next tile loading while P V runs), S = Q K^T and O += P V
// on tensor cores, online softmax in f32. bf16 / f16 only (the mma types); P is rounded to
// T for its product, as FlashAttention does.
//
// q: [heads, t, D] at q[h * q_head_stride + i * q_row_stride + e] (the softmax scale
// already applied); k, v: cache views [kv_heads, len, D] at k[g * kv_head_stride + j * D + e]
// (16-byte aligned rows); out: [t, heads * D].
// Grid: x = heads, y = query tiles (heaviest causal tiles first). Block: 4 warps, warp w
// owns the tile's query rows 16 w .. 16 w + 15.
constexpr int FA_WARPS = 4, FA_Q = 16 * FA_WARPS, FA_K = 64;
template <typename T, int D>
__device__ void flash_attn(const T *__restrict__ q, const T *__restrict__ k,
                           const T *__restrict__ v, T *__restrict__ out, int t, int len,
                           int heads, int group, long q_head_stride, long q_row_stride,
                           long kv_head_stride, int window, float softcap) {
  constexpr int PAD = D + 8;  // row stride of the tiles: conflict-free fragment reads
  constexpr int KS = D / 16;  // k-steps of Q K^T
  constexpr int NT = D / 8;   // n-tiles of O
  __shared__ __align__(16) T ks[FA_K][PAD];
  __shared__ __align__(16) T vs[FA_K][PAD];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int grp = lane / 4, tig = lane % 4;
  const int head = blockIdx.x, kvh = head / group;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int r0 = tile * FA_Q;
  const int first = len - t;  // key index of query 0
  const float LOG2E = 1.4426950408889634f;

  // This warp's Q rows as A fragments (rows past t are zeros).
  uint32_t qa[KS][4];
  {
    const int ra = r0 + warp * 16 + grp, rb = ra + 8;
    const T *qh = q + (long)head * q_head_stride;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const int c = s * 16 + 2 * tig;
      auto ld = [&](int r, int col) -> uint32_t {
        return r < t ? *reinterpret_cast<const uint32_t *>(qh + (long)r * q_row_stride + col) : 0u;
      };
      qa[s][0] = ld(ra, c);
      qa[s][1] = ld(rb, c);
      qa[s][2] = ld(ra, c + 8);
      qa[s][3] = ld(rb, c + 8);
    }
  }

  // Key tiles this query tile can see.
  const int r_last = min(t, r0 + FA_Q) - 1;
  const int hi = first + r_last + 1;
  const int lo = window > 0 ? max(0, first + r0 + 1 - window) : 0;
  const int kt0 = lo / FA_K * FA_K;
  const T *kh = k + (long)kvh * kv_head_stride, *vh = v + (long)kvh * kv_head_stride;
  constexpr int VEC = 8;  // elements per 16-byte copy
  auto load_tile = [&](T (*dst)[PAD], const T *src, int kt) {
    for (int idx = threadIdx.x; idx < FA_K * D / VEC; idx += FA_WARPS * 32) {
      const int r = idx / (D / VEC), c = idx % (D / VEC) * VEC;
      const int j = kt + r;
      cp_async16(&dst[r][c], src + (long)min(j, len - 1) * D + c, j < len);
    }
  };

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Running max (log2 units) and partial sum of the rows grp and grp + 8.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int qi[2] = {first + r0 + warp * 16 + grp, first + r0 + warp * 16 + grp + 8};

  load_tile(ks, kh, kt0);
  cp_async_commit();
  load_tile(vs, vh, kt0);
  cp_async_commit();
  for (int kt = kt0; kt < hi; kt += FA_K) {
    cp_async_wait<1>();  // K of this tile
    __syncthreads();
    float s[FA_K / 8][4];
#pragma unroll
    for (int n = 0; n < FA_K / 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const T *kr = &ks[n * 8 + grp][2 * tig];
#pragma unroll
      for (int st = 0; st < KS; ++st) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t *>(kr + st * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t *>(kr + st * 16 + 8);
        mma16816<T>(s[n], qa[st], b0, b1);
      }
    }
    __syncthreads();  // every warp is done with ks
    if (kt + FA_K < hi) load_tile(ks, kh, kt + FA_K);
    cp_async_commit();

    // Mask, softcap, online softmax (rows grp, grp + 8; a quad of lanes shares a row).
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < FA_K / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kt + n * 8 + 2 * tig + (e & 1), row = e >> 1;
        float x = s[n][e];
        if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
        const bool vis = j < len && j <= qi[row] && (window <= 0 || j > qi[row] - window);
        x = vis ? x * LOG2E : -INFINITY;
        s[n][e] = x;
        tmax[row] = fmaxf(tmax[row], x);
      }
    float corr[2];
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      tmax[row] = fmaxf(tmax[row], __shfl_xor_sync(0xffffffffu, tmax[row], 1));
      tmax[row] = fmaxf(tmax[row], __shfl_xor_sync(0xffffffffu, tmax[row], 2));
      const float m_new = fmaxf(m[row], tmax[row]);
      corr[row] = m_new == -INFINITY ? 1.f : exp2f(m[row] - m_new);
      m[row] = m_new;
      l[row] *= corr[row];
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
#pragma unroll
    for (int n = 0; n < FA_K / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e >> 1;
        const float p = m[row] == -INFINITY ? 0.f : exp2f(s[n][e] - m[row]);
        s[n][e] = p;
        l[row] += p;
      }

    cp_async_wait<1>();  // V of this tile
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < FA_K / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const T *vr = &vs[kk * 16 + (lane % 8) + ((lane / 8) & 1) * 8][(lane / 16) * 8];
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        uint32_t b[4];
        ldsm_x4_trans(b, vr + n * 8);
        mma16816<T>(o[n], pa, b[0], b[1]);
        mma16816<T>(o[n + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with vs
    if (kt + FA_K < hi) load_tile(vs, vh, kt + FA_K);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // Normalise and write rows grp, grp + 8 of this warp.
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    l[row] += __shfl_xor_sync(0xffffffffu, l[row], 1);
    l[row] += __shfl_xor_sync(0xffffffffu, l[row], 2);
  }
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    const int r = r0 + warp * 16 + grp + row * 8;
    if (r >= t) continue;
    const float inv = l[row] > 0.f ? 1.f / l[row] : 0.f;
    T *orow = out + (long)r * heads * D + (long)head * D + 2 * tig;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<uint32_t *>(orow + n * 8) =
          pack2<T>(o[n][2 * row] * inv, o[n][2 * row + 1] * inv);
  }
}

#define FLASH_ATTN(NAME, T, D)                                                                 \
  extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                                  \
      NAME(const T *q, const T *k, const T *v, T *out, int t, int len, int heads, int group,   \
           long q_head_stride, long q_row_stride, long kv_head_stride, int window,             \
           float softcap) {                                                                    \
    pdl_begin();                                                                               \
    flash_attn<T, D>(q, k, v, out, t, len, heads, group, q_head_stride, q_row_stride,          \
                     kv_head_stride, window, softcap);                                         \
  }
FLASH_ATTN(flash_attn_bf16_d32, __nv_bfloat16, 32)
FLASH_ATTN(flash_attn_bf16_d64, __nv_bfloat16, 64)
FLASH_ATTN(flash_attn_bf16_d128, __nv_bfloat16, 128)
FLASH_ATTN(flash_attn_f16_d32, __half, 32)
FLASH_ATTN(flash_attn_f16_d64, __half, 64)
FLASH_ATTN(flash_attn_f16_d128, __half, 128)
