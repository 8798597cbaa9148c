//! Attention visibility described by positions, materialised only when attention needs it.
//!
//! A cache update knows where its keys sit (a run of consecutive positions, or a wrapped
//! ring) and which are intact, so "which keys does query `p` see" is an interval of
//! positions per query. [`Mask`] keeps that description (a few integers, O(1) to build) and
//! answers "is anything hidden" in O(1); [`Mask::tensor`] writes the additive mask row by row
//! as at most two runs of zeros per row, so a cache operation never pays O(queries × keys).
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::tree::TokenTree;
use crate::error::Result;

/// Where key `i` of an update sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrder {
    /// Key `i` is position `first + i`.
    Linear {
        /// Position of key 0.
        first: usize,
    },
    /// A full ring of `len` slots whose newest position is `last`: slot `s` holds the
    /// position `≡ s (mod len)` in `(last - len, last]`.
    Ring {
        /// The newest position written.
        last: usize,
    },
}

/// Which keys the queries at positions `[q_start, q_end)` see: key position `k` is visible
/// to query `p` iff it is intact (`k >= held_lo`), `k <= p`, and, with a sliding `window`,
/// `k > p - window` (each query sees `window` tokens including itself, as in transformers).
///
/// The keys are `len` keys laid out as `keys`, optionally followed by a *tail* of `n`
/// consecutive positions from `first` (a staged speculation's K/V kept beside the ring);
/// tail keys are always intact.
///
/// With a token tree ([`Mask::with_tree`]), the keys and queries at and after the tree's
/// `base` are its nodes in block order (node `i` at key position `base + i`): query node `i`
/// sits at position `base + depth(i)`, sees history keys by the rule above for that position,
/// and of the block only its ancestors and itself (within the window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    q_start: usize,
    q_end: usize,
    keys: KeyOrder,
    /// Number of keys before the tail.
    len: usize,
    /// Lowest intact position (of the keys before the tail).
    held_lo: usize,
    window: Option<usize>,
    /// `(first position, count)` of the tail.
    tail: Option<(usize, usize)>,
    /// `(base, tree)`: the block from `base` is this tree.
    tree: Option<(usize, Arc<TokenTree>)>,
}

impl Mask {
    /// Queries `queries` over `len` keys laid out as `keys`, of which positions below
    /// `held_lo` are stale.
    pub fn new(
        queries: std::ops::Range<usize>,
        keys: KeyOrder,
        len: usize,
        held_lo: usize,
        window: Option<usize>,
    ) -> Self {
        Self {
            q_start: queries.start,
            q_end: queries.end,
            keys,
            len,
            held_lo,
            window,
            tail: None,
            tree: None,
        }
    }

    /// The same keys, where the block from position `base` is `tree`'s nodes in order (the
    /// queries must lie in that block).
    pub fn with_tree(self, base: usize, tree: Arc<TokenTree>) -> Self {
        Self {
            tree: Some((base, tree)),
            ..self
        }
    }

    /// The same keys followed by `n` consecutive positions from `first`.
    pub fn with_tail(self, first: usize, n: usize) -> Self {
        Self {
            tail: Some((first, n)),
            ..self
        }
    }

    /// Causal visibility over keys `[0, queries.end)` (the unbounded cache).
    pub fn causal(queries: std::ops::Range<usize>) -> Self {
        let len = queries.end;
        Self::new(queries, KeyOrder::Linear { first: 0 }, len, 0, None)
    }

    /// `Some(window)` when the keys are consecutive intact positions, the queries are the
    /// newest of them and there is no tree or tail: query `i` of `t` over `len` keys then
    /// sees key `j` iff `j <= len - t + i` (and `j > len - t + i - window`), which a kernel
    /// can apply from indices alone. `None` for anything else (rings, staged tails, trees,
    /// stale keys).
    pub fn causal_suffix(&self) -> Option<Option<usize>> {
        match (self.keys, &self.tail, &self.tree) {
            (KeyOrder::Linear { first }, None, None)
                if self.held_lo <= first
                    && self.q_end == first + self.len
                    && self.q_start < self.q_end =>
            {
                Some(self.window)
            }
            _ => None,
        }
    }

