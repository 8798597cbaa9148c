// Split attention on tensor cores (`SplitAttention` in attention.rs, bf16 / f16, d ≤ 128):
// the query vectors of several rows and heads of one kv head's group share every K/V tile a
// block loads, so a verification block of t rows reads the cache once, not t times.
#pragma once
#include "common.cuh"
#include "attn_split.cu"

constexpr int AM_WARPS = 4;  // warps a block
constexpr int AM_K = 64;     // keys a tile; warp w takes keys 16 w .. 16 w + 15 of each

// Split-K attention of t query rows over a cache, the rows' query vectors on tensor cores.
//
// Vectors: the t * group (row, head) pairs of kv head y, pair i = row * group + head; block x
// takes pairs NV x ... (NV = 16 MT: MT m16 tiles of the mma, zero rows past the last pair).
// Grid: x = ceil(t * group / NV), y = kv head, z: blocks sharing the splits (z takes splits
// z, z + gridDim.z, ... of those its vectors see). Block: AM_WARPS warps. Queries, keys,
// splits, the ring, the window, `len_ptr` and the fused RoPE / K/V store / q/k norms are those
// of `attn_split`; `part` and `y` are laid out as there, (m, l) in log2 units.
//
// Per split: K/V tiles of AM_K keys stream through shared memory (cp.async, the next tile's
// keys loading while this one's values are used); warp w scores its 16 keys of the tile
// against every vector (S = Q K^T, mma), keeps an online softmax per vector and accumulates
// O += P V (P rounded to T, as FlashAttention does); the warps' (m, l, O) are then combined in
// warp order. A vector whose visible keys lie in one split writes its output there; the last
// block of the (chunk, kv head) to finish combines the others' splits.
//
// A vector's result depends on its own row, keys and the split boundaries only: tiles no key
// of which it sees leave its running state exactly as it was (scale 1, products of zero), rows
// of a tile it does not see are multiplied by zero (cache rows no vector of the block sees
// are loaded as zeros, never as stale bytes), and an mma's output row depends on its own input
// row only. So a verification row is bitwise the decode step of its position, whatever the
// other rows and heads of its block, and whatever MT.
template <typename T, int D, int MT, bool ROPE, bool RING>
__device__ void attn_mma(const T *__restrict__ q, const T *__restrict__ k,
                         const T *__restrict__ v, float *__restrict__ part, T *__restrict__ y,
                         const uint32_t *__restrict__ len_ptr, uint32_t len_arg, int t,
                         int heads, int group, long q_head_stride, long q_row_stride,
                         long kv_head_stride, int split_len, int splits, int window,
                         float softcap, int ring, int ring_lo, const FusedRope<T> rope) {
  constexpr int NV = 16 * MT;
  constexpr int PAD = D + 8;  // row stride of the tiles: conflict-free fragment reads
  constexpr int KS = D / 16;  // k-steps of Q K^T
  constexpr int NT = D / 8;   // n-tiles of O
  constexpr int HALF = D / 2;
  constexpr float LOG2E = 1.4426950408889634f;
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
  // into the cache (every block that reads a new position writes the same bytes there first).
  const int fresh = ROPE ? len - t : len;
  const int wlo = max(fresh, vis_u);
  const int writes = ROPE ? max(0, qp_hi + 1 - wlo) * HALF : 0;
  __shared__ __align__(16) T sq[NV][PAD];
  __shared__ float qscale[NV], kscale[32];
  const bool qk_norm = ROPE && rope.qn != nullptr;
  if (qk_norm) {
    for (int item = warp; item < NV + writes / HALF; item += AM_WARPS) {
      const bool is_q = item < NV;
      if (is_q && item >= nv) continue;
      const int n = wlo - fresh + item - NV;  // new key row (not is_q)
      const T *xr = is_q ? q + head_of(item) * q_head_stride + (long)(qpos_of(item) - (len - t)) * q_row_stride
                         : rope.k_new + n * rope.k_row + (long)kvh * D;
      float ss = 0.f;
      for (int e = lane; e < D; e += 32) {
        const float f = to_f32(xr[e]);
        ss += f * f;
      }
      ss = warp_sum(ss);
      if (lane == 0) {
        if (is_q)
          qscale[item] = rsqrtf(ss / D + rope.q_eps);
        else
          kscale[n] = rsqrtf(ss / D + rope.k_eps);
      }
    }
    __syncthreads();
  }
  const auto normed = [&](float x, float scale, const T *w, int f) {
    return to_f32(from_f32<T>(x * scale * to_f32(w[f])));
  };
  for (int i = threadIdx.x; i < max(NV * D, writes); i += blockDim.x) {
    if (i < NV * D) {
      const int vec = i / D, e = i % D;
      float x = 0.f;
      if (vec < nv) {
        const int qp = qpos_of(vec);
        const T *qr = q + head_of(vec) * q_head_stride + (long)(qp - (len - t)) * q_row_stride;
        if (ROPE) {
          const int f = e % HALF;
          const float c = to_f32(rope.cos[(long)qp * HALF + f]);
          const float sn = to_f32(rope.sin[(long)qp * HALF + f]);
          float x1 = to_f32(qr[f]), x2 = to_f32(qr[f + HALF]);
          if (qk_norm) {
            x1 = normed(x1, qscale[vec], rope.qn, f);
            x2 = normed(x2, qscale[vec], rope.qn, f + HALF);
          }
          x = e < HALF ? x1 * c - x2 * sn : x1 * sn + x2 * c;
        } else {
          x = to_f32(qr[e]);
        }
      }
      sq[vec][e] = from_f32<T>(x);
    }
    if (ROPE && i < writes) {
      const int p = wlo + i / HALF, f = i % HALF;
      const int slot = RING ? p % ring : p, ps = slot / split_len;
      const int split = RING && ps < first_u ? ps + splits : ps;
      if (split >= start && split < end_u && (split - start) % zs == 0) {
        const int n = p - fresh;
        const float c = to_f32(rope.cos[(long)p * HALF + f]);
        const float sn = to_f32(rope.sin[(long)p * HALF + f]);
        const T *x = rope.k_new + n * rope.k_row + (long)kvh * D;
        float x1 = to_f32(x[f]), x2 = to_f32(x[f + HALF]);
        if (qk_norm) {
          x1 = normed(x1, kscale[n], rope.kn, f);
          x2 = normed(x2, kscale[n], rope.kn, f + HALF);
        }
        T *o = rope.kw + kvh * kv_head_stride + (long)slot * D;
        o[f] = from_f32<T>(x1 * c - x2 * sn);
        o[f + HALF] = from_f32<T>(x1 * sn + x2 * c);
        const T *vn = rope.v_new + n * rope.v_row + (long)kvh * D;
        T *w = rope.vw + kvh * kv_head_stride + (long)slot * D;
        w[f] = vn[f];
        w[f + HALF] = vn[f + HALF];
      }
    }
  }
  __syncthreads();

  // This thread's rows of the m16 tiles: vectors mt * 16 + grp + 8 r; what each sees.
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

  __shared__ __align__(16) T ks[AM_K][PAD];
  __shared__ __align__(16) T vsm[AM_K][PAD];
  __shared__ float wm[AM_WARPS][NV], wl[AM_WARPS][NV];
  // The warps' combined O of a split [NV][D], over ks once its tiles are done.
  static_assert(NV * D * sizeof(float) <= sizeof(ks), "sacc fits in ks");
  float *sacc = reinterpret_cast<float *>(&ks[0][0]);
  const T *kh = k + kvh * kv_head_stride, *vh = v + kvh * kv_head_stride;
  // Whether some vector sees several splits (else every vector writes its output from the
  // split it sees, and there is nothing to combine).
  bool any_multi = false;
  for (int vec = 0; vec < nv; ++vec) {
    int f, en;
    split_range(qpos_of(vec), vis_of(qpos_of(vec)), f, en);
    any_multi |= en - f > 1;
  }
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
      if (!RING) return a + AM_K > lo_b;
      const int d0 = (a - vslot_u + ring) % ring;
      return d0 < vn_u || d0 + (min(a + AM_K, s1) - a) > ring;
    };
    const auto next = [&](int a) {
      while (a < s1 && !live(a)) a += AM_K;
      return a;
    };
    const auto load_tile = [&](T(*dst)[PAD], const T *src, int a) {
      for (int idx = threadIdx.x; idx < AM_K * D / 8; idx += AM_WARPS * 32) {
        const int r = idx / (D / 8), c = idx % (D / 8) * 8, j = a + r;
        const bool ok = j < s1 && uvis(j);
        cp_async16(&dst[r][c], src + (long)(ok ? j : a) * D + c, ok);
      }
    };
    float o[MT][NT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < NT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
      m[mt][0] = m[mt][1] = -INFINITY;
      l[mt][0] = l[mt][1] = 0.f;
    }
    int a = next(RING ? s0 : s0 + (lo_b - s0) / AM_K * AM_K);
    if (a < s1) {
      load_tile(ks, kh, a);
      cp_async_commit();
      load_tile(vsm, vh, a);
      cp_async_commit();
    }
    while (a < s1) {
      const int an = next(a + AM_K);
      cp_async_wait<1>();  // K of this tile
      __syncthreads();
      float s[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < 2; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
      for (int st = 0; st < KS; ++st) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const T *kr = &ks[warp * 16 + n * 8 + grp][st * 16 + 2 * tig];
          const uint32_t b0 = *reinterpret_cast<const uint32_t *>(kr);
          const uint32_t b1 = *reinterpret_cast<const uint32_t *>(kr + 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const T *qa = &sq[mt * 16 + grp][st * 16 + 2 * tig];
            mma16816<T>(s[mt][n], *reinterpret_cast<const uint32_t *>(qa),
                        *reinterpret_cast<const uint32_t *>(qa + 8 * PAD),
                        *reinterpret_cast<const uint32_t *>(qa + 8),
                        *reinterpret_cast<const uint32_t *>(qa + 8 * PAD + 8), b0, b1);
          }
        }
      }
      __syncthreads();  // every warp is done with ks
      if (an < s1) load_tile(ks, kh, an);
      cp_async_commit();

      // Mask, softcap, online softmax of rows grp, grp + 8 of each m tile (a quad of lanes
      // shares a row; the quad's sums and maxima in one order).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = a + warp * 16 + n * 8 + 2 * tig + (e & 1), r = e >> 1;
            float x = s[mt][n][e];
            if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
            const bool vis = r_ok[mt][r] && j < s1 && sees(j, r_qp[mt][r], r_lo[mt][r]);
            x = vis ? x * LOG2E : -INFINITY;
            s[mt][n][e] = x;
            tmax[r] = fmaxf(tmax[r], x);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
          tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
          const float m_new = fmaxf(m[mt][r], tmax[r]);
          const float corr = m_new == -INFINITY ? 1.f : exp2f(m[mt][r] - m_new);
          m[mt][r] = m_new;
          l[mt][r] *= corr;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            o[mt][n][2 * r] *= corr;
            o[mt][n][2 * r + 1] *= corr;
          }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            const float p = m[mt][r] == -INFINITY ? 0.f : exp2f(s[mt][n][e] - m[mt][r]);
            s[mt][n][e] = p;
            l[mt][r] += p;
          }
      }

      cp_async_wait<1>();  // V of this tile
      __syncthreads();
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][0][0], s[mt][0][1]);
        pa[mt][1] = pack2<T>(s[mt][0][2], s[mt][0][3]);
        pa[mt][2] = pack2<T>(s[mt][1][0], s[mt][1][1]);
        pa[mt][3] = pack2<T>(s[mt][1][2], s[mt][1][3]);
      }
      const T *vr = &vsm[warp * 16 + (lane % 8) + ((lane / 8) & 1) * 8][(lane / 16) * 8];
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        uint32_t b[4];
        ldsm_x4_trans(b, vr + n * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o[mt][n], pa[mt], b[0], b[1]);
          mma16816<T>(o[mt][n + 1], pa[mt], b[2], b[3]);
        }
      }
      __syncthreads();  // every warp is done with vsm
      if (an < s1) load_tile(vsm, vh, an);
      cp_async_commit();
      a = an;
    }
    cp_async_wait<0>();

    // The warps' (m, l, O) of each vector combined in warp order (the quad's l summed first).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
        l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
        if (tig == 0) {
          wm[warp][mt * 16 + grp + 8 * r] = m[mt][r];
          wl[warp][mt * 16 + grp + 8 * r] = l[mt][r];
        }
      }
    for (int i = threadIdx.x; i < NV * D; i += blockDim.x) sacc[i] = 0.f;
    __syncthreads();
    float wgt[MT][2];  // exp2(m_warp - M) of this thread's rows for its own warp
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int vec = mt * 16 + grp + 8 * r;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AM_WARPS; ++w) M = fmaxf(M, wm[w][vec]);
        wgt[mt][r] = m[mt][r] > -INFINITY ? exp2f(m[mt][r] - M) : 0.f;
      }
    for (int w = 0; w < AM_WARPS; ++w) {
      if (warp == w) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            if (m[mt][r] == -INFINITY) continue;
            float *row = sacc + (mt * 16 + grp + 8 * r) * D + 2 * tig;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              row[n * 8] += o[mt][n][2 * r] * wgt[mt][r];
              row[n * 8 + 1] += o[mt][n][2 * r + 1] * wgt[mt][r];
            }
          }
      }
      __syncthreads();
    }
    // Each vector's split result: its output where this is its only split, else its partial
    // row; nothing for a vector that sees no key of this split.
    for (int i = threadIdx.x; i < nv * D; i += blockDim.x) {
      const int vec = i / D, e = i % D, qp = qpos_of(vec);
      int f, en;
      split_range(qp, vis_of(qp), f, en);
      const int own = RING && split < f ? split + splits : split;
      if (own < f || own >= en) continue;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < AM_WARPS; ++w) M = fmaxf(M, wm[w][vec]);
      float L = 0.f;
