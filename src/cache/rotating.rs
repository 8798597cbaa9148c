//! The sliding-window ring cache.
use std::sync::Arc;

use candle_core::Tensor;

use super::attend::Attend;
use super::buffer::{cat_seq, seq_len, KvBuf};
use super::error::CacheError;
use super::in_place::{InPlace, StagedTail};
use super::kv::check_tree_append;
use super::mask::KeyOrder;
use super::mask::Mask;
use super::tree::TokenTree;
use crate::error::Result;

mod staged;
mod tree_commit;

/// How a [`RotatingKvCache`] holds speculative tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotatingStrategy {
    /// Ring of exactly `window` slots; speculative K/V are kept in a side buffer and only the
    /// accepted prefix is appended to the ring on commit (O(accepted)).
    Staged,
    /// Ring of `window + max_draft + 1` slots; speculative K/V are written through, the mask
    /// enforces the window, and rollback moves the cursor (O(1)).
    Slack {
        /// The longest draft the ring must be able to roll back.
        max_draft: usize,
    },
}

/// Sliding-window cache over a ring buffer. Placement is canonical: the token at position
/// `p` lives in slot `p % capacity`. The ring holds the intact positions
/// `[max(lo, ring_end - capacity), ring_end)`; a query at position `p` sees keys in
/// `(p - window, p]`.
#[derive(Debug)]
pub struct RotatingKvCache {
    window: usize,
    capacity: usize,
    strategy: RotatingStrategy,
    ring: Option<KvBuf>,
    /// Position of the next token (staged tokens included while a speculation is open).
    offset: usize,
    /// No position below `lo` is known to be intact (after rewinds, restores, gaps).
    lo: usize,
    spec: Option<Spec>,
    /// Staged strategy only: the side buffer a speculation's K/V are written to, position
    /// `base + i` in slot `i` (`offset - base` of them while a speculation is open); kept
    /// between speculations, grown when a longer one needs it, so that a step written in
    /// place (a replayed CUDA graph) finds it where it was recorded.
    side: Option<KvBuf>,
    /// Staged strategy only: rows of the side buffer that a block written in place outside
    /// a speculation left for the ring (positions `[offset - unflushed, offset)`), copied
    /// into it right after the step (`flush_side` in model.rs).
    unflushed: usize,
}

#[derive(Debug)]
struct Spec {
    base: usize,
    /// The tree the block follows (block position `base + i` holds node `i`).
    tree: Option<Arc<TokenTree>>,
}

/// Owned copy of the last `window` tokens of a [`RotatingKvCache`], labelled with the range
/// `[from, to)` it stands for. Restorable to any `target` in `[from, to]` whose window of
/// history it holds.
#[derive(Debug)]
pub struct RotatingSnapshot {
    from: usize,
    to: usize,
    window: usize,
    /// First position held in `data`.
    data_start: usize,
    /// `[b, h, to - data_start, d]` in logical order; `None` when empty.
    data: Option<(Tensor, Tensor)>,
}

impl RotatingSnapshot {
    /// First position of the range this snapshot stands for.
    pub fn from(&self) -> usize {
        self.from
    }

    /// One past the last position covered.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Bytes of K/V held.
    pub fn bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        self.data.as_ref().map_or(0, |(k, v)| bytes(k) + bytes(v))
    }

    /// Joins `[a, b)` and `[b, c)` into `[a, c)`: the child's window is the state at `c`, so
    /// the result keeps the child's data. There is no `split`: a window cannot be cut.
    pub fn merge(&self, child: &RotatingSnapshot) -> Result<RotatingSnapshot> {
        if self.to != child.from || self.window != child.window {
            return Err(CacheError::MergeRefused(format!(
                "[{}, {}) (window {}) and [{}, {}) (window {}) are not adjacent",
                self.from, self.to, self.window, child.from, child.to, child.window
            ))
            .into());
        }
        Ok(RotatingSnapshot {
            from: self.from,
            to: child.to,
            window: child.window,
            data_start: child.data_start,
            data: child.data.as_ref().map(|(k, v)| (k.clone(), v.clone())),
        })
    }
}

