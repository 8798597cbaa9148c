//! `y = x Wᵀ` for a few rows of `x` on the CPU, reading `W` once.
//!
//! Decode and verification forwards multiply 1–16 token rows by every weight matrix. At that
//! size the product is bound by reading the weights from memory, so the best kernel streams
//! each row of `W: [out, in]` once and takes its dot product with every token row while it is
//! in L1. candle's general gemm instead repacks `W` when `x` has more than one row, which made
//! a 2–5 row product several times a one-row one (docs/kernel-notes.md, "CPU skinny
//! products"). Reading `W` once is what lets verifying γ drafts cost not much more than one
//! decode step.
//!
//! Kernels, picked at run time: AVX-512 ([`avx512`]: the weight kept a second time in a
//! blocked layout, [`ROWS`] rows per contiguous block, read as one stream with software
//! prefetch; a row's result independent of the row count), AVX2/FMA ([`avx2`]: one weight row
//! at a time, about one load per multiply-add) and portable code, both over `W` as stored.
//!
//! f32, contiguous operands only; anything else (other dtypes, devices, long prefills) goes
//! through candle's matmul.
#[cfg(target_arch = "x86_64")]
use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
// The layout is read by the AVX-512 kernel only; `ROWS` also sets the threads' split.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod blocked;
use blocked::ROWS;
#[cfg(target_arch = "x86_64")]
use blocked::{block_lines, blocked, is_f16, Line};

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

/// A weight `W: [out, in]` (f32, on the CPU) as [`skinny_matmul`] reads it, made once when a
/// layer is built.
#[derive(Debug, Clone)]
pub struct SkinnyWeight {
    out: usize,
    inp: usize,
    stored: Stored,
    kernel: Kernel,
}

#[derive(Debug, Clone)]
enum Stored {
    /// `W` as given (row-major): the AVX2 and portable kernels read it in place.
    Plain(Tensor),
    /// `W` again in [`ROWS`]-row blocks: block `b` (rows `ROWS·b ..`), feature step `s`
    /// (features `16s .. 16s + 16`), row `r` holds its 16 weights at element
    /// `((b · steps + s) · ROWS + r) · 16`, where `steps = ⌈in / 16⌉`; features past `in` and
    /// rows past `out` are zeros. A block is contiguous, so a product reads `W` as one stream
    /// in the order it sums. `half`: elements are f16, used when every weight is exactly an
    /// f16 (a checkpoint stored in f16 and widened at load): half the bytes to read, and the
    /// kernel widens each one back to the same f32, so products are bitwise unchanged.
    #[cfg(target_arch = "x86_64")]
    Blocked { lines: Arc<[Line]>, half: bool },
}

impl SkinnyWeight {
    /// `w: [out, in]` for the fastest kernel this CPU runs; `None` unless `w` is a 2-D f32
    /// tensor on the CPU.
    pub fn new(w: &Tensor) -> Result<Option<Self>> {
        Self::with_kernel(best_kernel(), w, true)
    }

