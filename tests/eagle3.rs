//! The EAGLE-3 drafter: the target's hidden states handed out by its forwards equal a fresh
//! forward's, transactionally (a rolled-back block leaves none); greedy EAGLE-3 speculation
//! equals autoregressive decoding token for token, chains and trees, on a rotating target
//! (the shipped Mistral-architecture target, both strategies, far past its window) and a
//! full-attention one (the shipped Llama-architecture draft used as a target; SmolLM2-135M
//! where the real checkpoints are fetched). Greedy equality is asserted in f32 (in half
//! precision a verification block and a one-token step may break near-ties differently).
mod common;

use std::path::Path;
use std::sync::Arc;

use candle_core::Tensor;
use common::checkpoint::{repo_path, shipped};
use common::eagle3::random_head;
use common::host::rel_err;
use common::run::{fresh, greedy};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::models::{load_eagle3, Model};
use specdec::speculative::{Drafting, Eagle3Drafter, LanguageModel, TreeParams};

const STRATEGIES: [RotatingStrategy; 2] = [
    RotatingStrategy::Staged,
    // Room for the tree's block of 10 drafts.
    RotatingStrategy::Slack { max_draft: 10 },
];

fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    common::decode::tokens(n, vocab, seed)
}

/// The hidden states a fresh cache's one forward over `tokens` records for `layers`.
fn fresh_states(model: &Model, tokens: &[u32], layers: &[usize]) -> Tensor {
    let mut cache = model.new_cache(RotatingStrategy::Staged).unwrap();
    cache.tap_hidden(Some(layers));
    model.forward(tokens, &mut cache).unwrap();
    let (start, rows) = cache.take_hidden().unwrap().expect("rows");
    assert_eq!(start, 0);
    rows
}

#[test]
fn hidden_states_follow_the_cache_transactions() {
    let target = shipped("target");
    let vocab = target.info().vocab_size;
    // Every layer id: the embeddings (0), inner layers, the last layer's output (4), one twice.
    let layers = [0, 1, 2, 4, 2];
    for strategy in STRATEGIES {
        let all = tokens(120, vocab, 3);
        let mut cache: ModelCache = target.new_cache(strategy).unwrap();
        cache.tap_hidden(Some(&layers));
        target.forward_last(&all[..70], &mut cache).unwrap();
        // A block of 6 keeps 3; a block of 5 is rolled back; a tree block keeps a path.
        let mut spec = cache.speculate().unwrap();
        target.forward(&all[70..76], spec.cache()).unwrap();
        spec.commit(3).unwrap();
        let mut spec = cache.speculate().unwrap();
        target.forward(&tokens(5, vocab, 9), spec.cache()).unwrap();
        drop(spec);
        let mut spec = cache.speculate().unwrap();
        // Nodes: 0 (root child) -> 1, 0 -> 2 -> 3; keep the path 0, 2, 3.
        spec.extend_tree(&[None, Some(0), Some(0), Some(2)])
            .unwrap();
        let nodes = [all[73], 5, all[74], all[75]];
        target.forward(&nodes, spec.cache()).unwrap();
        spec.commit_path(&[0, 2, 3]).unwrap();
        let (start, rows) = cache.take_hidden().unwrap().expect("rows");
        assert_eq!(start, 0);
        assert!(
            cache.take_hidden().unwrap().is_none(),
            "rows handed out twice"
        );
        let expected = fresh_states(&target, &all[..76], &layers);
        assert_eq!(rows.dims(), expected.dims(), "{strategy:?}");
        let err = rel_err(&rows, &expected, 1e-3);
        let tol = common::decode::tolerance();
        assert!(err < tol, "{strategy:?}: relative error {err}");
    }
}

/// What [`check_greedy`] saw: accepted drafts per step without a confidence threshold, and
/// with one, how many chain steps stopped short of γ out of how many.
struct GreedyStats {
    mean_accepted: f64,
    short_chains: usize,
    chains: usize,
}