impl RotatingKvCache {
    /// An empty cache for a sliding `window` (at least 1 token).
    pub fn new(window: usize, strategy: RotatingStrategy) -> Result<Self> {
        if window == 0 {
            return Err(CacheError::BadInput("sliding window of 0 tokens".into()).into());
        }
        let capacity = match strategy {
            RotatingStrategy::Staged => window,
            RotatingStrategy::Slack { max_draft } => window + max_draft + 1,
        };
        Ok(Self {
            window,
            capacity,
            strategy,
            ring: None,
            offset: 0,
            lo: 0,
            spec: None,
            side: None,
            unflushed: 0,
        })
    }

    /// Tokens seen: the absolute position of the next token.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The sliding window, in tokens (each query sees this many including itself).
    pub fn window(&self) -> usize {
        self.window
    }

    /// Ring slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The speculative strategy chosen at construction.
    pub fn strategy(&self) -> RotatingStrategy {
        self.strategy
    }

    /// The most tokens one speculation may append.
    pub fn max_speculative(&self) -> usize {
        match self.strategy {
            RotatingStrategy::Staged => usize::MAX,
            RotatingStrategy::Slack { .. } => self.capacity - self.window + 1,
        }
    }

    /// End of the positions written to the ring (staged tokens are not in it).
    fn ring_end(&self) -> usize {
        match &self.spec {
            Some(spec) if self.strategy == RotatingStrategy::Staged => spec.base,
            _ => self.offset,
        }
    }

    /// First intact position in the ring.
    fn held_lo(&self) -> usize {
        self.lo.max(self.ring_end().saturating_sub(self.capacity))
    }

    /// First position the next query needs.
    fn needed_from(&self, pos: usize) -> usize {
        pos.saturating_sub(self.window - 1)
    }

    /// For a forward that writes K/V itself (a replayed CUDA graph): the ring's buffers
    /// `[b, h, capacity, d]` and allocation id when a step of `t` tokens can attend over the
    /// ring in place, every position its queries see intact, and write positions
    /// `[offset, offset + t)` into slots `p % capacity` — or, for the staged strategy inside
    /// a speculation, into the side buffer (grown here if need be), returned as the
    /// [`InPlace::tail`]; the caller then calls [`Self::advance`]. `None` sends the step down
    /// the ordinary path (which also reports what is wrong): a tree, no ring yet, a block too
    /// long for the ring (outside a staged speculation, whose ring of `window` slots takes
    /// one-token steps) or the open speculation, or stale positions inside the window; an
    /// open token tree unless `trees` (the caller then masks its nodes itself).
    pub(crate) fn reserve(&mut self, t: usize, trees: bool) -> Result<Option<InPlace>> {
        if t == 0 || self.lo > self.needed_from(self.offset) {
            return Ok(None);
        }
        let Some(ring) = &self.ring else {
            return Ok(None);
        };
        let (k, v, id) = (ring.k.clone(), ring.v.clone(), ring.id);
        let in_ring = InPlace {
            k: k.clone(),
            v: v.clone(),
            id,
            tail: None,
        };
        let fits_ring = t + self.window - 1 <= self.capacity;
        let staged = match &self.spec {
            None if fits_ring => return Ok(Some(in_ring)),
            // A staged ring's block outside a speculation goes beside the ring too, and
            // [`Self::advance`] leaves it to be copied in.
            None if self.strategy == RotatingStrategy::Staged => t,
            None => return Ok(None),
            Some(spec) => {
                let staged = self.offset + t - spec.base;
                // A tree's nodes sit from the base on: its queries see the window before it.
                let tree_stale = self.lo > self.needed_from(spec.base);
                if spec.tree.is_some() && (!trees || tree_stale) {
                    return Ok(None);
                }
                if staged > self.max_speculative() {
                    return Ok(None);
                }
                if self.strategy != RotatingStrategy::Staged {
                    return Ok(fits_ring.then_some(in_ring));
                }
                staged
            }
        };
        // The queries see the ring's positions below the base (all intact: `lo` is checked
        // above and the ring holds the `window` before the base) and the side buffer's.
        self.ensure_side(&k, staged)?;
        let side = self.side.as_ref().ok_or_else(no_ring)?;
        let tail = StagedTail {
            k: side.k.clone(),
            v: side.v.clone(),
            id: side.id,
            len: staged,
        };
        Ok(Some(InPlace {
            k,
            v,
            id,
            tail: Some(tail),
        }))
    }

