// What every kernel file shares: element conversions and vector loads, warp sums, the PDL
// prologue (`pdl_begin`), the L2 prefetch of weights, and the tensor-core (mma, ldmatrix,
// cp.async) helpers. Included once through kernels.cu (one translation unit, one module);
// each family file also includes it, so that it compiles alone with nvcc.
#pragma once
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

// Programmatic dependent launch (sm_90+; `Launch` in launch.rs sets the launch attribute): a
// kernel may start while the kernel ahead of it on the stream still runs. `pdl_begin` first
// lets the next kernel begin launching, then waits until the kernel ahead has finished and
// its writes are visible. Every kernel calls it before it reads anything an earlier kernel
// wrote and before it writes anything (its output may reuse memory an earlier kernel still
// reads): before it, only weights, which no kernel writes, may be read, and prefetches issued
// (an L2 prefetch never changes what a load returns). Since a kernel lets the next one launch
// before its own wait, several kernels' prologues may run ahead of the kernel executing: each
// waits for the one ahead of it, which finished only after waiting for its own, so every
// write is still ordered. Every block calls it, also one with nothing to do, so a kernel
// never finishes before the one ahead. The next kernel may launch before the wait rather than
// after it because that made decode steps faster (docs/kernel-notes.md, "PDL";
// `SPECDEC_LAB_LATE_TRIGGER` restores the old order, for the lab bench only). Older GPUs run
// the kernels one after another and skip it.
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
// `pdl_begin`. Worth it where the kernel ahead leaves HBM idle (docs/kernel-notes.md, "L2
// prefetch").
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
