//! Invariants of the decoding engine, on tiny attention models over the real cache layer:
//! greedy speculative output equals greedy autoregressive output for every drafter, γ and
//! cache kind; a draft equal to the target is always accepted; exact stops; seeded runs
//! repeat; the n-gram drafter thrives on repetitive text.
mod common;

use std::cell::Cell;
use std::sync::Arc;

use candle_core::Tensor;
use common::run::fresh;
use common::Toy;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::nn::DeviceTokens;
use specdec::speculative::{
    Drafter, Drafting, GammaPolicy, GenParams, GenerationRecord, LanguageModel, ModelDrafter,
    NgramDrafter, SamplingParams, StopReason,
};

const VOCAB: usize = 40;

fn params(max_new_tokens: usize, gamma: GammaPolicy, sampling: SamplingParams) -> GenParams {
    GenParams {
        max_new_tokens,
        sampling,
        gamma,
        stop_at_eos: true,
    }
}

fn run_ar(
    target: &Toy,
    prompt: &[u32],
    p: &GenParams,
    strategy: RotatingStrategy,
    seed: u64,
) -> GenerationRecord {
    let mut cache = target.new_cache(strategy).unwrap();
    fresh(
        target,
        &mut cache,
        prompt,
        p,
        Drafting::None,
        &mut StdRng::seed_from_u64(seed),
    )
    .unwrap()
}

fn run_spec(
    target: &Toy,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    p: &GenParams,
    strategy: RotatingStrategy,
    seed: u64,
) -> GenerationRecord {
    let mut cache = target.new_cache(strategy).unwrap();
    fresh(
        target,
        &mut cache,
        prompt,
        p,
        Drafting::chain(drafter),
        &mut StdRng::seed_from_u64(seed),
    )
    .unwrap()
}

/// Targets: full attention, and a sliding window of 5 run far past it (60 new tokens).
fn targets() -> Vec<Toy> {
    vec![
        Toy::new(VOCAB, 16, 1, 3.0, None),
        Toy::new(VOCAB, 16, 2, 3.0, Some(5)),
    ]
}

fn strategies() -> [RotatingStrategy; 2] {
    [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 8 },
    ]
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![3],
        vec![1, 2, 3, 1, 2],
        vec![7, 7, 7, 9, 11, 13, 7, 7, 9],
    ]
}

/// Drafters of every kind: a near copy of the target, an unrelated model, prompt lookup.
fn drafters(target: &Toy, seed: u64, strategy: RotatingStrategy) -> Vec<Box<dyn Drafter>> {
    let close = Arc::new(Toy::new(VOCAB, 16, seed, 3.0, target.window));
    let other = Arc::new(Toy::new(VOCAB, 8, seed + 100, 3.0, Some(3)));
    vec![
        Box::new(ModelDrafter::new("close", close, strategy, None).unwrap()),
        Box::new(ModelDrafter::new("other", other, strategy, Some(0.3)).unwrap()),
        Box::new(NgramDrafter::new("ngram", 1, 3).unwrap()),
    ]
}

#[test]
fn greedy_speculative_equals_greedy_autoregressive() {
    for (ti, target) in targets().iter().enumerate() {
        for strategy in strategies() {
            for prompt in prompts() {
                let ar = run_ar(
                    target,
                    &prompt,
                    &params(60, GammaPolicy::Fixed(1), SamplingParams::greedy()),
                    strategy,
                    0,
                );
                assert_eq!(ar.output_ids.len(), 60);
                for gamma in [
                    GammaPolicy::Fixed(1),
                    GammaPolicy::Fixed(2),
                    GammaPolicy::Fixed(4),
                    GammaPolicy::Fixed(8),
                    GammaPolicy::Adaptive {
                        min: 1,
                        max: 8,
                        start: 4,
                    },
                ] {
                    for mut drafter in drafters(target, ti as u64 + 10, strategy) {
                        let p = params(60, gamma, SamplingParams::greedy());
                        let sp = run_spec(target, drafter.as_mut(), &prompt, &p, strategy, 0);
                        assert_eq!(
                            sp.output_ids,
                            ar.output_ids,
                            "target {ti}, {strategy:?}, {gamma:?}, drafter {}",
                            drafter.name()
                        );
                        assert_eq!(sp.stop_reason, Some(StopReason::MaxTokens));
                        let accepted: usize = sp.accepted.iter().sum();
                        // Each step yields its accepted drafts plus one target token.
                        assert_eq!(accepted + sp.accepted.len() + 1, sp.output_ids.len());
                        assert_eq!(sp.target_forwards, sp.accepted.len() + 1);
                    }
                }
            }
        }
    }
}

