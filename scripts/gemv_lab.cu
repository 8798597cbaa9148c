// A lab bench of one decode step's kernels, for the H200 (or any sm_90 GPU) without the Rust
// build: it includes src/nn/cuda/kernels.cu and launches its kernels in the order a Llama
// layer runs them (norm, q/k/v GEMV, RoPE + K/V store, split attention at 128 keys, output
// GEMV, norm, gate/up GEMV with SiLU, down GEMV) for 1B- and 8B-shaped layers with random
// bf16 weights, captured into a CUDA graph with programmatic dependent launch as the model
// does, replayed 100 times per measurement. Rows leave kernels out or fold the norms and
// adds into the GEMVs, so each kernel's marginal cost in the pipelined step shows; a first
// check shows whether PDL takes effect inside a graph. No embedding, LM head or argmax, so a
// step is shorter than `gpu_decode`'s. Used for the figures of docs/gpu-decode-2026-11-23.md,
// section "Fourth round". The "pf" rows test L2 prefetches of the next GEMVs' weights (the
// output projection's, the first MB of gate/up's) issued during the latency-bound RoPE and
// attention, from a kernel of their own or from those kernels' prologues. The "alloc" rows
// put a stream-ordered allocation and free around every launch, as a model step's tensors
// do, and print each graph's node and edge census: captured, the memory nodes sit between
// the kernels and every programmatic (PDL) edge becomes a full dependency. "one" replays one
// folded draft-shaped step twice, for ncu to time each kernel beside the model's step.
// Figures: docs/gpu-decode-2026-11-23.md, "Fourth round"; docs/gpu-decode-2026-11-25.md.
//
// On the GPU machine, in the checkout (the CUDA toolkit's nvcc):
//   nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/gemv_lab scripts/gemv_lab.cu
//   /tmp/gemv_lab [copy bandwidth in bytes/s, for the bound column; default 4.1e12] [pf | alloc | one]
#include "../src/nn/cuda/kernels.cu"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)
typedef __nv_bfloat16 bf;
static cudaStream_t st, st2;  // st2: a side branch of the graph (PF_SIDE)
static cudaEvent_t ev_fork, ev_join;
static bool g_pdl = true;
static bool g_side = false;  // launch on st2, without the PDL attribute
// Mimic candle's allocations (the "alloc" rows): before each launch a stream-ordered
// allocation for the kernel's output, after it the previous output freed, as a model step's
// tensors come and go. Captured, these become graph memory nodes between the kernels.
static bool g_alloc = false;
static void *g_prev = nullptr;
static size_t g_smem = 0;  // dynamic shared memory of the next launch (a folded norm's weight)

template <typename... P, typename... A>
void launch(void (*k)(P...), dim3 g, dim3 b, A... a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = g; cfg.blockDim = b; cfg.dynamicSmemBytes = g_smem; cfg.stream = g_side ? st2 : st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = g_pdl && !g_side ? 1 : 0;
  void *out = nullptr;
  if (g_alloc) CK(cudaMallocAsync(&out, 1 << 16, st));
  CK(cudaLaunchKernelEx(&cfg, k, ((P)a)...));
  if (g_alloc) { if (g_prev) CK(cudaFreeAsync(g_prev, st)); g_prev = out; }
}

__global__ void fill(bf *p, long n, unsigned seed) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 0.05f);
  }
}
__device__ __forceinline__ unsigned long long gtimer() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void spin(unsigned long long ns, unsigned long long *rec) {
  pdl_begin();
  unsigned long long t0 = gtimer();
  if (threadIdx.x == 0 && blockIdx.x == 0) rec[0] = t0;
  while (gtimer() - t0 < ns) {}
  if (threadIdx.x == 0 && blockIdx.x == 0) rec[1] = gtimer();
}
__global__ void probe(unsigned long long *rec) {
  unsigned long long t0 = gtimer();
  pdl_begin();
  if (threadIdx.x == 0 && blockIdx.x == 0) { rec[2] = t0; rec[3] = gtimer(); }
}

