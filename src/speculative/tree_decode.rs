//! The tree-speculative decode loop.
use std::time::Instant;

use rand::rngs::StdRng;

use super::decode::{fresh_sequence, prefill, prefill_drafter, GenParams};
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
    let start = Instant::now();
    let draft_forwards = drafter.forwards();
    let (mut out, first) = prefill(target, seq, prompt, params, rng)?;
    prefill_drafter(drafter, prompt, &mut out.record)?;
    let mut context = prompt.to_vec();
    context.push(first);
    let mut gamma = params.gamma.first();
    let mut done = out.push(first);
    while !done {
        // Never draft past max_new_tokens: a step yields at most depth + 1 tokens.
        let remaining = params.max_new_tokens - out.record.output_ids.len();
        let shape = TreeShape {
            depth: gamma.min(remaining - 1),
            width: tree_params.width,
            budget: tree_params.budget,
        };
        let t_draft = Instant::now();
        let draft = drafter.propose_tree(&context, shape, &params.sampling, rng)?;
        let tree = draft.tree();
        out.record.draft_s += t_draft.elapsed().as_secs_f64();

        let t_verify = Instant::now();
        let mut input = Vec::with_capacity(tree.len() + 1);
        input.extend(context.last().copied());
        input.extend_from_slice(&tree.tokens);
        let mut spec = seq.cache_mut().speculate()?;
        spec.extend_tree(&tree.block_parents())?;
        let logits = target.forward(&input, spec.cache())?;
        out.record.target_forwards += 1;
        let verdict = verify_tree(&logits, tree, &params.sampling, tree_params.residual, rng)?;
        spec.commit_path(&verdict.block_path())?;
        out.record.verify_s += t_verify.elapsed().as_secs_f64();

        let (depth, accepted) = (tree.depth(), verdict.path.len());
        let mut new_tokens: Vec<u32> = verdict.path.iter().map(|&n| tree.tokens[n]).collect();
        new_tokens.push(verdict.next);
        let t_finish = Instant::now();
        draft.finish(&verdict.path)?;
        out.record.draft_s += t_finish.elapsed().as_secs_f64();

        out.record.record_step(depth, accepted);
        gamma = params.gamma.next(gamma, depth, accepted);
        for token in new_tokens {
            context.push(token);
            if out.push(token) {
                done = true;
                break;
            }
        }
    }
    seq.finish(&context)?;
    out.record.draft_forwards = drafter.forwards() - draft_forwards;
    out.record.wall_s = start.elapsed().as_secs_f64();
    Ok(out.record)
}

fn check_tree_params(tree_params: &TreeParams) -> Result<()> {
    if tree_params.width == 0 {
        return Err(Error::invalid("tree width must be at least 1"));
    }
    Ok(())
}
