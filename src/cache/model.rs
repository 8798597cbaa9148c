//! The caches of all layers of one model, speculation transactions and whole-model snapshots.
use std::sync::Arc;

use candle_core::Tensor;

use super::attend::Attend;
use super::error::CacheError;
use super::in_place::InPlace;
use super::kv::KvCache;
use super::kv::KvSnapshot;
use super::rotating::RotatingKvCache;
use super::rotating::RotatingSnapshot;
use super::tree::TokenTree;
use crate::error::Result;

mod tree_commit;

use super::hidden::HiddenTap;

/// The cache of one attention layer.
#[derive(Debug)]
pub enum LayerCache {
    /// Full attention.
    Kv(KvCache),
    /// Sliding-window attention.
    Rotating(RotatingKvCache),
}

/// The snapshot of one layer; its kind matches the layer's.
#[derive(Debug)]
pub enum LayerSnapshot {
    /// Of a [`KvCache`].
    Kv(KvSnapshot),
    /// Of a [`RotatingKvCache`].
    Rotating(RotatingSnapshot),
}

impl LayerCache {
    /// Tokens seen by this layer.
    pub fn offset(&self) -> usize {
        match self {
            LayerCache::Kv(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
        }
    }

    /// Appends `k`/`v` (`[b, h, q, d]`) and returns what attention needs (see [`Attend`]).
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<Attend> {
        match self {
            LayerCache::Kv(c) => c.append(k, v),
            LayerCache::Rotating(c) => c.append(k, v),
        }
    }

    /// K/V the next query sees of history, in logical order.
    pub fn logical_kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        match self {
            LayerCache::Kv(c) => c.logical_kv(),
            LayerCache::Rotating(c) => c.logical_kv(),
        }
    }

    /// Bytes held by this layer's buffers.
    pub fn allocated_bytes(&self) -> usize {
        match self {
            LayerCache::Kv(c) => c.allocated_bytes(),
            LayerCache::Rotating(c) => c.allocated_bytes(),
        }
    }

    fn deep_clone(&self) -> Result<Self> {
        Ok(match self {
            LayerCache::Kv(c) => LayerCache::Kv(c.deep_clone()?),
            LayerCache::Rotating(c) => LayerCache::Rotating(c.deep_clone()?),
        })
    }

    fn snapshot(&self, from: usize) -> Result<LayerSnapshot> {
        Ok(match self {
            LayerCache::Kv(c) => LayerSnapshot::Kv(c.snapshot(from)?),
            LayerCache::Rotating(c) => LayerSnapshot::Rotating(c.snapshot(from)?),
        })
    }

    fn check_restore(&self, snap: Option<&LayerSnapshot>, target: usize) -> Result<()> {
        match (self, snap) {
            (LayerCache::Kv(c), None) => c.check_restore(None, target),
            (LayerCache::Kv(c), Some(LayerSnapshot::Kv(s))) => c.check_restore(Some(s), target),
            (LayerCache::Rotating(c), None) => c.check_restore(None, target),
            (LayerCache::Rotating(c), Some(LayerSnapshot::Rotating(s))) => {
                c.check_restore(Some(s), target)
            }
            _ => Err(CacheError::KindMismatch(
                "a KV snapshot for a rotating layer or the reverse".into(),
            )
            .into()),
        }
    }

    fn restore(&mut self, snap: Option<&LayerSnapshot>, target: usize) -> Result<()> {
        match (self, snap) {
            (LayerCache::Kv(c), None) => c.restore(None, target),
            (LayerCache::Kv(c), Some(LayerSnapshot::Kv(s))) => c.restore(Some(s), target),
            (LayerCache::Rotating(c), None) => c.restore(None, target),
            (LayerCache::Rotating(c), Some(LayerSnapshot::Rotating(s))) => {
                c.restore(Some(s), target)
            }
            _ => Err(CacheError::KindMismatch("layer and snapshot kinds differ".into()).into()),
        }
    }