    /// Counts `t` tokens written into the ring by a step [`Self::reserve`] allowed.
    /// A staged block outside a speculation (in the side buffer) leaves its rows unflushed.
    pub(crate) fn advance(&mut self, t: usize) {
        let outside = self.spec.is_none() && self.strategy == RotatingStrategy::Staged;
        if outside && t + self.window - 1 > self.capacity {
            self.unflushed = t;
        }
        self.offset += t;
    }

    /// Appends `k`/`v` (`[b, h, q, d]`) and returns what the `q` new queries attend over with
    /// the sliding-window mask in the same order (ring order for short updates, logical order
    /// for long ones and staged speculation).
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<Attend> {
        let q = seq_len(k, v)?;
        if q == 0 {
            return Err(CacheError::BadInput("empty update".into()).into());
        }
        if let Some(spec) = &self.spec {
            let len = self.offset + q - spec.base;
            if len > self.max_speculative() {
                let max = self.max_speculative();
                return Err(CacheError::SpeculationTooLong { len, max }.into());
            }
            if let Some(tree) = &spec.tree {
                check_tree_append(tree, len)?;
            }
            if self.strategy == RotatingStrategy::Staged {
                return self.append_staged(k, v, q);
            }
        }
        if q + self.window - 1 <= self.capacity {
            self.append_in_ring(k, v, q)
        } else {
            self.append_linear(k, v, q)
        }
    }

    /// Short update: write into the ring and attend over the ring in slot order.
    fn append_in_ring(&mut self, k: &Tensor, v: &Tensor, q: usize) -> Result<Attend> {
        self.ensure_ring(k)?;
        let start = self.offset;
        self.store(k, v, start)?;
        self.offset += q;
        let end = self.offset;
        let held_lo = self.held_lo();
        let cap = self.capacity;
        let ring = self.ring.as_ref().ok_or_else(no_ring)?;
        let (len, keys) = if end <= cap {
            (end, KeyOrder::Linear { first: 0 })
        } else {
            (cap, KeyOrder::Ring { last: end - 1 })
        };
        let (k_all, v_all) = ring.view(0, len)?;
        let mask = self.with_tree(Mask::new(start..end, keys, len, held_lo, Some(self.window)));
        Ok(Attend {
            k: k_all,
            v: v_all,
            tail: None,
            mask,
        })
    }

    /// Long update (prefill): attend over the logical tail plus the new tokens, then keep the
    /// last `capacity` of them in the ring.
    fn append_linear(&mut self, k: &Tensor, v: &Tensor, q: usize) -> Result<Attend> {
        self.ensure_ring(k)?;
        let tail_start = self.needed_from(self.offset).max(self.held_lo());
        let tail = self.logical(tail_start, self.offset)?;
        let new = (k.clone(), v.clone());
        let (k_all, v_all) = cat_seq(&[tail.as_ref(), Some(&new)])?.ok_or_else(no_ring)?;
        let end = self.offset + q;
        let keys = KeyOrder::Linear { first: tail_start };
        let mask = Mask::new(
            self.offset..end,
            keys,
            end - tail_start,
            tail_start,
            Some(self.window),
        );
        let start = self.offset;
        self.store(k, v, start)?;
        self.offset = end;
        Ok(Attend {
            k: k_all,
            v: v_all,
            tail: None,
            mask,
        })
    }

