//! Ways of rolling back a speculative step, side by side behind one interface, with what each
//! step costs in copied bytes and extra memory (the cache-strategy benchmark compares them).
//!
//! A step is what one verification does to one sequence's cache: append the K/V of γ+1
//! tokens (the current token and γ drafts) to every layer, then keep the first `keep` of them.
use std::time::{Duration, Instant};

use candle_core::Tensor;

use crate::cache::{
    path_moves, CacheError, CacheSnapshot, KvCache, LayerCache, ModelCache, RotatingKvCache,
    RotatingStrategy,
};
use crate::error::Result;

/// The cache layout a baseline strategy runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// Unbounded [`KvCache`] layers (full attention).
    Kv,
    /// Sliding-window [`RotatingKvCache`] layers with a ring of exactly `window` slots,
    /// written through outside any speculation.
    Rotating,
}

/// How a speculative step is undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RollbackStrategy {
    /// [`KvCache`] inside a [`crate::cache::Speculation`]: write through, rollback moves the
    /// offset back (O(1)).
    KvRewind,
    /// [`RotatingKvCache`] with [`RotatingStrategy::Staged`]: drafts wait in a side buffer;
    /// commit copies the kept prefix into the ring (O(keep)).
    Staged,
    /// [`RotatingKvCache`] with [`RotatingStrategy::Slack`]: the ring has spare slots for the
    /// longest step; rollback moves the cursor (O(1)), the slots cost memory.
    SlackRing,
    /// Snapshot what the step may overwrite (KV: the range from the offset on, which is
    /// empty; rotating: the whole window), write through, and on rejection restore the
    /// snapshot and re-append the kept K/V.
    Snapshot(Layout),
    /// Baseline: `deep_clone` the whole cache before each step, write through, and on
    /// rejection swap the clone back in and re-append the kept K/V.
    CloneTruncate(Layout),
    /// Baseline: no undo at all. A second cache holds the committed K/V history (a copy kept
    /// beside the model, standing in for the tokens a real engine would re-run); on
    /// rejection the live cache is emptied and rebuilt from it (KV: every committed position;
    /// rotating: the window), then the kept K/V are appended. This models the K/V memory
    /// traffic of a re-prefill; the forward pass that would produce those K/V in a real
    /// engine is not included, so real recompute costs more.
    Recompute(Layout),
}

impl RollbackStrategy {
    /// Every strategy: the three transactional ones and each baseline on both layouts.
    pub const ALL: [RollbackStrategy; 9] = [
        RollbackStrategy::KvRewind,
        RollbackStrategy::Staged,
        RollbackStrategy::SlackRing,
        RollbackStrategy::Snapshot(Layout::Kv),
        RollbackStrategy::Snapshot(Layout::Rotating),
        RollbackStrategy::CloneTruncate(Layout::Kv),
        RollbackStrategy::CloneTruncate(Layout::Rotating),
        RollbackStrategy::Recompute(Layout::Kv),
        RollbackStrategy::Recompute(Layout::Rotating),
    ];

    /// A short stable name (`kv-rewind`, `snapshot-rot`, …) used in configs and reports.
    pub fn name(self) -> &'static str {
        match self {
            RollbackStrategy::KvRewind => "kv-rewind",
            RollbackStrategy::Staged => "staged",
            RollbackStrategy::SlackRing => "slack-ring",
            RollbackStrategy::Snapshot(Layout::Kv) => "snapshot-kv",
            RollbackStrategy::Snapshot(Layout::Rotating) => "snapshot-rot",
            RollbackStrategy::CloneTruncate(Layout::Kv) => "clone-kv",
            RollbackStrategy::CloneTruncate(Layout::Rotating) => "clone-rot",
            RollbackStrategy::Recompute(Layout::Kv) => "recompute-kv",
            RollbackStrategy::Recompute(Layout::Rotating) => "recompute-rot",
        }
    }

    /// The strategy called `name` (see [`Self::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The layout its caches have.
    pub fn layout(self) -> Layout {
        match self {
            RollbackStrategy::KvRewind => Layout::Kv,
            RollbackStrategy::Staged | RollbackStrategy::SlackRing => Layout::Rotating,
            RollbackStrategy::Snapshot(l)
            | RollbackStrategy::CloneTruncate(l)
            | RollbackStrategy::Recompute(l) => l,
        }
    }

    /// True for the strategies that roll back inside a [`crate::cache::Speculation`] (and so
    /// can commit a token tree's path).
    pub fn transactional(self) -> bool {
        matches!(
            self,
            RollbackStrategy::KvRewind | RollbackStrategy::Staged | RollbackStrategy::SlackRing
        )
    }
}

