//! The products of decode and verification steps (`Linear::forward` of 1–16 rows: the CPU's
//! skinny kernel in f32, CUDA's GEMV kernels — tensor cores in bf16 / f16 — on the GPU,
//! candle's matmul elsewhere) against the dot products in f64 on the host, and, on CUDA, row
//! by row equal to the one-row product bitwise: the GEMV kernels sum each row in one order
//! for any row count, so a verification row has exactly the logits the decode step of the
//! same token has, which keeps greedy speculation equal to greedy decoding in half precision
//! (the CPU's kernel makes no such promise: f32 keeps it exact enough there).
use candle_core::{DType, Device, Tensor};
use specdec::nn::Linear;

#[path = "common/device.rs"]
mod device;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Whether a GEMV kernel takes every row count of this product on the test device (CUDA,
/// `fused::gemv`'s shape conditions).
fn row_exact(dev: &Device, out: usize, inp: usize) -> bool {
    dev.is_cuda() && out % 4 == 0 && inp % 8 == 0
}

fn check(dtype: DType, out: usize, inp: usize, tol: f32) {
    let dev = device::device();
    let w = Tensor::from_vec(values(out * inp, 7), (out, inp), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let x = Tensor::from_vec(values(16 * inp, 9), (16, inp), &dev)
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
    // Square, wide, tall, an input width that is no multiple of 32 and an odd output count.
    for (out, inp) in [(256, 256), (64, 1024), (1024, 64), (96, 200), (50, 128)] {
        check(DType::F32, out, inp, 1e-5);
        // Half precision: the inputs are the rounded values on both sides; the output is
        // rounded to the dtype (relative 2^-8 / 2^-11 of a result of size ~sqrt(inp)).
        check(DType::BF16, out, inp, 8e-3);
        check(DType::F16, out, inp, 1e-3);
    }
}