    /// Staged speculation: new K/V join the side buffer; attend over the ring (in slot order,
    /// no copy) followed by the staged K/V as the [`Attend::tail`].
    fn append_staged(&mut self, k: &Tensor, v: &Tensor, q: usize) -> Result<Attend> {
        let base = self.ring_end();
        let held_lo = self.held_lo();
        let n = self.staged_len();
        self.ensure_side(k, n + q)?;
        let side = self.side.as_ref().ok_or_else(no_ring)?;
        side.write(n, k, v)?;
        let staged = side.view(0, n + q)?;
        let end = self.offset + q;
        let queries = self.offset..end;
        self.offset = end;
        let (ring_len, keys) = if base <= self.capacity {
            (base, KeyOrder::Linear { first: 0 })
        } else {
            (self.capacity, KeyOrder::Ring { last: base - 1 })
        };
        let mask = self.with_tree(
            Mask::new(queries.clone(), keys, ring_len, held_lo, Some(self.window))
                .with_tail(base, end - base),
        );
        match &self.ring {
            Some(ring) if ring_len > 0 => {
                let (k_all, v_all) = ring.view(0, ring_len)?;
                Ok(Attend {
                    k: k_all,
                    v: v_all,
                    tail: Some(staged),
                    mask,
                })
            }
            // Nothing committed yet: the staged K/V are all there is.
            _ => Ok(Attend {
                k: staged.0,
                v: staged.1,
                tail: None,
                mask: self.with_tree(Mask::new(
                    queries,
                    KeyOrder::Linear { first: base },
                    end - base,
                    base,
                    Some(self.window),
                )),
            }),
        }
    }

    /// `mask` with the open speculation's tree, if it has one.
    fn with_tree(&self, mask: Mask) -> Mask {
        match &self.spec {
            Some(Spec {
                base,
                tree: Some(tree),
                ..
            }) => mask.with_tree(*base, tree.clone()),
            _ => mask,
        }
    }

    fn ensure_ring(&mut self, like: &Tensor) -> Result<()> {
        match &self.ring {
            Some(ring) if ring.fits(like) => Ok(()),
            Some(ring) => Err(CacheError::BadInput(format!(
                "k {:?} {:?} does not match the cache's {:?} {:?}",
                like.dims(),
                like.dtype(),
                ring.k.dims(),
                ring.k.dtype()
            ))
            .into()),
            None => {
                self.ring = Some(KvBuf::zeros_like(like, self.capacity)?);
                Ok(())
            }
        }
    }

    /// Writes tokens at positions `[first, first + n)` (`k`/`v` are `[b, h, n, d]`) into
    /// their canonical slots; only the last `capacity` of them fit. A write that leaves a gap
    /// after the ring's end moves `lo` up.
    fn store(&mut self, k: &Tensor, v: &Tensor, first: usize) -> Result<()> {
        let n = k.dim(2)?;
        let end = first + n;
        let p0 = first.max(end.saturating_sub(self.capacity));
        if p0 > self.ring_end() {
            self.lo = p0;
        }
        let (k, v) = (
            k.narrow(2, p0 - first, end - p0)?,
            v.narrow(2, p0 - first, end - p0)?,
        );
        let ring = self.ring.as_ref().ok_or_else(no_ring)?;
        let slot = p0 % self.capacity;
        let first_len = (end - p0).min(self.capacity - slot);
        let written = (|| -> Result<()> {
            ring.write(
                slot,
                &k.narrow(2, 0, first_len)?,
                &v.narrow(2, 0, first_len)?,
            )?;
            if first_len < end - p0 {
                let rest = end - p0 - first_len;
                ring.write(
                    0,
                    &k.narrow(2, first_len, rest)?,
                    &v.narrow(2, first_len, rest)?,
                )?;
            }
            Ok(())
        })();
        if written.is_err() {
            // Some slots may hold new tokens, others old ones: nothing below `end` is known
            // intact, so every later use that needs history is refused.
            self.lo = end;
        }
        written
    }