    /// `Some((base, first, tree))` when the keys are positions `0 .. len` in order, all
    /// intact, with no window or tail, and end with the whole block of a token tree from
    /// `base`, and the queries are its nodes `first ..` (its newest): a kernel can then tell
    /// what each query sees from the tree alone. `None` for anything else.
    pub fn tree_block(&self) -> Option<(usize, usize, Arc<TokenTree>)> {
        match (self.keys, &self.tail, &self.tree, self.window) {
            (KeyOrder::Linear { first: 0 }, None, Some((base, tree)), None)
                if self.held_lo == 0
                    && self.len == base + tree.len()
                    && self.q_end == self.len
                    && (*base..self.q_end).contains(&self.q_start) =>
            {
                Some((*base, self.q_start - base, tree.clone()))
            }
            _ => None,
        }
    }

    /// `Some((end, held_lo, window))` when the keys are a full ring of sliding-window slots,
    /// the queries are its newest positions (`[end - t, end)`) and there is no tree or tail:
    /// a kernel can then tell which slots a query sees from positions alone (slot `s` holds
    /// the newest position `≡ s` modulo the ring's length; query `p` sees positions in
    /// `(p - window, p]` from `held_lo` on). `None` for anything else.
    pub fn ring_suffix(&self) -> Option<(usize, usize, usize)> {
        match (self.keys, &self.tail, &self.tree, self.window) {
            (KeyOrder::Ring { last }, None, None, Some(window))
                if self.q_end == last + 1 && self.q_start < self.q_end =>
            {
                Some((self.q_end, self.held_lo, window))
            }
            _ => None,
        }
    }

    /// The same keys seen by the newest query alone (`[q_end - 1, q_end)`): what a forward
    /// that appends a block's K/V but needs only its last row's output attends with.
    pub fn last_query(&self) -> Self {
        Self {
            q_start: self.q_end.saturating_sub(1).max(self.q_start),
            ..self.clone()
        }
    }

    /// `[q_len, kv_len]` (tail included).
    pub fn shape(&self) -> (usize, usize) {
        let tail = self.tail.map_or(0, |(_, n)| n);
        (self.q_end - self.q_start, self.len + tail)
    }

    /// The positions `[first, last]` held by the keys before the tail, whatever their order.
    fn key_span(&self) -> Option<(usize, usize)> {
        if self.len == 0 {
            return None;
        }
        Some(match self.keys {
            KeyOrder::Linear { first } => (first, first + self.len - 1),
            KeyOrder::Ring { last } => (last + 1 - self.len, last),
        })
    }

    /// The positions `[lo, hi]` query `p` may see (empty when `lo > hi`).
    fn visible_span(&self, p: usize) -> (usize, usize) {
        let lo = self
            .window
            .map_or(0, |w| (p + 1).saturating_sub(w))
            .max(self.held_lo);
        (lo, p)
    }

    /// True when every query sees every key: no mask is needed. O(1): the visible span only
    /// moves right with the query, so the first and last queries decide.
    pub fn hides_nothing(&self) -> bool {
        if self.q_end <= self.q_start {
            return true;
        }
        if self.tree.is_some() {
            // Trees are materialised whatever they hide: the frontier of a tree is short.
            return false;
        }
        let (lo, _) = self.visible_span(self.q_end - 1);
        let (_, hi) = self.visible_span(self.q_start);
        let covers = |first: usize, last: usize| lo <= first && hi >= last;
        let head = self.key_span().is_none_or(|(f, l)| covers(f, l));
        let tail = match self.tail {
            Some((first, n)) if n > 0 => covers(first, first + n - 1),
            _ => true,
        };
        head && tail
    }