/// Greedy speculation with `head` on `target` equals autoregressive decoding for chains of
/// several lengths and a tree, every rotating strategy, with and without a confidence
/// threshold (`CONFIDENCE`).
fn check_greedy(
    target: &Model,
    head_dir: &Path,
    prompts: &[Vec<u32>],
    (new, strategies): (usize, &[RotatingStrategy]),
) -> GreedyStats {
    const CONFIDENCE: f32 = 0.5;
    let head =
        Arc::new(load_eagle3(head_dir, target.num_layers(), target.embedding()).expect("head"));
    let mut accepted = (0usize, 0usize);
    let (mut short_chains, mut chains) = (0, 0);
    for (&strategy, confidence) in strategies
        .iter()
        .flat_map(|s| [(s, None), (s, Some(CONFIDENCE))])
    {
        let mut drafter =
            Eagle3Drafter::with_confidence("eagle3", Arc::clone(&head), confidence).unwrap();
        for prompt in prompts {
            let mut cache = target.new_cache(strategy).unwrap();
            let mut rng = StdRng::seed_from_u64(0);
            let ar = fresh(
                target,
                &mut cache,
                prompt,
                &greedy(new, 1),
                Drafting::None,
                &mut rng,
            )
            .unwrap();
            let trees = [
                TreeParams::chain(),
                TreeParams {
                    width: 3,
                    budget: 10,
                    ..TreeParams::chain()
                },
            ];
            for gamma in [1, 3, 5] {
                for tree in trees {
                    let r = fresh(
                        target,
                        &mut cache,
                        prompt,
                        &greedy(new, gamma),
                        Drafting::tree(&mut drafter, tree),
                        &mut rng,
                    )
                    .unwrap();
                    assert_eq!(
                        r.output_ids, ar.output_ids,
                        "{strategy:?} γ = {gamma} tree width {} confidence {confidence:?}",
                        tree.width
                    );
                    assert!(r.draft_forwards > 0);
                    if confidence.is_none() {
                        accepted.0 += r.accepted.iter().sum::<usize>();
                        accepted.1 += r.accepted.len();
                    } else if tree.width == 1 && gamma > 1 {
                        // The last step may be cut by the token budget instead.
                        let steps = &r.proposed[..r.proposed.len().saturating_sub(1)];
                        short_chains += steps.iter().filter(|&&p| p < gamma).count();
                        chains += steps.len();
                    }
                }
            }
        }
    }
    GreedyStats {
        mean_accepted: accepted.0 as f64 / accepted.1 as f64,
        short_chains,
        chains,
    }
}

#[test]
fn greedy_eagle3_equals_autoregressive_on_a_rotating_target() {
    let target = shipped("target");
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (1024, 256), &[1, 2, 3], 300, 7);
    let prompts = [tokens(30, 1024, 1), tokens(90, 1024, 2)];
    // 150 new tokens: the 64-token window slides far.
    check_greedy(&target, tmp.path(), &prompts, (150, &STRATEGIES));
}

#[test]
fn greedy_eagle3_equals_autoregressive_on_a_full_attention_target() {
    let target = shipped("draft");
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (1024, 128), &[0, 1, 2], 1024, 11);
    let prompts = [tokens(20, 1024, 4), tokens(45, 1024, 5)];
    check_greedy(&target, tmp.path(), &prompts, (80, &STRATEGIES));
}

#[test]
fn greedy_eagle3_equals_autoregressive_on_smollm2() {
    let Some(path) = common::real::real_model(
        "greedy_eagle3_equals_autoregressive_on_smollm2",
        common::real::SMOLLM2,
    ) else {
        return;
    };
    let target = common::checkpoint::load(&path);
    let tmp = tempfile::tempdir().unwrap();
    // vLLM's default layers for 30 layers; a reduced draft vocabulary.
    random_head(tmp.path(), (49_152, 576), &[2, 15, 27], 2000, 13);
    let prompts = [tokens(30, 49_000, 6), tokens(50, 49_000, 8)];
    check_greedy(&target, tmp.path(), &prompts, (40, &STRATEGIES[..1]));
}

