//! Helpers of the decode-path equivalence tests (`decode_paths`, `decode_graphs`): caches,
//! token streams and the tolerance they compare logits by (with [`super::host::rel_err`]).
use candle_core::{Tensor, D};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::models::Model;

/// Relative tolerance in f32: the paths sum in different orders.
pub const TOL: f32 = 1e-4;

/// The floor of the scale of [`super::host::rel_err`] in these tests.
pub const MIN_SCALE: f32 = f32::MIN_POSITIVE;

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

/// The argmax of every row.
pub fn argmax_rows(t: &Tensor) -> Vec<u32> {
    t.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap()
}

/// [`TOL`] in f32; 1e-1 in half precision (rounding of a different kernel's order).
pub fn tolerance() -> f32 {
    match super::device::dtype_choice() {
        specdec::models::DTypeChoice::BF16 | specdec::models::DTypeChoice::F16 => 1e-1,
        _ => TOL,
    }
}