// L2 prefetch of weight ranges (weights only: no kernel writes them, so they may be read, and
// prefetched, before `pdl_begin`). Up to four ranges; `chunk` bytes per request (a multiple of
// 16). Bulk: one `cp.async.bulk.prefetch.L2` per chunk, consecutive chunks on different blocks
// (each SM's copy engine takes its share). Lines: one `prefetch.global.L2` per 128-byte line,
// consecutive lines on consecutive threads. evict_last: the lines get the L2's evict-last
// priority.
struct PfSet { const char *p[4]; long n[4]; int cnt; int lines; int evict_last; int chunk; };
__device__ __forceinline__ void pf_issue(const PfSet &s, long nblocks, long block, long nthr, long thr) {
  const long ch = s.lines ? 128 : s.chunk;
  long total = 0;
  for (int r = 0; r < s.cnt; ++r) total += (s.n[r] + ch - 1) / ch;
  const long stride = nblocks * nthr;
  const long gid = s.lines ? block * nthr + thr : thr * nblocks + block;
  unsigned long long pol = 0;
  if (s.evict_last && !s.lines) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  for (long c = gid; c < total; c += stride) {
    long cc = c; int r = 0;
    while (r < s.cnt - 1 && cc >= (s.n[r] + ch - 1) / ch) { cc -= (s.n[r] + ch - 1) / ch; ++r; }
    const char *a = s.p[r] + cc * ch;
    if (s.lines) {
      if (s.evict_last) asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(a));
      else asm volatile("prefetch.global.L2 [%0];" :: "l"(a));
    } else {
      long left = s.n[r] - cc * ch;
      unsigned sz = (unsigned)((left < ch ? left : ch) & ~15L);
      if (sz == 0) continue;
      if (s.evict_last) asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" :: "l"(a), "r"(sz), "l"(pol) : "memory");
      else asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(a), "r"(sz) : "memory");
    }
  }
}
__device__ __forceinline__ long blk_lin() { return blockIdx.x + (long)gridDim.x * (blockIdx.y + (long)gridDim.y * blockIdx.z); }
__device__ __forceinline__ long blk_cnt() { return (long)gridDim.x * gridDim.y * gridDim.z; }
// A kernel of its own in the chain: issues the prefetches (before its wait), then passes the
// dependency on.
__global__ void l2_prefetch(PfSet s) {
  pf_issue(s, blk_cnt(), blk_lin(), blockDim.x, threadIdx.x);
  pdl_begin();
}
// rope_store_bf16 with the prefetches in its prologue.
__global__ void rope_store_pf(const bf *q, long q_row, const bf *k, long k_row, const bf *v, long v_row, const bf *cos, const bf *sin, bf *q_out, bf *kc,
                              bf *vc, long cache_head_stride, const uint32_t *len_ptr, int t, int heads, int d, PfSet s) {
  pf_issue(s, blk_cnt(), blk_lin(), blockDim.x, threadIdx.x);
  pdl_begin();
  rope_store<bf>(q, q_row, k, k_row, v, v_row, cos, sin, q_out, kc, vc, cache_head_stride, len_ptr, t, heads, d);
}
// attn_split_bf16_d{64,128}_h1 with the prefetches in its prologue.
template <int E>
__global__ void __launch_bounds__(4 * 32) attn_split_pf(const bf *q, const bf *k, const bf *v, float *part, bf *y, const uint32_t *len_ptr,
                                                            uint32_t len_arg, int t, int heads, int group, long q_head_stride, long q_row_stride,
                                                            long kv_head_stride, int split_len, int splits, int window, float softcap, PfSet s) {
  pf_issue(s, blk_cnt(), blk_lin(), blockDim.x, threadIdx.x);
  // attn_split calls pdl_begin itself (after its own pre-wait prefetch).
  attn_split<bf, E, 1, 4, false>(q, k, v, part, y, len_ptr, len_arg, t, heads, group, q_head_stride, q_row_stride, kv_head_stride, split_len, splits, window, softcap,
                                FusedRope<bf>{});
}
// The folded output projection (gemv_tc_resid_bf16_n1_w16_v2) with the prefetches in its
// prologue: its blocks start when the attention passes its wait, so the requests go out while
// the attention runs.
__global__ void __launch_bounds__(16 * 32, 2) gemv_resid_pf_w16(const bf *x, const bf *w, bf *y, int rows, int in, int out, const bf *aux, float eps, PfSet s) {
  pf_issue(s, gridDim.x, blockIdx.x, blockDim.x, threadIdx.x);
  gemv_tc<bf, 1, 16, false, 2, GEMV_RESID>(x, w, y, rows, in, out, aux, eps);
}

struct Shape { const char *name; int layers, hidden, heads, kv, d, inter, ctx, cap; };