    /// K/V of positions `[start, end)` from the ring in logical order (views when contiguous
    /// in the ring); `None` when empty. The caller keeps the range intact.
    fn logical(&self, start: usize, end: usize) -> Result<Option<(Tensor, Tensor)>> {
        let ring = match &self.ring {
            Some(ring) if end > start => ring,
            _ => return Ok(None),
        };
        let slot = start % self.capacity;
        let len = end - start;
        if slot + len <= self.capacity {
            return Ok(Some(ring.view(slot, len)?));
        }
        let first = ring.view(slot, self.capacity - slot)?;
        let second = ring.view(0, len - (self.capacity - slot))?;
        cat_seq(&[Some(&first), Some(&second)])
    }

    /// K/V of the `window - 1` positions before `offset` (all the next query can see of
    /// history) in logical order; `None` when empty. Refused inside a speculation.
    pub fn logical_kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        if self.spec.is_some() {
            return Err(CacheError::SpeculationOpen.into());
        }
        let start = self.needed_from(self.offset);
        if start < self.held_lo() {
            return Err(CacheError::Unreachable {
                target: self.offset,
                reason: format!("position {start} is no longer held"),
            }
            .into());
        }
        self.logical(start, self.offset)
    }

    /// Owned copy of the last `window` tokens, labelled `[from, offset)`.
    pub fn snapshot(&self, from: usize) -> Result<RotatingSnapshot> {
        if self.spec.is_some() {
            return Err(CacheError::SpeculationOpen.into());
        }
        if from > self.offset {
            return Err(CacheError::Unreachable {
                target: from,
                reason: format!("snapshot start past the cache's offset {}", self.offset),
            }
            .into());
        }
        let data_start = self.offset.saturating_sub(self.window).max(self.held_lo());
        let data = self
            .logical(data_start, self.offset)?
            .map(|(k, v)| -> Result<_> { Ok((k.force_contiguous()?, v.force_contiguous()?)) })
            .transpose()?;
        Ok(RotatingSnapshot {
            from,
            to: self.offset,
            window: self.window,
            data_start,
            data,
        })
    }

    /// Brings the cache to `target`. Without a snapshot, rewinds the live state: refused when
    /// `target > offset` or the ring no longer holds the window before `target` (a wrapped
    /// ring can rewind only within its slack). With a snapshot of `[a, c)`, `a <= target <= c`
    /// and the snapshot must hold the window before `target`; the cache's state is replaced.
    pub fn restore(&mut self, snapshot: Option<&RotatingSnapshot>, target: usize) -> Result<()> {
        self.check_restore(snapshot, target)?;
        match snapshot {
            None => {
                // Nothing below `target` may count as intact if the ring no longer holds it
                // (a window of 1, or a rewind to 0, needs no history at all).
                self.lo = self.held_lo().min(target);
                self.offset = target;
            }
            Some(snap) => {
                let start = snap
                    .data_start
                    .max(target.saturating_sub(self.capacity))
                    .min(target);
                self.offset = start;
                self.lo = start;
                if let Some((k, v)) = &snap.data {
                    if target > start {
                        let skip = start - snap.data_start;
                        let (k, v) = (
                            k.narrow(2, skip, target - start)?,
                            v.narrow(2, skip, target - start)?,
                        );
                        self.ensure_ring(&k)?;
                        self.store(&k, &v, start)?;
                    }
                }
                self.offset = target;
            }
        }
        Ok(())
    }

    /// Refuses a restore that cannot be done, before anything is changed.
    pub(crate) fn check_restore(
        &self,
        snapshot: Option<&RotatingSnapshot>,
        target: usize,
    ) -> Result<()> {
        if self.spec.is_some() {
            return Err(CacheError::SpeculationOpen.into());
        }
        let needed = self.needed_from(target);
        let reason = match snapshot {
            None if target > self.offset => format!("rewind past the offset {}", self.offset),
            None if needed < target && needed < self.held_lo() => format!(
                "the ring has wrapped: position {needed} is no longer held (oldest is {})",
                self.held_lo()
            ),
            Some(s) if s.window != self.window => {
                return Err(CacheError::KindMismatch(format!(
                    "snapshot of window {} given to a cache of window {}",
                    s.window, self.window
                ))
                .into())
            }
            Some(s) if target < s.from || target > s.to => {
                format!("outside the snapshot's range [{}, {})", s.from, s.to)
            }
            Some(s) if needed < target && needed < s.data_start => format!(
                "the snapshot holds positions from {} but the window needs {needed}",
                s.data_start
            ),
            _ => return Ok(()),
        };
        Err(CacheError::Unreachable { target, reason }.into())
    }

    /// Empties the cache (the ring is kept for reuse).
    pub fn reset(&mut self) {
        self.offset = 0;
        self.lo = 0;
        self.spec = None;
    }

    /// An independent copy: later writes to either do not show in the other.
    pub fn deep_clone(&self) -> Result<Self> {
        let spec = self.spec.as_ref().map(|s| Spec {
            base: s.base,
            tree: s.tree.clone(),
        });
        Ok(Self {
            window: self.window,
            capacity: self.capacity,
            strategy: self.strategy,
            ring: self.ring.as_ref().map(KvBuf::deep_clone).transpose()?,
            offset: self.offset,
            lo: self.lo,
            spec,
            side: self.side.as_ref().map(KvBuf::deep_clone).transpose()?,
            unflushed: self.unflushed,
        })
    }

    /// Bytes held by the ring and the staged side buffer.
    pub fn allocated_bytes(&self) -> usize {
        let bytes = |b: &KvBuf| b.k.elem_count() * b.k.dtype().size_in_bytes() * 2;
        self.ring.as_ref().map_or(0, bytes) + self.side.as_ref().map_or(0, bytes)
    }

    // --- speculation (driven by `Speculation`) ---

    pub(crate) fn begin(&mut self) {
        self.spec = Some(Spec {
            base: self.offset,
            tree: None,
        });
    }

    /// Keeps the first `n` speculative tokens. Staged: appends them to the ring (O(n));
    /// slack: moves the cursor back (O(1)).
    pub(crate) fn commit(&mut self, n: usize) -> Result<()> {
        let Some(spec) = &self.spec else {
            return Ok(());
        };
        let base = spec.base;
        let keep = n.min(self.offset - base);
        match self.strategy {
            RotatingStrategy::Staged => {
                let staged = self.staged_kv()?;
                self.spec = None;
                self.offset = base;
                if let (Some((k, v)), true) = (staged, keep > 0) {
                    let (k, v) = (k.narrow(2, 0, keep)?, v.narrow(2, 0, keep)?);
                    self.ensure_ring(&k)?;
                    self.store(&k, &v, base)?;
                    self.offset = base + keep;
                }
            }
            RotatingStrategy::Slack { .. } => {
                self.lo = self.held_lo();
                self.spec = None;
                self.offset = base + keep;
            }
        }
        Ok(())
    }

    /// Drops every speculative token. Cannot fail.
    pub(crate) fn rollback(&mut self) {
        if let Some(spec) = self.spec.take() {
            if self.strategy != RotatingStrategy::Staged {
                self.lo = self.lo.max(self.offset.saturating_sub(self.capacity));
            }
            self.offset = spec.base;
        }
    }
}

fn no_ring() -> crate::error::Error {
    CacheError::BadInput("ring buffer missing".into()).into()
}
