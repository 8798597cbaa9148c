//! Tree drafting with a draft model: dynamic expansion by cumulative draft probability
//! (EAGLE-2, Li et al. 2024), one draft forward per level over the expanded frontier.
use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::drafter::{confidence, Draft, DraftBlock, ModelDrafter};
use super::model::LanguageModel;
use super::sampling::{sample, SamplingParams};
use super::tree::{DraftTree, TreeShape};
use crate::cache::Speculation;
use crate::error::Result;

/// A drafted tree and the draft cache's speculation over its expanded nodes.
struct ModelTreeDraft<'a> {
    spec: Speculation<'a>,
    /// The drafter's held tokens, to extend by the kept path.
    held: &'a mut Vec<u32>,
    tree: DraftTree,
    /// `block_of[i]`: node `i`'s index in the draft speculation's block (`None`: a leaf that
    /// was never fed to the draft model).
    block_of: Vec<Option<usize>>,
}

impl Draft for ModelTreeDraft<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Tree(&self.tree)
    }
    /// Keeps the accepted path's nodes that the draft model has seen; the rest (an unfed
    /// leaf) is fed with the next context, as in chain drafting.
    fn finish(self: Box<Self>, _drafts: &[u32], path: &[usize]) -> Result<()> {
        let keep: Vec<usize> = path.iter().map_while(|&n| self.block_of[n]).collect();
        self.spec.commit_path(&keep)?;
        self.held
            .extend(path[..keep.len()].iter().map(|&n| self.tree.tokens[n]));
        Ok(())
    }
}

/// The `k` children of a node whose next-token logits are `row`, with their probabilities
/// under the draft, and the distribution they were drawn from. Greedy: the `k` most likely
/// tokens (deterministic, `q = None`; probabilities from the softmax at T = 1). Sampled: `k`
/// i.i.d. draws from `q` (multi-candidate verification is exact only for i.i.d. children).
fn pick_children(
    row: &[f32],
    k: usize,
    sampling: &SamplingParams,
    rng: &mut StdRng,
) -> (Vec<(u32, f32)>, Option<Vec<f32>>) {
    if sampling.is_greedy() {
        let softmax = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::greedy()
        };
        let probs = softmax.probs(row);
        let mut order: Vec<usize> = (0..row.len()).collect();
        // Descending by logit, ties by id (the first maximum is the argmax, as in chains).
        let by_logit = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
        let k = k.min(order.len());
        if k > 0 && k < order.len() {
            order.select_nth_unstable_by(k - 1, by_logit);
        }
        order.truncate(k);
        order.sort_by(by_logit);
        let children = order.iter().map(|&t| (t as u32, probs[t])).collect();
        return (children, None);
    }
    let q = sampling.probs(row);
    let children = (0..k)
        .map(|_| {
            let t = sample(&q, rng);
            (t as u32, q[t])
        })
        .collect();
    (children, Some(q))
}

fn rows(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    Ok(logits.to_dtype(DType::F32)?.to_vec2::<f32>()?)
}

/// A tree being drafted: the nodes so far, their cumulative draft probabilities and where
/// the draft cache holds them.
struct Growing {
    tree: DraftTree,
    /// `cum[i]`: product of the draft probabilities along the path to node `i`.
    cum: Vec<f32>,
    /// See [`ModelTreeDraft::block_of`].
    block_of: Vec<Option<usize>>,
}

/// A node whose children are being chosen, with its next-token logits.
type Frontier = Vec<(Option<usize>, Vec<f32>)>;

impl Growing {
    /// `top[i]`: whether node `i` is among the `budget` most probable nodes (cumulative
    /// probability, ties to the earlier node). Closed under ancestors: a parent is drafted
    /// before its children and its cumulative probability is at least theirs (see
    /// [`Growing::grow`]).
    fn top(&self, budget: usize) -> Vec<bool> {
        let mut order: Vec<usize> = (0..self.tree.len()).collect();
        order.sort_by(|&a, &b| self.cum[b].total_cmp(&self.cum[a]).then(a.cmp(&b)));
        let mut top = vec![false; self.tree.len()];
        for &n in order.iter().take(budget) {
            top[n] = true;
        }
        top
    }

    /// Keeps the nodes marked in `keep` (closed under ancestors), renumbered in order.
    fn keep(&mut self, keep: &[bool]) {
        let mut new_index = vec![None; self.tree.len()];
        let mut next = 0;
        for (i, slot) in new_index.iter_mut().enumerate() {
            if keep[i] {
                *slot = Some(next);
                next += 1;
            }
        }
        let kept = |i: &usize| keep[*i];
        let all = 0..self.tree.len();
        let tree = &self.tree;
        self.tree = DraftTree {
            tokens: all.clone().filter(kept).map(|i| tree.tokens[i]).collect(),
            parents: all
                .clone()
                .filter(kept)
                .map(|i| tree.parents[i].map(|p| new_index[p].expect("ancestors are kept")))
                .collect(),
            child_q: std::iter::once(tree.child_q[0].clone())
                .chain(
                    all.clone()
                        .filter(kept)
                        .map(|i| tree.child_q[i + 1].clone()),
                )
                .collect(),
        };
        self.cum = all.clone().filter(kept).map(|i| self.cum[i]).collect();
        self.block_of = all.filter(kept).map(|i| self.block_of[i]).collect();
    }