struct Layer { bf *wn1, *wn2, *wqkv, *wo, *wgu, *wdown, *kc, *vc; };
struct Model {
  Shape s; std::vector<Layer> L; bf *cos, *sin, *x, *y, *n2, *qkv, *qo, *att, *o, *h, *dn; float *part, *ws; unsigned *len;
};
bf *alloc_fill(long n, unsigned seed) { bf *p; CK(cudaMalloc(&p, n * 2)); fill<<<1024, 256, 0, st>>>(p, n, seed); return p; }
Model make(Shape s) {
  Model m; m.s = s; unsigned seed = 1;
  for (int l = 0; l < s.layers; ++l) {
    Layer y;
    y.wn1 = alloc_fill(s.hidden, seed++); y.wn2 = alloc_fill(s.hidden, seed++);
    y.wqkv = alloc_fill((long)(s.heads + 2 * s.kv) * s.d * s.hidden, seed++);
    y.wo = alloc_fill((long)s.hidden * s.heads * s.d, seed++);
    y.wgu = alloc_fill((long)2 * s.inter * s.hidden, seed++);
    y.wdown = alloc_fill((long)s.hidden * s.inter, seed++);
    y.kc = alloc_fill((long)s.kv * s.cap * s.d, seed++); y.vc = alloc_fill((long)s.kv * s.cap * s.d, seed++);
    m.L.push_back(y);
  }
  m.cos = alloc_fill((long)s.cap * s.d / 2, 7); m.sin = alloc_fill((long)s.cap * s.d / 2, 8);
  m.x = alloc_fill(16 * 16384, 9); m.y = alloc_fill(16 * 16384, 10); m.n2 = alloc_fill(2 * 16 * 16384, 11);
  m.qkv = alloc_fill(16 * 16384, 12); m.qo = alloc_fill(16 * 16384, 13); m.att = alloc_fill(16 * 16384, 14);
  m.o = alloc_fill(16 * 16384, 15); m.h = alloc_fill(16 * 32768, 16); m.dn = alloc_fill(16 * 16384, 17);
  CK(cudaMalloc(&m.part, 64 << 20)); CK(cudaMalloc(&m.ws, 64 << 20));
  CK(cudaMalloc(&m.len, 4)); unsigned c = s.ctx; CK(cudaMemcpy(m.len, &c, 4, cudaMemcpyHostToDevice));
  return m;
}

enum { NORM = 1, QKV = 2, ROPE = 4, ATTN = 8, OPROJ = 16, GU = 32, DOWN = 64, ALL = 127 };
// Which kernels a step runs (parts), the GEMV's warps cap, and whether norms and residual adds
// ride in the GEMVs (as the model does on CUDA since they were added) or run on their own.
// Prefetch placement: none; a kernel of its own after the q/k/v GEMV (before RoPE); a kernel
// of its own after RoPE (before attention); in RoPE's prologue; in attention's prologue; a
// kernel of its own on a side branch of the graph that waits for the q/k/v GEMV (a full
// dependency, not a programmatic one) and joins at the step's end, off the chain.
// Or in the output projection's prologue (PF_IN_OGEMV).
enum Pf { PF_NONE, PF_K_ROPE, PF_K_ATTN, PF_IN_ROPE, PF_IN_ATTN, PF_SIDE, PF_IN_OGEMV };
struct Cfg {
  int parts = ALL; int warps_small = 16; bool fold = false;
  bool pdl = true; bool alloc = false;
  int pf = PF_NONE; double o_frac = 1.0; double gu_mb = 0; bool next_qkv = false; bool lines = false; bool evict_last = false; int chunk = 65536;
};

