//! The EAGLE-3 head's steps replayed as recorded CUDA graphs (the engine option
//! `cuda_graphs`, as `exp` runs): greedy EAGLE-3 chains with graphs on give exactly the
//! autoregressive output (f32; γ = 1, 3, 5; the shipped Llama-architecture draft as a
//! full-attention target and the shipped rotating target, slack strategy), and on CUDA the
//! head's steps really replayed recordings (a recording that failed would fall back to the
//! ordinary path unseen). With the trained head of the shipped target (which drafts what the
//! target accepts), proposals recorded as one graph each (`chain_graphs`) and step by step
//! draft the same: the same accepted drafts at every step, both equal to autoregressive
//! output. On the CPU graphs change nothing and the test checks the ordinary path.
//!
//! Its own test binary with one test: recording captures the device's whole stream, so no
//! other test may use the device meanwhile (see `specdec::nn::graphs_enabled`).
mod common;

use std::sync::Arc;

use common::checkpoint::shipped;
use common::decode::tokens;
use common::eagle3::random_head;
use common::run::fresh;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::load_eagle3;
use specdec::speculative::{Drafting, Eagle3Drafter, GammaPolicy, GenParams, SamplingParams};

#[test]
fn greedy_eagle3_with_recorded_head_steps_equals_autoregressive() {
    let options = specdec::engine::EngineOptions {
        cuda_graphs: true,
        ..specdec::engine::get()
    };
    specdec::engine::set(options).expect("engine options");
    let params = |new: usize, gamma: usize| GenParams {
        max_new_tokens: new,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: false,
    };
    let tmp = tempfile::tempdir().expect("temp dir");
    for (name, layers, seed) in [("draft", [0, 1, 2], 11), ("target", [1, 2, 3], 7)] {
        let target = shipped(name);
        let dir = tmp.path().join(name);
        let hidden = target.info().hidden_size;
        random_head(&dir, (1024, hidden), &layers, 1024, seed);
        let head =
            Arc::new(load_eagle3(&dir, target.num_layers(), target.embedding()).expect("head"));
        let mut drafter =
            Eagle3Drafter::with_confidence("eagle3", Arc::clone(&head), None).expect("drafter");
        for prompt in [tokens(20, 1024, 4), tokens(45, 1024, 5)] {
            let (mut cache, mut rng, ar) = autoregressive(&target, &prompt, &params(60, 1));
            for gamma in [1, 3, 5] {
                let drafting = Drafting::chain(&mut drafter);
                let r = fresh(
                    &target,
                    &mut cache,
                    &prompt,
                    &params(60, gamma),
                    drafting,
                    &mut rng,
                )
                .expect("speculative");
                assert_eq!(r.output_ids, ar.output_ids, "{name}: γ = {gamma}");
                assert!(r.draft_forwards > 0, "{name}: the head drafted nothing");
            }
        }
        if target.device().is_cuda() {
            assert!(
                head.graph_recordings() > 0,
                "{name}: the head recorded no CUDA graph (see the recording warning above)"
            );
        }
    }
    chained_proposals_draft_what_steps_draft(options, &params(100, 4));
}

/// The trained head on the shipped target, `chain_graphs` on and off: identical outputs and
/// accepted drafts per step, equal to autoregressive output; on CUDA only "on" chains.
fn chained_proposals_draft_what_steps_draft(
    options: specdec::engine::EngineOptions,
    params: &GenParams,
) {
    let target = shipped("target");
    let head = Arc::new(
        load_eagle3(
            &common::checkpoint::repo_path("models/eagle3"),
            target.num_layers(),
            target.embedding(),
        )
        .expect("trained head"),
    );
    for prompt in [tokens(30, 1024, 8), tokens(12, 1024, 9)] {
        let (mut cache, mut rng, ar) = autoregressive(&target, &prompt, params);
        let mut runs = Vec::new();
        for chain_graphs in [true, false] {
            specdec::engine::set(specdec::engine::EngineOptions {
                chain_graphs,
                ..options
            })
            .expect("engine options");
            let before = head.chained_proposals();
            let mut drafter =
                Eagle3Drafter::with_confidence("eagle3", Arc::clone(&head), None).expect("drafter");
            let drafting = Drafting::chain(&mut drafter);
            let r = fresh(&target, &mut cache, &prompt, params, drafting, &mut rng)
                .expect("speculative");
            assert_eq!(r.output_ids, ar.output_ids, "chain_graphs = {chain_graphs}");
            let chained = head.chained_proposals() - before;
            if target.device().is_cuda() && chain_graphs {
                assert!(chained > 0, "no proposal was recorded as one graph");
            } else {
                assert_eq!(chained, 0, "chain_graphs = {chain_graphs}");
            }
            runs.push(r.accepted);
        }
        assert!(
            runs[0].iter().sum::<usize>() > runs[0].len(),
            "the trained head accepted {:?}: too few to compare drafts",
            runs[0]
        );
        assert_eq!(
            runs[0], runs[1],
            "accepted drafts per step, chained vs step by step"
        );
    }
    specdec::engine::set(options).expect("engine options");
}

/// A slack-strategy cache of `target`, the generator, and the autoregressive generation after
/// `prompt` that speculation must reproduce.
fn autoregressive(
    target: &specdec::models::Model,
    prompt: &[u32],
    params: &GenParams,
) -> (
    specdec::cache::ModelCache,
    StdRng,
    specdec::speculative::GenerationRecord,
) {
    let strategy = RotatingStrategy::Slack { max_draft: 8 };
    let mut cache = target.new_cache(strategy).expect("cache");
    let mut rng = StdRng::seed_from_u64(0);
    let ar = fresh(target, &mut cache, prompt, params, Drafting::None, &mut rng)
        .expect("autoregressive");
    (cache, rng, ar)
}