#[test]
fn a_draft_equal_to_the_target_is_always_accepted_greedily() {
    for target in targets() {
        let same = Arc::new(Toy::new(
            VOCAB,
            16,
            if target.window.is_some() { 2 } else { 1 },
            3.0,
            target.window,
        ));
        for strategy in strategies() {
            for g in [1, 2, 4, 8] {
                let mut drafter = ModelDrafter::new("same", same.clone(), strategy, None).unwrap();
                let p = params(50, GammaPolicy::Fixed(g), SamplingParams::greedy());
                let sp = run_spec(&target, &mut drafter, &[5, 6], &p, strategy, 0);
                assert!(!sp.proposed.is_empty());
                assert_eq!(sp.accepted, sp.proposed, "γ = {g}, {strategy:?}");
            }
        }
    }
}

#[test]
fn stops_exactly_at_eos_and_max_new_tokens_mid_block() {
    for target in targets() {
        let ar_full = run_ar(
            &target,
            &[4, 2],
            &params(40, GammaPolicy::Fixed(1), SamplingParams::greedy()),
            RotatingStrategy::Staged,
            0,
        );
        // Every token of the greedy output, in turn, as the end-of-sequence token.
        for &eos in ar_full.output_ids.iter().take(12) {
            let target = Toy::new(
                VOCAB,
                16,
                if target.window.is_some() { 2 } else { 1 },
                3.0,
                target.window,
            )
            .with_eos(vec![eos]);
            for max_new in [1, 2, 3, 5, 8, 13, 40] {
                let ar = run_ar(
                    &target,
                    &[4, 2],
                    &params(max_new, GammaPolicy::Fixed(1), SamplingParams::greedy()),
                    RotatingStrategy::Staged,
                    0,
                );
                let cut = ar_full.output_ids.iter().position(|&t| t == eos).unwrap() + 1;
                assert_eq!(ar.output_ids, ar_full.output_ids[..cut.min(max_new)]);
                for g in [1, 2, 4, 8] {
                    for strategy in strategies() {
                        for mut drafter in drafters(&target, 10, strategy) {
                            let p =
                                params(max_new, GammaPolicy::Fixed(g), SamplingParams::greedy());
                            let sp = run_spec(&target, drafter.as_mut(), &[4, 2], &p, strategy, 0);
                            assert_eq!(
                                sp.output_ids, ar.output_ids,
                                "eos {eos}, max {max_new}, γ {g}"
                            );
                            assert_eq!(sp.stop_reason, ar.stop_reason);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_sampled_tokens() {
    let target = Toy::new(VOCAB, 16, 1, 1.0, Some(4));
    let sampling = SamplingParams {
        temperature: 1.0,
        top_k: 10,
        top_p: 0.9,
    };
    let p = params(40, GammaPolicy::Fixed(4), sampling);
    let run = |seed| {
        let mut d = ModelDrafter::new(
            "d",
            Arc::new(Toy::new(VOCAB, 16, 9, 1.0, None)),
            RotatingStrategy::Staged,
            None,
        )
        .unwrap();
        run_spec(&target, &mut d, &[1, 2], &p, RotatingStrategy::Staged, seed).output_ids
    };
    assert_eq!(run(7), run(7));
    assert_ne!(
        run(7),
        run(8),
        "different seeds should differ on a 40-token sample"
    );
}

#[test]
fn ngram_drafter_reaches_high_acceptance_on_repetitive_text() {
    // A target whose greedy output counts upward cyclically: highly repetitive text.
    let target = Toy::new(VOCAB, 16, 1, 1.0, Some(8)).with_successor_bias(50.0);
    let mut drafter = NgramDrafter::new("ngram", 1, 3).unwrap();
    let p = params(200, GammaPolicy::Fixed(8), SamplingParams::greedy());
    // The prompt shows one full cycle, so lookups find matches from the first step.
    let prompt: Vec<u32> = (0..VOCAB as u32).collect();
    let sp = run_spec(
        &target,
        &mut drafter,
        &prompt,
        &p,
        RotatingStrategy::Staged,
        0,
    );
    let (acc, prop): (usize, usize) = (sp.accepted.iter().sum(), sp.proposed.iter().sum());
    let alpha = acc as f64 / prop as f64;
    assert!(alpha > 0.9, "acceptance {alpha}");
    assert!(
        sp.target_forwards * 4 < sp.output_ids.len(),
        "few target forwards per token"
    );
}

#[test]
fn an_eos_among_accepted_drafts_ends_the_generation_and_leaves_a_consistent_cache() {
    // The target drafting for itself: every draft is accepted, so blocks run on past an EOS.
    for target in targets() {
        let ar_full = run_ar(
            &target,
            &[4, 2],
            &params(40, GammaPolicy::Fixed(1), SamplingParams::greedy()),
            RotatingStrategy::Staged,
            0,
        );
        for &eos in ar_full.output_ids.iter().take(10) {
            let seed = if target.window.is_some() { 2 } else { 1 };
            let target = Toy::new(VOCAB, 16, seed, 3.0, target.window).with_eos(vec![eos]);
            let twin = Arc::new(Toy::new(VOCAB, 16, seed, 3.0, target.window));
            let p = params(40, GammaPolicy::Fixed(8), SamplingParams::greedy());
            let ar = run_ar(&target, &[4, 2], &p, RotatingStrategy::Staged, 0);
            for strategy in strategies() {
                let mut drafter =
                    ModelDrafter::new("twin", Arc::clone(&twin), strategy, None).unwrap();
                let sp = run_spec(&target, &mut drafter, &[4, 2], &p, strategy, 0);
                assert_eq!(sp.output_ids, ar.output_ids, "eos {eos}, {strategy:?}");
            }
        }
    }
}

/// A target that counts how its forwards arrive: with host ids, or with ids left on the
/// device (read back here: the toy has no device path of its own).
struct Counting {
    inner: Toy,
    host: Cell<usize>,
    device: Cell<usize>,
}

impl LanguageModel for Counting {
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> specdec::Result<Tensor> {
        self.host.set(self.host.get() + 1);
        self.inner.forward(tokens, cache)
    }
    fn forward_device(
        &self,
        ids: &DeviceTokens,
        cache: &mut ModelCache,
    ) -> specdec::Result<Tensor> {
        self.device.set(self.device.get() + 1);
        self.inner.forward(&ids.to_vec()?, cache)
    }
    fn new_cache(&self, strategy: RotatingStrategy) -> specdec::Result<ModelCache> {
        self.inner.new_cache(strategy)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn eos_token_ids(&self) -> &[u32] {
        self.inner.eos_token_ids()
    }
}

/// Greedy drafts of a draft model without a confidence threshold are verified where they
/// lie (`forward_device`: one device → host round trip a step), with the same output as
/// autoregressive decoding; drafts that need the host (a confidence threshold, sampling,
/// an n-gram drafter) take `forward`. Both stages of a device step are booked.
#[test]
fn greedy_model_drafts_are_verified_on_the_device() {
    for window in [None, Some(6)] {
        let target = Counting {
            inner: Toy::new(VOCAB, 16, 1, 3.0, window),
            host: Cell::new(0),
            device: Cell::new(0),
        };
        let draft = Arc::new(Toy::new(VOCAB, 16, 11, 3.0, window));
        let strategy = RotatingStrategy::Staged;
        let greedy = params(50, GammaPolicy::Fixed(4), SamplingParams::greedy());
        let mut cache = target.new_cache(strategy).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        let ar = fresh(
            &target,
            &mut cache,
            &[3, 1, 4],
            &greedy,
            Drafting::None,
            &mut rng,
        )
        .unwrap();
        let sampled = params(
            50,
            GammaPolicy::Fixed(4),
            SamplingParams {
                temperature: 0.8,
                ..SamplingParams::greedy()
            },
        );
        let cases: Vec<(Box<dyn Drafter>, &GenParams, bool)> = vec![
            (
                Box::new(ModelDrafter::new("plain", Arc::clone(&draft), strategy, None).unwrap()),
                &greedy,
                true,
            ),
            (
                Box::new(
                    ModelDrafter::new("threshold", Arc::clone(&draft), strategy, Some(0.2))
                        .unwrap(),
                ),
                &greedy,
                false,
            ),
            (
                Box::new(ModelDrafter::new("sampled", Arc::clone(&draft), strategy, None).unwrap()),
                &sampled,
                false,
            ),
            (
                Box::new(NgramDrafter::new("ngram", 1, 3).unwrap()),
                &greedy,
                false,
            ),
        ];
        for (mut drafter, p, on_device) in cases {
            target.host.set(0);
            target.device.set(0);
            let mut cache = target.new_cache(strategy).unwrap();
            let mut rng = StdRng::seed_from_u64(0);
            let sp = fresh(
                &target,
                &mut cache,
                &[3, 1, 4],
                p,
                Drafting::chain(drafter.as_mut()),
                &mut rng,
            )
            .unwrap();
            let name = drafter.name().to_string();
            if p.sampling.is_greedy() {
                assert_eq!(sp.output_ids, ar.output_ids, "{window:?} {name}");
            }
            let steps = sp.accepted.len();
            assert!(steps >= 10, "{window:?} {name}: {steps} steps");
            let (device, host) = (target.device.get(), target.host.get());
            if on_device {
                // A step without drafts (the last token before max_new_tokens) has nothing
                // to verify on the device; the prefill is the other host forward.
                let drafted = sp.proposed.iter().filter(|&&n| n > 0).count();
                assert!(drafted + 1 >= steps, "{window:?} {name}");
                assert_eq!(
                    (device, host),
                    (drafted, 1 + steps - drafted),
                    "{window:?} {name}"
                );
            } else {
                assert_eq!((device, host), (0, steps + 1), "{window:?} {name}");
            }
            assert!(sp.draft_s > 0.0 && sp.verify_s > 0.0, "{window:?} {name}");
            assert!(sp.draft_s + sp.verify_s <= sp.wall_s, "{window:?} {name}");
        }
    }
}