    /// As [`Self::new`] with `kernel`; `half`: f16 storage allowed where lossless.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn with_kernel(kernel: Kernel, w: &Tensor, half: bool) -> Result<Option<Self>> {
        if !w.device().is_cpu() || w.dtype() != candle_core::DType::F32 || w.rank() != 2 {
            return Ok(None);
        }
        let (out, inp) = w.dims2()?;
        let w = w.contiguous()?;
        let stored = match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                let values = w.flatten_all()?.to_vec1::<f32>()?;
                let half = half && values.iter().all(|&v| is_f16(v));
                Stored::Blocked {
                    lines: blocked(&values, out, inp, half),
                    half,
                }
            }
            _ => Stored::Plain(w),
        };
        Ok(Some(Self {
            out,
            inp,
            stored,
            kernel,
        }))
    }

    /// True when this holds the weight in a layout of its own (not the given tensor).
    pub fn keeps_a_copy(&self) -> bool {
        match self.stored {
            #[cfg(target_arch = "x86_64")]
            Stored::Blocked { .. } => true,
            Stored::Plain(_) => false,
        }
    }

    /// True when [`skinny_matmul`] takes `x` against this weight: `[t, in]` with
    /// `MIN_ROWS ≤ t ≤ MAX_ROWS`, f32, contiguous, on the CPU.
    pub fn applies(&self, x: &Tensor) -> bool {
        x.device().is_cpu()
            && x.dtype() == candle_core::DType::F32
            && x.rank() == 2
            && (MIN_ROWS..=MAX_ROWS).contains(&x.dims()[0])
            && x.dims()[1] == self.inp
            && x.is_contiguous()
    }

    /// `f` of all of the weight's rows in its layout (a plain weight read in place, under its
    /// storage's read lock).
    fn with_weights<R>(&self, f: impl FnOnce(Weights) -> R) -> candle_core::Result<R> {
        match &self.stored {
            #[cfg(target_arch = "x86_64")]
            Stored::Blocked { lines, half } => Ok(f(Weights::Blocked { lines, half: *half })),
            Stored::Plain(tensor) => {
                let (storage, layout) = tensor.storage_and_layout();
                match (&*storage, layout.contiguous_offsets()) {
                    (Storage::Cpu(CpuStorage::F32(all)), Some((w0, w1))) => {
                        Ok(f(Weights::Plain(&all[w0..w1])))
                    }
                    _ => candle_core::bail!("skinny-matmul: w must be contiguous f32 on the CPU"),
                }
            }
        }
    }
}

/// `y = x wᵀ` for `x: [t, inp]` and the `out` rows of `w` (in `kernel`'s layout) into
/// `y: [t, out]`, split across rayon's threads in whole blocks of rows when it is large
/// enough.
fn product(kernel: Kernel, x: &[f32], w: Weights, t: usize, inp: usize, y: &mut [f32], out: usize) {
    let threads = rayon::current_num_threads();
    if out * inp < PARALLEL_MIN_WEIGHTS || threads == 1 {
        return rows(kernel, x, w, t, inp, y, out, out);
    }
    // Whole blocks of weight rows per thread, each into its own `[t, rows]` part, copied
    // into `y`'s columns after.
    let rows_per = out.div_ceil(threads).next_multiple_of(ROWS);
    let parts: Vec<Vec<f32>> = (0..out.div_ceil(rows_per))
        .into_par_iter()
        .map(|c| {
            let (j0, n) = (c * rows_per, rows_per.min(out - c * rows_per));
            let mut part = vec![0f32; t * n];
            rows(kernel, x, w.rows(j0, n, inp), t, inp, &mut part, n, n);
            part
        })
        .collect();
    for (c, part) in parts.iter().enumerate() {
        let (j0, n) = (c * rows_per, part.len() / t);
        for (y, part) in y.chunks_exact_mut(out).zip(part.chunks_exact(n)) {
            y[j0..j0 + n].copy_from_slice(part);
        }
    }
}

/// `x: [t, in]` (1 ≤ t ≤ [`MAX_ROWS`], f32, contiguous, on the CPU: [`SkinnyWeight::applies`])
/// times `w` transposed: `[t, out]`.
pub fn skinny_matmul(x: &Tensor, w: &SkinnyWeight) -> candle_core::Result<Tensor> {
    x.apply_op1_no_bwd(&SkinnyMatmul(w))
}

struct SkinnyMatmul<'a>(&'a SkinnyWeight);

impl CustomOp1 for SkinnyMatmul<'_> {
    fn name(&self) -> &'static str {
        "skinny-matmul"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let w = self.0;
        let CpuStorage::F32(x) = xs else {
            candle_core::bail!("skinny-matmul: f32 operands only");
        };
        let (t, inp) = xl.shape().dims2()?;
        if inp != w.inp || !(MIN_ROWS..=MAX_ROWS).contains(&t) {
            candle_core::bail!(
                "skinny-matmul: x {:?} and w [{}, {}]",
                xl.dims(),
                w.out,
                w.inp
            );
        }
        let Some((x0, x1)) = xl.contiguous_offsets() else {
            candle_core::bail!("skinny-matmul: contiguous operands only");
        };
        let x = &x[x0..x1];
        let mut y = vec![0f32; t * w.out];
        w.with_weights(|weights| product(w.kernel, x, weights, t, w.inp, &mut y, w.out))?;
        Ok((CpuStorage::F32(y), Shape::from((t, w.out))))
    }
}