    fn reset(&mut self) {
        match self {
            LayerCache::Kv(c) => c.reset(),
            LayerCache::Rotating(c) => c.reset(),
        }
    }

    fn begin(&mut self) {
        match self {
            LayerCache::Kv(c) => c.begin(),
            LayerCache::Rotating(c) => c.begin(),
        }
    }

    /// Keeps the first `n` speculative tokens; `copied`: a staged ring's rows were copied
    /// already ([`copy_side_rows`]), only the count remains.
    fn commit(&mut self, n: usize, copied: bool) -> Result<()> {
        #[cfg(not(feature = "cuda"))]
        let _ = copied;
        match self {
            LayerCache::Kv(c) => {
                c.commit(n);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            LayerCache::Rotating(c) if copied && c.side_rows(n).is_some() => {
                c.commit_copied(n);
                Ok(())
            }
            LayerCache::Rotating(c) => c.commit(n),
        }
    }

    fn rollback(&mut self) {
        match self {
            LayerCache::Kv(c) => c.rollback(),
            LayerCache::Rotating(c) => c.rollback(),
        }
    }
}

/// The per-sequence state of one model: one [`LayerCache`] per attention layer, all at the
/// same offset between forwards.
#[derive(Debug)]
pub struct ModelCache {
    layers: Vec<LayerCache>,
    /// Offset when the open speculation began.
    spec_base: Option<usize>,
    /// Set when a commit failed half-way; every later operation is refused.
    poisoned: bool,
    /// Hidden states the forwards record ([`ModelCache::tap_hidden`]).
    hidden: Option<HiddenTap>,
}

/// A snapshot of every layer of a [`ModelCache`] for the range `[from, to)`.
#[derive(Debug)]
pub struct CacheSnapshot {
    from: usize,
    to: usize,
    layers: Vec<LayerSnapshot>,
}

impl CacheSnapshot {
    /// First position of the range.
    pub fn from(&self) -> usize {
        self.from
    }

    /// One past the last position of the range.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Bytes of K/V held by all layers (what a prefix store's budget counts).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerSnapshot::Kv(s) => s.bytes(),
                LayerSnapshot::Rotating(s) => s.bytes(),
            })
            .sum()
    }
}

/// Joins snapshots of `[a, b)` and `[b, c)` into `[a, c)` (rotating layers keep the child's
/// window). Refused when they are not adjacent or their layers differ.
pub fn merge(parent: &CacheSnapshot, child: &CacheSnapshot) -> Result<CacheSnapshot> {
    if parent.to != child.from || parent.layers.len() != child.layers.len() {
        return Err(CacheError::MergeRefused(format!(
            "[{}, {}) with {} layers and [{}, {}) with {} layers",
            parent.from,
            parent.to,
            parent.layers.len(),
            child.from,
            child.to,
            child.layers.len()
        ))
        .into());
    }
    let layers = parent
        .layers
        .iter()
        .zip(&child.layers)
        .map(|pair| match pair {
            (LayerSnapshot::Kv(a), LayerSnapshot::Kv(b)) => Ok(LayerSnapshot::Kv(a.merge(b)?)),
            (LayerSnapshot::Rotating(a), LayerSnapshot::Rotating(b)) => {
                Ok(LayerSnapshot::Rotating(a.merge(b)?))
            }
            _ => Err(CacheError::KindMismatch("merge of different layer kinds".into()).into()),
        })
        .collect::<Result<_>>()?;
    Ok(CacheSnapshot {
        from: parent.from,
        to: child.to,
        layers,
    })
}

