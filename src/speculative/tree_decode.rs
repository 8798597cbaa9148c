//! The tree-speculative decode loop.
use std::time::Instant;

use rand::rngs::StdRng;

use super::decode::{fresh_sequence, speculative_loop, GenParams, StepOutcome};
use super::drafter::Drafter;
use super::metrics::GenerationRecord;
use super::prefill::CachedSequence;
use super::tree::{verify_tree, ResidualRule, TreeShape};
use super::LanguageModel;
use crate::cache::ModelCache;
use crate::error::{Error, Result};

/// Tree settings of a speculative generation (the depth is the step's γ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeParams {
    /// Children per expanded node (1 = chain).
    pub width: usize,
    /// Most drafted nodes per step.
    pub budget: usize,
    /// Residual update of multi-candidate verification ([`ResidualRule::Exact`] unless
    /// studying the bias of the naive rule).
    pub residual: ResidualRule,
}

impl TreeParams {
    /// The chain of γ drafts: width 1, budget `gamma`.
    pub fn chain(gamma: usize) -> Self {
        Self {
            width: 1,
            budget: gamma,
            residual: ResidualRule::Exact,
        }
    }
}

/// Tree speculative decoding: per step the drafter proposes a token tree of depth ≤ γ, the
/// target verifies `[last, nodes…]` in ONE forward inside a speculation whose block is that
/// tree, and the accepted root-to-node path plus one target token are committed (the path
/// moved into consecutive cache slots). Records the accepted depth per step as `accepted`
/// and the tree's depth as `proposed`, so per-position acceptance is acceptance per depth.
/// Greedy output equals [`super::autoregressive`]'s token for token; sampled output follows
/// the target's distribution. `cache` and the drafter are reset first.
pub fn speculative_tree<M: LanguageModel>(
    target: &M,
    cache: &mut ModelCache,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    params: &GenParams,
    tree_params: &TreeParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    check_tree_params(tree_params)?;
    drafter.reset()?;
    fresh_sequence(cache, |seq| {
        speculative_tree_continue(target, seq, drafter, prompt, params, tree_params, rng)
    })
}

/// [`speculative_tree`] continuing from what `seq` and the drafter hold (neither is reset):
/// only the new part of `prompt` is prefilled, by the target and by a draft model.
/// Afterwards `seq` holds every committed token but the last.
pub fn speculative_tree_continue<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    params: &GenParams,
    tree_params: &TreeParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    check_tree_params(tree_params)?;
    speculative_loop(target, seq, drafter, prompt, params, rng, |step| {
        let shape = TreeShape {
            depth: step.max_drafts,
            width: tree_params.width,
            budget: tree_params.budget,
        };
        let t_draft = Instant::now();
        let draft = step
            .drafter
            .propose_tree(step.context, shape, &params.sampling, step.rng)?;
        let tree = draft.tree();
        step.out.record.draft_s += t_draft.elapsed().as_secs_f64();

        let t_verify = Instant::now();
        let mut input = Vec::with_capacity(tree.len() + 1);
        input.extend(step.context.last().copied());
        input.extend_from_slice(&tree.tokens);
        let mut spec = step.seq.cache_mut().speculate()?;
        spec.extend_tree(&tree.block_parents())?;
        let logits = target.forward(&input, spec.cache())?;
        step.out.record.target_forwards += 1;
        let verdict = verify_tree(
            &logits,
            tree,
            &params.sampling,
            tree_params.residual,
            step.rng,
        )?;
        let mut tokens: Vec<u32> = verdict.path.iter().map(|&n| tree.tokens[n]).collect();
        tokens.push(verdict.next);
        // The root and the accepted nodes, cut where an EOS ends the generation.
        let block_path = verdict.block_path();
        spec.commit_path(&block_path[..step.out.takes(&tokens)])?;
        step.out.record.verify_s += t_verify.elapsed().as_secs_f64();

        let proposed = tree.depth();
        let t_finish = Instant::now();
        draft.finish(&verdict.path)?;
        step.out.record.draft_s += t_finish.elapsed().as_secs_f64();
        Ok(StepOutcome {
            tokens,
            proposed,
            accepted: verdict.path.len(),
        })
    })
}

fn check_tree_params(tree_params: &TreeParams) -> Result<()> {
    if tree_params.width == 0 {
        return Err(Error::invalid("tree width must be at least 1"));
    }
    Ok(())
}