/// The implementations of [`rows`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernel {
    /// Register-blocked AVX-512 over the blocked layout ([`avx512`]): a row's result does
    /// not depend on the rows beside it.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// One weight row at a time against up to 8 token rows, AVX2/FMA ([`avx2`]).
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

/// Some of a weight's rows, in its stored layout.
#[derive(Clone, Copy)]
enum Weights<'a> {
    /// `[rows, in]`, row-major.
    Plain(&'a [f32]),
    /// Whole blocks of [`Stored::Blocked`], f16 when `half`.
    #[cfg(target_arch = "x86_64")]
    Blocked { lines: &'a [Line], half: bool },
}

impl<'a> Weights<'a> {
    /// Rows `j0..j0 + n`; `j0` a multiple of [`ROWS`].
    fn rows(self, j0: usize, n: usize, inp: usize) -> Weights<'a> {
        match self {
            Weights::Plain(w) => Weights::Plain(&w[j0 * inp..(j0 + n) * inp]),
            #[cfg(target_arch = "x86_64")]
            Weights::Blocked { lines, half } => {
                let per_block = block_lines(inp, half);
                let (b0, b1) = (j0 / ROWS, (j0 + n).div_ceil(ROWS));
                Weights::Blocked {
                    lines: &lines[b0 * per_block..b1 * per_block],
                    half,
                }
            }
        }
    }
}

