//! `y = x Wᵀ` for a few rows of `x` on the CPU, reading `W` once.
//!
//! Decode and verification forwards multiply 1–16 token rows by every weight matrix. At that
//! size the product is bound by reading the weights from memory, so the best kernel streams
//! each row of `W: [out, in]` (row-major, as PyTorch stores it) once and takes its dot
//! product with every token row while it is in L1. candle's general gemm instead repacks `W`
//! when `x` has more than one row: measured on the default target's weights (cold in cache,
//! one thread), a 2–5 row product took 3–5× the time of a one-row product (`[1536, 256]`:
//! 65–100 µs for one row, 290–420 µs for 5); this kernel took 130–155 µs for 5 rows. That is
//! what lets verifying γ drafts cost not much more than one decode step.
//!
//! f32, contiguous operands only; anything else (other dtypes, devices, long prefills) goes
//! through candle's matmul.
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// The most rows of `x` this kernel takes; longer inputs (prefill) use candle's gemm, whose
/// packing pays off there.
pub const MAX_ROWS: usize = 16;

/// The fewest rows it takes. One-token decode steps use it too, so that a decode step and a
/// verification run the same kernel and a decode step never costs more than verifying two
/// tokens (with candle's gemv for one row it did: 0.62 against 0.57 ms on the default
/// target, a baseline handicap that inflated measured speedups). Against candle's gemv alone,
/// one thread, warm weights: within ±15% either way over the default pair's shapes.
pub const MIN_ROWS: usize = 1;

/// Below this many multiply-adds a product runs on the calling thread: waking the pool costs
/// more than it saves.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// `x: [t, in]` (1 ≤ t ≤ [`MAX_ROWS`]) times `w: [out, in]` transposed: `[t, out]`. Both f32
/// and contiguous on the CPU; the caller checks.
pub fn skinny_matmul(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    x.apply_op2_no_bwd(w, &SkinnyMatmul)
}

/// True when [`skinny_matmul`] applies to `x` and `w`.
pub fn applies(x: &Tensor, w: &Tensor) -> bool {
    x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && w.dtype() == candle_core::DType::F32
        && x.rank() == 2
        && (MIN_ROWS..=MAX_ROWS).contains(&x.dims()[0])
        && x.is_contiguous()
        && w.is_contiguous()
}

struct SkinnyMatmul;

impl CustomOp2 for SkinnyMatmul {
    fn name(&self) -> &'static str {
        "skinny-matmul"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (xs, ws) else {
            candle_core::bail!("skinny-matmul: f32 operands only");
        };
        let ((t, inp), (out, w_in)) = (xl.shape().dims2()?, wl.shape().dims2()?);
        if inp != w_in || t > MAX_ROWS {
            candle_core::bail!("skinny-matmul: x {:?} and w {:?}", xl.dims(), wl.dims());
        }
        let (Some((x0, x1)), Some((w0, w1))) = (xl.contiguous_offsets(), wl.contiguous_offsets())
        else {
            candle_core::bail!("skinny-matmul: contiguous operands only");
        };
        let (x, w) = (&x[x0..x1], &w[w0..w1]);
        // Output computed as [out, t] (one row of W per output row), transposed at the end.
        let mut yt = vec![0f32; out * t];
        let macs = out * inp * t;
        let threads = rayon::current_num_threads();
        if macs >= PARALLEL_MIN_MACS && threads > 1 {
            let rows_per = out.div_ceil(threads).max(1);
            yt.par_chunks_mut(rows_per * t)
                .zip(w.par_chunks(rows_per * inp))
                .for_each(|(yt, w)| rows(x, w, t, inp, yt));
        } else {
            rows(x, w, t, inp, &mut yt);
        }
        if t == 1 {
            // One row: `[out, 1]` and `[1, out]` are the same memory.
            return Ok((CpuStorage::F32(yt), Shape::from((t, out))));
        }
        let mut y = vec![0f32; t * out];
        for (j, col) in yt.chunks_exact(t.max(1)).enumerate() {
            for (i, &v) in col.iter().enumerate() {
                y[i * out + j] = v;
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((t, out))))
    }
}

/// `yt[j * t + i] = dot(x[i], w[j])` for the rows `j` of `w` given.
fn rows(x: &[f32], w: &[f32], t: usize, inp: usize, yt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        unsafe { x86::rows(x, w, t, inp, yt) };
        return;
    }
    for (w_row, y) in w.chunks_exact(inp).zip(yt.chunks_exact_mut(t)) {
        for (i, y) in y.iter_mut().enumerate() {
            *y = dot(&x[i * inp..(i + 1) * inp], w_row);
        }
    }
}

