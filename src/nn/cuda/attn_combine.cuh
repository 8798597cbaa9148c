// The combine of split attention's per-split partial softmax rows (`attn_split.cu`): over
// global memory by the last split of a (row, head block), or inside a thread block cluster.
#pragma once
#include "common.cuh"

// Most splits (`MAX_SPLITS` in attention.rs): the combine stages one weight per split and head
// in shared memory.
constexpr int MAX_SPLITS = 512;

// Combines the n splits' partial results of nh ≤ HB heads at once: head h's split s is
// p[h * head_stride + at(s) * (D + 2) ...] = (m, l, acc[D]) with at(s) = first + s, less
// `splits` past the last split (a ring's visible splits wrap), and at(n - 1) = `tail_at`
// where that is not negative (a staged tail's entry, after the ring's), and its output
// out[h * D + e] = sum_s acc_s[e] exp(m_s - M) / sum_s l_s exp(m_s - M), M the largest m_s.
// Warp h takes head h's scalars (one round of independent loads for the m's, one for the l's,
// the weights staged in shared memory); then every thread sums its (head, dimension) items
// over the splits, eight splits' loads in flight per item. All heads' chains of loads
// overlap: combining four heads one after another made an 8k-key decode step's combine a
// chain of ~24 dependent L2 round trips, now ~6. Per head the arithmetic is that head's
// alone (sums in split order), so a row's result does not depend on its neighbours. Reads
// through L2 (`__ldcg`): other blocks wrote p. Needs blockDim.x == W * 32 and HB ≤ W.
template <typename T, int D, int HB, int W, bool WRAP>
__device__ void attn_combine(const float *__restrict__ p, long head_stride, int nh, int first,
                             int n, int splits, int tail_at, T *__restrict__ out) {
  const auto at = [&](int s) {
    return (long)(WRAP && tail_at >= 0 && s == n - 1 ? tail_at
                  : WRAP && first + s >= splits      ? first + s - splits
                                                     : first + s) *
           (D + 2);
  };
  static_assert(HB <= W, "one warp per head's scalars");
  __shared__ float weight[HB][MAX_SPLITS + 1];
  __shared__ float total[HB];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp < nh) {
    const float *ph = p + warp * head_stride;
    float m = -INFINITY;
    for (int s = lane; s < n; s += 32) {
      const float ms = __ldcg(ph + at(s));
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
      l += __ldcg(ph + at(s) + 1) * wgt;
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
          a[it] += __ldcg(p + h * head_stride + at(s) + 2 + e) * weight[h][s];
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
