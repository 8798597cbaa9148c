// Split attention on tensor cores (`SplitAttention` in attention.rs, bf16 / f16, d ≤ 128):
// the query vectors of several rows and heads of one kv head's group share every K/V tile a
// block loads, so a verification block of t rows reads the cache once, not t times.
#pragma once
#include "common.cuh"
#include "attn_split.cu"


// Split-K attention of t query rows over a cache, the rows' query vectors on tensor cores.
//
// Vectors: the t * group (row, head) pairs of kv head y, pair i = row * group + head; block x
// takes pairs NV x ... (NV = 16 MT: MT m16 tiles of the mma, zero rows past the last pair).
// Grid: x = ceil(t * group / NV), y = kv head, z: blocks sharing the splits (z takes splits
// z, z + gridDim.z, ... of those its vectors see). Block: W warps (`mma_warps`). Queries,
// keys, splits, the ring, the window, `len_ptr` and the fused RoPE / K/V store / q/k norms
// are those of `attn_split`; `part` and `y` are laid out as there, (m, l) in log2 units.
//
// Per split, K/V tiles of KT = 16 W keys stream through shared memory (cp.async, the next
// tile's keys loading while this one's values are used). Warp w scores the tile's keys
// 16 w .. 16 w + 15 against every vector (S = Q K^T, mma),
// the warps' row maxima and sums of P meet in shared memory (taken in warp order), P (rounded
// to T, as FlashAttention does) goes to shared memory, and warp w accumulates O += P V for
// its slice of the D dimensions over all the tile's keys. At the split's end each warp writes its slice: a
// vector whose visible keys lie in this one split its output, else its partial row; the last
// block of the (chunk, kv head) to finish combines the partial rows.
//
// A vector's result depends on its own row, keys and the split boundaries only: tiles no key
// of which it sees leave its running state exactly as it was (scale 1, products of zero), rows
// of a tile it does not see are multiplied by zero (cache rows no vector of the block sees
// are loaded as zeros, never as stale bytes), an mma's output row depends on its own input
// row only, and a vector's maxima and sums are taken in the same order in every block. So a verification row is bitwise the decode step of its position, whatever
// the other rows and heads of its block, and whatever MT.
//
// Dynamic shared memory (`mma_smem` bytes, checked): K and V tiles [KT][D + 8], the staged
// queries [NV][D + 8] and P [NV][KT + 8].
template <int D> __host__ __device__ constexpr int mma_warps() { return D == 256 ? 4 : 8; }
template <int D, int MT> __host__ __device__ constexpr int mma_smem() {
  constexpr int KT = 16 * mma_warps<D>(), NV = 16 * MT, PAD = D + 8;
  return 2 * KT * PAD * 2 + NV * PAD * 2 + NV * (KT + 8) * 2;
}
template <typename T, int D, int MT, bool ROPE, bool RING>
__device__ void attn_mma(const T *__restrict__ q, const T *__restrict__ k,
                         const T *__restrict__ v, float *__restrict__ part, T *__restrict__ y,
                         const uint32_t *__restrict__ len_ptr, uint32_t len_arg, int t,
                         int heads, int group, long q_head_stride, long q_row_stride,
                         long kv_head_stride, int split_len, int splits, int window,
                         float softcap, int ring, int ring_lo, const FusedRope<T> rope) {
  constexpr int W = mma_warps<D>();
  constexpr int NV = 16 * MT;
  constexpr int KT = 16 * W;       // keys a tile
  constexpr int PAD = D + 8;       // row stride of the K/V tiles and staged queries
  constexpr int KS = D / 16;       // k-steps of Q K^T
  constexpr int NTW = D / 8 / W;   // n-tiles of O a warp
  constexpr int HALF = D / 2;
  constexpr float LOG2E = 1.4426950408889634f;
  static_assert(NTW >= 1 && KT % 64 == 0, "tile shape");
  extern __shared__ __align__(16) unsigned char smem[];
  {
    unsigned have;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
    if (have < (unsigned)mma_smem<D, MT>()) __trap();
  }
  T(*ks)[PAD] = reinterpret_cast<T(*)[PAD]>(smem);
  T(*vsm)[PAD] = reinterpret_cast<T(*)[PAD]>(smem + KT * PAD * sizeof(T));
  unsigned char *region = smem + 2 * KT * PAD * sizeof(T);
  T(*sq)[PAD] = reinterpret_cast<T(*)[PAD]>(region);
  constexpr int PP = KT + 8;  // row stride of P
  T(*sp)[PP] = reinterpret_cast<T(*)[PP]>(region + NV * PAD * sizeof(T));

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, grp = lane / 4, tig = lane % 4;
  const int kvh = blockIdx.y;
  const int v0 = blockIdx.x * NV, nv = min(NV, t * group - v0);
  const int len = len_ptr ? (int)*len_ptr : (int)len_arg;
  const auto qpos_of = [&](int vec) { return len - t + (v0 + vec) / group; };
  const auto head_of = [&](int vec) { return kvh * group + (v0 + vec) % group; };
  // The oldest position a query at qp sees.
  const auto vis_of = [&](int qp) {
    return max(max(window > 0 ? qp + 1 - window : 0, RING ? ring_lo : 0), 0);
  };
  // The splits holding a key a query at qp sees from position `vis` on (a ring's counting on
  // past the last split), as attn_split forms them.
  const auto split_range = [&](int qp, int vis, int &first, int &end) {
    if (RING) {
      const int vslot = vis % ring, vn = qp + 1 - vis;
      first = vslot / split_len;
      end = min(vslot + vn <= ring ? (vslot + vn - 1) / split_len + 1
                                   : splits + (vslot + vn - 1 - ring) / split_len + 1,
                first + splits);
    } else {
      first = vis / split_len;
      end = min(qp / split_len + 1, splits);
    }
  };
  // The block's vectors together see positions [vis_u, qp_hi]: the splits [first_u, end_u).
  const int qp_lo = qpos_of(0), qp_hi = qpos_of(nv - 1);
  const int vis_u = vis_of(qp_lo);
  int first_u, end_u;
  split_range(qp_hi, vis_u, first_u, end_u);
  const int vslot_u = RING ? vis_u % ring : 0, vn_u = qp_hi + 1 - vis_u;
  const int z = blockIdx.z, zs = gridDim.z;
  const int start = z + (max(0, first_u - z) + zs - 1) / zs * zs;
  if (start >= end_u) {
    pdl_begin();
    return;
  }
  // L2 prefetch of this block's first split's older rows, as attn_split does (see there).
  constexpr int PF_SPLITS = 4;
  if (end_u - first_u <= PF_SPLITS) {
    const int s0 = RING && start >= splits ? start - splits : start;
    const int a = s0 * split_len,
              b = RING ? min(a + split_len, ring) : min((s0 + 1) * split_len, len - t);
    constexpr int LINES = D * sizeof(T) >= 128 ? D * sizeof(T) / 128 : 1;
    const T *kr = k + kvh * kv_head_stride, *vr = v + kvh * kv_head_stride;
    for (int i = threadIdx.x; i < (b - a) * LINES; i += blockDim.x) {
      const long off = (long)(a + i / LINES) * D + (i % LINES) * (128 / (int)sizeof(T));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kr + off));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(vr + off));
    }
  }
  pdl_begin();

  // The query vectors into shared memory (rotated, normed, with RoPE fused) and, with RoPE
  // fused, the step's new positions any vector of the block sees, in this block's splits,
  // into the cache (every block that reads a new position writes the same bytes there
  // first). Items of eight elements of each half (a RoPE pair's both ends), their loads in
  // flight together.
  const int fresh = ROPE ? len - t : len;
  const int wlo = max(fresh, vis_u);
  const int nk = ROPE ? max(0, qp_hi + 1 - wlo) : 0;  // new positions written
  __shared__ float qscale[NV], kscale[32];
  const bool qk_norm = ROPE && rope.qn != nullptr;
  const auto q_row = [&](int vec) {
    return q + head_of(vec) * q_head_stride + (long)(qpos_of(vec) - (len - t)) * q_row_stride;
  };
  const auto k_row = [&](int n) { return rope.k_new + n * rope.k_row + (long)kvh * D; };
  if (qk_norm) {
    for (int item = warp; item < NV + nk; item += W) {
      const bool is_q = item < NV;
      if (is_q && item >= nv) continue;
      const int n = wlo - fresh + item - NV;  // new key row (not is_q)
      const T *xr = is_q ? q_row(item) : k_row(n);
      float ss2 = 0.f;
#pragma unroll
      for (int e = lane; e < D; e += 32) {
        const float f = to_f32(xr[e]);
        ss2 += f * f;
      }
      ss2 = warp_sum(ss2);
      if (lane == 0) {
        if (is_q)
          qscale[item] = rsqrtf(ss2 / D + rope.q_eps);
        else
          kscale[n] = rsqrtf(ss2 / D + rope.k_eps);
      }
    }
    __syncthreads();
  }
  const auto normed = [&](float x, float scale, const T *w, int f) {
    return to_f32(from_f32<T>(x * scale * to_f32(w[f])));
  };
  // (x1, x2) at pair f of position p rotated, into (r1, r2), rounded to T.
  constexpr int CH = 8, CHUNKS = HALF / CH;
  const auto rotate = [&](const T *x, int p, int f0, float scale, const T *nw, T (&r1)[CH],
                          T (&r2)[CH]) {
    float x1[CH], x2[CH], c[CH], sn[CH];
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      x1[u] = to_f32(x[f0 + u]);
      x2[u] = to_f32(x[f0 + u + HALF]);
      c[u] = to_f32(rope.cos[(long)p * HALF + f0 + u]);
      sn[u] = to_f32(rope.sin[(long)p * HALF + f0 + u]);
    }
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      if (nw != nullptr) {
        x1[u] = normed(x1[u], scale, nw, f0 + u);
        x2[u] = normed(x2[u], scale, nw, f0 + u + HALF);
      }
      r1[u] = from_f32<T>(x1[u] * c[u] - x2[u] * sn[u]);
      r2[u] = from_f32<T>(x1[u] * sn[u] + x2[u] * c[u]);
    }
  };
  for (int i = threadIdx.x; i < max(NV, nk) * CHUNKS; i += blockDim.x) {
    const int which = i / CHUNKS, f0 = i % CHUNKS * CH;
    if (which < NV) {
      T r1[CH], r2[CH];
      if (which >= nv) {
#pragma unroll
        for (int u = 0; u < CH; ++u) r1[u] = r2[u] = from_f32<T>(0.f);
      } else if (ROPE) {
        rotate(q_row(which), qpos_of(which), f0, qk_norm ? qscale[which] : 0.f,
               qk_norm ? rope.qn : nullptr, r1, r2);
      } else {
        const T *x = q_row(which);
#pragma unroll
        for (int u = 0; u < CH; ++u) {
          r1[u] = x[f0 + u];
          r2[u] = x[f0 + u + HALF];
        }
      }
#pragma unroll
      for (int u = 0; u < CH; ++u) {
        sq[which][f0 + u] = r1[u];
        sq[which][f0 + u + HALF] = r2[u];
      }
    }
    if (ROPE && which < nk) {
      const int p = wlo + which;
      const int slot = RING ? p % ring : p, ps = slot / split_len;
      const int split = RING && ps < first_u ? ps + splits : ps;
      if (split >= start && split < end_u && (split - start) % zs == 0) {
        const int n = p - fresh;
        T r1[CH], r2[CH];
        rotate(k_row(n), p, f0, qk_norm ? kscale[n] : 0.f, qk_norm ? rope.kn : nullptr, r1, r2);
        T *o = rope.kw + kvh * kv_head_stride + (long)slot * D;
        const T *vn = rope.v_new + n * rope.v_row + (long)kvh * D;
        T *w = rope.vw + kvh * kv_head_stride + (long)slot * D;
        T v1[CH], v2[CH];
#pragma unroll
        for (int u = 0; u < CH; ++u) {
          v1[u] = vn[f0 + u];
          v2[u] = vn[f0 + u + HALF];
        }
#pragma unroll
        for (int u = 0; u < CH; ++u) {
          o[f0 + u] = r1[u];
          o[f0 + u + HALF] = r2[u];
          w[f0 + u] = v1[u];
          w[f0 + u + HALF] = v2[u];
        }
      }
    }
  }
  __syncthreads();
  // This thread's rows of the m16 tiles: vectors mt * 16 + grp + 8 r, and what each sees.
  int r_qp[MT][2], r_lo[MT][2];
  bool r_ok[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int vec = mt * 16 + grp + 8 * r;
      r_ok[mt][r] = vec < nv;
      r_qp[mt][r] = qpos_of(min(vec, nv - 1));
      r_lo[mt][r] = vis_of(r_qp[mt][r]);
    }
  // Whether key index (a ring's: slot) j is one the query at qp sees from `lo` on.
  const auto sees = [&](int j, int qp, int lo) {
    if (RING) return (j - lo % ring + ring) % ring < qp + 1 - lo;
    return j >= lo && j <= qp;
  };
  const T *kh = k + kvh * kv_head_stride, *vh = v + kvh * kv_head_stride;
  // Whether some vector sees several splits (else every vector writes its output from the
  // split it sees, and there is nothing to combine).
  bool any_multi = false;
  for (int vec = 0; vec < nv; ++vec) {
    int f, en;
    split_range(qpos_of(vec), vis_of(qpos_of(vec)), f, en);
    any_multi |= en - f > 1;
  }
  // Each warp's row maxima and sums of P over its 16 keys of a tile.
  __shared__ float wmax[W][NV], wsum[W][NV];
  int mine = 0;  // splits this block wrote
  for (int vs = start; vs < end_u; vs += zs, ++mine) {
    const int split = RING && vs >= splits ? vs - splits : vs;
    const int s0 = split * split_len;
    // Key indices [lo_b, s1) of the split that some vector sees (a ring's: those slots of
    // [s0, s1) that `uvis` accepts).
    const int s1 = RING ? min(ring, s0 + split_len) : min(s0 + split_len, qp_hi + 1);
    const int lo_b = RING ? s0 : max(s0, vis_u);
    const auto uvis = [&](int j) {
      return RING ? (j - vslot_u + ring) % ring < vn_u : j >= lo_b;
    };
    // Whether the tile from key a holds a key some vector sees.
    const auto live = [&](int a) {
      if (a >= s1) return false;
      if (!RING) return a + KT > lo_b;
      const int d0 = (a - vslot_u + ring) % ring;
      return d0 < vn_u || d0 + (min(a + KT, s1) - a) > ring;
    };
    const auto next = [&](int a) {
      while (a < s1 && !live(a)) a += KT;
      return a;
    };
    const auto load_tile = [&](T(*dst)[PAD], const T *src, int a) {
      for (int idx = threadIdx.x; idx < KT * D / 8; idx += W * 32) {
        const int r = idx / (D / 8), c = idx % (D / 8) * 8, j = a + r;
        const bool ok = j < s1 && uvis(j);
        cp_async16(&dst[r][c], src + (long)(ok ? j : a) * D + c, ok);
      }
    };
    // O (this warp's n-tiles) and the running max (log2 units) and sum of this thread's rows
    // (the same in every warp).
    float o[MT][NTW][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < NTW; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
      m[mt][0] = m[mt][1] = -INFINITY;
      l[mt][0] = l[mt][1] = 0.f;
    }
    int a = next(RING ? s0 : s0 + (lo_b - s0) / KT * KT);
    if (a < s1) {
      load_tile(ks, kh, a);
      cp_async_commit();
      load_tile(vsm, vh, a);
      cp_async_commit();
    }
    while (a < s1) {
      const int an = next(a + KT);
      cp_async_wait<1>();  // K of this tile
      __syncthreads();
      // S of this warp's 16 keys (n-tiles 0, 1) for every vector.
      float sc[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < 2; ++n) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
#pragma unroll
      for (int st = 0; st < KS; ++st) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const T *p = &sq[mt * 16 + grp][st * 16 + 2 * tig];
          qa[mt][0] = *reinterpret_cast<const uint32_t *>(p);
          qa[mt][1] = *reinterpret_cast<const uint32_t *>(p + 8 * PAD);
          qa[mt][2] = *reinterpret_cast<const uint32_t *>(p + 8);
          qa[mt][3] = *reinterpret_cast<const uint32_t *>(p + 8 * PAD + 8);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const T *kr = &ks[warp * 16 + n * 8 + grp][st * 16 + 2 * tig];
          const uint32_t b0 = *reinterpret_cast<const uint32_t *>(kr);
          const uint32_t b1 = *reinterpret_cast<const uint32_t *>(kr + 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma16816<T>(sc[mt][n], qa[mt], b0, b1);
        }
      }
      __syncthreads();  // every warp is done with ks
      if (an < s1) load_tile(ks, kh, an);
      cp_async_commit();
      // Mask and softcap (log2 units); this warp's row maxima over its 16 keys.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tm = -INFINITY;
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = a + warp * 16 + n * 8 + 2 * tig + e;
              float x = sc[mt][n][2 * r + e];
              if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
              x = r_ok[mt][r] && j < s1 && sees(j, r_qp[mt][r], r_lo[mt][r]) ? x * LOG2E
                                                                           : -INFINITY;
              sc[mt][n][2 * r + e] = x;
              tm = fmaxf(tm, x);
            }
          tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
          tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
          if (tig == 0) wmax[warp][mt * 16 + grp + 8 * r] = tm;
        }
      __syncthreads();  // every warp's maxima
      // The tile's row maxima (over the warps, in order), the new running max and its
      // correction; P of this warp's keys (rounded to T) into shared memory, its row sums
      // beside it.
      float corr[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int vec = mt * 16 + grp + 8 * r;
          float tm = -INFINITY;
#pragma unroll
          for (int w = 0; w < W; ++w) tm = fmaxf(tm, wmax[w][vec]);
          const float m_new = fmaxf(m[mt][r], tm);
          corr[mt][r] = m_new == -INFINITY ? 1.f : exp2f(m[mt][r] - m_new);
          m[mt][r] = m_new;
          float ps = 0.f;
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const float p0 = m_new == -INFINITY ? 0.f : exp2f(sc[mt][n][2 * r] - m_new);
            const float p1 = m_new == -INFINITY ? 0.f : exp2f(sc[mt][n][2 * r + 1] - m_new);
            ps += p0;
            ps += p1;
            *reinterpret_cast<uint32_t *>(&sp[vec][warp * 16 + n * 8 + 2 * tig]) =
                pack2<T>(p0, p1);
          }
          ps += __shfl_xor_sync(0xffffffffu, ps, 1);
          ps += __shfl_xor_sync(0xffffffffu, ps, 2);
          if (tig == 0) wsum[warp][vec] = ps;
