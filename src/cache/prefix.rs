//! A store of cache snapshots keyed by token prefixes, so generations that share a prompt
//! prefix (a system text, an earlier turn) prefill it once.
//!
//! Layout: a trie whose entries are [`CacheSnapshot`]s of token spans `[from, to)`; an
//! entry's parent holds the span ending at `from`, so the path from a root to an entry
//! covers `[0, to)` and merging the snapshots along it gives the state after `to` tokens.
//! Restoring works for any target in `[from, to]` of a KV-only path, but a sliding-window
//! layer's snapshot holds only the window at `to`, so with rotating layers a path restores
//! only to its last entry's `to` (or `to - 1`). Entries are therefore *checkpoints*: for
//! KV-only models an entry that extends past a shared part is split there; for models with
//! rotating layers it cannot be, and the caller places checkpoints where it will want to
//! resume (every `checkpoint_every` tokens, where a prompt leaves the stored text, at turn
//! ends). Siblings may then share leading tokens; lookups follow the longest full match.
//!
//! Memory: entries are evicted least-recently-used, leaves first (an inner entry is needed by
//! every entry below it), to keep [`CacheSnapshot::bytes`] summed over entries within the
//! budget.
use super::model::merge;
use super::model::split;
use super::model::CacheSnapshot;
use super::model::ModelCache;
use crate::error::Result;

/// One stored span.
#[derive(Debug)]
struct Entry {
    parent: Option<usize>,
    /// First position of the span.
    from: usize,
    /// The span's tokens, positions `[from, from + tokens.len())`.
    tokens: Vec<u32>,
    /// The cache state of the span (rotating layers: the window at its end).
    snapshot: CacheSnapshot,
    children: Vec<usize>,
    /// Logical clock of the last lookup or insertion that used this entry.
    last_used: u64,
}

impl Entry {
    fn to(&self) -> usize {
        self.from + self.tokens.len()
    }
}

/// Cache snapshots keyed by token prefixes, within a byte budget (see the module docs).
#[derive(Debug)]
pub struct PrefixStore {
    /// Arena of entries; `None` marks a free slot.
    entries: Vec<Option<Entry>>,
    /// Entries starting at position 0.
    roots: Vec<usize>,
    budget: usize,
    bytes: usize,
    clock: u64,
}