    fn parent_cum(&self, parent: Option<usize>) -> f32 {
        parent.map_or(1.0, |p| self.cum[p])
    }

    /// Adds children below `frontier` and returns the new nodes. Greedy: every node's
    /// `width` most likely tokens (`share` is ignored: the caller reranks). Sampled: `width`
    /// i.i.d. draws from `q` per node in frontier order, `share` nodes in all, the counts
    /// fixed before drawing so that the children stay i.i.d.
    fn grow(
        &mut self,
        frontier: &Frontier,
        share: usize,
        width: usize,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Vec<usize> {
        let mut counts = vec![width; frontier.len()];
        let mut ranked: Vec<Vec<(u32, f32)>> = Vec::new();
        if sampling.is_greedy() {
            ranked = frontier
                .iter()
                .map(|(_, row)| pick_children(row, width, sampling, rng).0)
                .collect();
            for (c, r) in counts.iter_mut().zip(&ranked) {
                *c = r.len();
            }
        } else {
            let mut left = share;
            for c in counts.iter_mut() {
                *c = width.min(left);
                left -= *c;
            }
        }
        let mut added = Vec::new();
        for (i, (parent, row)) in frontier.iter().enumerate() {
            if counts[i] == 0 {
                continue;
            }
            let (children, q) = match ranked.get(i) {
                Some(r) => (r[..counts[i]].to_vec(), None),
                None => pick_children(row, counts[i], sampling, rng),
            };
            self.tree.child_q[parent.map_or(0, |p| p + 1)] = q;
            let parent_cum = self.parent_cum(*parent);
            for (token, prob) in children {
                added.push(self.tree.len());
                self.tree.tokens.push(token);
                self.tree.parents.push(*parent);
                self.tree.child_q.push(None);
                // Never above the parent's, which keeps `top` closed under ancestors.
                self.cum.push((parent_cum * prob).min(parent_cum));
                self.block_of.push(None);
            }
        }
        added
    }
}

impl<M: LanguageModel> ModelDrafter<M> {
    /// Drafts a tree of `shape` after `context` with the draft model (see [`grow_tree`]),
    /// inside the draft cache's speculation; the accepted path's fed nodes are kept.
    ///
    /// Width 1 drafts exactly the chain [`super::Drafter::propose`] drafts, with the same
    /// forwards, confidence threshold included.
    pub(super) fn draft_tree<'a>(
        &'a mut self,
        context: &[u32],
        shape: TreeShape,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        let root = if grows(shape) && !context.is_empty() {
            // Committed tokens the draft has not seen yet (at least the last one).
            let logits = self.sync(context)?;
            rows(&logits)?.pop()
        } else {
            None
        };
        let threshold = self.confidence;
        let (model, forwards) = (&self.model, &mut self.forwards);
        let (cache, held) = self.seq.parts();
        let mut spec = cache.speculate()?;
        let (tree, block_of) = grow_tree(
            &mut spec,
            root,
            (shape, sampling, threshold),
            rng,
            |spec, _, tokens| {
                let logits = model.forward(tokens, spec.cache())?;
                *forwards += 1;
                rows(&logits)
            },
        )?;
        Ok(Box::new(ModelTreeDraft {
            spec,
            held,
            tree,
            block_of,
        }))
    }
}

/// Whether a tree of `shape` has any node (a root row is worth computing).
pub(super) fn grows(shape: TreeShape) -> bool {
    shape.depth.min(shape.budget) > 0 && shape.width > 0
}

