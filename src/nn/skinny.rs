//! `y = x Wᵀ` for a few rows of `x` on the CPU, reading `W` once.
//!
//! Decode and verification forwards multiply 1–16 token rows by every weight matrix. At that
//! size the product is bound by reading the weights from memory, so the best kernel streams
//! each row of `W: [out, in]` (row-major, as PyTorch stores it) once and takes its dot
//! product with every token row while it is in L1. candle's general gemm instead repacks `W`
//! when `x` has more than one row, which made a 2–5 row product several times a one-row one
//! (docs/kernel-notes.md, "CPU skinny products"). Reading `W` once is what lets verifying γ
//! drafts cost not much more than one decode step.
//!
//! Kernels, picked at run time: AVX-512 ([`avx512`]: blocks of 8 weight rows × up to 3 token
//! rows, each loaded vector used several times, a row's result independent of the row
//! count), AVX2/FMA ([`x86`]: one weight row at a time, about one load per multiply-add) and
//! portable code.
//!
//! f32, contiguous operands only; anything else (other dtypes, devices, long prefills) goes
//! through candle's matmul.
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// The most rows of `x` this kernel takes; longer inputs (prefill) use candle's gemm, whose
/// packing pays off there.
pub const MAX_ROWS: usize = 16;

/// The fewest rows it takes. One-token decode steps use it too, so that a decode step and a
/// verification run the same kernel and a decode step never costs more than verifying two
/// tokens (with candle's gemv for one row it did, a baseline handicap that inflated measured
/// speedups: docs/kernel-notes.md).
pub const MIN_ROWS: usize = 1;

/// Weights below which a product runs on the calling thread: waking the pool costs more than
/// it saves. A count of weights, not of multiply-adds, so that a decode step splits exactly
/// the products a verification splits (the bound is reading the weights). Small products
/// are split too: their weights stream from L3, and two cores stream them faster than one
/// (docs/kernel-notes.md).
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

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
        let mut y = vec![0f32; t * out];
        let threads = rayon::current_num_threads();
        if out * inp >= PARALLEL_MIN_WEIGHTS && threads > 1 {
            // Whole blocks of the kernels' weight rows per thread, each into its own
            // `[t, rows]` part, copied into `y`'s columns after.
            let rows_per = out.div_ceil(threads).next_multiple_of(ROW_BLOCK);
            let parts: Vec<Vec<f32>> = w
                .par_chunks(rows_per * inp)
                .map(|w| {
                    let n = w.len() / inp;
                    let mut part = vec![0f32; t * n];
                    rows(x, w, t, inp, &mut part, n);
                    part
                })
                .collect();
            for (c, part) in parts.iter().enumerate() {
                let (j0, n) = (c * rows_per, part.len() / t);
                for (y, part) in y.chunks_exact_mut(out).zip(part.chunks_exact(n)) {
                    y[j0..j0 + n].copy_from_slice(part);
                }
            }
        } else {
            rows(x, w, t, inp, &mut y, out);
        }
        Ok((CpuStorage::F32(y), Shape::from((t, out))))
    }
}

/// Weight rows the fastest kernel takes per block; threads split `w` in multiples of it.
const ROW_BLOCK: usize = 8;

/// The implementations of [`rows`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernel {
    /// Register-blocked AVX-512 ([`avx512`]): a row's result does not depend on the rows
    /// beside it.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// One weight row at a time against up to 8 token rows, AVX2/FMA ([`x86`]).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Plain Rust ([`dot`]).
    Portable,
}

/// Every kernel this CPU runs, fastest first: the best one and its fallbacks.
fn supported() -> Vec<Kernel> {
    let mut all = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            all.push(Kernel::Avx512);
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            all.push(Kernel::Avx2);
        }
    }
    all.push(Kernel::Portable);
    all
}

/// The fastest kernel this CPU runs (detected once).
fn best_kernel() -> Kernel {
    static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| supported()[0])
}

/// `y[i * stride + j] = dot(x[i], w[j])` for every token row `i` of `x: [t, inp]` and every
/// row `j` of `w: [rows, inp]`; `y: [t, stride]`, `rows ≤ stride`; with [`best_kernel`].
fn rows(x: &[f32], w: &[f32], t: usize, inp: usize, y: &mut [f32], stride: usize) {
    rows_with(best_kernel(), x, w, t, inp, y, stride);
}

/// [`rows`] with `kernel`, which the CPU must support (one of [`supported`]).
fn rows_with(
    kernel: Kernel,
    x: &[f32],
    w: &[f32],
    t: usize,
    inp: usize,
    y: &mut [f32],
    stride: usize,
) {
    match kernel {
        // SAFETY: the CPU has AVX-512F (the caller's contract, detected at run time);
        // `avx512::rows` checks the lengths.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { avx512::rows(x, w, t, inp, y, stride) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => by_row(w, inp, t, y, stride, |w_row, col| {
            // SAFETY: the CPU has AVX2 and FMA (the caller's contract, detected at run
            // time); `x` holds `t` rows of `w_row`'s length.
            unsafe { x86::single(x, w_row, t, col) }
        }),
        Kernel::Portable => by_row(w, inp, t, y, stride, |w_row, col| portable(x, w_row, col)),
    }
}

