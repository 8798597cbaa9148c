#![allow(dead_code)]
//! Helpers of the decode-path equivalence tests (`decode_paths`, `decode_graphs`): the
//! shipped models on the test device, token streams, and the relative error they compare by.
//! The including test declares `mod device` (tests/common/device.rs) at its root.
use std::path::Path;

use candle_core::{Device, Tensor, D};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::models::Model;

/// Relative tolerance in f32: the paths sum in different orders.
pub const TOL: f32 = 1e-4;

/// The shipped model `name` (`target` or `draft`) on the test device.
pub fn load(name: &str) -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name);
    Model::load(&dir, &crate::device::load_options()).expect("shipped model loads")
}

/// An empty cache (slack rings for sliding layers).
pub fn cache(model: &Model) -> ModelCache {
    model
        .new_cache(RotatingStrategy::Slack { max_draft: 8 })
        .expect("cache")
}

/// `n` deterministic ids below `vocab`, different per `seed`.
pub fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729 + 17) % vocab) as u32)
        .collect()
}

/// `max |a - b| / max |b|`, in f32 on the CPU.
pub fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let host = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let (a, b) = (host(a), host(b));
    let scale = b
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The argmax of every row.
pub fn argmax_rows(t: &Tensor) -> Vec<u32> {
    t.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap()
}

/// [`TOL`] in f32; 1e-1 in half precision (rounding of a different kernel's order).
pub fn tolerance() -> f32 {
    match crate::device::dtype_choice() {
        specdec::models::DTypeChoice::BF16 | specdec::models::DTypeChoice::F16 => 1e-1,
        _ => TOL,
    }
}