#pragma unroll
          for (int n = 0; n < NTW; ++n) {
            o[mt][n][2 * r] *= corr[mt][r];
            o[mt][n][2 * r + 1] *= corr[mt][r];
          }
        }
      cp_async_wait<1>();  // V of this tile
      __syncthreads();     // P and the warps' sums complete
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int vec = mt * 16 + grp + 8 * r;
          float ts = 0.f;
#pragma unroll
          for (int w = 0; w < W; ++w) ts += wsum[w][vec];
          l[mt][r] = l[mt][r] * corr[mt][r] + ts;
        }
      // O += P V over the tile's keys, this warp's n-tiles.
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const T *pr = &sp[mt * 16 + grp][kk * 16 + 2 * tig];
          pa[mt][0] = *reinterpret_cast<const uint32_t *>(pr);
          pa[mt][1] = *reinterpret_cast<const uint32_t *>(pr + 8 * PP);
          pa[mt][2] = *reinterpret_cast<const uint32_t *>(pr + 8);
          pa[mt][3] = *reinterpret_cast<const uint32_t *>(pr + 8 * PP + 8);
        }
        const T *vr = &vsm[kk * 16 + (lane % 8) + ((lane / 8) & 1) * 8][(lane / 16) * 8];
#pragma unroll
        for (int n = 0; n < NTW; n += 2) {
          uint32_t b[4];
          ldsm_x4_trans(b, vr + (warp * NTW + (NTW == 1 ? -(warp & 1) : n)) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (NTW == 1) {
              mma16816<T>(o[mt][0], pa[mt], b[(warp & 1) * 2], b[(warp & 1) * 2 + 1]);
            } else {
              mma16816<T>(o[mt][n], pa[mt], b[0], b[1]);
              mma16816<T>(o[mt][n + 1], pa[mt], b[2], b[3]);
            }
          }
        }
      }
      __syncthreads();  // every warp is done with vsm and P
      if (an < s1) load_tile(vsm, vh, an);
      cp_async_commit();
      a = an;
    }
    cp_async_wait<0>();

    // Each vector's split result, this warp's dimensions: its output where this is its only
    // split, else its partial row (m, l by the first warp); nothing for a vector that sees no
    // key of this split.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int vec = mt * 16 + grp + 8 * r;
        if (vec >= nv) continue;
        const int qp = qpos_of(vec);
        int f, en;
        split_range(qp, vis_of(qp), f, en);
        const int own = RING && split < f ? split + splits : split;
        if (own < f || own >= en) continue;
        const float M = m[mt][r], L = l[mt][r];
        const long rh = (long)(qp - (len - t)) * heads + head_of(vec);