// GEMV dispatch through kernels.cu's names.
enum Mode { PLAIN, NORMM, RESID };
void gemv(const Cfg &c, Model &m, const bf *x, const bf *w, bf *y, int in, int out, bool gated, Mode mode, const bf *aux) {
  int rows = 1;  // (one decode row)
  int blocks = (gated ? 2 * out : out) / 16;
  int warps = blocks < 200 ? 32 : blocks < 600 ? 16 : 8;
  if (warps > c.warps_small) warps = c.warps_small;
  typedef void (*K)(const bf *, const bf *, bf *, int, int, int, const bf *, float);
  K k = nullptr;
#define PICK(W) if (warps == W) { \
    if (gated) k = mode == NORMM ? gemv_tc_silu_norm_bf16_n1_w##W##_v2 : gemv_tc_silu_bf16_n1_w##W##_v2; \
    else k = mode == NORMM ? gemv_tc_norm_bf16_n1_w##W##_v2 : mode == RESID ? gemv_tc_resid_bf16_n1_w##W##_v2 : gemv_tc_bf16_n1_w##W##_v2; }
  PICK(8) PICK(16) PICK(32)
  g_smem = mode == NORMM ? in * sizeof(bf) : 0;
  launch(k, blocks, warps * 32, x, w, y, rows, in, out, aux, 1e-5f);
  g_smem = 0;
}
void step(const Cfg &c, Model &m) {
  const Shape &s = m.s;
  const int qkv_out = (s.heads + 2 * s.kv) * s.d, att = s.heads * s.d;
  for (int l = 0; l < s.layers; ++l) {
    Layer &L = m.L[l];
    int nt = std::min(256, s.hidden / 8);
    if (!c.fold && (c.parts & NORM)) launch(add_rmsnorm_bf16, 1, nt, (const bf *)m.x, (const bf *)m.y, (const bf *)L.wn1, m.n2, 1, s.hidden, 1e-5f);
    if (c.parts & QKV) { if (c.fold) gemv(c, m, m.x, L.wqkv, m.qkv, s.hidden, qkv_out, false, NORMM, L.wn1); else gemv(c, m, m.n2 + s.hidden, L.wqkv, m.qkv, s.hidden, qkv_out, false, PLAIN, nullptr); }
    // The weights to prefetch: the first o_frac of the output projection's, the first gu_mb MB of
    // gate/up's (half from the gate rows, half from the up rows: the GEMV's first blocks read
    // both), the next layer's q/k/v (layer 0's after the last: the graph replays).
    PfSet ps = {}; ps.lines = c.lines; ps.evict_last = c.evict_last; ps.chunk = c.chunk;
    if (c.o_frac > 0) { ps.p[ps.cnt] = (const char *)L.wo; ps.n[ps.cnt++] = (long)(c.o_frac * s.hidden * att * 2) & ~127L; }
    if (c.gu_mb > 0) {
      long half = (long)(c.gu_mb * 0.5e6) & ~127L; if (half > (long)s.inter * s.hidden * 2) half = (long)s.inter * s.hidden * 2;
      ps.p[ps.cnt] = (const char *)L.wgu; ps.n[ps.cnt++] = half;
      ps.p[ps.cnt] = (const char *)(L.wgu + (long)s.inter * s.hidden); ps.n[ps.cnt++] = half;
    }
    if (c.next_qkv) { ps.p[ps.cnt] = (const char *)m.L[(l + 1) % s.layers].wqkv; ps.n[ps.cnt++] = (long)qkv_out * s.hidden * 2; }
    dim3 pg = c.lines ? dim3(132) : dim3(32), pb = c.lines ? dim3(256) : dim3(32);
    if (c.pf == PF_K_ROPE) launch(l2_prefetch, pg, pb, ps);
    if (c.pf == PF_SIDE) {
      CK(cudaEventRecord(ev_fork, st)); CK(cudaStreamWaitEvent(st2, ev_fork, 0));
      g_side = true; launch(l2_prefetch, pg, pb, ps); g_side = false;
    }
    if (c.parts & ROPE) {
      if (c.pf == PF_IN_ROPE)
        launch(rope_store_pf, dim3(1, s.heads + s.kv), s.d / 2, (const bf *)m.qkv, (long)qkv_out, (const bf *)(m.qkv + att), (long)qkv_out,
               (const bf *)(m.qkv + att + s.kv * s.d), (long)qkv_out, (const bf *)m.cos, (const bf *)m.sin, m.qo, L.kc, L.vc, (long)s.cap * s.d, (const unsigned *)m.len, 1, s.heads, s.d, ps);
      else
        launch(rope_store_bf16, dim3(1, s.heads + s.kv), s.d / 2, (const bf *)m.qkv, (long)qkv_out, (const bf *)(m.qkv + att), (long)qkv_out,
               (const bf *)(m.qkv + att + s.kv * s.d), (long)qkv_out, (const bf *)m.cos, (const bf *)m.sin, m.qo, L.kc, L.vc, (long)s.cap * s.d, (const unsigned *)m.len, 1, s.heads, s.d,
               (const char *)nullptr, 0L, (const char *)nullptr, 0L);
    }
    if (c.pf == PF_K_ATTN) launch(l2_prefetch, pg, pb, ps);
    if (c.parts & ATTN) {
      int splits = s.cap / 256;
      dim3 ag(s.heads / s.kv, s.kv, std::min(splits, 64));
      if (c.pf == PF_IN_ATTN) {
        auto k = s.d == 64 ? attn_split_pf<2> : attn_split_pf<4>;
        launch(k, ag, 128, (const bf *)m.qo, (const bf *)L.kc, (const bf *)L.vc, m.part, m.att, (const unsigned *)m.len, (unsigned)s.ctx,
               1, s.heads, s.heads / s.kv, (long)s.d, (long)s.d, (long)s.cap * s.d, 256, splits, 0, 0.f, ps);
      } else {
        auto k = s.d == 64 ? attn_split_bf16_d64_h1 : attn_split_bf16_d128_h1;
        launch(k, ag, 128, (const bf *)m.qo, (const bf *)L.kc, (const bf *)L.vc, m.part, m.att, (const unsigned *)m.len, (unsigned)s.ctx,
               1, s.heads, s.heads / s.kv, (long)s.d, (long)s.d, (long)s.cap * s.d, 256, splits, 0, 0.f);
      }
    }
    if ((c.parts & OPROJ) && c.fold && c.pf == PF_IN_OGEMV)
      launch(gemv_resid_pf_w16, s.hidden / 16, 16 * 32, (const bf *)m.att, (const bf *)L.wo, m.o, 1, att, s.hidden, (const bf *)m.x, 1e-5f, ps);
    else if (c.parts & OPROJ) { if (c.fold) gemv(c, m, m.att, L.wo, m.o, att, s.hidden, false, RESID, m.x); else gemv(c, m, m.att, L.wo, m.o, att, s.hidden, false, PLAIN, nullptr); }
    if (!c.fold && (c.parts & NORM)) launch(add_rmsnorm_bf16, 1, nt, (const bf *)m.x, (const bf *)m.o, (const bf *)L.wn2, m.n2, 1, s.hidden, 1e-5f);
    if (c.parts & GU) { if (c.fold) gemv(c, m, m.o, L.wgu, m.h, s.hidden, s.inter, true, NORMM, L.wn2); else gemv(c, m, m.n2 + s.hidden, L.wgu, m.h, s.hidden, s.inter, true, PLAIN, nullptr); }
    if (c.parts & DOWN) { if (c.fold) gemv(c, m, m.h, L.wdown, m.x, s.inter, s.hidden, false, RESID, m.o); else gemv(c, m, m.h, L.wdown, m.dn, s.inter, s.hidden, false, PLAIN, nullptr); }
  }
  if (c.pf == PF_SIDE) { CK(cudaEventRecord(ev_join, st2)); CK(cudaStreamWaitEvent(st, ev_join, 0)); }
}

