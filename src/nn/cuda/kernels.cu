// specdec's own CUDA kernels, compiled by build.rs (a fat binary: SASS and PTX) when the
// `cuda` feature is on and launched through candle's custom-op interface (src/nn/cuda/).
// Every kernel has a device-generic fallback made of candle ops; these exist where a
// measurement showed candle's op sequence costing us (see the README's GPU section).
//
// Layout conventions (batch 1):
//   q:      [heads, t, d] with element (h, i, e) at q[h * q_head_stride + i * q_row_stride + e]
//   k, v:   a cache buffer [kv_heads, capacity, d]; element (g, j, e) at
//           k[g * kv_head_stride + j * d + e] (the views handed out by the KV cache)
//   out:    [t, heads * d] row-major, ready for the output projection.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }

// E consecutive elements, loaded in one vector access (the caller guarantees alignment).
template <typename T, int E> struct __align__(sizeof(T) * E) Vec { T x[E]; };

template <typename T, int E>
__device__ __forceinline__ void load_vec(const T *p, float (&out)[E]) {
  Vec<T, E> v = *reinterpret_cast<const Vec<T, E> *>(p);
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = to_f32(v.x[e]);
}

// E consecutive elements as stored, through the L2 only (`ld.global.cg`): for data this
// kernel wrote itself, which the read-only path may not see.
template <typename T, int E>
__device__ __forceinline__ Vec<T, E> load_raw_cg(const T *p) {
  constexpr int BYTES = sizeof(T) * E;
  static_assert(BYTES % 16 == 0 || BYTES == 8 || BYTES == 4 || BYTES == 2, "vector");
  Vec<T, E> v;
  if constexpr (BYTES % 16 == 0) {
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i)
      reinterpret_cast<uint4 *>(&v)[i] = __ldcg(reinterpret_cast<const uint4 *>(p) + i);
  } else if constexpr (BYTES == 8) {
    *reinterpret_cast<uint2 *>(&v) = __ldcg(reinterpret_cast<const uint2 *>(p));
  } else if constexpr (BYTES == 4) {
    *reinterpret_cast<unsigned *>(&v) = __ldcg(reinterpret_cast<const unsigned *>(p));
  } else {
    *reinterpret_cast<unsigned short *>(&v) = __ldcg(reinterpret_cast<const unsigned short *>(p));
  }
  return v;
}

