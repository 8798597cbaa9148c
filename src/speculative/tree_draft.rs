//! Tree drafting with a draft model: dynamic expansion by cumulative draft probability
//! (EAGLE-2, Li et al. 2024), one draft forward per level over the expanded frontier.
use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::drafter::{confidence, ModelDrafter};
use super::sampling::{sample, SamplingParams};
use super::tree::{DraftTree, TreeDraft, TreeShape};
use super::LanguageModel;
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

impl TreeDraft for ModelTreeDraft<'_> {
    fn tree(&self) -> &DraftTree {
        &self.tree
    }
    /// Keeps the accepted path's nodes that the draft model has seen; the rest (an unfed
    /// leaf) is fed with the next context, as in chain drafting.
    fn finish(self: Box<Self>, path: &[usize]) -> Result<()> {
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
    fn parent_cum(&self, parent: Option<usize>) -> f32 {
        parent.map_or(1.0, |p| self.cum[p])
    }

    /// Adds up to `share` children below `frontier` (at most `width` per node) and returns
    /// the new nodes. Greedy: the `share` children of highest cumulative probability among
    /// every node's `width` most likely tokens. Sampled: the counts are fixed before drawing,
    /// `width` per node in frontier order, so the children stay i.i.d. draws from `q`.
    fn grow(
        &mut self,
        frontier: &Frontier,
        share: usize,
        width: usize,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Vec<usize> {
        let mut counts = vec![0usize; frontier.len()];
        let mut ranked: Vec<Vec<(u32, f32)>> = Vec::new();
        if sampling.is_greedy() {
            ranked = frontier
                .iter()
                .map(|(_, row)| pick_children(row, width, sampling, rng).0)
                .collect();
            for _ in 0..share {
                let next = |i: usize| {
                    let (parent, c) = (frontier[i].0, counts[i]);
                    ranked[i].get(c).map(|&(_, p)| self.parent_cum(parent) * p)
                };
                let best = (0..frontier.len())
                    .filter_map(|i| next(i).map(|v| (i, v)))
                    .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
                let Some((i, _)) = best else { break };
                counts[i] += 1;
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
                self.cum.push(parent_cum * prob);
                self.block_of.push(None);
            }
        }
        added
    }
}

impl<M: LanguageModel> ModelDrafter<M> {
    /// Drafts a tree of `shape` after `context`, level by level (dynamic expansion by
    /// cumulative draft probability, as EAGLE-2): each level gets an equal share of the
    /// remaining `budget` (`ceil(left / levels left)`), spent on the most probable children
    /// (see [`Growing::grow`]); all new nodes but the last level's are then fed to the draft
    /// model in ONE forward, inside the draft cache's speculation, as tree nodes (each sees
    /// the history and its ancestors). Width 1 drafts exactly the chain
    /// [`super::Drafter::propose`] drafts, with the same forwards, confidence threshold
    /// included: below level 1, nodes whose largest draft probability is under it get no
    /// children.
    pub(super) fn draft_tree<'a>(
        &'a mut self,
        context: &[u32],
        shape: TreeShape,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn TreeDraft + 'a>> {
        let mut g = Growing {
            tree: DraftTree {
                child_q: vec![None],
                ..DraftTree::default()
            },
            cum: Vec::new(),
            block_of: Vec::new(),
        };
        let empty = shape.depth == 0 || shape.width == 0 || shape.budget == 0;
        let mut frontier: Frontier = Vec::new();
        if !empty && !context.is_empty() {
            // Committed tokens the draft has not seen yet (at least the last one).
            let logits = self.sync(context)?;
            frontier.extend(rows(&logits)?.pop().map(|row| (None, row)));
        }
        let threshold = self.confidence;
        let (cache, held) = self.seq.parts();
        let mut spec = cache.speculate()?;
        for level in 1..=shape.depth {
            if let (Some(threshold), true) = (threshold, level > 1) {
                // As in chains: no children below a node whose largest draft probability is
                // under the threshold (the root always has some; the target takes over at the
                // pruned nodes). Decided before any child is drawn, so the tree stays lossless.
                frontier.retain(|(_, row)| confidence(row, sampling) >= threshold);
            }
            let left = shape.budget.saturating_sub(g.tree.len());
            let share = left.div_ceil(shape.depth - level + 1);
            let mut added = g.grow(&frontier, share, shape.width, sampling, rng);
            if added.is_empty() || level == shape.depth {
                break;
            }
            // Most probable first (stable: ties keep drafting order).
            added.sort_by(|&a, &b| g.cum[b].total_cmp(&g.cum[a]));
            let parents: Vec<Option<usize>> = added
                .iter()
                .map(|&n| g.tree.parents[n].and_then(|p| g.block_of[p]))
                .collect();
            let tokens: Vec<u32> = added.iter().map(|&n| g.tree.tokens[n]).collect();
            let first = spec.appended();
            spec.extend_tree(&parents)?;
            let logits = self.model.forward(&tokens, spec.cache())?;
            self.forwards += 1;
            frontier = added
                .iter()
                .copied()
                .map(Some)
                .zip(rows(&logits)?)
                .collect();
            for (r, &n) in added.iter().enumerate() {
                g.block_of[n] = Some(first + r);
            }
        }
        Ok(Box::new(ModelTreeDraft {
            spec,
            held,
            tree: g.tree,
            block_of: g.block_of,
        }))
    }
}