#pragma unroll
      for (int w = 0; w < AM_WARPS; ++w)
        if (wm[w][vec] > -INFINITY) L += wl[w][vec] * exp2f(wm[w][vec] - M);
      const long rh = (long)(qp - (len - t)) * heads + head_of(vec);
      if (en - f == 1) {
        y[rh * D + e] = from_f32<T>(L > 0.f ? sacc[vec * D + e] / L : 0.f);
      } else {
        float *out = part + (rh * splits + split) * (D + 2);
        out[2 + e] = sacc[vec * D + e];
        if (e == 0) {
          out[0] = M;
          out[1] = L;
        }
      }
    }
    __syncthreads();  // sacc (over ks) is the next split's tiles
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
  // vectors w, w + AM_WARPS, ... all at once (their loads in flight together), lanes over the
  // splits, each sum in one order. Then every thread sums acc_s exp2(m_s - M) over the splits
  // in split order for its (vector, pair of dimensions) items, eight items and eight splits'
  // loads in flight.
  constexpr int VPW = NV / AM_WARPS;
  __shared__ float cM[NV], cL[NV];
  const auto span = [&](int vec, int &f, int &n) {
    const int qp = qpos_of(vec);
    int en;
    split_range(qp, vis_of(qp), f, en);
    n = en - f;
  };
  const auto row_of = [&](int vec, int f, int s) {
    const long rh = (long)(qpos_of(vec) - (len - t)) * heads + head_of(vec);
    const int sp = RING && f + s >= splits ? f + s - splits : f + s;
    return part + (rh * splits + sp) * (D + 2);
  };
  {
    int fs[VPW], ns[VPW], nmax = 0;
#pragma unroll
    for (int j = 0; j < VPW; ++j) {
      const int vec = warp + j * AM_WARPS;
      fs[j] = 0;
      ns[j] = 0;
      if (vec < nv) span(vec, fs[j], ns[j]);
      nmax = max(nmax, ns[j]);
    }
    float M[VPW], L[VPW];
#pragma unroll
    for (int j = 0; j < VPW; ++j) M[j] = -INFINITY, L[j] = 0.f;
    for (int s0 = 0; s0 < nmax; s0 += 32) {
#pragma unroll
      for (int j = 0; j < VPW; ++j)
        if (s0 + lane < ns[j]) M[j] = fmaxf(M[j], __ldcg(row_of(warp + j * AM_WARPS, fs[j], s0 + lane)));
    }
#pragma unroll
    for (int j = 0; j < VPW; ++j)
#pragma unroll
      for (int o_ = 16; o_ > 0; o_ >>= 1) M[j] = fmaxf(M[j], __shfl_xor_sync(0xffffffffu, M[j], o_));
    for (int s0 = 0; s0 < nmax; s0 += 32) {
#pragma unroll
      for (int j = 0; j < VPW; ++j)
        if (s0 + lane < ns[j]) {
          const float *pr = row_of(warp + j * AM_WARPS, fs[j], s0 + lane);
          const float ms = __ldcg(pr);
          if (ms > -INFINITY) L[j] += __ldcg(pr + 1) * exp2f(ms - M[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < VPW; ++j) {
      L[j] = warp_sum(L[j]);
      if (lane == 0 && warp + j * AM_WARPS < nv) {
        cM[warp + j * AM_WARPS] = M[j];
        cL[warp + j * AM_WARPS] = L[j];
      }
    }
  }
  __syncthreads();
  constexpr int PAIRS = D / 2;
  constexpr int IT = (NV * PAIRS + AM_WARPS * 32 - 1) / (AM_WARPS * 32);
  constexpr int G = IT < 8 ? IT : 8;
  for (int g0 = 0; g0 < IT; g0 += G) {
    int vecs[G], fs[G], ns[G], nmax = 0;
    float2 acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = threadIdx.x + (g0 + g) * AM_WARPS * 32;
      vecs[g] = i / PAIRS;
      fs[g] = 0;
      ns[g] = 0;
      if (g0 + g < IT && vecs[g] < nv) span(vecs[g], fs[g], ns[g]);
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
            const int e = 2 * ((threadIdx.x + (g0 + g) * AM_WARPS * 32) % PAIRS);
            const float *pr = row_of(vecs[g], fs[g], s0 + u);
            const float ms = __ldcg(pr);
            const float2 x = __ldcg(reinterpret_cast<const float2 *>(pr + 2 + e));
            if (ms > -INFINITY) {
              const float w = exp2f(ms - cM[vecs[g]]);
              acc[g].x += x.x * w;
              acc[g].y += x.y * w;
            }
          }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (ns[g] > 0) {
        const int e = 2 * ((threadIdx.x + (g0 + g) * AM_WARPS * 32) % PAIRS);
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
  extern "C" __global__ void __launch_bounds__(AM_WARPS * 32)                                  \
      NAME(const T *q, const T *k, const T *v, float *part, T *y, const uint32_t *len_ptr,     \
           uint32_t len_arg, int t, int heads, int group, long q_head_stride,                 \
           long q_row_stride, long kv_head_stride, int split_len, int splits, int window,    \
           float softcap, int ring, int ring_lo) {                                             \
    attn_mma<T, D, MT, false, RING>(q, k, v, part, y, len_ptr, len_arg, t, heads, group,       \
                                    q_head_stride, q_row_stride, kv_head_stride, split_len,   \
                                    splits, window, softcap, ring, ring_lo, FusedRope<T>{});  \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(AM_WARPS * 32)                                  \
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
// `_m1` / `_m2`: one or two m16 tiles of vectors a block; `_ring` over a ring.
#define ATTN_MMA(NAME, T, D)                                                                   \
  ATTN_MMA1(NAME##_m1, T, D, 1, false) ATTN_MMA1(NAME##_m2, T, D, 2, false)                    \
  ATTN_MMA1(NAME##_m1_ring, T, D, 1, true) ATTN_MMA1(NAME##_m2_ring, T, D, 2, true)

ATTN_MMA(attn_mma_bf16_d32, __nv_bfloat16, 32)
ATTN_MMA(attn_mma_bf16_d64, __nv_bfloat16, 64)
ATTN_MMA(attn_mma_bf16_d128, __nv_bfloat16, 128)
ATTN_MMA(attn_mma_f16_d32, __half, 32)
ATTN_MMA(attn_mma_f16_d64, __half, 64)
ATTN_MMA(attn_mma_f16_d128, __half, 128)
