//! Tree speculation on the shipped trained pair (`models/target`: Mistral with a sliding
//! window of 64 → rotating caches; `models/draft`: Llama, full attention): greedy tree
//! speculative output equals greedy autoregressive output token for token, for every tested
//! width, budget and γ, on both rotating strategies, generating far past the window; and the
//! width-1 tree is the chain, step for step.
mod common;

use common::run::fresh;
use std::sync::Arc;

use common::checkpoint::{repo_path, shipped_on_cpu};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::load_tokenizer;
use specdec::speculative::{
    Drafter, Drafting, GammaPolicy, GenParams, LanguageModel, ModelDrafter, NgramDrafter,
    ResidualRule, SamplingParams, TreeParams,
};

fn prompt(text: &str) -> Vec<u32> {
    let dir = repo_path("models/target");
    let tok = load_tokenizer(&dir).expect("tokenizer");
    tok.encode(text, false).expect("encode").get_ids().to_vec()
}

fn greedy(max_new_tokens: usize, gamma: usize) -> GenParams {
    GenParams {
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: true,
    }
}

fn tree(width: usize, budget: usize) -> TreeParams {
    TreeParams {
        width,
        budget,
        residual: ResidualRule::Exact,
    }
}

/// (γ, width, budget): chains, budgets below and above what the width fills, wide trees.
const SHAPES: [(usize, usize, usize); 6] = [
    (4, 1, 4),
    (4, 2, 4),
    (4, 2, 16),
    (3, 3, 12),
    (6, 2, 7),
    (2, 4, 20),
];

#[test]
fn greedy_tree_speculative_equals_autoregressive_on_the_trained_pair() {
    let target = shipped_on_cpu("target");
    assert_eq!(target.info().sliding_window, Some(64));
    let draft = Arc::new(shipped_on_cpu("draft"));
    let p = prompt("class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def __init__(self, ");
    // The slack ring must roll back the largest block: budget + 1 tokens.
    for strategy in [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 20 },
    ] {
        let mut cache = target.new_cache(strategy).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        // 160 new tokens: well past the 64-token window.
        let ar = fresh(
            &target,
            &mut cache,
            &p,
            &greedy(160, 1),
            Drafting::None,
            &mut rng,
        )
        .unwrap();
        for (gamma, width, budget) in SHAPES {
            let drafters: Vec<Box<dyn Drafter>> = vec![
                Box::new(ModelDrafter::new("draft", draft.clone(), strategy, None).unwrap()),
                Box::new(
                    ModelDrafter::new("draft-conf", draft.clone(), strategy, Some(0.5)).unwrap(),
                ),
                Box::new(NgramDrafter::new("ngram", 1, 3).unwrap()),
            ];
            for mut d in drafters {
                let params = greedy(160, gamma);
                let shape = tree(width, budget);
                let sp = fresh(
                    &target,
                    &mut cache,
                    &p,
                    &params,
                    Drafting::tree(d.as_mut(), shape),
                    &mut rng,
                )
                .unwrap();
                let name = d.name().to_string();
                assert_eq!(
                    sp.output_ids, ar.output_ids,
                    "{name} γ={gamma} width={width} budget={budget} {strategy:?}"
                );
            }
        }
    }
}

/// Step for step, with and without a confidence threshold (which stops chains and prunes
/// trees before the same positions).
#[test]
fn a_tree_of_width_one_is_the_chain() {
    for confidence in [None, Some(0.4), Some(0.8)] {
        width_one_is_the_chain(confidence);
    }
}

fn width_one_is_the_chain(confidence: Option<f32>) {
    let target = shipped_on_cpu("target");
    let draft = Arc::new(shipped_on_cpu("draft"));
    let p = prompt("import os\n\n\ndef ");
    let strategy = RotatingStrategy::Staged;
    let mut cache = target.new_cache(strategy).unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let mut d = ModelDrafter::new("draft", draft, strategy, confidence).unwrap();
    let params = greedy(120, 4);
    let chain = fresh(
        &target,
        &mut cache,
        &p,
        &params,
        Drafting::chain(&mut d),
        &mut rng,
    )
    .unwrap();
    let as_tree = fresh(
        &target,
        &mut cache,
        &p,
        &params,
        Drafting::tree(&mut d, TreeParams::chain_of(4)),
        &mut rng,
    )
    .unwrap();
    let c = format!("confidence {confidence:?}");
    assert_eq!(as_tree.output_ids, chain.output_ids, "{c}");
    assert_eq!(as_tree.accepted, chain.accepted, "accepted per step, {c}");
    assert_eq!(as_tree.proposed, chain.proposed, "proposed per step, {c}");
    assert_eq!(as_tree.draft_forwards, chain.draft_forwards, "{c}");
    assert_eq!(as_tree.target_forwards, chain.target_forwards, "{c}");
    if confidence == Some(0.8) {
        assert!(
            chain.proposed.iter().any(|&p| p < 4),
            "the threshold stops some chains early"
        );
    }
}

/// The target drafting for itself (twin models, every path of its top children accepted), each
/// early output token in turn declared the end of sequence: accepted paths run on past the
/// EOS, and the generation must still end there with the cache holding exactly the committed
/// tokens, as the chain loop does.
#[test]
fn an_eos_inside_an_accepted_path_ends_the_generation() {
    for (seed, window) in [(1, None), (2, Some(5))] {
        let toy = || common::Toy::new(40, 16, seed, 3.0, window);
        let reference = toy();
        let mut cache = reference.new_cache(RotatingStrategy::Staged).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        let full = fresh(
            &reference,
            &mut cache,
            &[4, 2],
            &greedy(40, 1),
            Drafting::None,
            &mut rng,
        )
        .unwrap()
        .output_ids;
        for &eos in full.iter().take(10) {
            let target = toy().with_eos(vec![eos]);
            let twin = Arc::new(toy());
            let mut cache = target.new_cache(RotatingStrategy::Staged).unwrap();
            let ar = fresh(
                &target,
                &mut cache,
                &[4, 2],
                &greedy(40, 1),
                Drafting::None,
                &mut rng,
            )
            .unwrap();
            for strategy in [
                RotatingStrategy::Staged,
                RotatingStrategy::Slack { max_draft: 12 },
            ] {
                let mut cache = target.new_cache(strategy).unwrap();
                let mut d = ModelDrafter::new("twin", twin.clone(), strategy, None).unwrap();
                let sp = fresh(
                    &target,
                    &mut cache,
                    &[4, 2],
                    &greedy(40, 6),
                    Drafting::tree(&mut d, tree(2, 12)),
                    &mut rng,
                )
                .unwrap_or_else(|e| panic!("eos {eos}, {strategy:?}: {e}"));
                assert_eq!(sp.output_ids, ar.output_ids, "eos {eos}, {strategy:?}");
                assert_eq!(sp.stop_reason, ar.stop_reason, "eos {eos}, {strategy:?}");
            }
        }
    }
}
