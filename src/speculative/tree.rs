//! Draft token trees and their lossless verification.
//!
//! A [`DraftTree`] hangs below the last committed token (the *root*, not a node): node `i`
//! has a token and a parent node (`None` = a child of the root), in topological order. The
//! target verifies it in ONE forward over the block `[root, node 0, node 1, …]` (block index
//! `i + 1` is node `i`), each node seeing the history and its ancestors; verification walks
//! down from the root and returns the accepted root-to-node path plus one more token.
use candle_core::{DType, Tensor};
use rand::Rng;

use super::sampling::{sample, SamplingParams};
use crate::error::{Error, Result};

/// How a tree is drafted: depth ≤ `depth`; every expanded node gets up to `width` children;
/// at most `budget` nodes in all. Width 1 and budget ≥ depth is a chain of `depth` drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeShape {
    /// Most levels below the root (γ).
    pub depth: usize,
    /// Children per expanded node.
    pub width: usize,
    /// Most drafted nodes per step.
    pub budget: usize,
}

/// A token tree proposed by a drafter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraftTree {
    /// `tokens[i]`: the token of node `i`.
    pub tokens: Vec<u32>,
    /// `parents[i]`: node `i`'s parent, `None` for a child of the root; `parents[i] < i`.
    pub parents: Vec<Option<usize>>,
    /// `child_q[0]`: the distribution the root's children were drawn from; `child_q[i + 1]`:
    /// that of node `i`'s children. `None`: the children are deterministic (each one's `q`
    /// is one-hot), as in greedy drafting, n-gram lookups, or a node without children.
    pub child_q: Vec<Option<Vec<f32>>>,
}

impl DraftTree {
    /// The chain `tokens`, each drawn from `probs[i]` (or deterministic).
    pub fn chain(tokens: &[u32], probs: Option<&[Vec<f32>]>) -> Self {
        let n = tokens.len();
        let mut child_q = vec![None; n + 1];
        if let Some(probs) = probs {
            for (slot, q) in child_q.iter_mut().zip(probs) {
                *slot = Some(q.clone());
            }
        }
        Self {
            tokens: tokens.to_vec(),
            parents: (0..n).map(|i| i.checked_sub(1)).collect(),
            child_q,
        }
    }

    /// Number of nodes (the root excluded).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing was drafted.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Levels below the root.
    pub fn depth(&self) -> usize {
        let mut depth = vec![0usize; self.len()];
        for (i, p) in self.parents.iter().enumerate() {
            depth[i] = p.map_or(1, |p| depth[p] + 1);
        }
        depth.into_iter().max().unwrap_or(0)
    }

    /// Parents in the target's verification block `[root, nodes…]`: the root is block 0
    /// (a block root), node `i` is block `i + 1`.
    pub fn block_parents(&self) -> Vec<Option<usize>> {
        let nodes = self.parents.iter().map(|p| Some(p.map_or(0, |p| p + 1)));
        std::iter::once(None).chain(nodes).collect()
    }

    /// The children of block node `b` (0 = root), as node indices in order.
    fn children(&self, b: usize) -> Vec<usize> {
        let parent = b.checked_sub(1);
        (0..self.len())
            .filter(|&i| self.parents[i] == parent)
            .collect()
    }
}

/// How the target distribution changes after a candidate is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResidualRule {
    /// `norm(max(0, p − q))`: exact (SpecInfer's multi-step speculative sampling).
    Exact,
    /// `p` kept as it was: biased. An ablation that the distribution tests must reject.
    Unchanged,
}

/// Tree settings of a speculative generation (the depth is the step's γ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeParams {
    /// Children per expanded node (1 = a chain).
    pub width: usize,
    /// Most drafted nodes per step.
    pub budget: usize,
    /// Residual update of multi-candidate verification ([`ResidualRule::Exact`] unless
    /// studying the bias of the naive rule).
    pub residual: ResidualRule,
}

impl TreeParams {
    /// The chain: width 1, as many drafts as the step's γ.
    pub fn chain() -> Self {
        Self {
            width: 1,
            budget: usize::MAX,
            residual: ResidualRule::Exact,
        }
    }

    /// A chain (width 1) of at most `budget` drafts a step.
    pub fn chain_of(budget: usize) -> Self {
        Self {
            budget,
            ..Self::chain()
        }
    }

    /// Refuses a width of 0.
    pub fn check(&self) -> Result<()> {
        if self.width == 0 {
            return Err(Error::invalid("tree width must be at least 1"));
        }
        Ok(())
    }
}

/// Outcome of verifying a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeVerdict {
    /// The accepted nodes, root's child first (a root-to-node path; empty = none accepted).
    pub path: Vec<usize>,
    /// The token after the path: the target's correction or a bonus token.
    pub next: u32,
}

impl TreeVerdict {
    /// The block path to commit in the target (the root, then the accepted nodes).
    pub fn block_path(&self) -> Vec<usize> {
        std::iter::once(0)
            .chain(self.path.iter().map(|&i| i + 1))
            .collect()
    }
}