    /// The key indices query `p` sees, as at most three runs `[start, end)` (two in a
    /// wrapped ring, one in the tail).
    fn visible_runs(&self, p: usize) -> [(usize, usize); 3] {
        let mut runs = [(0, 0); 3];
        let (lo, hi) = self.visible_span(p);
        [runs[0], runs[1]] = self.head_runs(lo, hi);
        if let Some((first, n)) = self.tail {
            // Tail keys are intact whatever `held_lo` says of older positions.
            let lo = self
                .window
                .map_or(0, |w| (p + 1).saturating_sub(w))
                .max(first);
            let hi = p.min((first + n).saturating_sub(1));
            if n > 0 && lo <= hi {
                runs[2] = (self.len + lo - first, self.len + hi + 1 - first);
            }
        }
        runs
    }

    /// The additive mask `[q_len, kv_len]` (f32, 0 = visible, -inf = hidden) in key order, or
    /// `None` when nothing is hidden.
    pub fn tensor(&self, device: &Device) -> Result<Option<Tensor>> {
        if self.hides_nothing() {
            return Ok(None);
        }
        let (n_q, n_k) = self.shape();
        let mut data = vec![f32::NEG_INFINITY; n_q * n_k];
        for (row, p) in data
            .chunks_exact_mut(n_k.max(1))
            .zip(self.q_start..self.q_end)
        {
            match &self.tree {
                Some((base, tree)) => self.fill_tree_row(row, p, *base, tree),
                None => {
                    for (start, end) in self.visible_runs(p) {
                        row[start..end].fill(0.0);
                    }
                }
            }
        }
        Ok(Some(Tensor::from_vec(data, (n_q, n_k), device)?))
    }

    /// The indices of the keys before the tail holding positions `[lo, hi]`, as at most two
    /// runs `[start, end)` (two in a wrapped ring).
    fn head_runs(&self, lo: usize, hi: usize) -> [(usize, usize); 2] {
        let mut runs = [(0, 0); 2];
        if let Some((first, last)) = self.key_span() {
            let (lo, hi) = (lo.max(first), hi.min(last));
            if lo <= hi {
                match self.keys {
                    KeyOrder::Linear { first } => runs[0] = (lo - first, hi + 1 - first),
                    KeyOrder::Ring { .. } => {
                        let (a, b) = (lo % self.len, hi % self.len);
                        if a <= b {
                            runs[0] = (a, b + 1);
                        } else {
                            runs[0] = (a, self.len);
                            runs[1] = (0, b + 1);
                        }
                    }
                }
            }
        }
        runs
    }

    /// The key index of block position `pos` (in the tail when it holds `pos`).
    fn key_index(&self, pos: usize) -> Option<usize> {
        if let Some((first, n)) = self.tail {
            if (first..first + n).contains(&pos) {
                return Some(self.len + pos - first);
            }
        }
        let (first, last) = self.key_span()?;
        if !(first..=last).contains(&pos) {
            return None;
        }
        Some(match self.keys {
            KeyOrder::Linear { first } => pos - first,
            KeyOrder::Ring { .. } => pos % self.len,
        })
    }