// The model's decode step as `Transformer` runs it on CUDA today (the "model" and "trace"
// modes): per layer the q/k/v GEMV with the pre-norm folded, the split attention with RoPE
// and the K/V store fused (eight warps a block, its prologue prefetching the first
// `pf_mb` MB of gate/up into the L2), the output GEMV with the residual add folded, the
// gate/up GEMV with the norm and SiLU folded, the down GEMV with the add folded. The cache
// holds `ctx` keys before the step (its buffer `cap`), the step adds one.
void step_model(Model &m, double pf_mb) {
  const Shape &s = m.s;
  const int qkv_out = (s.heads + 2 * s.kv) * s.d, att = s.heads * s.d;
  Cfg c; c.fold = true;
  for (int l = 0; l < s.layers; ++l) {
    Layer &L = m.L[l];
    gemv(c, m, m.x, L.wqkv, m.qkv, s.hidden, qkv_out, false, NORMM, L.wn1);
    const int splits = (s.cap + 255) / 256;
    dim3 ag(s.heads / s.kv, s.kv, std::min(splits, 64));
    auto k = s.d == 64 ? attn_split_bf16_d64_h1_w8_rope : attn_split_bf16_d128_h1_w8_rope;
    const long half = std::min((long)(pf_mb * 0.5e6) & ~15L, (long)s.inter * s.hidden * 2);
    launch(k, ag, 256, (const bf *)m.qkv, (const bf *)L.kc, (const bf *)L.vc, m.part, m.att, (const unsigned *)m.len, (unsigned)(s.ctx + 1),
           1, s.heads, s.heads / s.kv, (long)s.d, (long)qkv_out, (long)s.cap * s.d, 256, splits, 0, 0.f,
           (const bf *)(m.qkv + att), (long)qkv_out, (const bf *)(m.qkv + att + s.kv * s.d), (long)qkv_out, (const bf *)m.cos, (const bf *)m.sin,
           L.kc, L.vc, (const char *)L.wgu, half, (const char *)(L.wgu + (long)s.inter * s.hidden), half);
    gemv(c, m, m.att, L.wo, m.o, att, s.hidden, false, RESID, m.x);
    gemv(c, m, m.o, L.wgu, m.h, s.hidden, s.inter, true, NORMM, L.wn2);
    gemv(c, m, m.h, L.wdown, m.x, s.inter, s.hidden, false, RESID, m.o);
  }
}

double time_model(Model &m, double pf_mb, int reps) {
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  step_model(m, pf_mb);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, st));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, st));
  for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
  float ms; CK(cudaEventElapsedTime(&ms, a, b));
