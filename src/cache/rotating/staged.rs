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

    /// For a copy the caller makes for several layers at once, of the rows a block written
    /// in place outside a speculation left unflushed, or else of a commit of `n` tokens: the
    /// side buffer's and the ring's buffers (`k`, `v` each), the rows to copy from the side
    /// buffer's first slot on (the unflushed ones, or `min(n, appended)`) and the ring slot
    /// of the first, when there are some and they fit the ring. The caller then calls
    /// [`Self::flushed`] or [`Self::commit_copied`].
    #[cfg(feature = "cuda")]
    pub(crate) fn side_rows(&self, n: usize) -> Option<([&Tensor; 4], usize, usize)> {
        let (rows, first) = match self.unflushed {
            0 => (n.min(self.staged_len()), self.ring_end()),
            u => (u, self.offset - u),
        };
        let (side, ring) = (self.side.as_ref()?, self.ring.as_ref()?);
        (rows > 0 && rows <= self.capacity && ring.fits(&side.k)).then_some((
            [&side.k, &side.v, &ring.k, &ring.v],
            rows,
            first % self.capacity,
        ))
    }

    /// Whether a block written in place left rows to copy into the ring ([`Self::advance`]).
    pub(crate) fn has_unflushed(&self) -> bool {
        self.unflushed > 0
    }

    /// Copies the rows a block written in place outside a speculation left in the side
    /// buffer into the ring (an error leaves nothing below the offset intact).
    pub(crate) fn flush(&mut self) -> Result<()> {
        let n = std::mem::take(&mut self.unflushed);
        if n == 0 {
            return Ok(());
        }
        let side = self.side.as_ref().ok_or_else(super::no_ring)?;
        let (k, v) = side.view(0, n)?;
        let first = self.offset - n;
        self.store(&k, &v, first)
    }

    /// The unflushed rows were copied by the caller (see [`Self::side_rows`]).
    #[cfg(feature = "cuda")]
    pub(crate) fn flushed(&mut self) {
        self.unflushed = 0;
    }

    /// A staged commit of `n` tokens whose rows the caller copied into the ring (see
    /// [`Self::side_rows`]): the bookkeeping of [`Self::commit`].
    #[cfg(feature = "cuda")]
    pub(crate) fn commit_copied(&mut self, n: usize) {
        if let Some(spec) = self.spec.take() {
            self.offset = spec.base + n.min(self.offset - spec.base);
        }
    }
}
