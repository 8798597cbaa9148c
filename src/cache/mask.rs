//! Attention masks built from absolute positions.
use candle_core::{Device, Tensor};

use crate::error::Result;

/// Additive mask `[queries.len(), keys.len()]` (f32, 0 = visible, -inf = hidden) for queries
/// at absolute positions `queries` over keys at positions `keys` (`None` = an empty or stale
/// slot). A key is visible to query `q` iff it is valid, `key <= q`, and, with a sliding
/// `window`, `key > q - window` (each query sees `window` tokens including itself, as in
/// transformers). Returns `None` when every key is visible to every query.
pub fn visibility_mask(
    queries: std::ops::Range<usize>,
    keys: &[Option<usize>],
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let visible = |q: usize, k: Option<usize>| match k {
        None => false,
        Some(k) => k <= q && window.is_none_or(|w| k + w > q),
    };
    let all_visible = queries.clone().all(|q| keys.iter().all(|&k| visible(q, k)));
    if all_visible {
        return Ok(None);
    }
    let n_q = queries.len();
    let mut data = Vec::with_capacity(n_q * keys.len());
    for q in queries {
        data.extend(keys.iter().map(|&k| {
            if visible(q, k) {
                0f32
            } else {
                f32::NEG_INFINITY
            }
        }));
    }
    Ok(Some(Tensor::from_vec(data, (n_q, keys.len()), device)?))
}