// load_vec through the L2 only (see load_raw_cg).
template <typename T, int E>
__device__ __forceinline__ void load_vec_cg(const T *p, float (&out)[E]) {
  const Vec<T, E> v = load_raw_cg<T, E>(p);
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = to_f32(v.x[e]);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Programmatic dependent launch (sm_90+; `Launch` in mod.rs sets the launch attribute): a
// kernel may start while the kernel ahead of it on the stream still runs. `pdl_begin` first
// lets the next kernel begin launching, then waits until the kernel ahead has finished and
// its writes are visible. Every kernel calls it before it reads anything an earlier kernel
// wrote and before it writes anything (its output may reuse memory an earlier kernel still
// reads): before it, only weights, which no kernel writes, may be read, and prefetches issued
// (an L2 prefetch never changes what a load returns). Since a kernel lets the next one launch
// before its own wait, several kernels' prologues may run ahead of the kernel executing: each
// waits for the one ahead of it, which finished only after waiting for its own, so every
// write is still ordered. Every block calls it, also one with nothing to do, so a kernel
// never finishes before the one ahead. Letting the next kernel launch before the wait rather
// than after it measured on the H200 (2026-11-26, scripts/gemv_lab.cu `model`): a 1B-shaped
// decode step 0.678 -> 0.664 ms, an 8B-shaped one 3.83 -> 3.80 ms. (`SPECDEC_LAB_LATE_TRIGGER`
// restores the old order, for the lab bench only.) Older GPUs run the kernels one after
// another and skip it.
#ifdef SPECDEC_KERNEL_TRACE
// Diagnostics builds only (scripts/gemv_lab.cu, or build.rs with SPECDEC_KERNEL_TRACE=1; read
// by `nn::kernel_trace`): per block, its launch's grid id, SM, and the globaltimer times it
// reached `pdl_begin` and passed its wait.
struct LabRec {
  unsigned long long grid, entry, release;
  unsigned sm, pad;
};
constexpr unsigned LAB_RECS = 1u << 20;
__device__ LabRec lab_recs[LAB_RECS];
__device__ unsigned lab_count;
#endif
__device__ __forceinline__ void pdl_begin() {
#if __CUDA_ARCH__ >= 900
#ifdef SPECDEC_KERNEL_TRACE
  unsigned long long t0 = 0, gid = 0;
  unsigned slot = 0;
  if (threadIdx.x == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
    slot = atomicAdd(&lab_count, 1u);
  }
#endif
#ifdef SPECDEC_LAB_LATE_TRIGGER
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#else
  asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
#endif
#ifdef SPECDEC_KERNEL_TRACE
  if (threadIdx.x == 0 && slot < LAB_RECS) {
    unsigned long long t1;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    lab_recs[slot] = LabRec{gid, t0, t1, sm, 0u};
  }
#endif
#endif
}


// L2 prefetch of weights a later kernel of the step reads, from a latency-bound kernel's
// prologue while HBM would idle: up to two byte ranges (16-byte aligned, whole 16-byte
// vectors), in 64 KB bulk requests at L2 evict-last priority, consecutive requests on
// different blocks. Weights only: no kernel writes them, so they may be read before
// `pdl_begin`. Lab bench (scripts/gemv_lab.cu, docs/gpu-decode-2026-11-25.md): the first 8 MB
// of the gate/up weight prefetched from RoPE's prologue took 3.5% off a 1B-shaped step and
// left an 8B-shaped one unchanged (+0.07%).
__device__ __forceinline__ void prefetch_l2(const char *p0, long n0, const char *p1, long n1) {
#if __CUDA_ARCH__ >= 900
  constexpr long CH = 65536;
  const long c0 = (n0 + CH - 1) / CH, total = c0 + (n1 + CH - 1) / CH;
  const long blocks = (long)gridDim.x * gridDim.y * gridDim.z;
  const long block = blockIdx.x + (long)gridDim.x * (blockIdx.y + (long)gridDim.y * blockIdx.z);
  const long gid = threadIdx.x * blocks + block, stride = blocks * blockDim.x;
  if (gid >= total) return;
  unsigned long long pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  for (long c = gid; c < total; c += stride) {
    const bool first = c < c0;
    const long off = (first ? c : c - c0) * CH, left = (first ? n0 : n1) - off;
    const unsigned size = (unsigned)((left < CH ? left : CH) & ~15L);
    if (size)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;"
                   :: "l"((first ? p0 : p1) + off), "r"(size), "l"(pol) : "memory");
  }
#endif
}


// Split counts of attn_split, per (row, head): zero at module load, back to zero after each
// launch. `ATTN_COUNTERS` in attention.rs.
constexpr int ATTN_COUNTERS = 8192;
__device__ unsigned int attn_done[ATTN_COUNTERS];
// Most splits (`MAX_SPLITS` in attention.rs): the combine stages one weight per split and head
// in shared memory.
constexpr int MAX_SPLITS = 512;