/// What one step cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCost {
    /// K/V bytes copied beyond writing the γ+1 new tokens once (commit copies, snapshots,
    /// clones, restores, re-appends, history upkeep), summed over layers.
    pub bytes_copied: usize,
    /// Extra memory the strategy holds at its peak during the step beyond the cache's own
    /// tokens (side buffer, slack slots, snapshot, clone, history), summed over layers.
    pub bytes_held: usize,
    /// Time of the speculative append (including any snapshot or clone taken before it).
    pub append: Duration,
    /// Time of the commit or rollback (including restores and re-appends).
    pub finish: Duration,
}

/// A [`ModelCache`] driven by one [`RollbackStrategy`].
#[derive(Debug)]
pub struct StrategyCache {
    strategy: RollbackStrategy,
    cache: ModelCache,
    /// [`RollbackStrategy::Recompute`] only: the committed K/V history.
    history: Option<ModelCache>,
    window: usize,
    max_draft: usize,
}

/// Geometry of a [`StrategyCache`].
#[derive(Debug, Clone, Copy)]
pub struct StrategySpec {
    /// The strategy.
    pub strategy: RollbackStrategy,
    /// Attention layers.
    pub layers: usize,
    /// Sliding window of rotating layouts, in tokens (ignored by KV layouts).
    pub window: usize,
    /// The longest draft γ a step may carry (a step appends up to γ+1 tokens).
    pub max_draft: usize,
}

impl StrategyCache {
    /// Empty caches for `spec`.
    pub fn new(spec: StrategySpec) -> Result<Self> {
        let layers = |rotating: RotatingStrategy| -> Result<ModelCache> {
            let layer = || -> Result<LayerCache> {
                Ok(match spec.strategy.layout() {
                    Layout::Kv => LayerCache::Kv(KvCache::default()),
                    Layout::Rotating => {
                        LayerCache::Rotating(RotatingKvCache::new(spec.window, rotating)?)
                    }
                })
            };
            Ok(ModelCache::new(
                (0..spec.layers).map(|_| layer()).collect::<Result<_>>()?,
            ))
        };
        let ring = match spec.strategy {
            RollbackStrategy::SlackRing => RotatingStrategy::Slack {
                max_draft: spec.max_draft,
            },
            _ => RotatingStrategy::Staged,
        };
        let history = match spec.strategy {
            RollbackStrategy::Recompute(_) => Some(layers(RotatingStrategy::Staged)?),
            _ => None,
        };
        Ok(Self {
            strategy: spec.strategy,
            cache: layers(ring)?,
            history,
            window: spec.window,
            max_draft: spec.max_draft,
        })
    }

    /// The strategy.
    pub fn strategy(&self) -> RollbackStrategy {
        self.strategy
    }

    /// The live cache (what attention reads).
    pub fn cache(&self) -> &ModelCache {
        &self.cache
    }

    /// Tokens committed.
    pub fn offset(&self) -> usize {
        self.cache.offset()
    }

    /// Appends committed K/V (one `[b, h, q, d]` pair per layer) outside any speculation.
    pub fn prefill(&mut self, kv: &[(Tensor, Tensor)]) -> Result<()> {
        append_all(&mut self.cache, kv)?;
        if let Some(h) = &mut self.history {
            append_all(h, kv)?;
        }
        Ok(())
    }

    /// Rewinds to `target` committed tokens without a snapshot (benchmark bookkeeping between
    /// steps); refused where the caches cannot rewind (a wrapped ring).
    pub fn rewind(&mut self, target: usize) -> Result<()> {
        self.cache.restore(None, target)?;
        if let Some(h) = &mut self.history {
            h.restore(None, target)?;
        }
        Ok(())
    }