/// One weight row `j` at a time: `dot(w_row, col)` fills the row's results for the `t`
/// token rows, which land in `y`'s column `j` (rows `stride` apart).
fn by_row(
    w: &[f32],
    inp: usize,
    t: usize,
    y: &mut [f32],
    stride: usize,
    mut dot: impl FnMut(&[f32], &mut [f32]),
) {
    let mut col = [0f32; MAX_ROWS];
    for (j, w_row) in w.chunks_exact(inp).enumerate() {
        let col = &mut col[..t];
        dot(w_row, col);
        for (i, v) in col.iter().enumerate() {
            y[i * stride + j] = *v;
        }
    }
}

/// `y[i] = dot(x[i], w_row)` for the `y.len()` rows of `x`.
fn portable(x: &[f32], w_row: &[f32], y: &mut [f32]) {
    let inp = w_row.len();
    for (i, y) in y.iter_mut().enumerate() {
        *y = dot(&x[i * inp..(i + 1) * inp], w_row);
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
mod x86 {
    use std::arch::x86_64::*;

    /// Tokens handled per pass over a row of `w`: eight accumulators plus the `w` vector
    /// and an `x` load fit the sixteen ymm registers.
    const BLOCK: usize = 8;

    /// `y[i] = dot(x[i], w_row)` for `i < t`, in blocks of up to [`BLOCK`] tokens.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn single(x: &[f32], w_row: &[f32], t: usize, y: &mut [f32]) {
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

    fn values(n: usize, seed: u64) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u64 * 2654435761 + seed) % 1000) as f32 - 500.0) / 250.0)
            .collect()
    }

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
            let x = Tensor::from_vec(values(t * inp, seed), (t, inp), &dev).unwrap();
            let w = Tensor::from_vec(values(out * inp, seed + 7), (out, inp), &dev).unwrap();
            let want: Vec<Vec<f32>> = x.matmul(&w.t().unwrap()).unwrap().to_vec2().unwrap();
            let got: Vec<Vec<f32>> = skinny_matmul(&x, &w).unwrap().to_vec2().unwrap();
            for (g, e) in got.iter().flatten().zip(want.iter().flatten()) {
                prop_assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
            }
        }

        /// Every kernel the CPU runs (AVX-512, AVX2, portable) against the dot products in
        /// f64, for every row count 1..=16, widths on both sides of the vector lengths (8,
        /// 16) and weight row counts that are not multiples of a kernel's block, into a
        /// wider output (`stride > rows`, as a thread's part is not).
        #[test]
        fn every_kernel_matches_the_f64_dot_products(
            inp in 1usize..80,
            out in 1usize..40,
            pad in 0usize..3,
            seed in 0u64..1000,
        ) {
            let x = values(MAX_ROWS * inp, seed);
            let w = values(out * inp, seed + 7);
            let stride = out + pad;
            for kernel in supported() {
                for t in 1..=MAX_ROWS {
                    let mut y = vec![f32::NAN; t * stride];
                    rows_with(kernel, &x[..t * inp], &w, t, inp, &mut y, stride);
                    for i in 0..t {
                        for j in 0..out {
                            let want: f64 = (0..inp)
                                .map(|k| x[i * inp + k] as f64 * w[j * inp + k] as f64)
                                .sum();
                            let got = y[i * stride + j];
                            prop_assert!(
                                (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()) * inp as f64,
                                "{kernel:?} t {t} row {i} col {j}: {got} vs {want}"
                            );
                        }
                        for j in out..stride {
                            prop_assert!(y[i * stride + j].is_nan(), "{kernel:?} wrote past its rows");
                        }
                    }
                }
            }
        }

        /// With AVX-512, a token row's results are bitwise those of the one-row product: the
        /// summation order does not depend on the row count (see `avx512`).
        #[test]
        fn avx512_rows_equal_the_one_row_product_bitwise(
            inp in 1usize..80,
            out in 1usize..40,
            seed in 0u64..1000,
        ) {
            #[cfg(target_arch = "x86_64")]
            if supported().contains(&Kernel::Avx512) {
                let x = values(MAX_ROWS * inp, seed);
                let w = values(out * inp, seed + 7);
                let single = |i: usize| {
                    let mut y = vec![0f32; out];
                    rows_with(Kernel::Avx512, &x[i * inp..(i + 1) * inp], &w, 1, inp, &mut y, out);
                    y
                };
                let singles: Vec<Vec<f32>> = (0..MAX_ROWS).map(single).collect();
                for t in 1..=MAX_ROWS {
                    let mut y = vec![0f32; t * out];
                    rows_with(Kernel::Avx512, &x[..t * inp], &w, t, inp, &mut y, out);
                    for (i, one) in singles.iter().enumerate().take(t) {
                        let row = &y[i * out..(i + 1) * out];
                        prop_assert!(
                            row.iter().zip(one).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "t {t} row {i}: {row:?} vs {one:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_large_product_splits_across_threads_with_the_same_result() {
        let dev = Device::Cpu;
        // 1,531 weight rows: the threads' parts end inside a block of the AVX-512 kernel.
        let (t, inp, out) = (5, 256, 1531);
        assert!(inp * out >= PARALLEL_MIN_WEIGHTS);
        let x = Tensor::randn(0f32, 1.0, (t, inp), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (out, inp), &dev).unwrap();
        let want: Vec<Vec<f32>> = x.matmul(&w.t().unwrap()).unwrap().to_vec2().unwrap();
        let got: Vec<Vec<f32>> = skinny_matmul(&x, &w).unwrap().to_vec2().unwrap();
        for (g, e) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
        }
    }
}