#[test]
fn an_oracle_runs_an_eagle3_head_for_its_cost() {
    use specdec::speculative::{Drafter, OracleDrafter, ReferenceStore};
    let target = Arc::new(shipped("target"));
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (1024, 256), &[1, 2, 3], 300, 7);
    let head = load_eagle3(tmp.path(), target.num_layers(), target.embedding()).unwrap();
    let oracle = OracleDrafter::new(
        "oracle",
        Arc::clone(&target),
        0.8,
        None,
        ReferenceStore::default(),
    )
    .unwrap();
    let mut oracle = oracle.with_eagle3_cost(Arc::new(head)).unwrap();
    let prompt = tokens(40, 1024, 3);
    let strategy = STRATEGIES[1];
    let mut cache = target.new_cache(strategy).unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let ar = fresh(
        target.as_ref(),
        &mut cache,
        &prompt,
        &greedy(90, 1),
        Drafting::None,
        &mut rng,
    )
    .unwrap();
    oracle.prepare(&prompt, 90).unwrap();
    let r = fresh(
        target.as_ref(),
        &mut cache,
        &prompt,
        &greedy(90, 4),
        Drafting::chain(&mut oracle),
        &mut rng,
    )
    .unwrap();
    assert_eq!(r.output_ids, ar.output_ids);
    assert_eq!(oracle.reference_mismatches(), 0);
    // The head's prefill, then per step one read of the new pairs and three drafting forwards.
    let steps = r.accepted.len();
    assert!(
        r.draft_forwards > 2 * steps,
        "{} forwards in {steps} steps",
        r.draft_forwards
    );
}
#[test]
fn the_trained_head_drafts_what_the_target_accepts() {
    let dir = repo_path("models/eagle3");
    let target = shipped("target");
    let tok = specdec::models::load_tokenizer(&repo_path("models/target")).unwrap();
    let prompt = |t: &str| tok.encode(t, false).unwrap().get_ids().to_vec();
    let prompts = [
        prompt("import os\n\n\ndef "),
        prompt("class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def __init__(self, "),
    ];
    let stats = check_greedy(&target, &dir, &prompts, (120, &STRATEGIES));
    // The trained head: well over one accepted draft per step (a random head accepts ~0).
    let mean = stats.mean_accepted;
    assert!(mean > 1.5, "mean accepted drafts per step {mean}");
    // Its confidence threshold stops some chains early and lets others run to γ (so the
    // equality above covered both).
    let (short, all) = (stats.short_chains, stats.chains);
    assert!(
        0 < short && short < all,
        "{short} of {all} chains stopped short"
    );
}

#[test]
fn bad_heads_are_refused_with_errors_naming_the_file_and_key() {
    let target = shipped("target");
    let load = |dir: &Path| {
        load_eagle3(dir, target.num_layers(), target.embedding())
            .err()
            .map(|e| e.to_string())
            .expect("a bad head must be refused")
    };
    // A head for another vocabulary.
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (512, 256), &[1, 2, 3], 100, 1);
    let e = load(tmp.path());
    assert!(e.contains("vocab_size") && e.contains("1024"), "{e}");
    // Fused layers past the target's.
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (1024, 256), &[1, 2, 9], 100, 1);
    let e = load(tmp.path());
    assert!(e.contains("eagle_aux_hidden_state_layer_ids"), "{e}");
    // A cut weights file.
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (1024, 256), &[1, 2, 3], 100, 1);
    let weights = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let e = load(tmp.path());
    assert!(e.contains("model.safetensors"), "{e}");
    // No weights at all.
    std::fs::remove_file(&weights).unwrap();
    let e = load(tmp.path());
    assert!(e.contains("pytorch_model.bin"), "{e}");
}
