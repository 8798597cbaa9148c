//! The products of decode and verification steps (`Linear::forward` of 1–16 rows: the CPU's
//! skinny kernel in f32, CUDA's GEMV kernels — tensor cores in bf16 / f16 — on the GPU,
//! candle's matmul elsewhere) against the dot products in f64 on the host, and, on CUDA, row
//! by row equal to the one-row product bitwise: the GEMV kernels sum each row in one order
//! for any row count, so a verification row has exactly the logits the decode step of the
//! same token has, which keeps greedy speculation equal to greedy decoding in half precision
//! (on the CPU the AVX-512 kernel keeps the same promise, checked in `nn::skinny`'s tests; its
//! AVX2 and portable fallbacks make none: f32 keeps them exact enough there).
use candle_core::{DType, Device, Tensor};
use specdec::nn::Linear;

#[path = "common/device.rs"]
mod device;
#[path = "common/host.rs"]
mod host;
use host::{host, values};

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
    let lin = Linear::new(w.clone(), None);
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

/// The gated MLP of 1–16 rows (`down(silu(gate) * up)`: two products and the fused
/// activation on CUDA) against the formula in f64, and, on CUDA, each row equal to the
/// one-row forward bitwise.
#[test]
fn gated_mlp_rows_match_the_formula_and_each_row_alone() {
    use specdec::nn::{Activation, GatedMlp};
    let dev = device::device();
    let (hidden, inter) = (128, 96);
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        let tensor = |n: usize, seed: u64, shape: (usize, usize)| {
            Tensor::from_vec(values(n, seed, 1.0), shape, &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let gate_up = tensor(2 * inter * hidden, 11, (2 * inter, hidden));
        let down = tensor(hidden * inter, 12, (hidden, inter));
        let x = tensor(16 * hidden, 13, (16, hidden));
        let (guh, dh, xh) = (host(&gate_up), host(&down), host(&x));
        let mlp = GatedMlp::new(
            Linear::new(gate_up, None),
            Linear::new(down, None),
            Activation::Silu,
        )
        .unwrap();
        let singles: Vec<Vec<f32>> = (0..16)
            .map(|r| host(&mlp.forward(&x.narrow(0, r, 1).unwrap()).unwrap()))
            .collect();
        for rows in 1..=16 {
            let y = host(&mlp.forward(&x.narrow(0, 0, rows).unwrap()).unwrap());
            for r in 0..rows {
                let dot = |w: &[f32], o: usize, v: &[f64]| -> f64 {
                    v.iter()
                        .enumerate()
                        .map(|(i, x)| w[o * v.len() + i] as f64 * x)
                        .sum()
                };
                let xr: Vec<f64> = xh[r * hidden..(r + 1) * hidden]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let act: Vec<f64> = (0..inter)
                    .map(|i| {
                        let (g, u) = (dot(&guh, i, &xr), dot(&guh, inter + i, &xr));
                        g / (1.0 + (-g).exp()) * u
                    })
                    .collect();
                let want: Vec<f64> = (0..hidden).map(|o| dot(&dh, o, &act)).collect();
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
