//! The engine on the shipped trained pair (`models/target`: Mistral architecture with a
//! sliding window of 64 → rotating caches; `models/draft`: Llama architecture, full
//! attention): greedy speculative output equals greedy autoregressive output token for token
//! for every drafter, γ ∈ {1, 2, 4, 8} and rotating strategy, generating far past the window;
//! the trained draft is useful; and its greedy drafts chained on the device are the drafts
//! read back step by step.
mod common;

use std::sync::Arc;

use common::run::fresh;

use common::checkpoint::{repo_path, shipped};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::load_tokenizer;
use specdec::speculative::{
    Drafter, Drafting, GammaPolicy, GenParams, LanguageModel, ModelDrafter, NgramDrafter,
    SamplingParams,
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

#[test]
fn greedy_speculative_equals_autoregressive_on_the_trained_pair() {
    let target = shipped("target");
    assert_eq!(target.info().sliding_window, Some(64));
    let draft = Arc::new(shipped("draft"));
    let prompts = [
        prompt("import os\n\n\ndef "),
        prompt("class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def __init__(self, "),
    ];
    let mut alphas = Vec::new();
    for strategy in [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 8 },
    ] {
        for p in &prompts {
            let mut cache = target.new_cache(strategy).unwrap();
            let mut rng = StdRng::seed_from_u64(0);
            // 160 new tokens: well past the 64-token window.
            let ar = fresh(
                &target,
                &mut cache,
                p,
                &greedy(160, 1),
                Drafting::None,
                &mut rng,
            )
            .unwrap();
            for gamma in [1, 2, 4, 8] {
                let drafters: Vec<Box<dyn Drafter>> = vec![
                    Box::new(ModelDrafter::new("draft", draft.clone(), strategy, None).unwrap()),
                    Box::new(NgramDrafter::new("ngram", 1, 3).unwrap()),
                ];
                for mut d in drafters {
                    let sp = fresh(
                        &target,
                        &mut cache,
                        p,
                        &greedy(160, gamma),
                        Drafting::chain(d.as_mut()),
                        &mut rng,
                    )
                    .unwrap();
                    assert_eq!(
                        sp.output_ids,
                        ar.output_ids,
                        "{} γ={gamma} {strategy:?}",
                        d.name()
                    );
                    if d.name() == "draft" && gamma == 4 {
                        let acc: usize = sp.accepted.iter().sum();
                        let prop: usize = sp.proposed.iter().sum();
                        alphas.push(acc as f64 / prop as f64);
                    }
                }
            }
        }
    }
    let mean = alphas.iter().sum::<f64>() / alphas.len() as f64;
    assert!(
        mean >= 0.4,
        "greedy acceptance of the trained draft at γ=4: {mean:.3}"
    );
}

#[test]
fn the_shipped_pair_shares_a_vocabulary() {
    assert_eq!(
        shipped("target").vocab_size(),
        shipped("draft").vocab_size()
    );
}

/// Greedy drafting chained on the device (no confidence threshold) proposes exactly the
/// drafts of the path that reads each argmax back (a threshold of 0, which never stops a
/// chain): the same accepted count at every step. Output equality alone would not show it,
/// as verification corrects any draft.
#[test]
fn drafts_chained_on_the_device_equal_drafts_read_back_each_step() {
    let target = shipped("target");
    let draft = Arc::new(shipped("draft"));
    let p = prompt("import os\n\n\ndef ");
    let strategy = RotatingStrategy::Slack { max_draft: 8 };
    for gamma in [2, 4, 8] {
        let run = |confidence: Option<f32>| {
            let mut cache = target.new_cache(strategy).unwrap();
            let mut drafter =
                ModelDrafter::new("draft", draft.clone(), strategy, confidence).unwrap();
            let mut rng = StdRng::seed_from_u64(0);
            fresh(
                &target,
                &mut cache,
                &p,
                &greedy(96, gamma),
                Drafting::chain(&mut drafter),
                &mut rng,
            )
            .unwrap()
        };
        let (chained, read_back) = (run(None), run(Some(0.0)));
        assert_eq!(chained.output_ids, read_back.output_ids, "γ={gamma}");
        assert_eq!(chained.proposed, read_back.proposed, "γ={gamma}: proposals");
        assert_eq!(
            chained.accepted, read_back.accepted,
            "γ={gamma}: accepted per step"
        );
        assert!(
            chained.accepted.iter().sum::<usize>() > 0,
            "γ={gamma}: the trained draft had nothing accepted"
        );
    }
}