#ifdef SPECDEC_KERNEL_TRACE
  if (reps == 0) {
    // One traced replay: per launch (grid id), blocks, first entry, first and last release.
    unsigned zero = 0; CK(cudaMemcpyToSymbol(lab_count, &zero, 4));
    CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
    unsigned n; CK(cudaMemcpyFromSymbol(&n, lab_count, 4)); n = std::min(n, LAB_RECS);
    std::vector<LabRec> r(n); CK(cudaMemcpyFromSymbol(r.data(), lab_recs, n * sizeof(LabRec)));
    struct K { unsigned long long grid, e0, e1, r0, r1; int n; };
    std::vector<K> ks;
    for (auto &x : r) {
      K *f = nullptr; for (auto &k : ks) if (k.grid == x.grid) { f = &k; break; }
      if (!f) { ks.push_back({x.grid, x.entry, x.entry, x.release, x.release, 0}); f = &ks.back(); }
      f->e0 = std::min(f->e0, x.entry); f->e1 = std::max(f->e1, x.entry); f->r0 = std::min(f->r0, x.release); f->r1 = std::max(f->r1, x.release); f->n++;
    }
    std::sort(ks.begin(), ks.end(), [](const K &a, const K &b) { return a.r0 < b.r0; });
    const char *names[5] = {"qkv", "attn", "o", "gate/up", "down"};
    double seg[5] = {}, wait[5] = {}, late[5] = {};
    const unsigned long long t0 = ks.empty() ? 0 : ks[0].r0;
    printf("traced %u blocks, %zu launches; first layers (us from the first release):\n| # | kernel | blocks | first entry | first release | last release | to next release |\n|---|---|---:|---:|---:|---:|---:|\n", n, ks.size());
    for (size_t i = 0; i < ks.size(); ++i) {
      const double nx = i + 1 < ks.size() ? (ks[i + 1].r0 - ks[i].r0) / 1e3 : 0;
      if (i < 10) printf("| %zu | %s | %d | %.2f | %.2f | %.2f | %.2f |\n", i, names[i % 5], ks[i].n, ((long long)ks[i].e0 - (long long)t0) / 1e3, (ks[i].r0 - t0) / 1e3, (ks[i].r1 - t0) / 1e3, nx);
      seg[i % 5] += nx; wait[i % 5] += ((long long)ks[i].r0 - (long long)ks[i].e0) / 1e3; late[i % 5] += (ks[i].r1 - ks[i].r0) / 1e3;
    }
    printf("per kernel kind, summed over layers (us): release to next release / first entry to release / first to last release\n");
    for (int k = 0; k < 5; ++k) printf("  %-8s %8.1f %8.1f %8.1f\n", names[k], seg[k], wait[k], late[k]);
    printf("  first release to last release of the step: %.1f us\n", ks.empty() ? 0 : (ks.back().r0 - t0) / 1e3);
  }
#endif
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  return reps ? ms / reps : 0;
}

// Counts of the graph's nodes by type and edges by (type, from port), once per config.
void graph_census(cudaGraph_t g, const char *name) {
  size_t n = 0; CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n); CK(cudaGraphGetNodes(g, nodes.data(), &n));
  int types[16] = {};
  for (auto nd : nodes) { cudaGraphNodeType t; CK(cudaGraphNodeGetType(nd, &t)); types[(int)t & 15]++; }
  size_t e = 0; CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &e));
  std::vector<cudaGraphNode_t> from(e), to(e); std::vector<cudaGraphEdgeData> data(e);
  CK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &e));
  int kinds[4][4] = {};
  for (auto &d : data) kinds[d.type & 3][d.from_port & 3]++;
  printf("graph %s: %zu nodes (kernel %d, memset %d, memcpy %d, mem alloc %d, mem free %d); edges (type,port):", name, n, types[cudaGraphNodeTypeKernel],
         types[cudaGraphNodeTypeMemset], types[cudaGraphNodeTypeMemcpy], types[cudaGraphNodeTypeMemAlloc], types[cudaGraphNodeTypeMemFree]);
  for (int a = 0; a < 4; ++a) for (int b = 0; b < 4; ++b) if (kinds[a][b]) printf(" (%d,%d)=%d", a, b, kinds[a][b]);
  printf("\n");
}

double time_graph(const Cfg &c, Model &m, int reps, bool sync = false, const char *census = nullptr) {
  cudaGraph_t g; cudaGraphExec_t ge;
  g_pdl = c.pdl; g_alloc = c.alloc; g_prev = nullptr;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  step(c, m);
  if (g_alloc && g_prev) CK(cudaFreeAsync(g_prev, st));
  CK(cudaStreamEndCapture(st, &g));
  g_pdl = true; g_alloc = false; g_prev = nullptr;
  if (census) graph_census(g, census);
  CK(cudaGraphInstantiate(&ge, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, st));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, st));
  unsigned hv; for (int i = 0; i < reps; ++i) { CK(cudaGraphLaunch(ge, st)); if (sync) { CK(cudaMemcpyAsync(&hv, m.len, 4, cudaMemcpyDeviceToHost, st)); CK(cudaStreamSynchronize(st)); } }
  CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
  float ms; CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  return ms / reps;
}

