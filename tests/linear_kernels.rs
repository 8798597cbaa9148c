//! The products of decode and verification steps (`Linear::forward` of 1–16 rows: the CPU's
//! skinny kernel in f32, CUDA's GEMV kernels — tensor cores in bf16 / f16 — on the GPU,
//! candle's matmul elsewhere) against the dot products in f64 on the host, and, on CUDA, row
//! by row equal to the one-row product bitwise: the GEMV kernels sum each row in one order
//! for any row count, so a verification row has exactly the logits the decode step of the
//! same token has, which keeps greedy speculation equal to greedy decoding in half precision
//! (on the CPU the AVX-512 kernel keeps the same promise, checked in `nn::skinny`'s tests; its
//! AVX2 and portable fallbacks make none: f32 keeps them exact enough there).
mod common;

use candle_core::{DType, Device, Tensor};
use common::device;
use common::host::{host, values};
use specdec::nn::{Activation, Linear};

/// Whether a GEMV kernel takes every row count of this product on the test device (CUDA,
/// `fused::gemv`'s shape conditions).
fn row_exact(dev: &Device, out: usize, inp: usize) -> bool {
    dev.is_cuda() && out.is_multiple_of(4) && inp.is_multiple_of(8)
}

fn check(dtype: DType, out: usize, inp: usize, tol: f32) {
    let dev = device::device();
    let w = Tensor::from_vec(values(out * inp, 7, 1.0), (out, inp), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let x = Tensor::from_vec(values(16 * inp, 9, 1.0), (16, inp), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let lin = Linear::new(w.clone(), None).unwrap();
    let (wh, xh) = (host(&w), host(&x));
    let singles: Vec<Vec<f32>> = (0..16)
        .map(|r| host(&lin.forward(&x.narrow(0, r, 1).unwrap()).unwrap()))
        .collect();
    for rows in 1..=16 {
        let y = lin.forward(&x.narrow(0, 0, rows).unwrap()).unwrap();
        assert_eq!(y.dims(), &[rows, out]);
        let y = host(&y);
        for r in 0..rows {
            for o in 0..out {
                let want: f64 = (0..inp)
                    .map(|i| wh[o * inp + i] as f64 * xh[r * inp + i] as f64)
                    .sum();
                let got = y[r * out + o];
                // Sums of `inp` products of unit-size terms: errors scale with sqrt(inp).
                let bound = tol * (inp as f32).sqrt();
                assert!(
                    (got as f64 - want).abs() <= bound as f64,
                    "{dtype:?} [{out}, {inp}] rows {rows}: row {r} output {o} is {got}, expected {want}"
                );
            }
            if row_exact(&dev, out, inp) {
                assert!(
                    y[r * out..(r + 1) * out] == singles[r][..],
                    "{dtype:?} [{out}, {inp}]: row {r} of a {rows}-row product differs from its one-row product"
                );
            }
        }
    }
}

#[test]
fn few_row_products_match_the_dot_products_and_each_row_alone() {
    // Square, wide, tall, an input width that is a multiple of 32 but not of 64 (the
    // tensor-core kernel's narrower chunks), one that is no multiple of 32, and an odd output
    // count.
    for (out, inp) in [
        (256, 256),
        (64, 1024),
        (1024, 64),
        (64, 160),
        (96, 200),
        (50, 128),
    ] {
        check(DType::F32, out, inp, 1e-5);
        // Half precision: the inputs are the rounded values on both sides; the output is
        // rounded to the dtype (relative 2^-8 / 2^-11 of a result of size ~sqrt(inp)).
        check(DType::BF16, out, inp, 8e-3);
        check(DType::F16, out, inp, 1e-3);
    }
}

/// A SiLU-gated MLP `[hidden] -> [inter] -> [hidden]` of values from `seed` on `dev` in
/// `dtype`, and its fused gate/up and down weights on the host.
fn gated_mlp(
    dev: &Device,
    dtype: DType,
    (hidden, inter): (usize, usize),
    seed: u64,
) -> (specdec::nn::GatedMlp, Vec<f32>, Vec<f32>) {
    gated_mlp_with(dev, dtype, (hidden, inter), seed, Activation::Silu)
}

/// [`gated_mlp`] with the gate's activation `act`.
fn gated_mlp_with(
    dev: &Device,
    dtype: DType,
    (hidden, inter): (usize, usize),
    seed: u64,
    act: Activation,
) -> (specdec::nn::GatedMlp, Vec<f32>, Vec<f32>) {
    use specdec::nn::GatedMlp;
    let tensor = |n: usize, seed: u64, shape: (usize, usize)| {
        Tensor::from_vec(values(n, seed, 1.0), shape, dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let gate_up = tensor(2 * inter * hidden, seed, (2 * inter, hidden));
    let down = tensor(hidden * inter, seed + 1, (hidden, inter));
    let (guh, dh) = (host(&gate_up), host(&down));
    let mlp = GatedMlp::new(
        Linear::new(gate_up, None).unwrap(),
        Linear::new(down, None).unwrap(),
        act,
    )
    .unwrap();
    (mlp, guh, dh)
}

/// `down(silu(gate x) * (up x))` in f64 from the host weights of [`gated_mlp`].
fn mlp_formula(guh: &[f32], dh: &[f32], x: &[f64]) -> Vec<f64> {
    mlp_formula_with(guh, dh, x, Activation::Silu)
}

/// `down(act(gate x) * (up x))` in f64 (GELU-tanh or SiLU).
fn mlp_formula_with(guh: &[f32], dh: &[f32], x: &[f64], act: Activation) -> Vec<f64> {
    let dot = |w: &[f32], o: usize, v: &[f64]| -> f64 {
        v.iter()
            .enumerate()
            .map(|(i, x)| w[o * v.len() + i] as f64 * x)
            .sum()
    };
    let inter = guh.len() / x.len() / 2;
    let act: Vec<f64> = (0..inter)
        .map(|i| {
            let (g, u) = (dot(guh, i, x), dot(guh, inter + i, x));
            let a = match act {
                Activation::GeluTanh => {
                    0.5 * g * (1.0 + (0.7978845608 * (g + 0.044715 * g * g * g)).tanh())
                }
                _ => g / (1.0 + (-g).exp()),
            };
            a * u
        })
        .collect();
    (0..dh.len() / inter).map(|o| dot(dh, o, &act)).collect()
}

/// The gated MLP of 1–16 rows (`down(silu(gate) * up)`: two products and the fused
/// activation on CUDA) against the formula in f64, and, on CUDA, each row equal to the
/// one-row forward bitwise.
#[test]
fn gated_mlp_rows_match_the_formula_and_each_row_alone() {
    let dev = device::device();
    let (hidden, inter) = (128, 96);
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        let (mlp, guh, dh) = gated_mlp(&dev, dtype, (hidden, inter), 11);
        let x = Tensor::from_vec(values(16 * hidden, 13, 1.0), (16, hidden), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let xh = host(&x);
        let singles: Vec<Vec<f32>> = (0..16)
            .map(|r| host(&mlp.forward(&x.narrow(0, r, 1).unwrap()).unwrap()))
            .collect();
        for rows in 1..=16 {
            let y = host(&mlp.forward(&x.narrow(0, 0, rows).unwrap()).unwrap());
            for r in 0..rows {
                let xr: Vec<f64> = xh[r * hidden..(r + 1) * hidden]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let want = mlp_formula(&guh, &dh, &xr);
                // Relative to the row's largest output: half precision rounds the gate/up
                // product and the activation before the down product.
                let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
                for (o, want) in want.iter().enumerate() {
                    let got = y[r * hidden + o] as f64;
                    assert!(
                        (got - want).abs() <= tol * scale,
                        "{dtype:?} rows {rows}: row {r} output {o} is {got}, expected {want} (scale {scale})"
                    );
                }
                if dev.is_cuda() {
                    assert!(
                        y[r * hidden..(r + 1) * hidden] == singles[r][..],
                        "{dtype:?}: MLP row {r} of {rows} rows differs from its one-row forward"
                    );
                }
            }
        }
    }
}

/// A residual stream `[16, n]` of rows whose sizes differ (scaled by 0.25–4 per row: the
/// norm's row scale is what the folded products take out of their sums) and a norm weight
/// around 1.
fn stream_and_norm(dev: &Device, dtype: DType, n: usize) -> (Tensor, specdec::nn::RmsNorm) {
    let scaled: Vec<f32> = values(16 * n, 21, 1.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 2f32.powi((i / n) as i32 % 5 - 2))
        .collect();
    let x = Tensor::from_vec(scaled, (16, n), dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let g: Vec<f32> = values(n, 22, 0.5).iter().map(|v| 1.0 + v).collect();
    let g = Tensor::from_vec(g, n, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    (x, specdec::nn::RmsNorm::new(g, 1e-5))
}

/// `norm(x)` of row `r` in f64 from the host values of `x: [rows, n]` and the norm weight.
fn normed_row(xh: &[f32], gh: &[f32], r: usize, eps: f64) -> Vec<f64> {
    let n = gh.len();
    let row = &xh[r * n..(r + 1) * n];
    let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
    let scale = 1.0 / (ms + eps).sqrt();
    row.iter()
        .zip(gh)
        .map(|(&v, &g)| v as f64 * scale * g as f64)
        .collect()
}

/// The products of a decode or verification step that fold in the pre-norm before them
/// (`Linear::forward_prenorm`) and the residual add after them (`Linear::forward_add`) — one
/// CUDA tensor-core GEMV each in half precision, a norm or add and the plain product
/// elsewhere — against the formulas in f64, and, on CUDA, each row equal to the one-row
/// product bitwise (the norm's row scale is summed in one order for any row count).
#[test]
fn folded_products_match_the_formulas_and_each_row_alone() {
    let dev = device::device();
    // Input widths that are multiples of 64 and of 32 only (the kernel's two chunk widths).
    for (out, inp) in [(256, 256), (64, 1024), (96, 160)] {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2), (DType::F16, 4e-3)] {
            let w = Tensor::from_vec(values(out * inp, 23, 1.0), (out, inp), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let lin = Linear::new(w.clone(), None).unwrap();
            let (x, norm) = stream_and_norm(&dev, dtype, inp);
            let resid = Tensor::from_vec(values(16 * out, 24, 4.0), (16, out), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let (wh, xh, gh, rh) = (host(&w), host(&x), host(norm.weight()), host(&resid));
            let one = |r: usize| {
                let x = x.narrow(0, r, 1).unwrap();
                let pre = host(&lin.forward_prenorm(&x, &norm).unwrap());
                let add = host(
                    &lin.forward_add(&x, &resid.narrow(0, r, 1).unwrap())
                        .unwrap(),
                );
                (pre, add)
            };
            let singles: Vec<_> = (0..16).map(one).collect();
            // On CUDA in half precision these shapes take the folded kernels (not the
            // fallback through a norm and a plain product).
            let folded = dev.is_cuda() && dtype != DType::F32;
            let fold = specdec::nn::Folded::Norm(norm.weight(), norm.eps());
            assert_eq!(
                specdec::nn::folded_gemv(&x, &w, fold, None, None)
                    .unwrap()
                    .is_some(),
                folded,
                "{dtype:?} [{out}, {inp}]: folded kernel taken"
            );
            for rows in [1, 2, 5, 8, 9, 16] {
                let xs = x.narrow(0, 0, rows).unwrap();
                let pre = host(&lin.forward_prenorm(&xs, &norm).unwrap());
                let add = host(
                    &lin.forward_add(&xs, &resid.narrow(0, 0, rows).unwrap())
                        .unwrap(),
                );
                for r in 0..rows {
                    let normed = normed_row(&xh, &gh, r, 1e-5);
                    let plain = &xh[r * inp..(r + 1) * inp];
                    for o in 0..out {
                        let wr = &wh[o * inp..(o + 1) * inp];
                        let want_pre: f64 =
                            wr.iter().zip(&normed).map(|(&w, n)| w as f64 * n).sum();
                        let want_add = rh[r * out + o] as f64
                            + wr.iter()
                                .zip(plain)
                                .map(|(&w, &x)| w as f64 * x as f64)
                                .sum::<f64>();
                        // Unit-size normed inputs; the added stream is up to 4 and the plain
                        // rows up to 4 times larger.
                        let bound = (tol * (inp as f32).sqrt()) as f64;
                        let (got_pre, got_add) = (pre[r * out + o] as f64, add[r * out + o] as f64);
                        assert!(
                            (got_pre - want_pre).abs() <= bound,
                            "{dtype:?} [{out}, {inp}] rows {rows}: normed row {r} output {o} is {got_pre}, expected {want_pre}"
                        );
                        assert!(
                            (got_add - want_add).abs() <= 8.0 * bound,
                            "{dtype:?} [{out}, {inp}] rows {rows}: added row {r} output {o} is {got_add}, expected {want_add}"
                        );
                    }
                    if folded {
                        let (p1, a1) = &singles[r];
                        assert!(
                            pre[r * out..(r + 1) * out] == p1[..] && add[r * out..(r + 1) * out] == a1[..],
                            "{dtype:?} [{out}, {inp}]: row {r} of a {rows}-row folded product differs from its one-row product"
                        );
                    }
                }
            }
        }
    }
}

/// A biased product after a pre-norm (Qwen2's q/k/v: `Linear::forward_prenorm` with a bias;
/// on CUDA in half precision the bias rides in the folded GEMV's epilogue) equals the product
/// without the bias followed by candle's add of the bias, bit for bit, at every row count.
#[test]
fn a_folded_product_adds_its_bias_as_a_separate_add_would() {
    let dev = device::device();
    for (out, inp) in [(256, 256), (96, 160)] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let w = Tensor::from_vec(values(out * inp, 31, 1.0), (out, inp), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let b = Tensor::from_vec(values(out, 32, 2.0), out, &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let (x, norm) = stream_and_norm(&dev, dtype, inp);
            let biased = Linear::new(w.clone(), Some(b.clone())).unwrap();
            let plain = Linear::new(w, None).unwrap();
            for rows in [1, 2, 5, 16] {
                let xs = x.narrow(0, 0, rows).unwrap();
                let got = host(&biased.forward_prenorm(&xs, &norm).unwrap());
                let want = host(
                    &plain
                        .forward_prenorm(&xs, &norm)
                        .unwrap()
                        .broadcast_add(&b)
                        .unwrap(),
                );
                assert!(
                    got == want,
                    "{dtype:?} [{out}, {inp}] rows {rows}: the biased product differs from the product plus the bias"
                );
                let bias_changes_it = got
                    .iter()
                    .zip(host(&plain.forward_prenorm(&xs, &norm).unwrap()))
                    .any(|(a, b)| *a != b);
                assert!(bias_changes_it, "{dtype:?}: the bias was not added");
            }
        }
    }
}

/// The gated MLP over the residual stream (`GatedMlp::forward_residual`: `x +
/// down(silu(gate) * up)` of `norm(x)`; on CUDA the norm rides in the gate/up GEMV and the
/// add in the down GEMV) against the formula in f64 and, on CUDA, each row equal to the
/// one-row forward bitwise.
#[test]
fn folded_mlp_rows_match_the_formula_and_each_row_alone() {
    let dev = device::device();
    let (hidden, inter) = (128, 96);
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 3e-2), (DType::F16, 6e-3)] {
        let (mlp, guh, dh) = gated_mlp(&dev, dtype, (hidden, inter), 31);
        let (x, norm) = stream_and_norm(&dev, dtype, hidden);
        let (xh, gh) = (host(&x), host(norm.weight()));
        let singles: Vec<Vec<f32>> = (0..16)
            .map(|r| {
                host(
                    &mlp.forward_residual(&x.narrow(0, r, 1).unwrap(), &norm)
                        .unwrap(),
                )
            })
            .collect();
        for rows in [1, 3, 8, 16] {
            let y = host(
                &mlp.forward_residual(&x.narrow(0, 0, rows).unwrap(), &norm)
                    .unwrap(),
            );
            for r in 0..rows {
                let mlp_out = mlp_formula(&guh, &dh, &normed_row(&xh, &gh, r, 1e-5));
                let scale = mlp_out.iter().fold(1f64, |m, w| m.max(w.abs()));
                for (o, m) in mlp_out.iter().enumerate() {
                    let want = xh[r * hidden + o] as f64 + m;
                    let got = y[r * hidden + o] as f64;
                    // Relative to the row's largest term: half precision rounds the normed
                    // inputs, the gate/up products, the activation and the sum.
                    let bound = tol * scale.max(want.abs());
                    assert!(
                        (got - want).abs() <= bound,
                        "{dtype:?} rows {rows}: row {r} output {o} is {got}, expected {want}"
                    );
                }
                if dev.is_cuda() && dtype != DType::F32 {
                    assert!(
                        y[r * hidden..(r + 1) * hidden] == singles[r][..],
                        "{dtype:?}: folded MLP row {r} of {rows} rows differs from its one-row forward"
                    );
                }
            }
        }
    }
}

/// A sandwich block's folded parts (Gemma 3): the gated MLP of the normed stream
/// (`GatedMlp::forward_prenorm`: on CUDA in half precision the norm and the activation, SiLU
/// or GELU-tanh, ride in the gate/up GEMV) and a post-norm with the residual add after it
/// (`RmsNorm::add_normed`: one kernel on CUDA), against the formulas in f64 and, on CUDA,
/// each row equal to the one-row result bitwise.
#[test]
fn sandwich_parts_match_the_formulas_and_each_row_alone() {
    let dev = device::device();
    let (hidden, inter) = (128, 96);
    for act in [Activation::GeluTanh, Activation::Silu] {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 3e-2), (DType::F16, 6e-3)] {
            let (mlp, guh, dh) = gated_mlp_with(&dev, dtype, (hidden, inter), 41, act);
            let (x, norm) = stream_and_norm(&dev, dtype, hidden);
            let y = Tensor::from_vec(values(16 * hidden, 42, 3.0), (16, hidden), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let (xh, yh, gh) = (host(&x), host(&y), host(norm.weight()));
            let half_cuda = dev.is_cuda() && dtype != DType::F32;
            if half_cuda {
                // The folded kernel is taken, not the fallback through a norm.
                let w = Tensor::from_vec(
                    values(2 * inter * hidden, 41, 1.0),
                    (2 * inter, hidden),
                    &dev,
                )
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
                let gate = match act {
                    Activation::GeluTanh => specdec::nn::Gate::Gelu,
                    _ => specdec::nn::Gate::Silu,
                };
                let fold = specdec::nn::Folded::Norm(norm.weight(), norm.eps());
                let taken = specdec::nn::folded_gemv(&x, &w, fold, Some(gate), None).unwrap();
                assert!(
                    taken.is_some(),
                    "{act:?} {dtype:?}: the folded gated kernel was not taken"
                );
            }
            let one = |r: usize| {
                let xr = x.narrow(0, r, 1).unwrap();
                let m = host(&mlp.forward_prenorm(&xr, &norm).unwrap());
                let a = host(&norm.add_normed(&xr, &y.narrow(0, r, 1).unwrap()).unwrap());
                (m, a)
            };
            let singles: Vec<_> = (0..16).map(one).collect();
            for rows in [1, 3, 8, 16] {
                let xs = x.narrow(0, 0, rows).unwrap();
                let m = host(&mlp.forward_prenorm(&xs, &norm).unwrap());
                let a = host(
                    &norm
                        .add_normed(&xs, &y.narrow(0, 0, rows).unwrap())
                        .unwrap(),
                );
                for r in 0..rows {
                    let want = mlp_formula_with(&guh, &dh, &normed_row(&xh, &gh, r, 1e-5), act);
                    let scale = want.iter().fold(1f64, |m, w| m.max(w.abs()));
                    for (o, w) in want.iter().enumerate() {
                        let got = m[r * hidden + o] as f64;
                        assert!(
                            (got - w).abs() <= tol * scale,
                            "{act:?} {dtype:?} rows {rows}: MLP row {r} output {o} is {got}, expected {w}"
                        );
                    }
                    let ny = normed_row(&yh, &gh, r, 1e-5);
                    for o in 0..hidden {
                        let w = xh[r * hidden + o] as f64 + ny[o];
                        let got = a[r * hidden + o] as f64;
                        // The stream is up to 4, the normed rows about 1.
                        assert!(
                            (got - w).abs() <= tol * 8.0,
                            "{dtype:?} rows {rows}: post-norm add row {r} output {o} is {got}, expected {w}"
                        );
                    }
                    if dev.is_cuda() {
                        let (m1, a1) = &singles[r];
                        assert!(
                            m[r * hidden..(r + 1) * hidden] == m1[..]
                                && a[r * hidden..(r + 1) * hidden] == a1[..],
                            "{act:?} {dtype:?}: row {r} of {rows} rows differs from its one-row result"
                        );
                    }
                }
            }
        }
    }
}

/// The row argmax that ends a greedy step (`specdec::nn::argmax_rows`: on CUDA one block per
/// row, or, for rows of 16k ids or more, a row split over blocks whose last combines them)
/// against the host's rule — the largest value, the first index on ties — on rows of several
/// lengths with the maximum repeated across the split's 4,096-id chunks, rows of -inf and
/// (on CUDA, where NaN never wins) NaN entries; f32 and bf16.
#[test]
fn row_argmax_takes_the_first_largest_value() {
    let dev = device::device();
    for n in [1000usize, 20_000, 262_151] {
        for dtype in [DType::F32, DType::BF16] {
            let rows = 5;
            let mut x: Vec<f32> = values(rows * n, 51, 1.0);
            for (r, row) in x.chunks_mut(n).enumerate() {
                match r {
                    // The maximum three times, the first in the row's last chunk but one.
                    0 => {
                        for &j in &[n - 5000.min(n - 1), n - 3, n / 2 + 4096 % n] {
                            row[j.min(n - 1)] = 9.0;
                        }
                    }
                    // Every entry -inf.
                    1 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                    // The maximum at the very end.
                    2 => row[n - 1] = 9.0,
                    // NaN beside the maximum (CUDA only: candle's CPU argmax orders NaN
                    // otherwise).
                    3 if dev.is_cuda() => {
                        row[0] = f32::NAN;
                        row[n / 3] = 9.0;
                        row[n / 3 + 1] = f32::NAN;
                    }
                    _ => row[n / 4] = 9.0,
                }
            }
            let t = Tensor::from_vec(x, (rows, n), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let host_rows = host(&t);
            let want: Vec<u32> = host_rows
                .chunks(n)
                .map(|row| {
                    let mut best = (f32::NEG_INFINITY, None::<usize>);
                    for (j, &v) in row.iter().enumerate() {
                        if v > best.0 || (best.1.is_none() && v == best.0) {
                            best = (v, Some(j));
                        }
                    }
                    best.1.unwrap_or(0) as u32
                })
                .collect();
            let got = specdec::nn::argmax_rows(&t).unwrap();
            assert_eq!(got, want, "{dtype:?}, rows of {n}");
        }
    }
}