    /// Replaces the committed state with `snapshot` at `target` (see
    /// [`ModelCache::restore`]); lets many caches start from one prefill. The snapshot must
    /// come from a cache of the same layout, layer count and window.
    pub fn restore_from(&mut self, snapshot: &CacheSnapshot, target: usize) -> Result<()> {
        self.cache.reset();
        self.cache.restore(Some(snapshot), target)?;
        if let Some(h) = &mut self.history {
            h.reset();
            h.restore(Some(snapshot), target)?;
        }
        Ok(())
    }

    /// One speculative step: appends `kv` (one `[b, h, γ+1, d]` pair per layer) and keeps
    /// the first `keep` tokens. The cache then holds `keep` more committed tokens.
    pub fn step(&mut self, kv: &[(Tensor, Tensor)], keep: usize) -> Result<StepCost> {
        let appended = kv_len(kv)?;
        if keep > appended {
            return Err(CacheError::CommitTooLong { n: keep, appended }.into());
        }
        if appended > self.max_draft + 1 {
            let max = self.max_draft + 1;
            return Err(CacheError::SpeculationTooLong { len: appended, max }.into());
        }
        let token = token_bytes(kv)?;
        if self.strategy.transactional() {
            return self.step_transactional(kv, keep, token);
        }
        match self.strategy {
            RollbackStrategy::Snapshot(_) => self.step_snapshot(kv, keep, token),
            RollbackStrategy::CloneTruncate(_) => self.step_clone(kv, keep),
            _ => self.step_recompute(kv, keep, token),
        }
    }

    /// Bytes a rotating cache holds beyond its window's K/V (`token` bytes a position, all
    /// layers): the staged side buffer, kept between steps in slots of 16, or the slack
    /// ring's spare slots.
    fn beyond_window(&self, token: usize) -> usize {
        self.cache
            .allocated_bytes()
            .saturating_sub(self.window * token)
    }

    fn step_transactional(
        &mut self,
        kv: &[(Tensor, Tensor)],
        keep: usize,
        token: usize,
    ) -> Result<StepCost> {
        let start = Instant::now();
        let mut spec = self.cache.speculate()?;
        append_all(spec.cache(), kv)?;
        let append = start.elapsed();
        let start = Instant::now();
        spec.commit(keep)?;
        let finish = start.elapsed();
        let (bytes_copied, bytes_held) = match self.strategy {
            RollbackStrategy::Staged => (keep * token, self.beyond_window(token)),
            RollbackStrategy::SlackRing => (0, self.beyond_window(token)),
            _ => (0, 0),
        };
        Ok(StepCost {
            bytes_copied,
            bytes_held,
            append,
            finish,
        })
    }

    /// One tree step: appends `kv` (one `[b, h, n, d]` pair per layer) as the token tree
    /// `parents` and keeps the root-to-node `path`. Speculation strategies only; the others
    /// have no tree commit and are refused.
    pub fn step_path(
        &mut self,
        kv: &[(Tensor, Tensor)],
        parents: &[Option<usize>],
        path: &[usize],
    ) -> Result<StepCost> {
        let appended = kv_len(kv)?;
        if !self.strategy.transactional() || appended > self.max_draft + 1 {
            return Err(CacheError::BadTree(format!(
                "{}: no path commit of {appended} tokens",
                self.strategy.name()
            ))
            .into());
        }
        let token = token_bytes(kv)?;
        let start = Instant::now();
        let mut spec = self.cache.speculate()?;
        spec.extend_tree(parents)?;
        append_all(spec.cache(), kv)?;
        let append = start.elapsed();
        let start = Instant::now();
        spec.commit_path(path)?;
        let finish = start.elapsed();
        let moved: usize = path_moves(path).iter().map(|&(_, _, n)| n).sum();
        let (bytes_copied, bytes_held) = match self.strategy {
            RollbackStrategy::Staged => (path.len() * token, self.beyond_window(token)),
            RollbackStrategy::SlackRing => (moved * token, self.beyond_window(token)),
            _ => (moved * token, 0),
        };
        Ok(StepCost {
            bytes_copied,
            bytes_held,
            append,
            finish,
        })
    }