#pragma unroll
        for (int n = 0; n < NTW; ++n) {
          const int e = (warp * NTW + n) * 8 + 2 * tig;
          if (en - f == 1) {
            y[rh * D + e] = from_f32<T>(L > 0.f ? o[mt][n][2 * r] / L : 0.f);
            y[rh * D + e + 1] = from_f32<T>(L > 0.f ? o[mt][n][2 * r + 1] / L : 0.f);
          } else {
            float *out = part + (rh * splits + split) * (D + 2);
            *reinterpret_cast<float2 *>(out + 2 + e) = make_float2(o[mt][n][2 * r], o[mt][n][2 * r + 1]);
            if (warp == 0 && n == 0 && tig == 0) {
              out[0] = M;
              out[1] = L;
            }
          }
        }
      }
  }
  if (!any_multi) return;

  // The last of the (chunk, kv head)'s live splits to finish combines, for each vector that
  // sees several splits, its splits' partial rows (its count is reset for the next launch).
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int *done = &attn_done[kvh * gridDim.x + blockIdx.x];
    last = atomicAdd(done, (unsigned int)mine) + mine == (unsigned int)(end_u - first_u);
    if (last) *done = 0u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Per vector: M, the largest m of its splits, and L = sum_s l_s exp2(m_s - M): warp w takes
  // vectors w, w + W, ... all at once (their loads in flight together), lanes over the
  // splits, each sum in one order. Then every thread sums acc_s exp2(m_s - M) over the splits
  // in split order for its (vector, pair of dimensions) items, four items and eight splits'
  // loads in flight (the weights of the first CW splits from shared memory).
  constexpr int VPW = NV / W;
  __shared__ float cM[NV], cL[NV];
  // Weights of each vector's first CW splits, over the K tile (free once the splits are done).
  constexpr int CW = 64;
  static_assert(NV * CW * sizeof(float) <= KT * PAD * sizeof(T), "weights fit over ks");
  float(*cw)[CW] = reinterpret_cast<float(*)[CW]>(smem);
  const auto span = [&](int vec, int &f, int &n) {
    const int qp = qpos_of(vec);
    int en;
    split_range(qp, vis_of(qp), f, en);
    n = en - f;
  };
  // Vector vec's partial rows, and split f + s of them (a ring's wrapping past the last).
  const auto rows_of = [&](int vec) {
    const long rh = (long)(qpos_of(vec) - (len - t)) * heads + head_of(vec);
    return part + rh * splits * (D + 2);
  };
  const auto row_at = [&](const float *rows, int f, int s) {
    const int sp = RING && f + s >= splits ? f + s - splits : f + s;
    return rows + (long)sp * (D + 2);
  };
  {
    int fs[VPW], ns[VPW], nmax = 0;
    const float *rows[VPW];
#pragma unroll
    for (int j = 0; j < VPW; ++j) {
      const int vec = warp + j * W;
      fs[j] = 0;
      ns[j] = 0;
      rows[j] = part;
      if (vec < nv) {
        span(vec, fs[j], ns[j]);
        rows[j] = rows_of(vec);
      }
      nmax = max(nmax, ns[j]);
    }
    float M[VPW], L[VPW];
#pragma unroll
    for (int j = 0; j < VPW; ++j) M[j] = -INFINITY, L[j] = 0.f;
    for (int s0 = 0; s0 < nmax; s0 += 32) {
#pragma unroll
      for (int j = 0; j < VPW; ++j)
        if (s0 + lane < ns[j]) M[j] = fmaxf(M[j], __ldcg(row_at(rows[j], fs[j], s0 + lane)));
    }
#pragma unroll
    for (int j = 0; j < VPW; ++j)
#pragma unroll
      for (int o_ = 16; o_ > 0; o_ >>= 1) M[j] = fmaxf(M[j], __shfl_xor_sync(0xffffffffu, M[j], o_));
    for (int s0 = 0; s0 < nmax; s0 += 32) {
#pragma unroll
      for (int j = 0; j < VPW; ++j)
        if (s0 + lane < ns[j]) {
          const float *pr = row_at(rows[j], fs[j], s0 + lane);
          const float ms = __ldcg(pr);
          if (ms > -INFINITY) L[j] += __ldcg(pr + 1) * exp2f(ms - M[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < VPW; ++j) {
      L[j] = warp_sum(L[j]);
      if (lane == 0 && warp + j * W < nv) {
        cM[warp + j * W] = M[j];
        cL[warp + j * W] = L[j];
      }
      // The first CW splits' weights exp2(m_s - M), for the sums below.
      for (int s = lane; s < min(ns[j], CW); s += 32)
        cw[warp + j * W][s] = exp2f(__ldcg(row_at(rows[j], fs[j], s)) - M[j]);
    }
  }
  __syncthreads();
  constexpr int PAIRS = D / 2;
  constexpr int IT = (NV * PAIRS + W * 32 - 1) / (W * 32);
  constexpr int G = IT < 4 ? IT : 4;
  for (int g0 = 0; g0 < IT; g0 += G) {
    int vecs[G], fs[G], ns[G], nmax = 0;
    const float *rows[G];
    float2 acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = threadIdx.x + (g0 + g) * W * 32;
      vecs[g] = i / PAIRS;
      fs[g] = 0;
      ns[g] = 0;
      rows[g] = part;
      if (g0 + g < IT && vecs[g] < nv) {
        span(vecs[g], fs[g], ns[g]);
        rows[g] = rows_of(vecs[g]) + 2 + 2 * (i % PAIRS);
      }
      if (ns[g] <= 1) ns[g] = 0;  // written from its one split, or past the vectors
      nmax = max(nmax, ns[g]);
      acc[g] = make_float2(0.f, 0.f);
    }
    if (nmax == 0) continue;
    for (int s0 = 0; s0 < nmax; s0 += 8) {
#pragma unroll
      for (int u = 0; u < 8; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (s0 + u < ns[g]) {
            // rows[g] points at the item's dimensions: m is 2 + e floats before them.
            const int e = 2 * ((threadIdx.x + (g0 + g) * W * 32) % PAIRS);
            const float *pr = row_at(rows[g], fs[g], s0 + u);
            const float2 x = __ldcg(reinterpret_cast<const float2 *>(pr));
            const float w = s0 + u < CW ? cw[vecs[g]][s0 + u]
                                        : exp2f(__ldcg(pr - 2 - e) - cM[vecs[g]]);
            acc[g].x += x.x * w;
            acc[g].y += x.y * w;
          }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (ns[g] > 0) {
        const int e = 2 * ((threadIdx.x + (g0 + g) * W * 32) % PAIRS);
        const float L = cL[vecs[g]];
        const long rh = (long)(qpos_of(vecs[g]) - (len - t)) * heads + head_of(vecs[g]);
        y[rh * D + e] = from_f32<T>(L > 0.f ? acc[g].x / L : 0.f);
        y[rh * D + e + 1] = from_f32<T>(L > 0.f ? acc[g].y / L : 0.f);
      }
  }
}

// `NAME`: the plain kernel; `NAME_rope`: RoPE, the q/k norms and the K/V store fused in, with
// attn_split's `_rope` arguments (its prologue prefetches [pf0, pf0 + pf0_n) and [pf1,
// pf1 + pf1_n) into the L2).
#define ATTN_MMA1(NAME, T, D, MT, RING)                                                        \
  extern "C" __global__ void __launch_bounds__(mma_warps<D>() * 32, 2)                                  \
      NAME(const T *q, const T *k, const T *v, float *part, T *y, const uint32_t *len_ptr,     \
           uint32_t len_arg, int t, int heads, int group, long q_head_stride,                 \
           long q_row_stride, long kv_head_stride, int split_len, int splits, int window,    \
           float softcap, int ring, int ring_lo) {                                             \
    attn_mma<T, D, MT, false, RING>(q, k, v, part, y, len_ptr, len_arg, t, heads, group,       \
                                    q_head_stride, q_row_stride, kv_head_stride, split_len,   \
                                    splits, window, softcap, ring, ring_lo, FusedRope<T>{});  \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(mma_warps<D>() * 32, 2)                                  \
      NAME##_rope(const T *q, const T *k, const T *v, float *part, T *y,                       \
                  const uint32_t *len_ptr, uint32_t len_arg, int t, int heads, int group,     \
                  long q_head_stride, long q_row_stride, long kv_head_stride, int split_len,  \
                  int splits, int window, float softcap, int ring, int ring_lo,               \
                  const T *k_new, long k_row, const T *v_new, long v_row, const T *cos,       \
                  const T *sin, T *kw, T *vw, const char *pf0, long pf0_n, const char *pf1,  \
                  long pf1_n, const T *qn, const T *kn, float q_eps, float k_eps) {           \
    prefetch_l2(pf0, pf0_n, pf1, pf1_n);                                                       \
    attn_mma<T, D, MT, true, RING>(q, k, v, part, y, len_ptr, len_arg, t, heads, group,        \
                                   q_head_stride, q_row_stride, kv_head_stride, split_len,    \
                                   splits, window, softcap, ring, ring_lo,                    \
                                   FusedRope<T>{k_new, v_new, k_row, v_row, cos, sin, kw, vw, \
                                                qn, kn, q_eps, k_eps});                        \
  }
// `_m1` / `_m2`: one or two m16 tiles of vectors a block; `_ring` over a ring. d = 256
// (Gemma 3): one (two would not fit the registers).
#define ATTN_MMA(NAME, T, D)                                                                   \
  ATTN_MMA1(NAME##_m1, T, D, 1, false) ATTN_MMA1(NAME##_m2, T, D, 2, false)                    \
  ATTN_MMA1(NAME##_m1_ring, T, D, 1, true) ATTN_MMA1(NAME##_m2_ring, T, D, 2, true)
#define ATTN_MMA256(NAME, T)                                                                   \
  ATTN_MMA1(NAME##_m1, T, 256, 1, false) ATTN_MMA1(NAME##_m1_ring, T, 256, 1, true)

ATTN_MMA(attn_mma_bf16_d64, __nv_bfloat16, 64)
ATTN_MMA(attn_mma_bf16_d128, __nv_bfloat16, 128)
ATTN_MMA(attn_mma_f16_d64, __half, 64)
ATTN_MMA(attn_mma_f16_d128, __half, 128)
ATTN_MMA256(attn_mma_bf16_d256, __nv_bfloat16)
ATTN_MMA256(attn_mma_f16_d256, __half)