// Combines the n splits' partial results of nh ≤ HB heads at once: head h's split s is
// p[h * head_stride + s * (D + 2) ...] = (m, l, acc[D]), and its output
// out[h * D + e] = sum_s acc_s[e] exp(m_s - M) / sum_s l_s exp(m_s - M), M the largest m_s.
// Warp h takes head h's scalars (one round of independent loads for the m's, one for the l's,
// the weights staged in shared memory); then every thread sums its (head, dimension) items
// over the splits, eight splits' loads in flight per item. All heads' chains of loads
// overlap: combining four heads one after another made an 8k-key decode step's combine a
// chain of ~24 dependent L2 round trips, now ~6. Per head the arithmetic is that head's
// alone (sums in split order), so a row's result does not depend on its neighbours. Reads
// through L2 (`__ldcg`): other blocks wrote p. Needs blockDim.x == W * 32 and HB ≤ W.
template <typename T, int D, int HB, int W>
__device__ void attn_combine(const float *__restrict__ p, long head_stride, int nh, int n,
                             T *__restrict__ out) {
  static_assert(HB <= W, "one warp per head's scalars");
  __shared__ float weight[HB][MAX_SPLITS];
  __shared__ float total[HB];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp < nh) {
    const float *ph = p + warp * head_stride;
    float m = -INFINITY;
    for (int s = lane; s < n; s += 32) {
      const float ms = __ldcg(ph + (long)s * (D + 2));
      weight[warp][s] = ms;
      m = fmaxf(m, ms);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int s = lane; s < n; s += 32) {
      const float ms = weight[warp][s];
      const float wgt = ms > -INFINITY ? __expf(ms - m) : 0.f;
      weight[warp][s] = wgt;
      l += __ldcg(ph + (long)s * (D + 2) + 1) * wgt;
    }
    l = warp_sum(l);
    if (lane == 0) total[warp] = l;
  }
  __syncthreads();
  constexpr int ITEMS = (HB * D + W * 32 - 1) / (W * 32);
  float a[ITEMS];
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) a[it] = 0.f;
  for (int s0 = 0; s0 < n; s0 += 8) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int s = s0 + u;
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int i = threadIdx.x + it * W * 32, h = i / D, e = i % D;
        if (s < n && h < nh)
          a[it] += __ldcg(p + h * head_stride + (long)s * (D + 2) + 2 + e) * weight[h][s];
      }
    }
  }
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int i = threadIdx.x + it * W * 32, h = i / D, e = i % D;
    if (h < nh) out[h * D + e] = from_f32<T>(total[h] > 0.f ? a[it] / total[h] : 0.f);
  }
}

// Thread block clusters (compute capability 9.0+; the host launches the `_cl` kernels only
// there). `cluster_sync`: every thread of every block of the cluster arrives, with release
// semantics for its earlier writes (shared memory included), and waits, with acquire
// semantics. `ld_cluster`: a float of block `rank`'s shared memory at the address `p` has in
// this block's (distributed shared memory: the same static layout in every block).
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ float ld_cluster(const float *p, unsigned rank) {
#if __CUDA_ARCH__ >= 900
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  unsigned r;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r));
  return v;
#else
  return 0.f;
#endif
}

// Most splits of a cluster-combined split attention (`CLUSTER_SPLITS` in attention.rs): the
// portable cluster size.
constexpr int CL_MAX = 8;

// The cluster's combine (`_cl` kernels): blocks first ... first + n - 1 of the cluster (one
// split each, ranks = splits) hold their split's (m, l, acc[D]) for nh ≤ HB heads in shared
// memory (`cm`, `cl`, `cacc` [HB][D]); this block reads them all, every load of a thread in
// flight at once (one round trip within the GPC, where the global combine takes a fence, a
// counter and three dependent L2 round trips), and writes out[h * D + e] =
// sum_s acc_s[e] exp(m_s - M) / sum_s l_s exp(m_s - M), M the largest m_s, both sums in
// split order. Like `attn_combine`, a head's result depends on its own splits only.
template <typename T, int D, int HB, int W>
__device__ void attn_combine_cluster(const float *cm, const float *cl, const float *cacc,
                                     int nh, int first, int n, T *__restrict__ out) {
  for (int i = threadIdx.x; i < nh * D; i += W * 32) {
    const int h = i / D, e = i % D;
    float ms[CL_MAX], ls[CL_MAX], as[CL_MAX];
#pragma unroll
    for (int s = 0; s < CL_MAX; ++s)
      if (s < n) {
        ms[s] = ld_cluster(cm + h, first + s);
        ls[s] = ld_cluster(cl + h, first + s);
        as[s] = ld_cluster(cacc + h * D + e, first + s);
      }
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < CL_MAX; ++s)
      if (s < n) M = fmaxf(M, ms[s]);
    float L = 0.f, a = 0.f;
#pragma unroll
    for (int s = 0; s < CL_MAX; ++s)
      if (s < n && ms[s] > -INFINITY) {
        const float w = __expf(ms[s] - M);
        L += ls[s] * w;
        a += as[s] * w;
      }
    out[h * D + e] = from_f32<T>(L > 0.f ? a / L : 0.f);
  }
}

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
template <typename T> struct FusedRope {
  const T *k_new, *v_new;  // [t, kv_heads, d] rows k_row / v_row apart, heads d apart
  long k_row, v_row;
  const T *cos, *sin;      // [P, d / 2] tables
  T *kw, *vw;              // the cache buffers k and v view, written
};