    fn step_snapshot(
        &mut self,
        kv: &[(Tensor, Tensor)],
        keep: usize,
        token: usize,
    ) -> Result<StepCost> {
        let start = Instant::now();
        let base = self.cache.offset();
        let snapshot = self.cache.snapshot(base)?;
        append_all(&mut self.cache, kv)?;
        let append = start.elapsed();
        let start = Instant::now();
        let rejected = keep < kv_len(kv)?;
        if rejected {
            self.cache.restore(Some(&snapshot), base)?;
            append_all(&mut self.cache, &prefix(kv, keep)?)?;
        }
        let finish = start.elapsed();
        let snap_bytes = match self.strategy.layout() {
            Layout::Kv => 0,
            Layout::Rotating => base.min(self.window) * token,
        };
        let restored = if rejected {
            snap_bytes + keep * token
        } else {
            0
        };
        Ok(StepCost {
            bytes_copied: snap_bytes + restored,
            bytes_held: snap_bytes,
            append,
            finish,
        })
    }

    fn step_clone(&mut self, kv: &[(Tensor, Tensor)], keep: usize) -> Result<StepCost> {
        let token = token_bytes(kv)?;
        let start = Instant::now();
        let clone = self.cache.deep_clone()?;
        append_all(&mut self.cache, kv)?;
        let append = start.elapsed();
        let start = Instant::now();
        let clone_bytes = clone.allocated_bytes();
        let rejected = keep < kv_len(kv)?;
        if rejected {
            self.cache = clone;
            append_all(&mut self.cache, &prefix(kv, keep)?)?;
        }
        let finish = start.elapsed();
        let reappended = if rejected { keep * token } else { 0 };
        Ok(StepCost {
            bytes_copied: clone_bytes + reappended,
            bytes_held: clone_bytes,
            append,
            finish,
        })
    }

    fn step_recompute(
        &mut self,
        kv: &[(Tensor, Tensor)],
        keep: usize,
        token: usize,
    ) -> Result<StepCost> {
        let start = Instant::now();
        let base = self.cache.offset();
        append_all(&mut self.cache, kv)?;
        let append = start.elapsed();
        let start = Instant::now();
        let kept = prefix(kv, keep)?;
        let history = self.history.as_mut().ok_or_else(no_history)?;
        let rebuilt = if keep < kv_len(kv)? {
            let from = match self.strategy.layout() {
                Layout::Kv => 0,
                Layout::Rotating => base.saturating_sub(self.window),
            };
            let snapshot = history.snapshot(from)?;
            self.cache.reset();
            self.cache.restore(Some(&snapshot), base)?;
            append_all(&mut self.cache, &kept)?;
            2 * (base - from) * token + keep * token
        } else {
            0
        };
        append_all(history, &kept)?;
        let finish = start.elapsed();
        let held = history.allocated_bytes();
        Ok(StepCost {
            bytes_copied: rebuilt + keep * token,
            bytes_held: held,
            append,
            finish,
        })
    }
}

/// Appends one K/V pair to each layer (a layer gets nothing for an empty pair).
fn append_all(cache: &mut ModelCache, kv: &[(Tensor, Tensor)]) -> Result<()> {
    if kv.len() != cache.num_layers() {
        return Err(CacheError::BadInput(format!(
            "{} K/V pairs for {} layers",
            kv.len(),
            cache.num_layers()
        ))
        .into());
    }
    for (i, (k, v)) in kv.iter().enumerate() {
        if k.dim(2)? > 0 {
            cache.layer_mut(i)?.append(k, v)?;
        }
    }
    Ok(())
}

/// The first `n` tokens of each pair.
fn prefix(kv: &[(Tensor, Tensor)], n: usize) -> Result<Vec<(Tensor, Tensor)>> {
    kv.iter()
        .map(|(k, v)| Ok((k.narrow(2, 0, n)?, v.narrow(2, 0, n)?)))
        .collect()
}

/// Tokens in the step (the sequence length of the first pair).
fn kv_len(kv: &[(Tensor, Tensor)]) -> Result<usize> {
    Ok(match kv.first() {
        Some((k, _)) => k.dim(2)?,
        None => 0,
    })
}

/// K/V bytes of one token summed over layers.
fn token_bytes(kv: &[(Tensor, Tensor)]) -> Result<usize> {
    let mut total = 0;
    for (k, v) in kv {
        let n = k.dim(2)?.max(1);
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        total += (bytes(k) + bytes(v)) / n;
    }
    Ok(total)
}

fn no_history() -> crate::Error {
    CacheError::BadInput("recompute strategy without a history cache".into()).into()
}
