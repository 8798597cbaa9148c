//! Tree drafting with a draft model: dynamic expansion by cumulative draft probability
//! (EAGLE-2, Li et al. 2024), one draft forward per level over the expanded frontier.
use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::drafter::ModelDrafter;
use super::sampling::{sample, SamplingParams};
use super::tree::{DraftTree, TreeDraft, TreeShape};
use super::LanguageModel;
use crate::cache::Speculation;
use crate::error::Result;

/// A drafted tree and the draft cache's speculation over its expanded nodes.
struct ModelTreeDraft<'a> {
    spec: Speculation<'a>,
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
        self.spec.commit_path(&keep)
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

impl<M: LanguageModel> ModelDrafter<M> {
    /// Drafts a tree of `shape` after `context`. Level by level: every frontier node (most
    /// probable first) gets up to `width` children while fewer than `budget` nodes exist;
    /// then the `width` new nodes of highest cumulative draft probability form the next
    /// frontier and are fed to the draft model in ONE forward, inside the draft cache's
    /// speculation, as tree nodes (each sees the history and its ancestors). Leaves of the
    /// last level are never fed. Width 1 drafts exactly the chain [`super::Drafter::propose`]
    /// drafts, with the same forwards.
    pub(super) fn draft_tree<'a>(
        &'a mut self,
        context: &[u32],
        shape: TreeShape,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn TreeDraft + 'a>> {
        let mut tree = DraftTree {
            child_q: vec![None],
            ..DraftTree::default()
        };
        if self.cache.offset() >= context.len() {
            self.cache.reset();
        }
        let empty = shape.depth == 0 || shape.width == 0 || shape.budget == 0;
        let mut frontier: Vec<(Option<usize>, Vec<f32>)> = Vec::new();
        if !empty && !context.is_empty() {
            // Committed tokens the draft has not seen yet (at least the last one).
            let fresh = &context[self.cache.offset()..];
            let logits = self.model.forward_last(fresh, &mut self.cache)?;
            self.forwards += 1;
            frontier.extend(rows(&logits)?.pop().map(|row| (None, row)));
        }
        let mut spec = self.cache.speculate()?;
        let mut cum: Vec<f32> = Vec::new();
        let mut block_of: Vec<Option<usize>> = Vec::new();
        for level in 1..=shape.depth {
            let mut added = Vec::new();
            for (parent, row) in &frontier {
                let k = shape.width.min(shape.budget - tree.len());
                if k == 0 {
                    break;
                }
                let (children, q) = pick_children(row, k, sampling, rng);
                tree.child_q[parent.map_or(0, |p| p + 1)] = q;
                let parent_cum = parent.map_or(1.0, |p| cum[p]);
                for (token, prob) in children {
                    added.push(tree.len());
                    tree.tokens.push(token);
                    tree.parents.push(*parent);
                    tree.child_q.push(None);
                    cum.push(parent_cum * prob);
                    block_of.push(None);
                }
            }
            if added.is_empty() || level == shape.depth {
                break;
            }
            // The most probable new nodes are expanded (stable: ties keep drafting order).
            added.sort_by(|&a, &b| cum[b].total_cmp(&cum[a]));
            added.truncate(shape.width);
            let parents: Vec<Option<usize>> = added
                .iter()
                .map(|&n| tree.parents[n].and_then(|p| block_of[p]))
                .collect();
            let tokens: Vec<u32> = added.iter().map(|&n| tree.tokens[n]).collect();
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
                block_of[n] = Some(first + r);
            }
        }
        Ok(Box::new(ModelTreeDraft {
            spec,
            tree,
            block_of,
        }))
    }
}