double bytes(const Model &m, int parts) {
  const Shape &s = m.s; double b = 0;
  if (parts & QKV) b += (double)(s.heads + 2 * s.kv) * s.d * s.hidden;
  if (parts & OPROJ) b += (double)s.hidden * s.heads * s.d;
  if (parts & GU) b += 2.0 * s.inter * s.hidden;
  if (parts & DOWN) b += (double)s.hidden * s.inter;
  return b * 2 * s.layers;
}

void pdl_check() {
  unsigned long long *rec; CK(cudaMalloc(&rec, 64)); unsigned long long h[4];
  for (int graph = 0; graph < 2; ++graph)
    for (int pdl = 0; pdl < 2; ++pdl) {
      g_pdl = pdl;
      if (graph) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        launch(spin, 1, 32, 20000ull, rec); launch(probe, 1, 32, rec);
        CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st)); CK(cudaGraphLaunch(ge, st));
      } else {
        launch(spin, 1, 32, 20000ull, rec); launch(probe, 1, 32, rec);
      }
      CK(cudaStreamSynchronize(st)); CK(cudaMemcpy(h, rec, 32, cudaMemcpyDeviceToHost));
      printf("pdl check graph=%d pdl=%d: spin %.1f us; probe entered %.1f us after spin start, passed wait %.1f us after spin end\n",
             graph, pdl, (h[1] - h[0]) / 1e3, ((long long)h[2] - (long long)h[0]) / 1e3, ((long long)h[3] - (long long)h[1]) / 1e3);
    }
  g_pdl = true;
}

