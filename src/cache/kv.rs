//! The unbounded KV cache.
use std::sync::Arc;

use candle_core::Tensor;

use super::attend::Attend;
use super::buffer::{cat_seq, seq_len, KvBuf};
use super::error::CacheError;
use super::in_place::InPlace;
use super::mask::Mask;
use super::tree::path_moves;
use super::tree::TokenTree;
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
    /// Slots the buffers get at least when made or grown ([`Self::expect_tokens`]).
    expected: usize,
    /// Offset when the open speculation began.
    spec_base: Option<usize>,
    /// The tree the open speculation's block follows (slot `spec_base + i` holds node `i`).
    tree: Option<Arc<TokenTree>>,
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
            expected: 0,
            spec_base: None,
            tree: None,
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
        if let (Some(tree), Some(base)) = (&self.tree, self.spec_base) {
            check_tree_append(tree, end - base)?;
        }
        self.ensure_capacity(k, end)?;
        let buf = self.buf.as_ref().ok_or_else(|| bad("no buffer"))?;
        buf.write(self.offset, k, v)?;
        let (k_all, v_all) = buf.view(0, end)?;
        let mut mask = Mask::causal(self.offset..end);
        if let (Some(tree), Some(base)) = (&self.tree, self.spec_base) {
            mask = mask.with_tree(base, tree.clone());
        }
        self.offset = end;
        Ok(Attend {
            k: k_all,
            v: v_all,
            tail: None,
            mask,
        })
    }

    /// For a forward that writes its K/V itself (a replayed CUDA graph): makes room for `t`
    /// more tokens and returns the whole buffers `[b, h, capacity, d]` with their allocation
    /// id; the caller writes slots `[offset, offset + t)` and then calls [`Self::advance`].
    /// `None` while the cache has no buffer yet, or a token tree is open unless `trees` (the
    /// caller then masks the tree's nodes itself).
    pub(crate) fn reserve(&mut self, t: usize, trees: bool) -> Result<Option<InPlace>> {
        if self.tree.is_some() && !trees {
            return Ok(None);
        }
        let Some(buf) = &self.buf else {
            return Ok(None);
        };
        let like = buf.k.clone();
        self.ensure_capacity(&like, self.offset + t)?;
        Ok(self.buf.as_ref().map(|b| InPlace {
            k: b.k.clone(),
            v: b.v.clone(),
            id: b.id,
            tail: None,
        }))
    }

    /// Counts `t` tokens written into the slots [`Self::reserve`] made room for.
    pub(crate) fn advance(&mut self, t: usize) {
        self.offset += t;
    }

    /// Sizes the buffers for sequences of up to `tokens` tokens (rounded up to the growth
    /// step), so that such a sequence never grows them mid-generation: a grown buffer is a
    /// new allocation, and steps recorded as CUDA graphs over the old one are recorded again.
    /// Grows existing buffers now (keeping what they hold); before the first write, whose
    /// K/V give the buffers their shape, the size is kept for that allocation. Never shrinks.
    pub fn expect_tokens(&mut self, tokens: usize) -> Result<()> {
        self.expected = self.expected.max(tokens);
        match &self.buf {
            Some(buf) if buf.capacity() < tokens => {
                let like = buf.k.clone();
                self.ensure_capacity(&like, tokens)
            }
            _ => Ok(()),
        }
    }

    fn ensure_capacity(&mut self, like: &Tensor, needed: usize) -> Result<()> {
        let capacity = needed.max(self.expected).div_ceil(self.step) * self.step;
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
        self.tree = None;
    }

    /// An independent copy: later writes to either do not show in the other.
    pub fn deep_clone(&self) -> Result<Self> {
        Ok(Self {
            buf: self.buf.as_ref().map(KvBuf::deep_clone).transpose()?,
            offset: self.offset,
            step: self.step,
            expected: self.expected,
            spec_base: self.spec_base,
            tree: self.tree.clone(),
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
        self.tree = None;
        if let Some(base) = self.spec_base.take() {
            self.offset = self.offset.min(base + n);
        }
    }

    /// Declares the tree the speculation's block follows (nodes appended so far included).
    pub(crate) fn set_tree(&mut self, tree: Arc<TokenTree>) {
        self.tree = Some(tree);
    }

    /// The tree the open speculation's block follows, and how many of its nodes are appended.
    pub(crate) fn open_tree(&self) -> Option<(&TokenTree, usize)> {
        Some((self.tree.as_deref()?, self.offset - self.spec_base?))
    }

    /// RoPE positions of the next `t` appended tokens when the block is a tree.
    pub(crate) fn tree_positions(&self, t: usize) -> Option<Vec<usize>> {
        let (tree, base) = (self.tree.as_ref()?, self.spec_base?);
        Some(tree_positions(tree, base, self.offset - base, t))
    }

    /// Keeps the block nodes of `path` (checked root-to-node by the caller): moves them to
    /// consecutive slots from the speculation's base, O(path length) whatever the offset.
    pub(crate) fn commit_path(&mut self, path: &[usize]) -> Result<()> {
        let Some(base) = self.spec_base else {
            return Ok(());
        };
        if let Some(buf) = &self.buf {
            for (dest, src, len) in path_moves(path) {
                // An owned copy first: a slice_set from a view of the same buffer would alias.
                let (k, v) = buf.copy(base + src, len)?;
                buf.write(base + dest, &k, &v)?;
            }
        }
        self.commit(path.len());
        Ok(())
    }

    pub(crate) fn rollback(&mut self) {
        self.commit(0);
    }

    /// For a path commit the caller makes for several layers at once: the buffers holding
    /// the open speculation's nodes (from the base's slot on), which also take the path.
    #[cfg(feature = "cuda")]
    pub(crate) fn path_rows(&self) -> Option<(&Tensor, &Tensor, usize)> {
        let (buf, base) = (self.buf.as_ref()?, self.spec_base?);
        Some((&buf.k, &buf.v, base))
    }
}

/// Refuses an append that would reach past the tree's nodes (`len` block tokens after it).
pub(crate) fn check_tree_append(tree: &TokenTree, len: usize) -> Result<()> {
    if len > tree.len() {
        return Err(CacheError::BadTree(format!(
            "{len} tokens appended to a tree of {} nodes",
            tree.len()
        ))
        .into());
    }
    Ok(())
}

/// Positions `base + depth` of block nodes `[appended, appended + t)`.
pub(crate) fn tree_positions(
    tree: &TokenTree,
    base: usize,
    appended: usize,
    t: usize,
) -> Vec<usize> {
    (appended..appended + t)
        .map(|i| base + tree.depth(i))
        .collect()
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

fn bad(msg: &str) -> crate::error::Error {
    CacheError::BadInput(msg.to_string()).into()
}