    /// Opens (zeroes) the keys tree query `p` (block node `p - base`) sees: history before
    /// `base` within the window of its position `base + depth`, then its ancestors.
    fn fill_tree_row(&self, row: &mut [f32], p: usize, base: usize, tree: &TokenTree) {
        let node = p - base;
        let depth = tree.depth(node);
        let (lo, _) = self.visible_span(base + depth);
        if base > 0 {
            for (start, end) in self.head_runs(lo, base - 1) {
                row[start..end].fill(0.0);
            }
        }
        let mut ancestor = Some(node);
        while let Some(a) = ancestor {
            let in_window = self.window.is_none_or(|w| depth - tree.depth(a) < w);
            if let (true, Some(i)) = (in_window, self.key_index(base + a)) {
                row[i] = 0.0;
            }
            ancestor = tree.parent(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, key by key: `(position, intact)` of key `i`, then the rule.
    fn reference(m: &Mask) -> Vec<Vec<bool>> {
        let key = |i: usize| -> (usize, bool) {
            if i >= m.len {
                let (first, _) = m.tail.unwrap();
                return (first + i - m.len, true);
            }
            let k = match m.keys {
                KeyOrder::Linear { first } => first + i,
                KeyOrder::Ring { last } => last - (last + m.len - i) % m.len,
            };
            (k, k >= m.held_lo)
        };
        let (_, n_k) = m.shape();
        (m.q_start..m.q_end)
            .map(|p| {
                (0..n_k)
                    .map(|i| {
                        let (k, intact) = key(i);
                        intact && k <= p && m.window.is_none_or(|w| k + w > p)
                    })
                    .collect()
            })
            .collect()
    }

    fn materialised(m: &Mask) -> Vec<Vec<bool>> {
        match m.tensor(&Device::Cpu).unwrap() {
            None => vec![vec![true; m.shape().1]; m.q_end - m.q_start],
            Some(t) => t
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .map(|r| r.iter().map(|&x| x == 0.0).collect())
                .collect(),
        }
    }

    /// `tree_block` claims only masks whose visibility is the kernel's rule: query node `i`
    /// sees keys `0 .. base`, its ancestors and itself (checked against the materialised mask).
    #[test]
    fn tree_block_is_the_masks_visibility() {
        let tree =
            Arc::new(TokenTree::new(vec![None, Some(0), Some(0), Some(1), Some(2)]).unwrap());
        let (base, n) = (7, tree.len());
        for first in [0, 3] {
            let m = Mask::causal(base + first..base + n).with_tree(base, tree.clone());
            let (b, f, _) = m.tree_block().expect("a tree block at the end of the keys");
            assert_eq!((b, f), (base, first));
            for (i, row) in materialised(&m).iter().enumerate() {
                let node = first + i;
                let want: Vec<bool> = (0..base + n)
                    .map(|key| key < base || tree.sees(node, key - base))
                    .collect();
                assert_eq!(row, &want, "node {node}");
            }
        }
        let windowed = Mask::new(
            base..base + n,
            KeyOrder::Linear { first: 0 },
            base + n,
            0,
            Some(4),
        );
        let older = Mask::causal(base..base + n - 1);
        let tailed = Mask::causal(base..base + n).with_tail(base + n, 1);
        for (name, m) in [
            ("window", windowed),
            ("older queries", older),
            ("tail", tailed),
        ] {
            assert!(
                m.with_tree(base, tree.clone()).tree_block().is_none(),
                "{name}"
            );
        }
    }

    proptest! {
        /// The run-based mask and the O(1) "hides nothing" answer agree with the definition.
        #[test]
        fn runs_match_the_definition(
            ring in any::<bool>(),
            len in 1usize..40,
            first in 0usize..50,
            q_len in 1usize..10,
            q_back in 0usize..12,
            held_back in 0usize..60,
            window in proptest::option::of(1usize..30),
            tail in proptest::option::of(0usize..6),
        ) {
            // Keys end at `end - 1`; queries end at or before the newest key + 1.
            let end = first + len;
            let q_end = end.saturating_sub(q_back).max(q_len);
            let queries = q_end - q_len..q_end;
            let keys = if ring { KeyOrder::Ring { last: end - 1 } } else { KeyOrder::Linear { first } };
            let mut m = Mask::new(queries, keys, len, end.saturating_sub(held_back), window);
            if let Some(n) = tail {
                // A staged tail continues the keys, and the queries are its last positions.
                let q_len = q_len.min(n.max(1));
                m = Mask::new(end + n - q_len..end + n, keys, len, end.saturating_sub(held_back), window)
                    .with_tail(end, n);
            }
            let want = reference(&m);
            prop_assert_eq!(materialised(&m), want.clone());
            prop_assert_eq!(m.hides_nothing(), want.iter().flatten().all(|&v| v));
            // The newest query alone sees what its row of the block's mask shows, and keeps
            // the kernels' shortcuts the block had.
            let last = m.last_query();
            prop_assert_eq!(materialised(&last), want[want.len() - 1..].to_vec());
            prop_assert_eq!(last.causal_suffix(), m.causal_suffix());
            prop_assert_eq!(last.ring_suffix().is_some(), m.ring_suffix().is_some());
        }
    }
}