/// Verifies `tree` against `logits` (`[tree.len() + 1, vocab]`, row `b` = the target's
/// logits after block node `b`). Greedy: from the root, follow the child whose token is the
/// target's argmax; next = the argmax at the last accepted node. Sampled (SpecInfer, Miao et
/// al. 2024): at each node try its children in order, accepting child `c` with probability
/// `min(1, p(c) / q(c))`, and after each rejection replace `p` by `norm(max(0, p − q))`
/// (`q` one-hot for deterministic children); when all are rejected sample from `p`. With
/// children drawn i.i.d. from `q` (or deterministic) the output follows the target exactly.
pub fn verify_tree<R: Rng + ?Sized>(
    logits: &Tensor,
    tree: &DraftTree,
    sampling: &SamplingParams,
    rule: ResidualRule,
    rng: &mut R,
) -> Result<TreeVerdict> {
    let rows = logits.dim(0)?;
    if rows != tree.len() + 1 || tree.child_q.len() != tree.len() + 1 {
        return Err(Error::invalid(format!(
            "tree verification needs {} logit rows and child distributions, got {rows} and {}",
            tree.len() + 1,
            tree.child_q.len()
        )));
    }
    if sampling.is_greedy() {
        let best = crate::nn::argmax_rows(logits)?;
        let (mut block, mut path) = (0, Vec::new());
        while let Some(c) = tree
            .children(block)
            .into_iter()
            .find(|&c| tree.tokens[c] == best[block])
        {
            path.push(c);
            block = c + 1;
        }
        return Ok(TreeVerdict {
            path,
            next: best[block],
        });
    }
    let logits = logits.to_dtype(DType::F32)?;
    let (mut block, mut path) = (0, Vec::new());
    loop {
        let mut p = sampling.probs(&logits.get(block)?.to_vec1::<f32>()?);
        let q = tree.child_q[block].as_deref();
        match try_children(&mut p, q, tree, &tree.children(block), rule, rng) {
            Some(c) => {
                path.push(c);
                block = c + 1;
            }
            None => {
                return Ok(TreeVerdict {
                    path,
                    next: sample(&p, rng) as u32,
                })
            }
        }
    }
}

/// Tries `children` in turn against `p` (updated in place by `rule` after each rejection);
/// returns the accepted child, or `None` with `p` the distribution to sample from.
fn try_children<R: Rng + ?Sized>(
    p: &mut Vec<f32>,
    q: Option<&[f32]>,
    tree: &DraftTree,
    children: &[usize],
    rule: ResidualRule,
    rng: &mut R,
) -> Option<usize> {
    for &c in children {
        let d = tree.tokens[c] as usize;
        let q_d = q.map_or(1.0, |q| q.get(d).copied().unwrap_or(0.0));
        let p_d = p.get(d).copied().unwrap_or(0.0);
        // min(1, p/q) without dividing by a zero q.
        if q_d > 0.0 && rng.random::<f32>() * q_d < p_d {
            return Some(c);
        }
        if rule == ResidualRule::Unchanged {
            continue;
        }
        let residual: Vec<f32> = match q {
            Some(q) => p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect(),
            None => {
                let mut r = p.clone();
                if let Some(x) = r.get_mut(d) {
                    *x = 0.0;
                }
                r
            }
        };
        // Normalised: the next child's acceptance test compares against it. An all-zero
        // residual means p == q up to rounding: the rejection had probability 0, and p
        // itself is the exact answer.
        let total: f64 = residual.iter().map(|&x| x as f64).sum();
        if total > 0.0 {
            *p = residual
                .iter()
                .map(|&x| (x as f64 / total) as f32)
                .collect();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn greedy_follows_the_argmax_down_the_tree() {
        // root ─ a(1) ─ c(3)
        //      └ b(2) ─ d(0)
        let tree = DraftTree {
            tokens: vec![1, 2, 3, 0],
            parents: vec![None, None, Some(0), Some(1)],
            child_q: vec![None; 5],
        };
        // Argmax per block row: root → 2 (node b), b → 0 (node d), d → 3 (bonus).
        let rows = [2u32, 1, 0, 1, 3];
        let mut logits = vec![0f32; 5 * 4];
        for (r, &best) in rows.iter().enumerate() {
            logits[r * 4 + best as usize] = 1.0;
        }
        let logits = Tensor::from_vec(logits, (5, 4), &Device::Cpu).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        let greedy = SamplingParams::greedy();
        let v = verify_tree(&logits, &tree, &greedy, ResidualRule::Exact, &mut rng).unwrap();
        assert_eq!(v.path, [1, 3]);
        assert_eq!(v.next, 3);
        assert_eq!(v.block_path(), [0, 2, 4]);
        assert_eq!(
            tree.block_parents(),
            [None, Some(0), Some(0), Some(1), Some(2)]
        );
        assert_eq!(tree.depth(), 2);
    }
}