/// Grows a tree of `shape` below `root` (the next-token logits after the committed tokens,
/// vocabulary-sized; `None`: an empty tree), level by level, with ONE drafter forward per
/// level over the nodes chosen for expansion: `forward(spec, parents, tokens)` runs the
/// drafter over `tokens`, already declared in `spec` as tree nodes with these `parents`
/// (block indices; `None` = below the root), and returns each one's next-token logits. The
/// last level is never fed. Returns the tree and where each node lies in `spec`'s block
/// (`None`: never fed).
///
/// Drafts a tree of `shape` after `context`, level by level, with ONE draft forward per
/// level over the nodes chosen for expansion, inside the draft cache's speculation, as
/// tree nodes (each sees the history and its ancestors); the last level is never fed.
///
/// Greedy (EAGLE-2's expand-then-rerank, Li et al. 2024): every expanded node gets its
/// `width` most likely tokens as children. A level's nodes are expanded (fed) when they
/// rank among the `budget` most probable nodes drafted so far (cumulative draft
/// probability), most probable first, at most `ceil(budget / depth)` per level and
/// `budget` per step (the draft speculation's block). After the last level the tree keeps
/// the `budget` most probable of all drafted nodes; a node's cumulative probability never
/// exceeds its parent's, so they form a tree. Without the caps it would be the `budget`
/// most probable nodes of the full tree of the draft's top-`width` children: a node among
/// those has its parent among the `budget` most probable when the parent's level is
/// expanded.
///
/// Sampled: children must stay i.i.d. draws from `q` (multi-candidate verification is
/// exact only then), so none is dropped for its value: each level gets an equal share of
/// the remaining budget (`ceil(left / levels left)`), `width` draws per node in order of
/// cumulative probability, counts fixed before drawing (see [`Growing::grow`]), and every
/// new node but the last level's is fed.
///
/// Width 1 drafts exactly the chain [`super::Drafter::propose`] drafts, with the same
/// forwards, confidence threshold included: below level 1, nodes whose largest draft
/// probability is under it get no children.
pub(super) fn grow_tree<'s>(
    spec: &mut Speculation<'s>,
    root: Option<Vec<f32>>,
    (shape, sampling, threshold): (TreeShape, &SamplingParams, Option<f32>),
    rng: &mut StdRng,
    mut forward: impl FnMut(&mut Speculation<'s>, &[Option<usize>], &[u32]) -> Result<Vec<Vec<f32>>>,
) -> Result<(DraftTree, Vec<Option<usize>>)> {
    let mut g = Growing {
        tree: DraftTree {
            child_q: vec![None],
            ..DraftTree::default()
        },
        cum: Vec::new(),
        block_of: Vec::new(),
    };
    // No node deeper than the budget can be kept (its ancestors come first).
    let depth = shape.depth.min(shape.budget);
    let greedy = sampling.is_greedy();
    let mut frontier: Frontier = Vec::new();
    if grows(shape) {
        frontier.extend(root.map(|row| (None, row)));
    }
    for level in 1..=depth {
        if let (Some(threshold), true) = (threshold, level > 1) {
            // As in chains: no children below a node whose largest draft probability is
            // under the threshold (the root always has some; the target takes over at the
            // pruned nodes). Decided before any child is drawn, so the tree stays lossless.
            frontier.retain(|(_, row)| confidence(row, sampling) >= threshold);
        }
        // Sampled trees' share of the budget (greedy ones rerank instead).
        let left = shape.budget.saturating_sub(g.tree.len());
        let share = left.div_ceil(depth - level + 1);
        let mut added = g.grow(&frontier, share, shape.width, sampling, rng);
        if added.is_empty() || level == depth {
            break;
        }
        // Most probable first (stable: ties keep drafting order).
        added.sort_by(|&a, &b| g.cum[b].total_cmp(&g.cum[a]));
        if greedy {
            // Expand only what can still be kept, within the draft's block of `budget`.
            let top = g.top(shape.budget);
            let fed = g.block_of.iter().flatten().count();
            added.retain(|&n| top[n]);
            added.truncate((shape.budget - fed).min(shape.budget.div_ceil(depth)));
            if added.is_empty() {
                break;
            }
        }
        let parents: Vec<Option<usize>> = added
            .iter()
            .map(|&n| g.tree.parents[n].and_then(|p| g.block_of[p]))
            .collect();
        let tokens: Vec<u32> = added.iter().map(|&n| g.tree.tokens[n]).collect();
        let first = spec.appended();
        spec.extend_tree(&parents)?;
        let next = forward(spec, &parents, &tokens)?;
        frontier = added.iter().copied().map(Some).zip(next).collect();
        for (r, &n) in added.iter().enumerate() {
            g.block_of[n] = Some(first + r);
        }
    }
    if greedy {
        let top = g.top(shape.budget);
        g.keep(&top);
    }
    Ok((g.tree, g.block_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root ─ a(.6) ─ c(.6·.5) ─ e(.3·.9)
    ///      │       └ d(.6·.4)
    ///      └ b(.3) ─ f(.3·.9)
    fn growing() -> Growing {
        let parents = vec![None, None, Some(0), Some(0), Some(2), Some(1)];
        let cum = vec![0.6, 0.3, 0.3, 0.24, 0.27, 0.27];
        Growing {
            tree: DraftTree {
                tokens: vec![10, 11, 12, 13, 14, 15],
                child_q: vec![None; parents.len() + 1],
                parents,
            },
            cum,
            block_of: vec![Some(0), Some(1), Some(2), None, None, None],
        }
    }

    #[test]
    fn the_budget_keeps_the_most_probable_nodes_as_a_tree() {
        let mut g = growing();
        // Ties go to the earlier node: b (.3) before c (.3), e (.27) before f (.27).
        let top = g.top(4);
        assert_eq!(top, [true, true, true, false, true, false]);
        g.keep(&top);
        assert_eq!(g.tree.tokens, [10, 11, 12, 14]);
        assert_eq!(g.tree.parents, [None, None, Some(0), Some(2)]);
        assert_eq!(g.tree.child_q.len(), 5);
        assert_eq!(g.cum, [0.6, 0.3, 0.3, 0.27]);
        assert_eq!(g.block_of, [Some(0), Some(1), Some(2), None]);
        assert_eq!(g.top(10), [true; 4]);
    }
}
