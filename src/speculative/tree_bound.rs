//! An upper bound on the τ of greedy tree speculation with a draft model, from one
//! teacher-forced draft pass over the target's greedy output.
//!
//! Under greedy verification a tree node is accepted iff every node on its path carries the
//! target's token. A tree whose children are the draft's `width` most likely tokens (what
//! [`super::Drafter::propose`] drafts as a tree for a draft model) therefore accepts, from output
//! position `t`, at most `run(t)` = the number of consecutive target tokens from `t` that are
//! among the draft's top `width` given the true prefix (capped at the depth γ), and the
//! *full* tree of that width and depth accepts exactly that. The full tree also needs the
//! fewest steps: its next position `t + run(t) + 1` never decreases with `t` (`run(t + 1) ≥
//! run(t) − 1`), so by induction it is ahead of any other tree policy after every step. Its
//! τ is thus the most that any tree of that width and depth reaches, whatever the budget
//! and however the budget is spent.
use candle_core::DType;

use super::model::LanguageModel;
use crate::cache::RotatingStrategy;
use crate::error::{Error, Result};

/// `ranks[j]`: the rank of `output[j]` among the draft's next-token logits after `prompt` and
/// `output[..j]` (0 = the draft's most likely token; ties ordered by id, as tree drafting
/// orders children), from ONE teacher-forced forward of `draft` over `prompt + output`.
pub fn draft_ranks<M: LanguageModel>(
    draft: &M,
    prompt: &[u32],
    output: &[u32],
) -> Result<Vec<usize>> {
    if prompt.is_empty() {
        return Err(Error::invalid("draft ranks need a non-empty prompt"));
    }
    let mut cache = draft.new_cache(RotatingStrategy::Staged)?;
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(output);
    let logits = draft.forward(&seq, &mut cache)?;
    let rows = logits
        .narrow(0, prompt.len() - 1, output.len())?
        .to_dtype(DType::F32)?
        .to_vec2::<f32>()?;
    Ok(rows
        .iter()
        .zip(output)
        .map(|(row, &token)| {
            let t = token as usize;
            let v = row.get(t).copied().unwrap_or(f32::NEG_INFINITY);
            row.iter()
                .enumerate()
                .filter(|&(i, &x)| x > v || (x == v && i < t))
                .count()
        })
        .collect())
}

/// Target forwards after the prefill (verification steps) that the full tree of `width` and
/// depth `gamma` needs to produce `ranks.len()` output tokens, given the draft `ranks` of
/// those tokens (see [`draft_ranks`]). Follows the tree decode loop: the prefill yields
/// token 0; a step's depth is `min(gamma, max_new_tokens − produced − 1)`; a step yields its
/// accepted tokens plus one. An output shorter than `max_new_tokens` ended at EOS.
pub fn full_tree_steps(
    ranks: &[usize],
    width: usize,
    gamma: usize,
    max_new_tokens: usize,
) -> usize {
    let (mut pos, mut steps) = (1, 0);
    while pos < ranks.len() {
        let depth = gamma.min(max_new_tokens.saturating_sub(pos + 1));
        let end = (pos + depth).min(ranks.len());
        let accepted = ranks[pos..end].iter().take_while(|&&r| r < width).count();
        pos += accepted + 1;
        steps += 1;
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_follow_the_runs_of_top_width_tokens() {
        // Token 0 comes from the prefill. Ranks 0 0 1 0 | 3 | 0 0 0 0 | 0.
        let ranks = [9, 0, 0, 1, 0, 3, 0, 0, 0, 0, 0];
        // Width 1: [0 0] then next (the rank-1 token); [0] next (rank 3); [0 0 0 0] + 1 → end.
        assert_eq!(full_tree_steps(&ranks, 1, 4, 100), 3);
        // Width 2: [0 0 1 0] + the rank-3 token; [0 0 0 0] + 1 → end.
        assert_eq!(full_tree_steps(&ranks, 2, 4, 100), 2);
        // Width 4 accepts everything: 4 + 1, then 4 + 1 → 11 tokens in 2 steps.
        assert_eq!(full_tree_steps(&ranks, 4, 4, 100), 2);
        // γ = 1: each step yields at most 2 tokens.
        assert_eq!(full_tree_steps(&ranks, 4, 1, 100), 5);
    }

    #[test]
    fn the_depth_shrinks_before_max_new_tokens() {
        // 6 tokens of 6 allowed: after token 0, depth min(4, 6 - 1 - 1) = 4 → tokens 1..=5.
        assert_eq!(full_tree_steps(&[0; 6], 2, 4, 6), 1);
        // 7 allowed: positions 1..=5 need one step, position 6 another.
        assert_eq!(full_tree_steps(&[0; 7], 2, 4, 7), 2);
        assert_eq!(full_tree_steps(&[0; 1], 2, 4, 1), 0);
    }
}
