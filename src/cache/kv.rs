//! The unbounded KV cache.
use candle_core::Tensor;

use super::buffer::{cat_seq, seq_len, KvBuf};
use super::{Attend, CacheError, Mask};
use crate::error::Result;

/// Default growth step of [`KvCache`] buffers, in tokens.
pub const DEFAULT_STEP: usize = 256;

/// Unbounded cache: buffers `[b, h, capacity, d]` grown by `step` slots at a time, so a decode
/// step writes in place without reallocating. Slot `i` holds the token at position `i`.
#[derive(Debug)]
pub struct KvCache {
    buf: Option<KvBuf>,
    /// Tokens held (the position of the next token).
    offset: usize,
    step: usize,
    /// Offset when the open speculation began.
    spec_base: Option<usize>,
}

/// Owned copy of the K/V of positions `[from, to)` of a [`KvCache`].
#[derive(Debug)]
pub struct KvSnapshot {
    from: usize,
    to: usize,
    /// `[b, h, to - from, d]`; `None` when the range is empty.
    data: Option<(Tensor, Tensor)>,
}

impl KvSnapshot {
    /// First position covered.
    pub fn from(&self) -> usize {
        self.from
    }

    /// One past the last position covered.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Bytes of K/V held.
    pub fn bytes(&self) -> usize {
        self.data
            .as_ref()
            .map_or(0, |(k, v)| tensor_bytes(k) + tensor_bytes(v))
    }

    /// Joins `[a, b)` and `[b, c)` into `[a, c)`; refused when the ranges are not adjacent.
    pub fn merge(&self, child: &KvSnapshot) -> Result<KvSnapshot> {
        if self.to != child.from {
            return Err(CacheError::MergeRefused(format!(
                "[{}, {}) and [{}, {}) are not adjacent",
                self.from, self.to, child.from, child.to
            ))
            .into());
        }
        let data = cat_seq(&[self.data.as_ref(), child.data.as_ref()])?;
        Ok(KvSnapshot {
            from: self.from,
            to: child.to,
            data,
        })
    }

    /// Splits `[a, c)` at `at` into owned `[a, at)` and `[at, c)`.
    pub fn split(&self, at: usize) -> Result<(KvSnapshot, KvSnapshot)> {
        if at < self.from || at > self.to {
            return Err(CacheError::SplitRefused(format!(
                "{at} is outside [{}, {})",
                self.from, self.to
            ))
            .into());
        }
        let part = |start: usize, end: usize| -> Result<KvSnapshot> {
            let data = match &self.data {
                Some((k, v)) if end > start => {
                    let (s, n) = (start - self.from, end - start);
                    Some((
                        k.narrow(2, s, n)?.force_contiguous()?,
                        v.narrow(2, s, n)?.force_contiguous()?,
                    ))
                }
                _ => None,
            };
            Ok(KvSnapshot {
                from: start,
                to: end,
                data,
            })
        };
        Ok((part(self.from, at)?, part(at, self.to)?))
    }
}

impl Default for KvCache {
    fn default() -> Self {
        Self::new(DEFAULT_STEP)
    }
}

impl KvCache {
    /// An empty cache growing by `step` slots (at least 1).
    pub fn new(step: usize) -> Self {
        Self {
            buf: None,
            offset: 0,
            step: step.max(1),
            spec_base: None,
        }
    }

