//! The staged strategy's side buffer on a [`super::RotatingKvCache`]: where a speculation's
//! K/V go, and a commit whose copies the caller makes for several layers at once.
use candle_core::Tensor;

use super::{RotatingKvCache, RotatingStrategy};
use crate::cache::buffer::KvBuf;
use crate::cache::error::CacheError;
use crate::error::Result;

/// Slots a staged side buffer grows by.
const SIDE_STEP: usize = 16;

impl RotatingKvCache {
    /// Makes the side buffer fit `like` with room for `needed` slots, keeping the open
    /// speculation's staged K/V (an error when they are of another shape than `like`).
    pub(super) fn ensure_side(&mut self, like: &Tensor, needed: usize) -> Result<()> {
        let kept = self.staged_len();
        let capacity = needed.div_ceil(SIDE_STEP) * SIDE_STEP;
        self.side = match self.side.take() {
            Some(side) if side.fits(like) && side.capacity() >= needed => Some(side),
            Some(side) if side.fits(like) => Some(side.grown(capacity, kept)?),
            Some(side) if kept > 0 => {
                let dims = side.k.dims().to_vec();
                self.side = Some(side);
                return Err(CacheError::BadInput(format!(
                    "k {:?} {:?} does not match the staged K/V {dims:?}",
                    like.dims(),
                    like.dtype()
                ))
                .into());
            }
            _ => Some(KvBuf::zeros_like(like, capacity)?),
        };
        Ok(())
    }

    /// Tokens of the open staged speculation (0 for slack, or outside a speculation).
    pub(super) fn staged_len(&self) -> usize {
        match &self.spec {
            Some(spec) if self.strategy == RotatingStrategy::Staged => self.offset - spec.base,
            _ => 0,
        }
    }

    /// The open staged speculation's K/V, `[b, h, staged_len, d]` views of the side buffer;
    /// `None` when there are none.
    pub(super) fn staged_kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        match (&self.side, self.staged_len()) {
            (Some(side), n) if n > 0 => Ok(Some(side.view(0, n)?)),
            _ => Ok(None),
        }
    }

    /// For a commit of `n` tokens whose copy the caller makes for several layers at once:
    /// the staged side buffer's and the ring's buffers (`k`, `v` each) and the rows to copy,
    /// `min(n, appended)`, when the staged strategy has tokens to keep that fit the ring; the
    /// caller copies them to the ring from [`Self::base_slot`] on and then calls
    /// [`Self::commit_copied`].
    #[cfg(feature = "cuda")]
    pub(crate) fn staged_commit_parts(&self, n: usize) -> Option<([&Tensor; 4], usize)> {
        let keep = n.min(self.staged_len());
        let (side, ring) = (self.side.as_ref()?, self.ring.as_ref()?);
        (keep > 0 && keep <= self.capacity && ring.fits(&side.k))
            .then_some(([&side.k, &side.v, &ring.k, &ring.v], keep))
    }

    /// A staged commit of `n` tokens whose rows the caller copied into the ring (see
    /// [`Self::staged_commit_parts`]): the bookkeeping of [`Self::commit`].
    #[cfg(feature = "cuda")]
    pub(crate) fn commit_copied(&mut self, n: usize) {
        if let Some(spec) = self.spec.take() {
            self.offset = spec.base + n.min(self.offset - spec.base);
        }
    }

    /// The ring slot of the open speculation's base.
    #[cfg(feature = "cuda")]
    pub(crate) fn base_slot(&self) -> usize {
        self.ring_end() % self.capacity
    }
}