/// Dot product with eight independent partial sums (vectorisable without reassociation).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Tokens handled per pass over a row of `w`: eight accumulators plus the `w` vector
    /// and an `x` load fit the sixteen ymm registers.
    const BLOCK: usize = 8;

    /// See [`super::rows`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows(x: &[f32], w: &[f32], t: usize, inp: usize, yt: &mut [f32]) {
        for (w_row, y) in w.chunks_exact(inp).zip(yt.chunks_exact_mut(t)) {
            single(x, w_row, t, y);
        }
    }

    /// Every token against one row of `w`, in blocks of up to [`BLOCK`] tokens.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn single(x: &[f32], w_row: &[f32], t: usize, y: &mut [f32]) {
        let mut i0 = 0;
        while i0 < t {
            let n = (t - i0).min(BLOCK);
            // A block size known at compile time keeps the accumulators in registers. Blocks
            // of one or two tokens split each dot product over several accumulators: one
            // chain of dependent FMAs would wait on the FMA latency every step (a one-token
            // decode ran ~20% slower than candle's gemv that way).
            match n {
                1 => block::<1, 4>(x, w_row, i0, y),
                2 => block::<2, 2>(x, w_row, i0, y),
                3 => block::<3, 1>(x, w_row, i0, y),
                4 => block::<4, 1>(x, w_row, i0, y),
                5 => block::<5, 1>(x, w_row, i0, y),
                6 => block::<6, 1>(x, w_row, i0, y),
                7 => block::<7, 1>(x, w_row, i0, y),
                _ => block::<BLOCK, 1>(x, w_row, i0, y),
            }
            i0 += n;
        }
    }

    /// `y[i0 + b] = dot(x[i0 + b], w_row)` for `b < N`, each dot product over `U`
    /// independent accumulators (`N · U` ≤ [`BLOCK`] keeps them in registers).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const N: usize, const U: usize>(
        x: &[f32],
        w_row: &[f32],
        i0: usize,
        y: &mut [f32],
    ) {
        let inp = w_row.len();
        let body = inp - inp % 8;
        let wide = inp - inp % (8 * U);
        let mut acc = [[_mm256_setzero_ps(); U]; N];
        let (xp, wp) = (x.as_ptr().add(i0 * inp), w_row.as_ptr());
        let mut k = 0;
        while k < wide {
            for u in 0..U {
                let wv = _mm256_loadu_ps(wp.add(k + 8 * u));
                for (b, a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(xp.add(b * inp + k + 8 * u));
                    a[u] = _mm256_fmadd_ps(xv, wv, a[u]);
                }
            }
            k += 8 * U;
        }
        while k < body {
            let wv = _mm256_loadu_ps(wp.add(k));
            for (b, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(b * inp + k)), wv, a[0]);
            }
            k += 8;
        }
        for (b, a) in acc.iter().enumerate() {
            let row = &x[(i0 + b) * inp..(i0 + b + 1) * inp];
            let tail: f32 = (body..inp).map(|k| row[k] * w_row[k]).sum();
            let mut sum = a[0];
            for part in &a[1..] {
                sum = _mm256_add_ps(sum, *part);
            }
            y[i0 + b] = hsum(sum) + tail;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Equals candle's matmul (up to f32 summation order) for every shape it accepts,
        /// including widths that are not multiples of the vector length and one-row weights.
        #[test]
        fn matches_candle_matmul(
            t in 1usize..=MAX_ROWS,
            inp in 1usize..70,
            out in 1usize..90,
            seed in 0u64..1000,
        ) {
            let dev = Device::Cpu;
            let val = |i: usize| (((i as u64 * 2654435761 + seed) % 1000) as f32 - 500.0) / 250.0;
            let x = Tensor::from_vec((0..t * inp).map(val).collect(), (t, inp), &dev).unwrap();
            let w = Tensor::from_vec((0..out * inp).map(|i| val(i + 7)).collect(), (out, inp), &dev).unwrap();
            let want: Vec<Vec<f32>> = x.matmul(&w.t().unwrap()).unwrap().to_vec2().unwrap();
            let got: Vec<Vec<f32>> = skinny_matmul(&x, &w).unwrap().to_vec2().unwrap();
            for (g, e) in got.iter().flatten().zip(want.iter().flatten()) {
                prop_assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
            }
        }
    }

    #[test]
    fn a_large_product_splits_across_threads_with_the_same_result() {
        let dev = Device::Cpu;
        let (t, inp, out) = (5, 256, 1536);
        assert!(t * inp * out >= PARALLEL_MIN_MACS);
        let x = Tensor::randn(0f32, 1.0, (t, inp), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (out, inp), &dev).unwrap();
        let want: Vec<Vec<f32>> = x.matmul(&w.t().unwrap()).unwrap().to_vec2().unwrap();
        let got: Vec<Vec<f32>> = skinny_matmul(&x, &w).unwrap().to_vec2().unwrap();
        for (g, e) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
        }
    }
}
