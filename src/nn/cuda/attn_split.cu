// Split attention of decode and verification steps over a KV cache read in place
// (`SplitAttention` in attention.rs): per-split partial softmax, combined by the last split
// of each (row, head) or inside a thread block cluster; RoPE and the K/V store optionally
// fused in.
#pragma once
#include "common.cuh"
#include "attn_combine.cuh"

// Split counts of attn_split, per (row, head): zero at module load, back to zero after each
// launch. `ATTN_COUNTERS` in attention.rs.
constexpr int ATTN_COUNTERS = 8192;
__device__ unsigned int attn_done[ATTN_COUNTERS];

// Split-K attention of single query rows over a cache ("flash decoding").
//
// Grid: x = t * ceil(group / HB) (query row i = x / that; the block takes heads
// HB * (x % that) ... of the kv head's group, at most HB of them), y = kv head,
// z: blocks sharing the `splits` splits (z takes splits z, z + gridDim.z, ...). Block: W
// warps (8 by default: twice the loads in flight and half the chain of tiles of 4; the
// choice follows the cache's capacity, never the row count). Split s covers key indices
// [s * split_len, (s+1) * split_len) in tiles of 32 keys,
// one tile per warp at a time: lane l loads key tile + l once and scores it against each of
// the block's query heads, the warp takes the tile's softmax terms with shuffles, then every
// lane loads its E dimensions of each of the tile's value rows once and accumulates them for
// every head (coalesced). Grouped query heads thus read their K/V once per block, not once
// per head. The keys are `len` consecutive positions and the t queries are the newest t of
// them: query i sits at key index len - t + i and sees key j iff j <= len - t + i and, with
// a sliding `window` > 0, j > len - t + i - window. `len` is read from `len_ptr` when it is
// not null (a captured graph replays with the length of the step), else it is `len_arg`.
//
// Writes per (row, head, split): max score m, sum of exp(score - m) l, and the unnormalised
// output acc[d] = sum exp(score - m) v, at part[((i * heads + h) * splits + s) * (d + 2)];
// the last split block of a (row, head block) to finish combines them into y[i, h * d ...]
// ([t, heads * d]). Splits without a visible key write nothing; a query whose visible keys
// all sit in one split writes y directly (what the combine makes of one split: its weight
// is exp(0) = 1). A head's result depends on its own row, keys and the split boundaries
// only: never on t, the group or the other heads of its block.
// HB = 1 (one block per query head: the shortest chain of dependent loads, for short caches)
// or 4 (long caches: K/V read once for four heads).
// CL (the `_cl` kernels, compute capability 9.0+): gridDim.z = the splits any query of the
// launch sees (2 to CL_MAX), launched as clusters of gridDim.z blocks; each block takes one
// split and leaves its (m, l, acc) in shared memory, and the block of the query's first
// visible split combines them through distributed shared memory (`attn_combine_cluster`):
// no partial rows in global memory, no counter.
//
// Fused RoPE and K/V store (ROPE; a decode or verification step's graph): q is the
// projection's output before RoPE, and the step's t new keys and values (positions
// len - t ... len - 1) are not yet in the cache. The block rotates its query rows as it
// stages them (rounded to T, as a rotated q tensor would be) and, in the same loop, before
// any split is read, writes the new positions of its splits it sees — k rotated, v as is —
// into the cache
// (`rope.kw`, `rope.vw`: the buffers k and v view). Its K/V loads then all go through the L2
// (`load_vec_cg`): the read-only path may not see what the kernel wrote. Every block that
// sees a new position writes the same bytes there; the query of row i sees its own
// position, so all t are written. Older positions are only read.
//
// Staged tail (RING with `tail.n` > 0: a staged ring inside a speculation): the positions
// [len - tail.n, len) live in the side buffer `tail.k`, `tail.v` (position len - tail.n + i
// in slot i, heads `tail.head_stride` apart), the ring holds those below. A query sees the
// ring's visible positions below the tail, then the tail's: one more split after the
// ring's (its partial row at index `splits`, after the ring's), and with RoPE fused the
// step's t new positions (the tail's last t) are written to the side buffer (`rope.kw`,
// `rope.vw` are then the side buffer).
//
// Token tree (TREE, the `_tree` kernels: `rope.tree` not null, RoPE fused; a template
// parameter, so that the other kernels carry none of it, as with RING): the positions from `base = len -
// tree[0]` on are the nodes of a token tree appended inside a speculation, in the order
// appended (slots as for a chain), at most 32 of them. Row i's node has RoPE position
// base + tree[1 + i] (its depth) and sees the keys below `base` (those within the window of
// that position) and the nodes whose bit is set in tree[1 + t + i] (bit n: node base + n is
// the row's ancestor or itself); the step's new keys are rotated at their nodes' positions.
// The splits are those of the chain of the same slots, so a block reads what a chain would.
//
// Per-head q/k RMSNorm fused too (`rope.qn` not null: Qwen3, Gemma 3): before RoPE, each
// query head's row and each new key row become x * rsqrt(mean(x^2) + eps) * w, rounded to T
// as the separate norm rounds it; every row's scale is summed by one warp in one order, so a
// row's result never depends on the rows or heads beside it.
template <typename T> struct FusedRope {
  const T *k_new, *v_new;  // [t, kv_heads, d] rows k_row / v_row apart, heads d apart
  long k_row, v_row;
  const T *cos, *sin;      // [P, d / 2] tables
  T *kw, *vw;              // the cache buffers k and v view, written
  const T *qn, *kn;        // [d] q and k norm weights, or null (no q/k norm)
  float q_eps, k_eps;
  const uint32_t *tree;    // a token tree's rows (see attn_split), or null (a chain)
};

