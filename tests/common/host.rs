//! Host-side inputs, read-back, and the relative error the parity tests compare logits by.
use candle_core::{DType, Device, Tensor};

/// Deterministic values in [-scale, scale) (xorshift; the same sequence for a seed).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `t` on the host as f32, flattened.
pub fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// `max |a - b| / max(max |b|, min_scale)`, in f32 on the CPU (either may live on the test
/// device): the largest error relative to the largest reference value. `min_scale` keeps an
/// all-zero reference from dividing by zero (the model tests use 1e-12, the decode-path tests
/// `f32::MIN_POSITIVE`).
pub fn rel_err(a: &Tensor, b: &Tensor, min_scale: f32) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let on_host = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let (a, b) = (&on_host(a), &on_host(b));
    let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    let scale = b.abs().unwrap().max_all().unwrap();
    diff.to_scalar::<f32>().unwrap() / scale.to_scalar::<f32>().unwrap().max(min_scale)
}
