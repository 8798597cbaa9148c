//! The full-tree bound of greedy tree speculation on the shipped trained pair: computed from
//! one teacher-forced draft pass, it predicts exactly the verification steps of the chain
//! (width 1) and of the full binary tree (width 2 at γ = 4: 2, 4, 8 and 16 nodes per level,
//! budget 30), and no width-2 tree under a smaller budget needs fewer steps.
mod common;

use std::sync::Arc;

use common::run::fresh;

use common::checkpoint::{repo_path, shipped_on_cpu};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::load_tokenizer;
use specdec::speculative::{
    draft_ranks, full_tree_steps, Drafting, GammaPolicy, GenParams, ModelDrafter, ResidualRule,
    SamplingParams, TreeParams,
};

#[test]
fn the_full_tree_bound_matches_decoding_on_the_trained_pair() {
    let target = shipped_on_cpu("target");
    let draft = Arc::new(shipped_on_cpu("draft"));
    let dir = repo_path("models/target");
    let tok = load_tokenizer(&dir).expect("tokenizer");
    let text = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n";
    let p = tok.encode(text, false).expect("encode").get_ids().to_vec();
    let (gamma, max_new) = (4, 120);
    let params = |gamma| GenParams {
        max_new_tokens: max_new,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: true,
    };
    let strategy = RotatingStrategy::Staged;
    let mut cache = target.new_cache(strategy).unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let ar = fresh(
        &target,
        &mut cache,
        &p,
        &params(1),
        Drafting::None,
        &mut rng,
    )
    .unwrap();
    let ranks = draft_ranks(draft.as_ref(), &p, &ar.output_ids).unwrap();
    let mut steps = |width, budget| {
        let mut d = ModelDrafter::new("draft", draft.clone(), strategy, None).unwrap();
        let tree = TreeParams {
            width,
            budget,
            residual: ResidualRule::Exact,
        };
        let r = fresh(
            &target,
            &mut cache,
            &p,
            &params(gamma),
            Drafting::tree(&mut d, tree),
            &mut rng,
        )
        .unwrap();
        assert_eq!(r.output_ids, ar.output_ids, "width {width} budget {budget}");
        r.accepted.len()
    };
    let (chain, full, budget_16) = (steps(1, gamma), steps(2, 30), steps(2, 16));
    let bound = |width| full_tree_steps(&ranks, width, gamma, max_new);
    // Equal, not just bounded: the draft's logits over a tree block and over the plain
    // sequence agree to the argmax on this prompt (CPU, f32).
    assert_eq!(chain, bound(1), "the chain");
    assert_eq!(full, bound(2), "the full binary tree");
    assert!(
        budget_16 >= full,
        "budget 16: {budget_16} steps, bound {full}"
    );
    assert!(
        full < chain,
        "the tree saves steps on this prompt: {full} vs {chain}"
    );
}