/// Splits a snapshot of `[a, c)` at `at` into `[a, at)` and `[at, c)`. Refused for models
/// with rotating layers (a window cannot be cut) and for `at` outside the range.
pub fn split(snapshot: &CacheSnapshot, at: usize) -> Result<(CacheSnapshot, CacheSnapshot)> {
    let mut left = Vec::with_capacity(snapshot.layers.len());
    let mut right = Vec::with_capacity(snapshot.layers.len());
    for layer in &snapshot.layers {
        match layer {
            LayerSnapshot::Kv(s) => {
                let (a, b) = s.split(at)?;
                left.push(LayerSnapshot::Kv(a));
                right.push(LayerSnapshot::Kv(b));
            }
            LayerSnapshot::Rotating(_) => {
                return Err(CacheError::SplitRefused(
                    "rotating layers hold a whole window, which cannot be cut".into(),
                )
                .into())
            }
        }
    }
    if at < snapshot.from || at > snapshot.to {
        return Err(CacheError::SplitRefused(format!(
            "{at} is outside [{}, {})",
            snapshot.from, snapshot.to
        ))
        .into());
    }
    let part = |from, to, layers| CacheSnapshot { from, to, layers };
    Ok((part(snapshot.from, at, left), part(at, snapshot.to, right)))
}

impl ModelCache {
    /// A model's caches, one per layer, all empty.
    pub fn new(layers: Vec<LayerCache>) -> Self {
        Self {
            layers,
            spec_base: None,
            poisoned: false,
            hidden: None,
        }
    }

    /// Tokens seen: the absolute position of the next token (0 for a model without layers).
    pub fn offset(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::offset)
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The layers, for inspection.
    pub fn layers(&self) -> &[LayerCache] {
        &self.layers
    }

    /// The cache of layer `i`, for a forward pass to append to. Refused after a failed commit.
    pub fn layer_mut(&mut self, i: usize) -> Result<&mut LayerCache> {
        if self.poisoned {
            return Err(CacheError::Poisoned.into());
        }
        let n = self.layers.len();
        self.layers
            .get_mut(i)
            .ok_or_else(|| CacheError::BadInput(format!("layer {i} of {n}")).into())
    }

    /// Every layer, for a forward that appends to several at once (the ranks of a
    /// tensor-parallel model, each its own run of layers). Refused after a failed commit.
    pub fn layers_mut(&mut self) -> Result<&mut [LayerCache]> {
        if self.poisoned {
            return Err(CacheError::Poisoned.into());
        }
        Ok(&mut self.layers)
    }

    /// For a forward that writes K/V itself (a replayed CUDA graph): when every layer can
    /// take a step of `t` tokens in place (an unbounded KV cache with a buffer, or a ring:
    /// see [`KvCache::reserve`], [`RotatingKvCache::reserve`]) and no tree
    /// is open, makes room for them and returns each layer's whole buffers
    /// `[b, h, capacity, d]` and allocation id; the forward writes positions
    /// `[offset, offset + t)` (a KV cache's slots of the same index, a ring's modulo its
    /// capacity, a staged ring's inside a speculation into its side buffer, the
    /// [`InPlace::tail`]) and the caller then calls [`Self::advance`]. `None` otherwise (the forward
    /// takes the ordinary path).
    pub fn reserve_in_place(&mut self, t: usize) -> Result<Option<Vec<InPlace>>> {
        if self.poisoned {
            return Err(CacheError::Poisoned.into());
        }
        reserve_layers(&mut self.layers, t, false)
    }

    /// Counts `t` tokens written by a forward into the room [`Self::reserve_in_place`] made
    /// (a staged ring's block outside a speculation is copied from its side buffer into the
    /// ring here).
    pub fn advance(&mut self, t: usize) -> Result<()> {
        advance_layers(&mut self.layers, t)
    }