int main(int argc, char **argv) {
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming)); CK(cudaEventCreateWithFlags(&ev_join, cudaEventDisableTiming));
  pdl_check();
  double bw = argc > 1 ? atof(argv[1]) : 4.1e12;
  Shape shapes[2] = {{"draft-1b", 16, 2048, 32, 8, 64, 8192, 128, 4096}, {"target-8b", 32, 4096, 32, 8, 128, 14336, 128, 4096}};
  if (argc > 2 && !strcmp(argv[2], "model")) {
    // The model's step (cache buffer of 256 keys, 128 before the step), 8 MB prefetch,
    // three interleaved passes; then (a SPECDEC_KERNEL_TRACE build) one traced replay.
    for (auto s : shapes) {
      s.cap = 256;
      Model m = make(s); CK(cudaStreamSynchronize(st));
      printf("\n== %s model step (bound at %.0f GB/s: %.3f ms)\n", s.name, bw / 1e9, bytes(m, ALL) / bw * 1e3);
      // Rows: the L2 prefetch's MB, interleaved over three passes.
      const double pfs[] = {8, 0, 12, 16};
      for (int pass = 0; pass < 3; ++pass)
        for (double pf : pfs) {
          double t[3]; for (int i = 0; i < 3; ++i) t[i] = time_model(m, pf, 200);
          std::sort(t, t + 3);
          printf("pass %d, pf %2.0f MB: %.4f %.4f %.4f ms/step, GEMV bytes at %.0f GB/s\n", pass, pf, t[0], t[1], t[2], bytes(m, ALL) / (t[1] * 1e-3) / 1e9);
        }
      time_model(m, 8, 0);
      for (auto &L : m.L) { cudaFree(L.wn1); cudaFree(L.wn2); cudaFree(L.wqkv); cudaFree(L.wo); cudaFree(L.wgu); cudaFree(L.wdown); cudaFree(L.kc); cudaFree(L.vc); }
    }
    return 0;
  }
  for (auto &s : shapes) {
    if (argc > 2 && !strcmp(argv[2], "one") && strcmp(s.name, "draft-1b")) continue;
    Model m = make(s); CK(cudaStreamSynchronize(st));
    printf("\n== %s (bound at %.0f GB/s: %.3f ms)\n", s.name, bw / 1e9, bytes(m, ALL) / bw * 1e3);
    struct Row { std::string name; Cfg c; bool sync; };
    std::vector<Row> rows;
    auto add = [&](const char *n, int parts, int ws, bool fold, bool sync) { Cfg c; c.parts = parts; c.warps_small = ws; c.fold = fold; rows.push_back({n, c, sync}); };
    // Folded rows with L2 prefetches: where, the fraction of o, MB of gate/up, the next layer's
    // q/k/v, per-line prefetches, evict-last priority.
    const char *where[] = {"-", "own kernel before rope", "own kernel before attn", "in rope prologue", "in attn prologue", "side branch after qkv", "in o-GEMV prologue"};
    auto addp = [&](int pf, double o_frac, double gu_mb, bool next_qkv = false, bool lines = false, bool evict_last = false, int chunk = 65536) {
      Cfg c; c.fold = true; c.pf = pf; c.o_frac = o_frac; c.gu_mb = gu_mb; c.next_qkv = next_qkv; c.lines = lines; c.evict_last = evict_last; c.chunk = chunk;
      char b[200];
      snprintf(b, sizeof b, "folded + pf %.0f%% o + %.0f MB gate/up%s, %s%s%s", o_frac * 100, gu_mb, next_qkv ? " + next qkv" : "", where[pf],
               lines ? ", per line" : evict_last ? ", evict_last" : "", chunk != 65536 ? (chunk < 65536 ? ", 16 KB requests" : ", 256 KB requests") : "");
      rows.push_back({b, c, false});
    };
    const bool pf_rows = argc > 2 && !strcmp(argv[2], "pf");
    const bool alloc_rows = argc > 2 && !strcmp(argv[2], "alloc");
    auto adda = [&](const char *n, bool pdl, bool alloc) { Cfg c; c.fold = true; c.pdl = pdl; c.alloc = alloc; rows.push_back({n, c, false}); };
    if (argc > 2 && !strcmp(argv[2], "one")) {
      // One folded step of the draft's shape, replayed twice: for a kernel profiler (ncu) to
      // time each kernel beside the model's own step.
      Cfg c; c.fold = true; time_graph(c, m, 2); CK(cudaStreamSynchronize(st));
      continue;
    }
    if (alloc_rows) {
      adda("folded, PDL", true, false);
      adda("folded, no PDL", false, false);
      adda("folded, PDL, memory nodes", true, true);
      adda("folded, no PDL, memory nodes", false, true);
      adda("folded, PDL", true, false);
    } else if (!pf_rows) {
      add("full (current kernels)", ALL, 16, false, false);
      add("full, folded norms", ALL, 16, true, false);
      add("full - norms", ALL & ~NORM, 16, false, false);
      add("gemvs only", QKV | OPROJ | GU | DOWN, 16, false, false);
      add("gemvs only, folded modes", QKV | OPROJ | GU | DOWN, 16, true, false);
      add("qkv only", QKV, 16, false, false);
      add("qkv only, norm mode", QKV, 16, true, false);
      add("gate/up only", GU, 16, false, false);
      add("gate/up only, norm mode", GU, 16, true, false);
      add("full, 32w cap", ALL, 32, false, false);
      add("full, folded, 32w cap", ALL, 32, true, false);
    } else {
    // Earlier passes also had: a prefetch kernel of its own before RoPE or before the attention,
    // the attention's prologue, o's weights (all or part) with or without gate/up's, 16 KB and
    // per-line requests, evict-last, the next layer's q/k/v, a side branch: none better than
    // the rows below on the H200.
    add("full, folded norms", ALL, 16, true, false);
    add("gemvs only, folded modes", QKV | OPROJ | GU | DOWN, 16, true, false);
    addp(PF_IN_ROPE, 0, 2);
    addp(PF_IN_ROPE, 0, 4);
    addp(PF_IN_ROPE, 0, 6);
    addp(PF_IN_ROPE, 0, 8);
    addp(PF_IN_ROPE, 0, 10);
    addp(PF_IN_ROPE, 0, 8, false, false, true);
    addp(PF_IN_ROPE, 0, 16, false, false, true);
    addp(PF_IN_ROPE, 0, 8, false, false, false, 262144);
    add("full, folded norms", ALL, 16, true, false);
    addp(PF_IN_OGEMV, 0, 0);  // the prologue's code with nothing to prefetch
    addp(PF_IN_OGEMV, 0, 4);
    addp(PF_IN_OGEMV, 0, 8);
    addp(PF_IN_OGEMV, 0, 16);
    addp(PF_IN_OGEMV, 0, 8, false, false, true);
    addp(PF_IN_OGEMV, 0, 16, false, false, true);
    add("full, folded norms", ALL, 16, true, false);
    }
    for (int pass = 0; pass < 2; ++pass) {
      printf("-- pass %d (PDL on)\n| config | ms/step (3 runs) | GEMV bytes GB/s |\n|---|---|---:|\n", pass);
      for (auto &r : rows) {
        double t[3]; for (int i = 0; i < 3; ++i) t[i] = time_graph(r.c, m, r.sync ? 50 : 100, r.sync, pass == 0 && i == 0 ? r.name.c_str() : nullptr);
        std::sort(t, t + 3);
        printf("| %s | %.4f %.4f %.4f | %.0f |\n", r.name.c_str(), t[0], t[1], t[2], bytes(m, r.c.parts) / (t[1] * 1e-3) / 1e9);
      }
    }
    // free
    for (auto &L : m.L) { cudaFree(L.wn1); cudaFree(L.wn2); cudaFree(L.wqkv); cudaFree(L.wo); cudaFree(L.wgu); cudaFree(L.wdown); cudaFree(L.kc); cudaFree(L.vc); }
  }
  return 0;
}