// A staged ring's side buffer (see attn_split); `n` = 0: none.
template <typename T> struct RingTail {
  const T *k, *v;
  long head_stride;
  int n;
};

template <typename T, int E, int HB, int W, bool ROPE, bool HV = false, bool CL = false,
          bool RING = false, bool TREE = false>
__device__ void attn_split(const T *__restrict__ q, const T *__restrict__ k,
                           const T *__restrict__ v, float *__restrict__ part, T *__restrict__ y,
                           const uint32_t *__restrict__ len_ptr, uint32_t len_arg, int t,
                           int heads, int group, long q_head_stride, long q_row_stride,
                           long kv_head_stride, int split_len, int splits, int window,
                           float softcap, int ring, int ring_lo, const RingTail<T> tail,
                           const FusedRope<T> rope) {
  constexpr int D = 32 * E;
  // Elements per 16-byte load of a key row.
  constexpr int V16 = 16 / sizeof(T);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hblocks = (group + HB - 1) / HB;
  const int row = blockIdx.x / hblocks, hb = blockIdx.x % hblocks;
  const int h0 = blockIdx.y * group + hb * HB, nh = min(HB, group - hb * HB);
  const int len = len_ptr ? (int)*len_ptr : (int)len_arg;
  // qpos: the row's index among the keys (a slot's order); rpos: its position (RoPE, the
  // window), the same but for a tree's node.
  const int qpos = len - t + row;
  const uint32_t *tree = ROPE && TREE ? rope.tree : nullptr;
  const int tree_base = tree ? len - (int)tree[0] : len;
  const unsigned ancestors = tree ? tree[1 + t + row] : 0u;
  const int rpos = tree ? tree_base + (int)tree[1 + row] : qpos;
  // The splits holding a key this query sees: [first_split, end_split). This block takes
  // those congruent to blockIdx.z modulo gridDim.z, one after another; a block without any
  // (a graph's splits span the cache's capacity) leaves at once.
  //
  // RING (the `_ring` kernels: k and v are a ring of `ring` slots, position p in slot
  // p % ring; a template parameter, so that the other kernels carry none of it): the
  // query sees positions [vis, qpos], vis = max(qpos + 1 - window, ring_lo, 0), which lie in
  // the slots from vslot = vis % ring on, vn of them, wrapping past the last slot. Splits are
  // runs of slots; [first_split, end_split) counts on past the last split (split s is then
  // s - splits) and covers each split once (the one holding both ends of a wrapped run too).
  //
  // A staged tail (`has_tail`) holds the positions from `tbase` on: the ring's visible run
  // ends below it (vn may be 0), and the tail is split `end_split` (one past the ring's),
  // partial row `splits`.
  const bool has_tail = RING && tail.n > 0;
  const int tbase = has_tail ? len - tail.n : len;
  const int vis = RING ? max(max(window > 0 ? rpos + 1 - window : 0, ring_lo), 0) : 0;
  const int vslot = RING ? vis % ring : 0,
            vn = has_tail ? max(0, tbase - vis) : qpos + 1 - vis;
  const int first_split =
      RING ? vslot / split_len : window > 0 ? max(0, rpos + 1 - window) / split_len : 0;
  const int end_split =
      RING ? (vn == 0 ? first_split
                      : min(vslot + vn <= ring ? (vslot + vn - 1) / split_len + 1
                                               : splits + (vslot + vn - 1 - ring) / split_len + 1,
                            first_split + splits))
           : min(qpos / split_len + 1, splits);
  // Splits including the tail's; partial rows per (row, head): a ring's one more.
  const int end_all = end_split + (has_tail ? 1 : 0);
  const int prows = RING ? splits + 1 : splits;
  const int z = blockIdx.z, zs = gridDim.z;
  const int start = z + (max(0, first_split - z) + zs - 1) / zs * zs;
  // CL: the row's splits are one cluster's blocks (gridDim.z = splits ≤ CL_MAX, one split a
  // block, cluster rank = split). Where the query sees several, every block of the cluster
  // takes part in the combine's two barriers, those without a visible key included.
  const bool multi = end_all - first_split > 1;
  if (start >= end_all) {
    pdl_begin();  // every block waits: the kernel completes only after the one ahead of it
    if (CL && multi) {
      cluster_sync();
      cluster_sync();
    }
    return;
  }
  // Before `pdl_begin` (the kernel ahead, the q/k/v product, may still run): an L2 prefetch
  // of the key and value rows of this block's first split that lie below the step's new
  // positions. Those were written by earlier steps, and no kernel of a step writes them (a
  // step writes only its own t positions; the length comes from the host's copy into the
  // graph's input buffer, or an argument), so the requests may overlap the kernel ahead; the
  // loads after `pdl_begin` then find the rows in the L2 instead of HBM. (Loading the first
  // tile into registers instead held 70-130 more registers a thread.) Only for queries that
  // see at most PF_SPLITS splits: over long caches every block's prefetch together is the
  // layer's whole K/V, issued while the product ahead streams its weights (slower there:
  // docs/kernel-notes.md, "Split attention: K/V prefetch"). Touches no result: the loads
  // read the same bytes.
  constexpr int PF_SPLITS = 4;
  if (end_all - first_split <= PF_SPLITS && start < end_split) {
    const int s0 = RING && start >= splits ? start - splits : start;
    const int a = s0 * split_len,
              b = RING ? min(a + split_len, ring) : min((start + 1) * split_len, len - t);
    constexpr int LINES = D * sizeof(T) >= 128 ? D * sizeof(T) / 128 : 1;  // 128-byte lines a row
    const T *kr = k + blockIdx.y * kv_head_stride, *vr = v + blockIdx.y * kv_head_stride;
    for (int i = threadIdx.x; i < (b - a) * LINES; i += blockDim.x) {
      const long off = (long)(a + i / LINES) * D + (i % LINES) * (128 / (int)sizeof(T));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kr + off));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(vr + off));
    }
  }
  pdl_begin();

  constexpr int HALF = D / 2;
  // First of the step's new positions (with fused RoPE: not in the cache until written here).
  const int fresh = ROPE ? len - t : len;
  __shared__ float sq[HB][D];
  // The query rows into shared memory (rotated with RoPE fused) and, with RoPE fused, the new
  // positions this query sees in this block's splits into the cache, in one loop: both
  // rounds of loads in flight together, one barrier for both. The new positions are the
  // last t ≤ 32 < split_len, so they lie in at most two splits.
  const int writes = ROPE ? (qpos + 1 - fresh) * HALF : 0;
  // The q/k norms' row scales: query head h's in qscale[h], new key row n's in kscale[n]
  // (rows fresh ... qpos, at most t ≤ 32), one warp a row.
  __shared__ float qscale[HB], kscale[32];
  const bool qk_norm = ROPE && rope.qn != nullptr;
  if (qk_norm) {
    for (int item = warp; item < HB + writes / HALF; item += W) {
      const bool is_q = item < HB;
      if (is_q && item >= nh) continue;
      const T *xr = is_q ? q + (h0 + item) * q_head_stride + row * q_row_stride
                         : rope.k_new + (item - HB) * rope.k_row + (long)blockIdx.y * D;
      float ss = 0.f;
      if constexpr (E >= 8) {
        // d = 256: all of the lane's loads in flight at once (one round trip; the unroll
        // would cost the d = 128 four-head kernels registers), summed in the same order.
#pragma unroll
        for (int e = lane; e < D; e += 32) {
          const float f = to_f32(xr[e]);
          ss += f * f;
        }
      } else {
        for (int e = lane; e < D; e += 32) {
          const float f = to_f32(xr[e]);
          ss += f * f;
        }
      }
      ss = warp_sum(ss);
      if (lane == 0) {
        if (is_q)
          qscale[item] = rsqrtf(ss / D + rope.q_eps);
        else
          kscale[item - HB] = rsqrtf(ss / D + rope.k_eps);
      }
    }
    __syncthreads();
  }
  // x * scale * w of element f of a normed row, rounded to T (the unfused norm's output).
  const auto normed = [&](float x, float scale, const T *w, int f) {
    return to_f32(from_f32<T>(x * scale * to_f32(w[f])));
  };
  for (int i = threadIdx.x; i < max(HB * D, writes); i += blockDim.x) {
    const int h = i / D, e = i % D;
    if (h < HB) {
      const T *qr = q + (h0 + h) * q_head_stride + row * q_row_stride;
      float x = 0.f;
      if (ROPE && h < nh) {
        const int f = e % HALF;
        const float c = to_f32(rope.cos[(long)rpos * HALF + f]);
        const float sn = to_f32(rope.sin[(long)rpos * HALF + f]);
        float x1 = to_f32(qr[f]), x2 = to_f32(qr[f + HALF]);
        if (qk_norm) {
          x1 = normed(x1, qscale[h], rope.qn, f);
          x2 = normed(x2, qscale[h], rope.qn, f + HALF);
        }
        x = to_f32(from_f32<T>(e < HALF ? x1 * c - x2 * sn : x1 * sn + x2 * c));
      } else if (h < nh) {
        x = to_f32(qr[e]);
      }
      sq[h][e] = x;
    }
    const int p = fresh + i / HALF, f = i % HALF;
    const int slot = has_tail ? p - tbase : RING ? p % ring : p, ps = slot / split_len;
    // The split's place in [first_split, end_all) (a ring's count on past the last; a
    // tail's new positions are all in its own split).
    const int split = has_tail ? end_split : RING && ps < first_split ? ps + splits : ps;
    const long wstride = has_tail ? tail.head_stride : kv_head_stride;
    const bool visible = window <= 0 || p > qpos - window;
    if (ROPE && i < writes && visible && split >= start && (split - start) % zs == 0) {
      const int n = p - fresh;
      const long pp = tree ? tree_base + (long)tree[1 + n] : p;  // the node's position
      const float c = to_f32(rope.cos[pp * HALF + f]);
      const float sn = to_f32(rope.sin[pp * HALF + f]);
      const T *x = rope.k_new + n * rope.k_row + (long)blockIdx.y * D;
      const T *vn = rope.v_new + n * rope.v_row + (long)blockIdx.y * D;
      // The value's loads beside the key's, before any store (a load may not move past a
      // store that might alias it): one round trip.
      const T v1 = vn[f], v2 = vn[f + HALF];
      float x1 = to_f32(x[f]), x2 = to_f32(x[f + HALF]);
      if (qk_norm) {
        x1 = normed(x1, kscale[n], rope.kn, f);
        x2 = normed(x2, kscale[n], rope.kn, f + HALF);
      }
      T *o = rope.kw + blockIdx.y * wstride + (long)slot * D;
      o[f] = from_f32<T>(x1 * c - x2 * sn);
      o[f + HALF] = from_f32<T>(x1 * sn + x2 * c);
      T *w = rope.vw + blockIdx.y * wstride + (long)slot * D;
      w[f] = v1;
      w[f + HALF] = v2;
    }
  }
  __syncthreads();
  __shared__ float sm[W][HB], sl[W][HB], sacc[W][HB][D];
  // CL: this block's split result, read by the combining block of the cluster.
  __shared__ float cm[CL ? HB : 1], cl[CL ? HB : 1], cacc[CL ? HB : 1][CL ? D : 1];
  int mine = 0;  // splits this block wrote
  for (int vs = start; vs < end_all; vs += zs, ++mine) {
    const bool in_tail = has_tail && vs == end_split;
    // The split's partial row.
    const int split = in_tail ? splits : RING && vs >= splits ? vs - splits : vs;
    const T *kb = in_tail ? tail.k + blockIdx.y * tail.head_stride : k + blockIdx.y * kv_head_stride;
    const T *vb = (in_tail ? tail.v + blockIdx.y * tail.head_stride : v + blockIdx.y * kv_head_stride) +
                  lane * E;
    // Keys [lo, hi) of the split; a ring's are the visible slots among them, a tail's the
    // slots of the visible positions from tbase on.
    const int hi = in_tail ? qpos + 1 - tbase
                   : RING  ? min(ring, (split + 1) * split_len)
                           : min(qpos + 1, (split + 1) * split_len);
    int lo = in_tail ? max(vis - tbase, 0) : split * split_len;
    if (window > 0 && !RING) lo = max(lo, rpos + 1 - window);
    float m[HB], l[HB], acc[HB][E];
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
    }
    for (int tile = (in_tail ? 0 : split * split_len) + warp * 32; tile < hi; tile += W * 32) {
      const int j = tile + lane;
      bool live = j >= lo && j < hi && (!RING || in_tail || (j - vslot + ring) % ring < vn);
      if (TREE && live) {
        // The key's index: a tree's node is seen by its descendants only.
        const int idx = in_tail ? tbase + j : RING ? vis + (j - vslot + ring) % ring : j;
        live = idx < tree_base || (ancestors >> (idx - tree_base)) & 1u;
      }
      if (!__any_sync(0xffffffffu, live)) continue;  // nothing visible in this tile
      // Value rows in batches of VB independent loads, each batch one round trip to memory
      // (rows past `hi` are not read; rows below `lo` are cache rows with probability 0).
      // HV (the `_hv` kernels): the first batch does not depend on the scores, so it loads
      // beside the keys, in their round trip, kept as stored until the scores are known: one
      // round trip fewer a tile, the same values summed in the same order, but 32 more
      // registers a thread (fewer blocks an SM: for grids of one wave only).
      constexpr int VB = E <= 2 ? 32 : E <= 4 ? 16 : 8;
      const int n = min(32, hi - tile);
      Vec<T, E> v0[HV ? VB : 1];
      if constexpr (HV) {
#pragma unroll
        for (int u = 0; u < VB; ++u)
          if (u < n)
            v0[u] = ROPE ? load_raw_cg<T, E>(vb + (long)(tile + u) * D)
                         : *reinterpret_cast<const Vec<T, E> *>(vb + (long)(tile + u) * D);
      }
      float sc[HB];
#pragma unroll
      for (int h = 0; h < HB; ++h) sc[h] = -INFINITY;
      if (live) {
        const T *kr = kb + (long)j * D;
        float dot[HB];
#pragma unroll
        for (int h = 0; h < HB; ++h) dot[h] = 0.f;
#pragma unroll
        for (int c = 0; c < D; c += V16) {
          float kv_[V16];
          // With RoPE fused every K/V load goes through the L2: a choice per load would
          // serialise the batches of independent loads (a far slower kernel).
          if (ROPE)
            load_vec_cg<T, V16>(kr + c, kv_);
          else
            load_vec<T, V16>(kr + c, kv_);
#pragma unroll
          for (int h = 0; h < HB; ++h)
#pragma unroll
            for (int e = 0; e < V16; ++e) dot[h] += sq[h][c + e] * kv_[e];
        }
#pragma unroll
        for (int h = 0; h < HB; ++h)
          sc[h] = softcap > 0.f ? tanhf(dot[h] / softcap) * softcap : dot[h];
      }
      float p[HB];
#pragma unroll
      for (int h = 0; h < HB; ++h) {
        float tile_max = sc[h];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
        const float m_new = fmaxf(m[h], tile_max);
        const float corr = __expf(m[h] - m_new);
        p[h] = live ? __expf(sc[h] - m_new) : 0.f;
        l[h] = l[h] * corr + warp_sum(p[h]);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[h][e] *= corr;
        m[h] = m_new;
      }
      for (int base = 0; base < n; base += VB) {
        float vv[VB][E];
#pragma unroll
        for (int u = 0; u < VB; ++u) {
          if (HV && base == 0 && u < n) {
#pragma unroll
            for (int e = 0; e < E; ++e) vv[u][e] = to_f32(v0[HV ? u : 0].x[e]);
          } else if (base + u < n) {
            if (ROPE)
              load_vec_cg<T, E>(vb + (long)(tile + base + u) * D, vv[u]);
            else
              load_vec<T, E>(vb + (long)(tile + base + u) * D, vv[u]);
          } else {
#pragma unroll
            for (int e = 0; e < E; ++e) vv[u][e] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < VB; ++u)
#pragma unroll
          for (int h = 0; h < HB; ++h) {
            const float pj = __shfl_sync(0xffffffffu, p[h], base + u);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[h][e] += pj * vv[u][e];
          }
      }
    }

    // Combine the warps, head by head.
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      if (lane == 0) {
        sm[warp][h] = m[h];
        sl[warp][h] = l[h];
      }
#pragma unroll
      for (int e = 0; e < E; ++e) sacc[warp][h][lane * E + e] = acc[h][e];
    }
    __syncthreads();
    const bool only = end_all - first_split == 1;
    for (int h = 0; h < nh; ++h) {
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, sm[w][h]);
      float L = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w)
        if (sm[w][h] > -INFINITY) L += sl[w][h] * __expf(sm[w][h] - M);
      const int rh = row * heads + h0 + h;
      float *out = CL ? nullptr : part + ((long)rh * prows + split) * (D + 2);
      for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w)
          if (sm[w][h] > -INFINITY) a += sacc[w][h][e] * __expf(sm[w][h] - M);
        if (only)
          y[(long)rh * D + e] = from_f32<T>(L > 0.f ? a / L : 0.f);
        else if (CL)
          cacc[CL ? h : 0][CL ? e : 0] = a;
        else
          out[2 + e] = a;
      }
      if (!only && threadIdx.x == 0) {
        if (CL) {
          cm[CL ? h : 0] = M;
          cl[CL ? h : 0] = L;
        } else {
          out[0] = M;
          out[1] = L;
        }
      }
    }
    if (only) return;
    __syncthreads();  // sm, sl, sacc are the next split's
  }
  if constexpr (CL) {
    cluster_sync();  // every visible split's cm, cl, cacc written
    if ((int)blockIdx.z == first_split)
      attn_combine_cluster<T, D, HB, W>(&cm[0], &cl[0], &cacc[0][0], nh, first_split,
                                        end_split - first_split,
                                        y + (long)(row * heads + h0) * D);
    cluster_sync();  // the peers' shared memory lives until the combining block has read it
    return;
  }
  // The last of the (row, head block)'s live splits to finish combines them all (its count
  // is reset for the next launch; no other block of this launch touches it again).
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int *done = &attn_done[row * heads + h0];
    last = atomicAdd(done, (unsigned int)mine) + mine == (unsigned int)(end_all - first_split);
    if (last) *done = 0u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int rh = row * heads + h0;
  attn_combine<T, D, HB, W, RING>(part + (long)rh * prows * (D + 2), (long)prows * (D + 2), nh,
                                  first_split, end_all - first_split, splits,
                                  has_tail ? splits : -1, y + (long)rh * D);
}

