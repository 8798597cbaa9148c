//! Token trees verified in recorded CUDA graph steps (the engine option `cuda_graphs`, as
//! `exp` runs): the split kernel masks each node's non-ancestors and rotates it at its depth
//! over the cache where it lies, so greedy tree speculation with graphs on gives exactly the
//! autoregressive output (f32), on the shipped rotating target under both strategies (ring
//! and side buffer) with the shipped draft drafting trees, and on the shipped draft as a
//! full-attention target with the target drafting trees over its rings; and on CUDA the
//! targets really recorded tree steps (a tree step that fell back to the ordinary path would
//! pass unseen). On the CPU graphs change nothing and the test checks the ordinary path.
//!
//! Its own test binary with one test: recording captures the device's whole stream, so no
//! other test may use the device meanwhile (see `specdec::nn::graphs_enabled`).
mod common;

use std::sync::Arc;

use common::checkpoint::{repo_path, shipped};
use common::run::fresh;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::load_tokenizer;
use specdec::speculative::{
    Drafting, GammaPolicy, GenParams, ModelDrafter, ResidualRule, SamplingParams, TreeParams,
};

fn greedy(max_new_tokens: usize, gamma: usize) -> GenParams {
    GenParams {
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: false,
    }
}

/// (γ, width, budget): a narrow tree, a wide one, a deep one; every verification block of
/// at most 16 rows (the recorded steps' limit).
const SHAPES: [(usize, usize, usize); 3] = [(4, 2, 6), (3, 3, 12), (6, 2, 9)];

#[test]
fn greedy_trees_in_recorded_steps_equal_autoregressive() {
    // The environment's `SPECDEC_*` overrides (`scripts/gpu-tests.sh` runs this test again
    // with `SPECDEC_TREE_IN_PLACE=0`: trees on the masked product beside recorded chains).
    let options = specdec::engine::EngineOptions {
        cuda_graphs: true,
        ..specdec::engine::env::overrides(specdec::engine::get()).expect("SPECDEC_* overrides")
    };
    specdec::engine::set(options).expect("engine options");
    let tok = load_tokenizer(&repo_path("models/target")).expect("tokenizer");
    let text = "def merge(left, right):\n    \"\"\"Merge two sorted lists.\"\"\"\n    ";
    let prompt = tok.encode(text, false).expect("encode").get_ids().to_vec();
    let target = Arc::new(shipped("target"));
    let draft = Arc::new(shipped("draft"));
    // (target, drafter, strategies): the rotating target under both strategies, the
    // full-attention draft as a target (its drafter's rings take the strategy).
    let slack = RotatingStrategy::Slack { max_draft: 16 };
    let pairs = [
        ("target", &target, &draft, [RotatingStrategy::Staged, slack]),
        ("draft", &draft, &target, [RotatingStrategy::Staged, slack]),
    ];
    for (name, t, d, strategies) in pairs {
        for strategy in strategies {
            let mut cache = t.new_cache(strategy).expect("cache");
            let mut rng = StdRng::seed_from_u64(0);
            // 150 new tokens: past the target's 64-token window, its rings wrapped.
            let ar = fresh(
                t.as_ref(),
                &mut cache,
                &prompt,
                &greedy(150, 1),
                Drafting::None,
                &mut rng,
            )
            .expect("autoregressive");
            for (gamma, width, budget) in SHAPES {
                let mut drafter =
                    ModelDrafter::new("tree", Arc::clone(d), strategy, None).expect("drafter");
                let shape = TreeParams {
                    width,
                    budget,
                    residual: ResidualRule::Exact,
                };
                let sp = fresh(
                    t.as_ref(),
                    &mut cache,
                    &prompt,
                    &greedy(150, gamma),
                    Drafting::tree(&mut drafter, shape),
                    &mut rng,
                )
                .expect("tree speculation");
                assert_eq!(
                    sp.output_ids, ar.output_ids,
                    "{name}, {strategy:?}: γ {gamma}, width {width}, budget {budget}"
                );
            }
        }
        if t.device().is_cuda() && options.fused_rope && options.tree_in_place {
            let made = t.graph_steps_made();
            assert!(
                made.iter().any(|&(rows, words)| rows > 1 && words > 1),
                "{name}: no token tree step was recorded: {made:?}"
            );
        }
    }
}