    /// Bytes held by all layers.
    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::allocated_bytes).sum()
    }

    /// Opens a speculation: until it is committed or dropped, nothing else can touch these
    /// caches, and forwards through [`Speculation::cache`] append tentatively.
    pub fn speculate(&mut self) -> Result<Speculation<'_>> {
        self.check_idle()?;
        let base = self.offset();
        self.layers.iter_mut().for_each(LayerCache::begin);
        self.spec_base = Some(base);
        Ok(Speculation {
            cache: self,
            base,
            open: true,
            tree: None,
        })
    }

    fn check_idle(&self) -> Result<()> {
        if self.poisoned {
            return Err(CacheError::Poisoned.into());
        }
        if self.spec_base.is_some() {
            return Err(CacheError::SpeculationOpen.into());
        }
        Ok(())
    }

    /// Owned copy of the state for `[from, offset)` (rotating layers: their whole window).
    pub fn snapshot(&self, from: usize) -> Result<CacheSnapshot> {
        self.check_idle()?;
        let layers = self
            .layers
            .iter()
            .map(|l| l.snapshot(from))
            .collect::<Result<_>>()?;
        Ok(CacheSnapshot {
            from,
            to: self.offset(),
            layers,
        })
    }

    /// Brings every layer to `target`, from `snapshot` or (with `None`) by rewinding the live
    /// state. All-or-nothing: every layer is checked before any is changed.
    pub fn restore(&mut self, snapshot: Option<&CacheSnapshot>, target: usize) -> Result<()> {
        self.check_idle()?;
        if let Some(s) = snapshot {
            if s.layers.len() != self.layers.len() {
                return Err(CacheError::KindMismatch(format!(
                    "snapshot of {} layers for a cache of {}",
                    s.layers.len(),
                    self.layers.len()
                ))
                .into());
            }
        }
        let snap_layer = |i: usize| snapshot.map(|s| &s.layers[i]);
        for (i, layer) in self.layers.iter().enumerate() {
            layer.check_restore(snap_layer(i), target)?;
        }
        self.hidden_moved(target);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            if let Err(e) = layer.restore(snap_layer(i), target) {
                self.poisoned = true;
                return Err(e);
            }
        }
        Ok(())
    }

    /// True when some layer is a sliding-window ring (its snapshots cannot be split).
    pub fn has_rotating_layers(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerCache::Rotating(_)))
    }

    /// Called when a forward that began at offset `before` failed part-way through its layers,
    /// leaving some appended and others not (or a ring half-written). Outside a speculation
    /// every layer is rewound to `before` when all of them can be (checked first, like
    /// [`Self::restore`]); otherwise, and always inside a speculation, the cache is poisoned:
    /// every later use is refused with [`CacheError::Poisoned`] until [`Self::reset`]. Layers
    /// at different offsets are never left in use.
    pub fn recover_failed_forward(&mut self, before: usize) {
        if self.poisoned {
            return;
        }
        let reachable = self.spec_base.is_none()
            && self
                .layers
                .iter()
                .all(|l| l.check_restore(None, before).is_ok());
        if !reachable {
            self.poisoned = true;
            return;
        }
        for layer in &mut self.layers {
            if layer.restore(None, before).is_err() {
                self.poisoned = true;
                return;
            }
        }
    }

    /// [`KvCache::expect_tokens`] for every full-attention layer (a ring's size is its window).
    pub fn expect_tokens(&mut self, tokens: usize) -> Result<()> {
        for layer in &mut self.layers {
            if let LayerCache::Kv(c) = layer {
                c.expect_tokens(tokens)?;
            }
        }
        Ok(())
    }

    /// True after a failed commit, restore or forward: every use is refused until a reset.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Empties every layer (buffers are kept for reuse) and clears a poisoned state.
    pub fn reset(&mut self) {
        self.layers.iter_mut().for_each(LayerCache::reset);
        self.spec_base = None;
        self.poisoned = false;
        self.hidden_moved(0);
    }

    /// Makes this cache's forwards record the hidden states of `layers` (see [`HiddenTap`]
    /// for the ids), or none (`None`). Setting the layers it already records keeps the
    /// rows waiting; anything else starts afresh at the current offset.
    pub fn tap_hidden(&mut self, layers: Option<&[usize]>) {
        match (layers, &self.hidden) {
            (Some(l), Some(tap)) if tap.layers() == l => {}
            (Some(l), _) => self.hidden = Some(HiddenTap::new(l, self.offset())),
            (None, _) => self.hidden = None,
        }
    }

    /// The layers whose hidden states forwards record, if any.
    pub fn hidden_layers(&self) -> Option<&[usize]> {
        self.hidden.as_ref().map(HiddenTap::layers)
    }

    /// Records a forward's hidden-state rows (`[t, ids × hidden]`, positions
    /// `[offset − t, offset)` after the forward appended them): tentative inside a
    /// speculation, else committed. Called by the model after every layer appended.
    pub fn record_hidden(&mut self, rows: Tensor) {
        let open = self.spec_base.is_some();
        if let Some(tap) = self.hidden.as_mut() {
            tap.record(rows, open);
        }
    }

    /// The committed rows not taken yet, as `(position of the first, [n, ids × hidden])`;
    /// `None` when there are none (or nothing is recorded).
    pub fn take_hidden(&mut self) -> Result<Option<(usize, Tensor)>> {
        match self.hidden.as_mut() {
            Some(tap) => tap.take(),
            None => Ok(None),
        }
    }

    /// After the cache moved to `offset` by other means than forwards (a restore, a
    /// reset): the rows waiting no longer describe it.
    fn hidden_moved(&mut self, offset: usize) {
        if let Some(tap) = self.hidden.as_mut() {
            tap.clear_at(offset);
        }
    }

    /// The open speculation ended: keep the tentative rows of `rows` (`None`: none).
    fn hidden_settled(&mut self, rows: Option<&[usize]>) -> Result<()> {
        match self.hidden.as_mut() {
            Some(tap) => tap.settle(rows),
            None => Ok(()),
        }
    }

    /// An independent copy of every layer (the clone-and-truncate baseline; test probes).
    pub fn deep_clone(&self) -> Result<Self> {
        self.check_idle()?;
        Ok(Self {
            layers: self
                .layers
                .iter()
                .map(LayerCache::deep_clone)
                .collect::<Result<_>>()?,
            spec_base: None,
            poisoned: false,
            hidden: self.hidden.clone(),
        })
    }
}

