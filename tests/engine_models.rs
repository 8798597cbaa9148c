//! The engine on the shipped trained pair (`models/target`: Mistral architecture with a
//! sliding window of 64 → rotating caches; `models/draft`: Llama architecture, full
//! attention): greedy speculative output equals greedy autoregressive output token for token
//! for every drafter, γ ∈ {1, 2, 4, 8} and rotating strategy, generating far past the window;
//! and the trained draft is useful.
use std::path::Path;
use std::sync::Arc;

use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::{load_tokenizer, Model};
use specdec::speculative::{
    autoregressive, speculative, Drafter, GammaPolicy, GenParams, LanguageModel, ModelDrafter,
    NgramDrafter, SamplingParams,
};

#[path = "common/device.rs"]
mod device;

fn load(name: &str) -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name);
    Model::load(&dir, &device::load_options()).expect("the shipped model loads")
}

fn prompt(text: &str) -> Vec<u32> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/target");
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
    let target = load("target");
    assert_eq!(target.info().sliding_window, Some(64));
    let draft = Arc::new(load("draft"));
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
            let ar = autoregressive(&target, &mut cache, p, &greedy(160, 1), &mut rng).unwrap();
            for gamma in [1, 2, 4, 8] {
                let drafters: Vec<Box<dyn Drafter>> = vec![
                    Box::new(ModelDrafter::new("draft", draft.clone(), strategy, None).unwrap()),
                    Box::new(NgramDrafter::new("ngram", 1, 3).unwrap()),
                ];
                for mut d in drafters {
                    let sp = speculative(
                        &target,
                        &mut cache,
                        d.as_mut(),
                        p,
                        &greedy(160, gamma),
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
    assert_eq!(load("target").vocab_size(), load("draft").vocab_size());
}
