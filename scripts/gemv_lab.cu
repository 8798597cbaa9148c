// A lab bench of one decode step's kernels, for the H200 (or any sm_90 GPU) without the Rust
// build: it includes src/nn/cuda/kernels.cu and launches its kernels in the order a Llama
// layer runs them (norm, q/k/v GEMV, RoPE + K/V store, split attention at 128 keys, output
// GEMV, norm, gate/up GEMV with SiLU, down GEMV) for 1B- and 8B-shaped layers with random
// bf16 weights, captured into a CUDA graph with programmatic dependent launch as the model
// does, replayed 100 times per measurement. Rows leave kernels out or fold the norms and
// adds into the GEMVs, so each kernel's marginal cost in the pipelined step shows; a first
// check shows whether PDL takes effect inside a graph. No embedding, LM head or argmax, so a
// step is shorter than `gpu_decode`'s. Used for the figures of docs/gpu-decode-2026-11-23.md,
// section "Fourth round".
//
// On the GPU machine, in the checkout (the CUDA toolkit's nvcc):
//   nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/gemv_lab scripts/gemv_lab.cu
//   /tmp/gemv_lab [copy bandwidth in bytes/s, for the bound column; default 4.1e12]
#include "../src/nn/cuda/kernels.cu"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)
typedef __nv_bfloat16 bf;
static cudaStream_t st;
static bool g_pdl = true;
static size_t g_smem = 0;  // dynamic shared memory of the next launch (a folded norm's weight)

template <typename... P, typename... A>
void launch(void (*k)(P...), dim3 g, dim3 b, A... a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = g; cfg.blockDim = b; cfg.dynamicSmemBytes = g_smem; cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = g_pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, k, ((P)a)...));
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
struct Cfg { int parts = ALL; int warps_small = 16; bool fold = false; };

// GEMV dispatch through kernels.cu's names.
enum Mode { PLAIN, NORMM, RESID };
void gemv(const Cfg &c, Model &m, const bf *x, const bf *w, bf *y, int in, int out, bool gated, Mode mode, const bf *aux) {
  int rows = 1;
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
    if (c.parts & ROPE) launch(rope_store_bf16, dim3(1, s.heads + s.kv), s.d / 2, (const bf *)m.qkv, (long)qkv_out, (const bf *)(m.qkv + att), (long)qkv_out,
                                 (const bf *)(m.qkv + att + s.kv * s.d), (long)qkv_out, (const bf *)m.cos, (const bf *)m.sin, m.qo, L.kc, L.vc, (long)s.cap * s.d, (const unsigned *)m.len, 1, s.heads, s.d);
    if (c.parts & ATTN) {
      int splits = s.cap / 256;
      auto k = s.d == 64 ? attn_split_bf16_d64_h1 : attn_split_bf16_d128_h1;
      launch(k, dim3(s.heads / s.kv, s.kv, std::min(splits, 64)), 128, (const bf *)m.qo, (const bf *)L.kc, (const bf *)L.vc, m.part, m.att, (const unsigned *)m.len, (unsigned)s.ctx,
             1, s.heads, s.heads / s.kv, (long)s.d, (long)s.d, (long)s.cap * s.d, 256, splits, 0, 0.f);
    }
    if (c.parts & OPROJ) { if (c.fold) gemv(c, m, m.att, L.wo, m.o, att, s.hidden, false, RESID, m.x); else gemv(c, m, m.att, L.wo, m.o, att, s.hidden, false, PLAIN, nullptr); }
    if (!c.fold && (c.parts & NORM)) launch(add_rmsnorm_bf16, 1, nt, (const bf *)m.x, (const bf *)m.o, (const bf *)L.wn2, m.n2, 1, s.hidden, 1e-5f);
    if (c.parts & GU) { if (c.fold) gemv(c, m, m.o, L.wgu, m.h, s.hidden, s.inter, true, NORMM, L.wn2); else gemv(c, m, m.n2 + s.hidden, L.wgu, m.h, s.hidden, s.inter, true, PLAIN, nullptr); }
    if (c.parts & DOWN) { if (c.fold) gemv(c, m, m.h, L.wdown, m.x, s.inter, s.hidden, false, RESID, m.o); else gemv(c, m, m.h, L.wdown, m.dn, s.inter, s.hidden, false, PLAIN, nullptr); }
  }
}

double time_graph(const Cfg &c, Model &m, int reps, bool sync = false) {
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  step(c, m);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
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
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  pdl_check();
  double bw = argc > 1 ? atof(argv[1]) : 4.1e12;
  Shape shapes[2] = {{"draft-1b", 16, 2048, 32, 8, 64, 8192, 128, 4096}, {"target-8b", 32, 4096, 32, 8, 128, 14336, 128, 4096}};
  for (auto &s : shapes) {
    Model m = make(s); CK(cudaStreamSynchronize(st));
    printf("\n== %s (bound at %.0f GB/s: %.3f ms)\n", s.name, bw / 1e9, bytes(m, ALL) / bw * 1e3);
    struct Row { const char *name; Cfg c; bool sync; };
    std::vector<Row> rows;
    auto add = [&](const char *n, int parts, int ws, bool fold, bool sync) { Cfg c; c.parts = parts; c.warps_small = ws; c.fold = fold; rows.push_back({n, c, sync}); };
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
    for (int pass = 0; pass < 2; ++pass) {
      printf("-- pass %d (PDL on)\n| config | ms/step (3 runs) | GEMV bytes GB/s |\n|---|---|---:|\n", pass);
      for (auto &r : rows) {
        double t[3]; for (int i = 0; i < 3; ++i) t[i] = time_graph(r.c, m, r.sync ? 50 : 100, r.sync);
        std::sort(t, t + 3);
        printf("| %s | %.4f %.4f %.4f | %.0f |\n", r.name, t[0], t[1], t[2], bytes(m, r.c.parts) / (t[1] * 1e-3) / 1e9);
      }
    }
    // free
    for (auto &L : m.L) { cudaFree(L.wn1); cudaFree(L.wn2); cudaFree(L.wqkv); cudaFree(L.wo); cudaFree(L.wgu); cudaFree(L.wdown); cudaFree(L.kc); cudaFree(L.vc); }
  }
  return 0;
}