    /// Tokens held: the absolute position of the next token.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, KvBuf::capacity)
    }

    /// Appends `k`/`v` (`[b, h, q, d]`) at `[offset, offset + q)` and returns K/V of
    /// `[0, offset + q)` with the causal mask for the `q` new queries.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<Attend> {
        let q = seq_len(k, v)?;
        let end = self.offset + q;
        self.ensure_capacity(k, end)?;
        let buf = self.buf.as_ref().ok_or_else(|| bad("no buffer"))?;
        buf.write(self.offset, k, v)?;
        let (k_all, v_all) = buf.view(0, end)?;
        let mask = Mask::causal(self.offset..end);
        self.offset = end;
        Ok(Attend {
            k: k_all,
            v: v_all,
            tail: None,
            mask,
        })
    }

    fn ensure_capacity(&mut self, like: &Tensor, needed: usize) -> Result<()> {
        let capacity = needed.div_ceil(self.step) * self.step;
        match &self.buf {
            Some(buf) if !buf.fits(like) => {
                return Err(bad(&format!(
                    "k {:?} {:?} does not match the cache's {:?} {:?}",
                    like.dims(),
                    like.dtype(),
                    buf.k.dims(),
                    buf.k.dtype()
                )))
            }
            Some(buf) if buf.capacity() >= needed => {}
            Some(buf) => self.buf = Some(buf.grown(capacity, self.offset)?),
            None => self.buf = Some(KvBuf::zeros_like(like, capacity)?),
        }
        Ok(())
    }

    /// K/V of every position `[0, offset)` in logical order (what the next query attends
    /// over); `None` when empty.
    pub fn logical_kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        match &self.buf {
            Some(buf) if self.offset > 0 => Ok(Some(buf.view(0, self.offset)?)),
            _ => Ok(None),
        }
    }

    /// Owned copy of positions `[from, offset)`.
    pub fn snapshot(&self, from: usize) -> Result<KvSnapshot> {
        if from > self.offset {
            return Err(CacheError::Unreachable {
                target: from,
                reason: format!("snapshot start past the cache's offset {}", self.offset),
            }
            .into());
        }
        let data = match &self.buf {
            Some(buf) if self.offset > from => Some(buf.copy(from, self.offset - from)?),
            _ => None,
        };
        Ok(KvSnapshot {
            from,
            to: self.offset,
            data,
        })
    }

    /// Brings the cache to `target`. Without a snapshot, rewinds the live state (refused when
    /// `target > offset`). With a snapshot of `[a, c)`, needs `a <= offset` (the cache holds
    /// `[0, a)`) and `a <= target <= c`, and writes the snapshot's `[a, target)` in place.
    pub fn restore(&mut self, snapshot: Option<&KvSnapshot>, target: usize) -> Result<()> {
        self.check_restore(snapshot, target)?;
        if let Some(snap) = snapshot {
            if let Some((k, v)) = &snap.data {
                let n = target - snap.from;
                if n > 0 {
                    let (k, v) = (k.narrow(2, 0, n)?, v.narrow(2, 0, n)?);
                    self.ensure_capacity(&k, target)?;
                    let buf = self.buf.as_ref().ok_or_else(|| bad("no buffer"))?;
                    buf.write(snap.from, &k, &v)?;
                }
            }
        }
        self.offset = target;
        Ok(())
    }

    /// Refuses a restore that cannot be done, before anything is changed.
    pub(crate) fn check_restore(&self, snapshot: Option<&KvSnapshot>, target: usize) -> Result<()> {
        let reason = match snapshot {
            None if target > self.offset => format!("rewind past the offset {}", self.offset),
            Some(s) if s.from > self.offset => format!(
                "snapshot starts at {} but the cache holds only {} tokens",
                s.from, self.offset
            ),
            Some(s) if target < s.from || target > s.to => {
                format!("outside the snapshot's range [{}, {})", s.from, s.to)
            }
            _ => return Ok(()),
        };
        Err(CacheError::Unreachable { target, reason }.into())
    }

    /// Empties the cache (buffers are kept for reuse).
    pub fn reset(&mut self) {
        self.offset = 0;
        self.spec_base = None;
    }

    /// An independent copy: later writes to either do not show in the other.
    pub fn deep_clone(&self) -> Result<Self> {
        Ok(Self {
            buf: self.buf.as_ref().map(KvBuf::deep_clone).transpose()?,
            offset: self.offset,
            step: self.step,
            spec_base: self.spec_base,
        })
    }

    /// Bytes held by the buffers.
    pub fn allocated_bytes(&self) -> usize {
        self.buf
            .as_ref()
            .map_or(0, |b| 2 * b.k.elem_count() * b.k.dtype().size_in_bytes())
    }

    // --- speculation (driven by `Speculation`) ---

    pub(crate) fn begin(&mut self) {
        self.spec_base = Some(self.offset);
    }

    /// Keeps the first `n` appended tokens: O(1), the offset moves back.
    pub(crate) fn commit(&mut self, n: usize) {
        if let Some(base) = self.spec_base.take() {
            self.offset = self.offset.min(base + n);
        }
    }

    pub(crate) fn rollback(&mut self) {
        self.commit(0);
    }
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

fn bad(msg: &str) -> crate::error::Error {
    CacheError::BadInput(msg.to_string()).into()
}