/// Where a token sequence leaves the trie.
struct Walk {
    /// Entries fully matched, root first.
    path: Vec<usize>,
    /// The entry matched only in part and how many of its tokens match (at least one).
    partial: Option<(usize, usize)>,
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixStore {
    /// An empty store that keeps at most `budget_bytes` of snapshots.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            entries: Vec::new(),
            roots: Vec::new(),
            budget: budget_bytes,
            bytes: 0,
            clock: 0,
        }
    }

    /// Bytes held by the stored snapshots.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.entries.iter().flatten().count()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entry(&self, i: usize) -> &Entry {
        self.entries[i].as_ref().expect("live entry index")
    }

    fn entry_mut(&mut self, i: usize) -> &mut Entry {
        self.entries[i].as_mut().expect("live entry index")
    }

    fn children(&self, parent: Option<usize>) -> &[usize] {
        match parent {
            None => &self.roots,
            Some(p) => &self.entry(p).children,
        }
    }

    /// Follows `tokens` down the trie: at each level the longest fully matching entry, else
    /// the entry sharing the most leading tokens.
    fn walk(&self, tokens: &[u32]) -> Walk {
        let mut path = Vec::new();
        let mut pos = 0;
        loop {
            let parent = path.last().copied();
            let rest = &tokens[pos..];
            let mut full: Option<(usize, usize)> = None;
            let mut part: Option<(usize, usize)> = None;
            for &c in self.children(parent) {
                let e = self.entry(c);
                let n = common_len(&e.tokens, rest);
                if n == e.tokens.len() && n > 0 {
                    full = full.filter(|&(_, m)| m >= n).or(Some((c, n)));
                } else if n > 0 {
                    part = part.filter(|&(_, m)| m >= n).or(Some((c, n)));
                }
            }
            match full {
                Some((c, n)) => {
                    path.push(c);
                    pos += n;
                }
                None => {
                    return Walk {
                        path,
                        partial: part,
                    }
                }
            }
        }
    }

    /// Length of the longest stored token prefix of `tokens` (it may end inside an entry):
    /// where a prompt leaves the stored text, a good place for a checkpoint.
    pub fn shared_len(&self, tokens: &[u32]) -> usize {
        let walk = self.walk(tokens);
        let full = walk.path.last().map_or(0, |&e| self.entry(e).to());
        full + walk.partial.map_or(0, |(_, n)| n)
    }

    /// Splits entry `i` after its first `n` tokens (KV-only snapshots): the entry keeps
    /// `[from, from + n)` and a new child takes the rest with the old children. Refused (and
    /// nothing changed) when a snapshot has rotating layers.
    fn split_entry(&mut self, i: usize, n: usize) -> Result<()> {
        let e = self.entry(i);
        let (left, right) = split(&e.snapshot, e.from + n)?;
        let last_used = e.last_used;
        let e = self.entry_mut(i);
        let tail_tokens = e.tokens.split_off(n);
        let tail_children = std::mem::take(&mut e.children);
        e.snapshot = left;
        let tail = Entry {
            parent: Some(i),
            from: right.from(),
            tokens: tail_tokens,
            snapshot: right,
            children: tail_children,
            last_used,
        };
        let t = self.push(tail);
        for c in self.entry(t).children.clone() {
            self.entry_mut(c).parent = Some(t);
        }
        self.entry_mut(i).children.push(t);
        // Bytes: the split copies both halves, the old snapshot is dropped.
        self.recount();
        Ok(())
    }

    fn push(&mut self, entry: Entry) -> usize {
        match self.entries.iter().position(Option::is_none) {
            Some(i) => {
                self.entries[i] = Some(entry);
                i
            }
            None => {
                self.entries.push(Some(entry));
                self.entries.len() - 1
            }
        }
    }

    fn recount(&mut self) {
        self.bytes = self
            .entries
            .iter()
            .flatten()
            .map(|e| e.snapshot.bytes())
            .sum();
    }

    fn touch(&mut self, path: &[usize]) {
        self.clock += 1;
        let now = self.clock;
        for &i in path {
            self.entry_mut(i).last_used = now;
        }
    }

    /// Restores `cache` to the longest stored prefix of `tokens` that leaves at least the
    /// last token to prefill (its logits give the next token), merging the snapshots along
    /// the stored path; an entry extending past the shared part is split there when its
    /// layers allow. Returns the restored length, or 0 without touching `cache` when nothing
    /// longer than `better_than` tokens is stored. An error is a refused merge or restore:
    /// the store stays consistent and the cache is unchanged or poisoned (see
    /// [`ModelCache::restore`]); the caller falls back to a full prefill.
    pub fn restore(
        &mut self,
        tokens: &[u32],
        better_than: usize,
        cache: &mut ModelCache,
    ) -> Result<usize> {
        let limit = tokens.len().saturating_sub(1);
        let mut walk = self.walk(tokens);
        if let Some((i, n)) = walk.partial {
            if self.split_entry(i, n).is_ok() {
                walk.path.push(i);
            }
        }
        // A path with rotating layers restores only to its end or one before: drop entries
        // that end past `limit + 1`.
        while let Some(&last) = walk.path.last() {
            if self.entry(last).to() <= limit + 1 {
                break;
            }
            walk.path.pop();
        }
        let Some(&last) = walk.path.last() else {
            return Ok(0);
        };
        let len = self.entry(last).to().min(limit);
        if len <= better_than {
            return Ok(0);
        }
        self.touch(&walk.path);
        let first = &self.entry(walk.path[0]).snapshot;
        if walk.path.len() == 1 {
            cache.restore(Some(first), len)?;
            return Ok(len);
        }
        let mut merged = merge(first, &self.entry(walk.path[1]).snapshot)?;
        for &i in &walk.path[2..] {
            merged = merge(&merged, &self.entry(i).snapshot)?;
        }
        cache.restore(Some(&merged), len)?;
        Ok(len)
    }

    /// Stores the state of `cache`, which holds exactly `tokens`, as an entry below the
    /// longest stored prefix of `tokens` (a no-op when all of it is stored). Then evicts
    /// least-recently-used entries to fit the budget. Returns whether an entry was added
    /// (false also when its snapshot alone exceeds the budget).
    pub fn insert(&mut self, tokens: &[u32], cache: &ModelCache) -> Result<bool> {
        if tokens.len() != cache.offset() {
            return Err(crate::error::Error::invalid(format!(
                "prefix store: {} tokens given for a cache holding {}",
                tokens.len(),
                cache.offset()
            )));
        }
        let mut walk = self.walk(tokens);
        if let Some((i, n)) = walk.partial {
            // Share the common part with the existing entry when it can be cut (KV only).
            if self.split_entry(i, n).is_ok() {
                walk.path.push(i);
            }
        }
        let parent = walk.path.last().copied();
        let from = parent.map_or(0, |p| self.entry(p).to());
        self.touch(&walk.path);
        if from >= tokens.len() {
            return Ok(false);
        }
        let snapshot = cache.snapshot(from)?;
        let size = snapshot.bytes();
        if size > self.budget {
            return Ok(false);
        }
        let entry = Entry {
            parent,
            from,
            tokens: tokens[from..].to_vec(),
            snapshot,
            children: Vec::new(),
            last_used: self.clock,
        };
        let i = self.push(entry);
        match parent {
            None => self.roots.push(i),
            Some(p) => self.entry_mut(p).children.push(i),
        }
        self.bytes += size;
        while self.bytes > self.budget && self.evict_lru() {}
        Ok(true)
    }

    /// Evicts the least-recently-used entry that has no children; false when empty.
    pub fn evict_lru(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i, e)))
            .filter(|(_, e)| e.children.is_empty())
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i);
        let Some(i) = victim else {
            return false;
        };
        let Some(e) = self.entries[i].take() else {
            return false;
        };
        self.bytes -= e.snapshot.bytes();
        match e.parent {
            None => self.roots.retain(|&r| r != i),
            Some(p) => self.entry_mut(p).children.retain(|&c| c != i),
        }
        true
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.roots.clear();
        self.bytes = 0;
    }
}