// `NAME`: the plain kernel; `NAME_rope`: RoPE and the K/V store fused in (FusedRope), whose
// prologue also prefetches [pf0, pf0 + pf0_n) and [pf1, pf1 + pf1_n) into the L2
// (`prefetch_l2`; lengths 0 for none).
#define ATTN_SPLIT1(NAME, T, E, HB, W, RING)                                                    \
  extern "C" __global__ void __launch_bounds__(W * 32)                                     \
      NAME(const T *q, const T *k, const T *v, float *part, T *y, const uint32_t *len_ptr,     \
           uint32_t len_arg, int t, int heads, int group, long q_head_stride,                 \
           long q_row_stride, long kv_head_stride, int split_len, int splits, int window,    \
           float softcap, int ring, int ring_lo, const T *tail_k, const T *tail_v,            \
           long tail_head_stride, int tail_n) {                                                \
    attn_split<T, E, HB, W, false, false, false, RING>(q, k, v, part, y, len_ptr, len_arg, t, \
                                                       heads, group,                          \
                                q_head_stride, q_row_stride, kv_head_stride, split_len,       \
                                splits, window, softcap, ring, ring_lo,                       \
                                RingTail<T>{tail_k, tail_v, tail_head_stride, tail_n},        \
                                FusedRope<T>{});                                              \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(W * 32)                                     \
      NAME##_rope(const T *q, const T *k, const T *v, float *part, T *y,                       \
                  const uint32_t *len_ptr, uint32_t len_arg, int t, int heads, int group,     \
                  long q_head_stride, long q_row_stride, long kv_head_stride, int split_len,  \
                  int splits, int window, float softcap, int ring, int ring_lo,               \
                  const T *tail_k, const T *tail_v, long tail_head_stride, int tail_n,        \
                  const T *k_new, long k_row,                                                 \
                  const T *v_new, long v_row, const T *cos, const T *sin, T *kw, T *vw,       \
                  const char *pf0, long pf0_n, const char *pf1, long pf1_n, const T *qn,      \
                  const T *kn, float q_eps, float k_eps, const uint32_t *tree) {               \
    prefetch_l2(pf0, pf0_n, pf1, pf1_n);                                                       \
    attn_split<T, E, HB, W, true, false, false, RING>(q, k, v, part, y, len_ptr, len_arg, t,  \
                                                      heads, group,                           \
                               q_head_stride, q_row_stride, kv_head_stride, split_len,        \
                               splits, window, softcap, ring, ring_lo,                        \
                               RingTail<T>{tail_k, tail_v, tail_head_stride, tail_n},         \
                               FusedRope<T>{k_new, v_new, k_row, v_row, cos, sin, kw, vw, qn, \
                                            kn, q_eps, k_eps, tree});                          \
  }