/// `y[i * stride + j] = dot(x[i], w[j])` for every token row `i` of `x: [t, inp]` and every
/// one of the `n ≤ stride` rows of `w`; `y: [t, stride]`. `kernel` must be one of
/// [`supported`] and `w` in its layout.
#[allow(clippy::too_many_arguments)]
fn rows(
    kernel: Kernel,
    x: &[f32],
    w: Weights,
    t: usize,
    inp: usize,
    y: &mut [f32],
    stride: usize,
    n: usize,
) {
    match (kernel, w) {
        // SAFETY: the CPU has AVX-512F (the caller's contract, detected at run time);
        // `avx512::rows` checks the lengths.
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx512, Weights::Blocked { lines, half }) => unsafe {
            if half {
                avx512::rows::<avx512::F16>(x, lines, inp, n, t, y, stride)
            } else {
                avx512::rows::<avx512::F32>(x, lines, inp, n, t, y, stride)
            }
        },
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx2, Weights::Plain(w)) => {
            by_row(&w[..n * inp], inp, t, y, stride, |w_row, col| {
                // SAFETY: the CPU has AVX2 and FMA (the caller's contract, detected at run
                // time); `x` holds `t` rows of `w_row`'s length.
                unsafe { avx2::single(x, w_row, t, col) }
            })
        }
        (Kernel::Portable, Weights::Plain(w)) => {
            by_row(&w[..n * inp], inp, t, y, stride, |w_row, col| {
                portable(x, w_row, col)
            })
        }
        #[cfg(target_arch = "x86_64")]
        _ => unreachable!("a kernel gets the layout SkinnyWeight made for it"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use proptest::prelude::*;

    /// `rows` with `kernel` over `w: [out, in]` laid out for it (f16 storage where lossless
    /// when `half`).
    #[allow(clippy::too_many_arguments)]
    fn rows_with(
        kernel: Kernel,
        half: bool,
        x: &[f32],
        w: &[f32],
        t: usize,
        inp: usize,
        y: &mut [f32],
        stride: usize,
    ) {
        let out = w.len() / inp;
        let wt = Tensor::from_slice(w, (out, inp), &Device::Cpu).unwrap();
        let sw = SkinnyWeight::with_kernel(kernel, &wt, half)
            .unwrap()
            .unwrap();
        sw.with_weights(|ws| rows(kernel, x, ws, t, inp, y, stride, out))
            .unwrap();
    }

    /// True when `w` was stored in f16.
    #[cfg(target_arch = "x86_64")]
    fn stored_half(w: &SkinnyWeight) -> bool {
        matches!(w.stored, Stored::Blocked { half: true, .. })
    }

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
            let sw = SkinnyWeight::new(&w).unwrap().unwrap();
            let got: Vec<Vec<f32>> = skinny_matmul(&x, &sw).unwrap().to_vec2().unwrap();
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
                    rows_with(kernel, false, &x[..t * inp], &w, t, inp, &mut y, stride);
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
                    rows_with(Kernel::Avx512, false, &x[i * inp..(i + 1) * inp], &w, 1, inp, &mut y, out);
                    y
                };
                let singles: Vec<Vec<f32>> = (0..MAX_ROWS).map(single).collect();
                for t in 1..=MAX_ROWS {
                    let mut y = vec![0f32; t * out];
                    rows_with(Kernel::Avx512, false, &x[..t * inp], &w, t, inp, &mut y, out);
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Weights that are all exact f16 values are stored in f16 (AVX-512), and every row
        /// count's products are bitwise those of the same weights stored in f32; one weight
        /// that is not an f16 keeps the whole matrix in f32.
        #[test]
        fn f16_storage_is_bitwise_the_f32_product(
            inp in 1usize..80,
            out in 1usize..40,
            seed in 0u64..1000,
            inexact in any::<bool>(),
        ) {
            #[cfg(target_arch = "x86_64")]
            if supported().contains(&Kernel::Avx512) {
                let x = values(MAX_ROWS * inp, seed);
                let mut w: Vec<f32> = values(out * inp, seed + 7)
                    .into_iter()
                    .map(|v| half::f16::from_f32(v).to_f32())
                    .collect();
                if inexact {
                    let at = seed as usize % w.len();
                    w[at] = 0.1;
                }
                let wt = Tensor::from_slice(&w, (out, inp), &Device::Cpu).unwrap();
                let sw = SkinnyWeight::with_kernel(Kernel::Avx512, &wt, true).unwrap().unwrap();
                prop_assert_eq!(stored_half(&sw), !inexact);
                for t in 1..=MAX_ROWS {
                    let mut halves = vec![0f32; t * out];
                    rows_with(Kernel::Avx512, true, &x[..t * inp], &w, t, inp, &mut halves, out);
                    let mut floats = vec![0f32; t * out];
                    rows_with(Kernel::Avx512, false, &x[..t * inp], &w, t, inp, &mut floats, out);
                    prop_assert!(
                        halves.iter().zip(&floats).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "t {t}: {halves:?} vs {floats:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_large_product_splits_across_threads_with_the_same_result() {
        let dev = Device::Cpu;
        // 1,531 weight rows: the threads' parts end inside a block of the kernels, and the
        // last block holds padding rows. Every kernel, split across the pool, gives bitwise
        // its one-thread result, and that result agrees with candle's matmul.
        let (t, inp, out) = (5, 250, 1531);
        assert!(inp * out >= PARALLEL_MIN_WEIGHTS);
        let x = Tensor::randn(0f32, 1.0, (t, inp), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (out, inp), &dev).unwrap();
        let want: Vec<f32> = x
            .matmul(&w.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (xs, ws) = (
            x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            w.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for kernel in supported() {
            let mut one = vec![0f32; t * out];
            rows_with(kernel, false, &xs, &ws, t, inp, &mut one, out);
            let sw = SkinnyWeight::with_kernel(kernel, &w, true)
                .unwrap()
                .unwrap();
            let split: Vec<f32> = pool
                .install(|| skinny_matmul(&x, &sw))
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert!(
                split
                    .iter()
                    .zip(&one)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kernel:?}: the split product differs from the one-thread one"
            );
            for (g, e) in split.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{kernel:?}: {g} vs {e}"
                );
            }
        }
    }
}