/// [`ModelCache::reserve_in_place`] over a run of `layers` (one rank's of a split model's
/// cache, see [`ModelCache::layers_mut`]); an open token tree only with `trees` (the caller
/// masks its nodes: [`ModelCache::reserve_tree_in_place`]).
pub fn reserve_layers(
    layers: &mut [LayerCache],
    t: usize,
    trees: bool,
) -> Result<Option<Vec<InPlace>>> {
    let mut out = Vec::with_capacity(layers.len());
    for layer in layers {
        let bufs = match layer {
            LayerCache::Kv(c) => c.reserve(t, trees)?,
            LayerCache::Rotating(c) => c.reserve(t, trees)?,
        };
        match bufs {
            Some(bufs) => out.push(bufs),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// On CUDA, the copies from every staged ring's side buffer into the ring — the rows a
/// block written in place outside a speculation left, or else a commit's `n` — in one launch
/// (`nn::cuda::commit_rings`) instead of several a layer; true when made. Elsewhere, with
/// fewer than two such rings, or buffers the kernel does not take, false: each layer copies
/// its own rows.
fn copy_side_rows(layers: &[LayerCache], n: usize) -> Result<bool> {
    #[cfg(feature = "cuda")]
    {
        let mut commits = Vec::new();
        let mut rows = Vec::new();
        for layer in layers {
            if let LayerCache::Rotating(c) = layer {
                if let Some(([sk, sv, rk, rv], n_rows, first_slot)) = c.side_rows(n) {
                    rows.push(n_rows);
                    commits.push(crate::nn::RingCommit {
                        side: (sk, sv),
                        ring: (rk, rv),
                        first_slot,
                    });
                }
            }
        }
        // One launch copies the same rows of every ring (all layers share the offsets).
        if commits.len() >= 2 && rows.iter().all(|&r| r == rows[0]) {
            return Ok(crate::nn::commit_rings(&commits, rows[0])?);
        }
    }
    let _ = (layers, n);
    Ok(false)
}

/// [`ModelCache::advance`] over a run of `layers`.
pub fn advance_layers(layers: &mut [LayerCache], t: usize) -> Result<()> {
    for layer in layers.iter_mut() {
        match layer {
            LayerCache::Kv(c) => c.advance(t),
            LayerCache::Rotating(c) => c.advance(t),
        }
    }
    let unflushed = |l: &LayerCache| matches!(l, LayerCache::Rotating(c) if c.has_unflushed());
    if !layers.iter().any(unflushed) {
        return Ok(());
    }
    // Every ring's unflushed rows in one launch where the kernel takes them (a failed launch
    // falls back to the rings' own copies, which say what is intact).
    let copied = matches!(copy_side_rows(layers, 0), Ok(true));
    for layer in layers.iter_mut() {
        if let LayerCache::Rotating(c) = layer {
            #[cfg(feature = "cuda")]
            if copied && c.side_rows(0).is_some() {
                c.flushed();
                continue;
            }
            c.flush()?;
        }
    }
    let _ = copied;
    Ok(())
}

/// A transaction over a [`ModelCache`]: forwards through [`Speculation::cache`] append K/V
/// tentatively; [`Speculation::commit`] keeps the first `n` appended tokens; dropping it
/// without a commit rolls every layer back to where it began.
#[must_use = "a speculation rolls back when dropped; call commit to keep tokens"]
#[derive(Debug)]
pub struct Speculation<'a> {
    cache: &'a mut ModelCache,
    base: usize,
    open: bool,
    /// The block's token tree, once [`Speculation::extend_tree`] was called.
    tree: Option<Arc<TokenTree>>,
}

impl Speculation<'_> {
    /// The caches, for the speculative forwards.
    pub fn cache(&mut self) -> &mut ModelCache {
        self.cache
    }

    /// Offset when the speculation began.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Tokens appended so far.
    pub fn appended(&self) -> usize {
        self.cache.offset().saturating_sub(self.base)
    }

    /// Keeps exactly the first `n` appended tokens and closes the transaction. On error the
    /// speculation is rolled back (and a cache whose write failed half-way is poisoned).
    pub fn commit(mut self, n: usize) -> Result<()> {
        if self.cache.poisoned {
            return Err(CacheError::Poisoned.into());
        }
        let appended = self.appended();
        if n > appended {
            return Err(CacheError::CommitTooLong { n, appended }.into());
        }
        if self.tree.is_some() {
            return self.commit_path(&(0..n).collect::<Vec<_>>());
        }
        self.open = false;
        self.cache.spec_base = None;
        let copied = match copy_side_rows(&self.cache.layers, n) {
            Ok(copied) => copied,
            Err(e) => return self.copy_failed(e),
        };
        for i in 0..self.cache.layers.len() {
            if let Err(e) = self.cache.layers[i].commit(n, copied) {
                self.cache.layers[i + 1..]
                    .iter_mut()
                    .for_each(LayerCache::rollback);
                self.cache.poisoned = i > 0 || n > 0;
                self.cache.hidden_settled(None)?;
                return Err(e);
            }
        }
        if self.cache.hidden.is_none() {
            // Nothing recorded: no row list to build on this per-step path.
            return Ok(());
        }
        let rows: Vec<usize> = (0..n).collect();
        self.cache.hidden_settled(Some(&rows))
    }

    /// A commit's one-launch copy for every layer failed: some layers may hold new rows over
    /// old ones, so nothing is known intact — every layer rolls back and the cache is
    /// poisoned. Returns `e`.
    pub(super) fn copy_failed(&mut self, e: crate::error::Error) -> Result<()> {
        self.cache.layers.iter_mut().for_each(LayerCache::rollback);
        self.cache.poisoned = true;
        self.cache.hidden_settled(None)?;
        Err(e)
    }
}

impl Drop for Speculation<'_> {
    fn drop(&mut self) {
        if self.open {
            self.cache.layers.iter_mut().for_each(LayerCache::rollback);
            self.cache.spec_base = None;
            // Dropping rows cannot fail.
            let _ = self.cache.hidden_settled(None);
        }
    }
}