// `_ring` after the head and warp counts: the same over a ring (RING).
#define ATTN_SPLIT(NAME, T, E)                                                                 \
  ATTN_SPLIT1(NAME##_h1, T, E, 1, 4, false) ATTN_SPLIT1(NAME##_h4, T, E, 4, 4, false)            \
  ATTN_SPLIT1(NAME##_h1_w8, T, E, 1, 8, false) ATTN_SPLIT1(NAME##_h4_w8, T, E, 4, 8, false)      \
  ATTN_SPLIT1(NAME##_h2_w8, T, E, 2, 8, false)                                                 \
  ATTN_SPLIT1(NAME##_h1_ring, T, E, 1, 4, true) ATTN_SPLIT1(NAME##_h4_ring, T, E, 4, 4, true)    \
  ATTN_SPLIT1(NAME##_h1_w8_ring, T, E, 1, 8, true)                                             \
  ATTN_SPLIT1(NAME##_h4_w8_ring, T, E, 4, 8, true)                                             \
  ATTN_SPLIT1(NAME##_h2_w8_ring, T, E, 2, 8, true)

// The eight-warp fused kernels with HV (`_hv`: d <= 64) and CL (`_cl`: the splits combined
// in a cluster); see attn_split.
// A tree step's kernels keep two blocks an SM (at most 128 registers a thread: the ring's
// four-head one took 163 and one block an SM); the others as the compiler chooses.
#define ATTN_BOUNDS_false __launch_bounds__(8 * 32)
#define ATTN_BOUNDS_true __launch_bounds__(8 * 32, 2)
#define ATTN_SPLIT_FUSED8(NAME, T, E, HB, HV, CL, RING, TREE)                                   \
  extern "C" __global__ void ATTN_BOUNDS_##TREE                                                \
      NAME(const T *q, const T *k, const T *v, float *part, T *y, const uint32_t *len_ptr,     \
           uint32_t len_arg, int t, int heads, int group, long q_head_stride,                 \
           long q_row_stride, long kv_head_stride, int split_len, int splits, int window,    \
           float softcap, int ring, int ring_lo, const T *tail_k, const T *tail_v,            \
           long tail_head_stride, int tail_n, const T *k_new, long k_row,                     \
           const T *v_new, long v_row,                                                        \
           const T *cos, const T *sin, T *kw, T *vw, const char *pf0, long pf0_n,            \
           const char *pf1, long pf1_n, const T *qn, const T *kn, float q_eps, float k_eps,  \
           const uint32_t *tree) {                                                            \
    prefetch_l2(pf0, pf0_n, pf1, pf1_n);                                                       \
    attn_split<T, E, HB, 8, true, HV, CL, RING, TREE>(q, k, v, part, y, len_ptr, len_arg, t,   \
                                                      heads, group,                            \
                                          q_head_stride, q_row_stride, kv_head_stride,        \
                                          split_len, splits, window, softcap, ring, ring_lo,  \
                                          RingTail<T>{tail_k, tail_v, tail_head_stride, tail_n}, \
                                          FusedRope<T>{k_new, v_new, k_row, v_row, cos, sin,  \
                                                       kw, vw, qn, kn, q_eps, k_eps, tree});  \
  }
#define ATTN_SPLIT_HV(NAME, T, E)                                                              \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_hv, T, E, 1, true, false, false, false)                  \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_hv, T, E, 4, true, false, false, false)                  \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_hv, T, E, 2, true, false, false, false)                  \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_ring_rope_hv, T, E, 1, true, false, true, false)              \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_ring_rope_hv, T, E, 4, true, false, true, false)              \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_ring_rope_hv, T, E, 2, true, false, true, false)              \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_hv_cl, T, E, 2, true, true, false, false)                \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_hv_cl, T, E, 1, true, true, false, false)                \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_hv_cl, T, E, 4, true, true, false, false)
// The eight-warp fused kernels of a token tree's step (TREE), with and without a ring.
#define ATTN_SPLIT_TREE(NAME, T, E)                                                            \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_tree, T, E, 1, false, false, false, true)                \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_tree, T, E, 2, false, false, false, true)                \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_tree, T, E, 4, false, false, false, true)                \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_ring_rope_tree, T, E, 1, false, false, true, true)            \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_ring_rope_tree, T, E, 2, false, false, true, true)            \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_ring_rope_tree, T, E, 4, false, false, true, true)
#define ATTN_SPLIT_CL(NAME, T, E)                                                              \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_cl, T, E, 1, false, true, false, false)                  \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_cl, T, E, 4, false, true, false, false)                  \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_cl, T, E, 2, false, true, false, false)

ATTN_SPLIT_HV(attn_split_f32_d32, float, 1)
ATTN_SPLIT_HV(attn_split_f32_d64, float, 2)
ATTN_SPLIT_HV(attn_split_bf16_d32, __nv_bfloat16, 1)
ATTN_SPLIT_HV(attn_split_bf16_d64, __nv_bfloat16, 2)
ATTN_SPLIT_HV(attn_split_f16_d32, __half, 1)
ATTN_SPLIT_HV(attn_split_f16_d64, __half, 2)
ATTN_SPLIT(attn_split_f32_d32, float, 1)
ATTN_SPLIT(attn_split_f32_d64, float, 2)
ATTN_SPLIT(attn_split_f32_d128, float, 4)
ATTN_SPLIT(attn_split_f32_d256, float, 8)
ATTN_SPLIT(attn_split_bf16_d32, __nv_bfloat16, 1)
ATTN_SPLIT(attn_split_bf16_d64, __nv_bfloat16, 2)
ATTN_SPLIT(attn_split_bf16_d128, __nv_bfloat16, 4)
ATTN_SPLIT(attn_split_bf16_d256, __nv_bfloat16, 8)
ATTN_SPLIT(attn_split_f16_d32, __half, 1)
ATTN_SPLIT(attn_split_f16_d64, __half, 2)
ATTN_SPLIT(attn_split_f16_d128, __half, 4)
ATTN_SPLIT(attn_split_f16_d256, __half, 8)
ATTN_SPLIT_CL(attn_split_f32_d32, float, 1)
ATTN_SPLIT_CL(attn_split_f32_d64, float, 2)
ATTN_SPLIT_CL(attn_split_f32_d128, float, 4)
ATTN_SPLIT_CL(attn_split_f32_d256, float, 8)
ATTN_SPLIT_CL(attn_split_bf16_d32, __nv_bfloat16, 1)
ATTN_SPLIT_CL(attn_split_bf16_d64, __nv_bfloat16, 2)
ATTN_SPLIT_CL(attn_split_bf16_d128, __nv_bfloat16, 4)
ATTN_SPLIT_CL(attn_split_bf16_d256, __nv_bfloat16, 8)
ATTN_SPLIT_CL(attn_split_f16_d32, __half, 1)
ATTN_SPLIT_CL(attn_split_f16_d64, __half, 2)
ATTN_SPLIT_CL(attn_split_f16_d128, __half, 4)
ATTN_SPLIT_CL(attn_split_f16_d256, __half, 8)
ATTN_SPLIT_TREE(attn_split_f32_d32, float, 1)
ATTN_SPLIT_TREE(attn_split_f32_d64, float, 2)
ATTN_SPLIT_TREE(attn_split_f32_d128, float, 4)
ATTN_SPLIT_TREE(attn_split_f32_d256, float, 8)
ATTN_SPLIT_TREE(attn_split_bf16_d32, __nv_bfloat16, 1)
ATTN_SPLIT_TREE(attn_split_bf16_d64, __nv_bfloat16, 2)
ATTN_SPLIT_TREE(attn_split_bf16_d128, __nv_bfloat16, 4)
ATTN_SPLIT_TREE(attn_split_bf16_d256, __nv_bfloat16, 8)
ATTN_SPLIT_TREE(attn_split_f16_d32, __half, 1)
ATTN_SPLIT_TREE(attn_split_f16_d64, __half, 2)
ATTN_SPLIT_TREE(attn_split_f16_d128, __half, 4)
ATTN_SPLIT_TREE(attn_split_f16_d256, __half, 8)