template <typename T, int E, int HB, int W, bool ROPE, bool HV = false, bool CL = false>
__device__ void attn_split(const T *__restrict__ q, const T *__restrict__ k,
                           const T *__restrict__ v, float *__restrict__ part, T *__restrict__ y,
                           const uint32_t *__restrict__ len_ptr, uint32_t len_arg, int t,
                           int heads, int group, long q_head_stride, long q_row_stride,
                           long kv_head_stride, int split_len, int splits, int window,
                           float softcap, const FusedRope<T> rope) {
  constexpr int D = 32 * E;
  // Elements per 16-byte load of a key row.
  constexpr int V16 = 16 / sizeof(T);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hblocks = (group + HB - 1) / HB;
  const int row = blockIdx.x / hblocks, hb = blockIdx.x % hblocks;
  const int h0 = blockIdx.y * group + hb * HB, nh = min(HB, group - hb * HB);
  const int len = len_ptr ? (int)*len_ptr : (int)len_arg;
  const int qpos = len - t + row;
  // The splits holding a key this query sees: [first_split, end_split). This block takes
  // those congruent to blockIdx.z modulo gridDim.z, one after another; a block without any
  // (a graph's splits span the cache's capacity) leaves at once.
  const int first_split = window > 0 ? max(0, qpos + 1 - window) / split_len : 0;
  const int end_split = min(qpos / split_len + 1, splits);
  const int z = blockIdx.z, zs = gridDim.z;
  const int start = z + (max(0, first_split - z) + zs - 1) / zs * zs;
  // CL: the row's splits are one cluster's blocks (gridDim.z = splits ≤ CL_MAX, one split a
  // block, cluster rank = split). Where the query sees several, every block of the cluster
  // takes part in the combine's two barriers, those without a visible key included.
  const bool multi = end_split - first_split > 1;
  if (start >= end_split) {
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
  // tile into registers instead held 70-130 more registers a thread and measured slower.)
  // Lab bench, H100, 2026-11-25: the 1B-shaped step -2.7%, the 8B-shaped -1.2%; in the model
  // 1B decode at 128 tokens -3.4%, 8B -1.8%. Only for queries that see at most PF_SPLITS
  // splits: over an 8,000-token cache every block's prefetch together is the layer's whole
  // K/V (33 MB for the 8B shape), issued while the product ahead streams its weights, and
  // decode there measured 1-2% slower. Touches no result: the loads read the same bytes.
  constexpr int PF_SPLITS = 4;
  if (end_split - first_split <= PF_SPLITS) {
    const int a = start * split_len, b = min((start + 1) * split_len, len - t);
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
  for (int i = threadIdx.x; i < max(HB * D, writes); i += blockDim.x) {
    const int h = i / D, e = i % D;
    if (h < HB) {
      const T *qr = q + (h0 + h) * q_head_stride + row * q_row_stride;
      float x = 0.f;
      if (ROPE && h < nh) {
        const int f = e % HALF;
        const float c = to_f32(rope.cos[(long)qpos * HALF + f]);
        const float sn = to_f32(rope.sin[(long)qpos * HALF + f]);
        const float x1 = to_f32(qr[f]), x2 = to_f32(qr[f + HALF]);
        x = to_f32(from_f32<T>(e < HALF ? x1 * c - x2 * sn : x1 * sn + x2 * c));
      } else if (h < nh) {
        x = to_f32(qr[e]);
      }
      sq[h][e] = x;
    }
    const int p = fresh + i / HALF, f = i % HALF, split = p / split_len;
    const bool visible = window <= 0 || p > qpos - window;
    if (ROPE && i < writes && visible && split >= start && (split - start) % zs == 0) {
      const int n = p - fresh;
      const float c = to_f32(rope.cos[(long)p * HALF + f]);
      const float sn = to_f32(rope.sin[(long)p * HALF + f]);
      const T *x = rope.k_new + n * rope.k_row + (long)blockIdx.y * D;
      const float x1 = to_f32(x[f]), x2 = to_f32(x[f + HALF]);
      T *o = rope.kw + blockIdx.y * kv_head_stride + (long)p * D;
      o[f] = from_f32<T>(x1 * c - x2 * sn);
      o[f + HALF] = from_f32<T>(x1 * sn + x2 * c);
      const T *vn = rope.v_new + n * rope.v_row + (long)blockIdx.y * D;
      T *w = rope.vw + blockIdx.y * kv_head_stride + (long)p * D;
      w[f] = vn[f];
      w[f + HALF] = vn[f + HALF];
    }
  }
  __syncthreads();
  const T *kb = k + blockIdx.y * kv_head_stride;
  const T *vb = v + blockIdx.y * kv_head_stride + lane * E;
  __shared__ float sm[W][HB], sl[W][HB], sacc[W][HB][D];
  // CL: this block's split result, read by the combining block of the cluster.
  __shared__ float cm[CL ? HB : 1], cl[CL ? HB : 1], cacc[CL ? HB : 1][CL ? D : 1];
  int mine = 0;  // splits this block wrote
  for (int split = start; split < end_split; split += zs, ++mine) {
    const int hi = min(qpos + 1, (split + 1) * split_len);
    int lo = split * split_len;
    if (window > 0) lo = max(lo, qpos + 1 - window);
    float m[HB], l[HB], acc[HB][E];
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
    }
    for (int tile = split * split_len + warp * 32; tile < hi; tile += W * 32) {
      const int j = tile + lane;
      const bool live = j >= lo && j < hi;
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
          // serialise the batches of independent loads (measured: 2.4x slower kernel).
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
    const bool only = end_split - first_split == 1;
    for (int h = 0; h < nh; ++h) {
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, sm[w][h]);
      float L = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w)
        if (sm[w][h] > -INFINITY) L += sl[w][h] * __expf(sm[w][h] - M);
      const int rh = row * heads + h0 + h;
      float *out = CL ? nullptr : part + ((long)rh * splits + split) * (D + 2);
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
    last = atomicAdd(done, (unsigned int)mine) + mine == (unsigned int)(end_split - first_split);
    if (last) *done = 0u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int rh = row * heads + h0;
  attn_combine<T, D, HB, W>(part + ((long)rh * splits + first_split) * (D + 2),
                         (long)splits * (D + 2), nh, end_split - first_split, y + (long)rh * D);
}

// `NAME`: the plain kernel; `NAME_rope`: RoPE and the K/V store fused in (FusedRope), whose
// prologue also prefetches [pf0, pf0 + pf0_n) and [pf1, pf1 + pf1_n) into the L2
// (`prefetch_l2`; lengths 0 for none).
#define ATTN_SPLIT1(NAME, T, E, HB, W)                                                          \
  extern "C" __global__ void __launch_bounds__(W * 32)                                     \
      NAME(const T *q, const T *k, const T *v, float *part, T *y, const uint32_t *len_ptr,     \
           uint32_t len_arg, int t, int heads, int group, long q_head_stride,                 \
           long q_row_stride, long kv_head_stride, int split_len, int splits, int window,    \
           float softcap) {                                                                    \
    attn_split<T, E, HB, W, false>(q, k, v, part, y, len_ptr, len_arg, t, heads, group,       \
                                q_head_stride, q_row_stride, kv_head_stride, split_len,       \
                                splits, window, softcap, FusedRope<T>{});                     \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(W * 32)                                     \
      NAME##_rope(const T *q, const T *k, const T *v, float *part, T *y,                       \
                  const uint32_t *len_ptr, uint32_t len_arg, int t, int heads, int group,     \
                  long q_head_stride, long q_row_stride, long kv_head_stride, int split_len,  \
                  int splits, int window, float softcap, const T *k_new, long k_row,          \
                  const T *v_new, long v_row, const T *cos, const T *sin, T *kw, T *vw,       \
                  const char *pf0, long pf0_n, const char *pf1, long pf1_n) {                 \
    prefetch_l2(pf0, pf0_n, pf1, pf1_n);                                                       \
    attn_split<T, E, HB, W, true>(q, k, v, part, y, len_ptr, len_arg, t, heads, group,        \
                               q_head_stride, q_row_stride, kv_head_stride, split_len,        \
                               splits, window, softcap,                                       \
                               FusedRope<T>{k_new, v_new, k_row, v_row, cos, sin, kw, vw});   \
  }
#define ATTN_SPLIT(NAME, T, E)                                                                 \
  ATTN_SPLIT1(NAME##_h1, T, E, 1, 4) ATTN_SPLIT1(NAME##_h4, T, E, 4, 4)                          \
  ATTN_SPLIT1(NAME##_h1_w8, T, E, 1, 8) ATTN_SPLIT1(NAME##_h4_w8, T, E, 4, 8)                    \
  ATTN_SPLIT1(NAME##_h2_w8, T, E, 2, 8)

// The eight-warp fused kernels with HV (`_hv`: d <= 64) and CL (`_cl`: the splits combined
// in a cluster); see attn_split.
#define ATTN_SPLIT_FUSED8(NAME, T, E, HB, HV, CL)                                               \
  extern "C" __global__ void __launch_bounds__(8 * 32)                                         \
      NAME(const T *q, const T *k, const T *v, float *part, T *y, const uint32_t *len_ptr,     \
           uint32_t len_arg, int t, int heads, int group, long q_head_stride,                 \
           long q_row_stride, long kv_head_stride, int split_len, int splits, int window,    \
           float softcap, const T *k_new, long k_row, const T *v_new, long v_row,            \
           const T *cos, const T *sin, T *kw, T *vw, const char *pf0, long pf0_n,            \
           const char *pf1, long pf1_n) {                                                     \
    prefetch_l2(pf0, pf0_n, pf1, pf1_n);                                                       \
    attn_split<T, E, HB, 8, true, HV, CL>(q, k, v, part, y, len_ptr, len_arg, t, heads, group, \
                                          q_head_stride, q_row_stride, kv_head_stride,        \
                                          split_len, splits, window, softcap,                 \
                                          FusedRope<T>{k_new, v_new, k_row, v_row, cos, sin,  \
                                                       kw, vw});                              \
  }
#define ATTN_SPLIT_HV(NAME, T, E)                                                              \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_hv, T, E, 1, true, false)                                \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_hv, T, E, 4, true, false)                                \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_hv, T, E, 2, true, false)                                \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_hv_cl, T, E, 2, true, true)                              \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_hv_cl, T, E, 1, true, true)                              \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_hv_cl, T, E, 4, true, true)
#define ATTN_SPLIT_CL(NAME, T, E)                                                              \
  ATTN_SPLIT_FUSED8(NAME##_h1_w8_rope_cl, T, E, 1, false, true)                                \
  ATTN_SPLIT_FUSED8(NAME##_h4_w8_rope_cl, T, E, 4, false, true)                                \
  ATTN_SPLIT_FUSED8(NAME##_h2_w8_rope_cl, T, E, 2, false, true)

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

// ---- Tensor-core helpers (sm_80+): bf16 / f16 mma with f32 accumulation. ----

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

// c += a b for one m16n8k16 tile: a (row-major 16x16) in 4 registers, b (col-major 16x8)
// in 2, c (16x8 f32) in 4, in the PTX fragment layouts (lane = 4 * group + tig:
// a: {(group, 2 tig), (group + 8, 2 tig), (group, 2 tig + 8), (group + 8, 2 tig + 8)},
// b: {(k = 2 tig, n = group), (k = 2 tig + 8, n = group)}, c: rows group / group + 8, columns
// 2 tig, 2 tig + 1; each register holds two consecutive elements, the lower index low).
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  mma16816<T>(c, a, b0, b1);
}

// Four 8x8 b16 matrices from shared memory, transposed (lane l gives the address of row
// l % 8 of matrix l / 8; register i receives matrix i's element pair (2 tig, 2 tig + 1) of
// column `group`).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void *p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// 16 bytes global -> shared without passing through registers; `fill` false writes zeros.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool fill) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  const int n = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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
// GATED (the gated MLP's SiLU inside the gate/up product): w is the fused [2 out, in]
// gate/up weight (gate rows, then up rows) and y[r, o] = silu(g) * u of the rounded products
// g = x w[o], u = x w[out + o], exactly what `silu_mul` computes from the plain product: the
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
//   way. Measured on the H200 (2026-11-23, scripts/gemv_lab.cu): a 1B-shaped draft step
//   0.83 -> 0.78 ms, an 8B-shaped one 3.91 -> 3.84 ms.
// - GEMV_RESID: y = round(aux + round(w . x)), the residual add after the product, in the
//   arithmetic of `add_rmsnorm`'s sum (aux: [rows, out], the residual stream).
// `in` is a multiple of 32. Grid: x = ceil(out / 16) (GATED: ceil(out / 8)). Block:
// WARPS * 32.
constexpr int GEMV_PLAIN = 0, GEMV_NORM = 1, GEMV_RESID = 2;
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
// lanes read 64 V contiguous bytes: V = 2 made an 8B-shaped decode step 7% faster on the
// H200). (An L2 prefetch of each warp's first chunks before `pdl_begin` made it 2-7% slower.)
template <typename T, int NT, int WARPS, bool GATED, int V, int MODE>
__device__ void gemv_tc(const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y,
                        int rows, int in, int out, const T *__restrict__ aux, float eps) {
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
      y[(long)r * out + o0 + o] = from_f32<T>(g / (1.f + __expf(-g)) * u);
    }
  } else {
    // Thread i < 256 takes output o0 + i / 16 of row i % 16.
    const int o = threadIdx.x / 16, r = threadIdx.x % 16;
    if (threadIdx.x < 256 && r / 8 < NT && r < rows && o0 + o < out) {
      const long at = (long)r * out + o0 + o;
      const T p = from_f32<T>(sum(o, r) * scale(r));
      y[at] = MODE == GEMV_RESID ? from_f32<T>(to_f32(aux[at]) + to_f32(p)) : p;
    }
  }
}

// One-tile blocks of 8 or 16 warps are held to 64 registers a thread (two 16-warp blocks or
// four 8-warp blocks an SM): GEMV_NORM took ~90 unasked, and the plain and residual kernels
// 68-70 once GEMV_NORM's norm weight moved to shared memory, which ran the 8B-shaped target's
// 256-block products in two waves (lab bench: 3.97 against 3.84 ms a step). (The 1B-shaped
// draft's step was faster with the plain kernels at 68 registers in the lab, 0.72 against
// 0.78 ms, one 128-block grid's blocks per SM; spreading those grids one block per SM by
// their launch's shared memory measured no different in the model, and was dropped.)
#define GEMV_TC1(NAME, T, NT, W, GATED, V, MODE)                                               \
  extern "C" __global__ void __launch_bounds__(W * 32, NT == 1 && W < 32 ? 1024 / (W * 32) : 1) \
      NAME(const T *x, const T *w, T *y, int rows, int in, int out, const T *aux, float eps) { \
    gemv_tc<T, NT, W, GATED, V, MODE>(x, w, y, rows, in, out, aux, eps);                       \
  }
// Kernel names: gemv_tc_[silu_][norm_|resid_]<dtype>_n<NT>_w<W>_v<V>.
#define GEMV_TC_M(T, NAME, NT, W, V)                                                           \
  GEMV_TC1(gemv_tc_##NAME##_n##NT##_w##W##_v##V, T, NT, W, false, V, GEMV_PLAIN)               \
  GEMV_TC1(gemv_tc_norm_##NAME##_n##NT##_w##W##_v##V, T, NT, W, false, V, GEMV_NORM)           \
  GEMV_TC1(gemv_tc_resid_##NAME##_n##NT##_w##W##_v##V, T, NT, W, false, V, GEMV_RESID)         \
  GEMV_TC1(gemv_tc_silu_##NAME##_n##NT##_w##W##_v##V, T, NT, W, true, V, GEMV_PLAIN)           \
  GEMV_TC1(gemv_tc_silu_norm_##NAME##_n##NT##_w##W##_v##V, T, NT, W, true, V, GEMV_NORM)
#define GEMV_TC_W(T, NAME, NT, V)                                                              \
  GEMV_TC_M(T, NAME, NT, 8, V) GEMV_TC_M(T, NAME, NT, 16, V) GEMV_TC_M(T, NAME, NT, 32, V)
#define GEMV_TC(T, NAME, NT) GEMV_TC_W(T, NAME, NT, 1) GEMV_TC_W(T, NAME, NT, 2)
GEMV_TC(__nv_bfloat16, bf16, 1)
GEMV_TC(__nv_bfloat16, bf16, 2)
GEMV_TC(__half, f16, 1)
GEMV_TC(__half, f16, 2)

// Gated MLP activation: y[r, i] = silu(g[r, i]) * u[r, i] where the fused product is
// gu = [g | u], [t, 2 * inter] row-major. One pass instead of candle's strided silu and mul.
template <typename T>
__device__ void silu_mul(const T *__restrict__ gu, T *__restrict__ y, int inter, long n) {
  for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < n;
       idx += (long)gridDim.x * blockDim.x) {
    const long r = idx / inter, i = idx % inter;
    const float g = to_f32(gu[r * 2 * inter + i]), u = to_f32(gu[r * 2 * inter + inter + i]);
    y[idx] = from_f32<T>(g / (1.f + __expf(-g)) * u);
  }
}

#define SILU_MUL(NAME, T)                                                                      \
  extern "C" __global__ void NAME(const T *gu, T *y, int inter, long n) {                     \
    pdl_begin();                                                                               \
    silu_mul<T>(gu, y, inter, n);                                                              \
  }
SILU_MUL(silu_mul_f32, float)
SILU_MUL(silu_mul_bf16, __nv_bfloat16)
SILU_MUL(silu_mul_f16, __half)

// Residual add then RMSNorm of the sum, one block per row: s = x + y (rounded to T, as the
// separate add would), out = s / sqrt(mean(s^2) + eps) * w. Writes s to out[0] and the norm
// to out[1] of a [2, t, h] output. 16-byte vectors: thread i holds vectors i,
// i + blockDim.x, ... (at most NORM_VECS of them) in registers; the norm's weights load
// before `pdl_begin`. h is a multiple of the vector and rows start 16-byte aligned
// (`AddRmsNorm` checks).
constexpr int NORM_VECS = 8;
template <typename T>
__device__ void add_rmsnorm(const T *__restrict__ x, const T *__restrict__ y,
                            const T *__restrict__ w, T *__restrict__ out, int t, int h,
                            float eps) {
  constexpr int VEC = 16 / sizeof(T);
  const int nvec = h / VEC;
  uint4 wv[NORM_VECS], sv[NORM_VECS];
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) wv[k] = reinterpret_cast<const uint4 *>(w)[i];
  }
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
  __shared__ float red[32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  ss = 0.f;
  for (int i = 0; i < (int)blockDim.x / 32; ++i) ss += red[i];
  const float scale = rsqrtf(ss / h + eps);
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
