//! [`Attend`]: what attention reads after a cache update.
use candle_core::Tensor;

use super::mask::Mask;
use crate::error::Result;

/// What attention needs after a cache update.
///
/// `k`, `v`: `[batch, kv_heads, kv_len, head_dim]`, possibly non-contiguous views of the
/// cache's buffers (valid until the cache is next written); `tail`: more keys and values
/// after them, kept apart (a staged speculation's K/V beside the ring, which would otherwise
/// be copied together with the whole window on every append). `mask`: which of all those keys
/// each new query sees, described by positions; attention materialises it
/// (`[q_len, kv_len + tail_len]` f32, additive) only when something is hidden.
#[derive(Debug, Clone)]
pub struct Attend {
    /// Keys to attend over.
    pub k: Tensor,
    /// Values to attend over.
    pub v: Tensor,
    /// Keys and values that follow `k` and `v`.
    pub tail: Option<(Tensor, Tensor)>,
    /// Visibility of `k` then `tail` (in that order) to the new queries.
    pub mask: Mask,
}

impl Attend {
    /// The same keys for the newest query alone ([`Mask::last_query`]).
    pub fn last_query(self) -> Self {
        Self {
            mask: self.mask.last_query(),
            ..self
        }
    }

    /// `k` and `v` with the tail appended (a copy when there is a tail): for consumers that
    /// want one tensor each.
    pub fn joined(&self) -> Result<(Tensor, Tensor)> {
        match &self.tail {
            None => Ok((self.k.clone(), self.v.clone())),
            Some((tk, tv)) => Ok((
                Tensor::cat(&[&self.k, tk], 2)?,
                Tensor::cat(&[&self.v, tv], 2)?,
            )),
        }
    }

    /// The additive mask `[q_len, kv_len]` on `k`'s device, or `None` when nothing is hidden.
    pub fn mask_tensor(&self) -> Result<Option<Tensor>> {
        self.mask.tensor(self.k.device())
    }
}
