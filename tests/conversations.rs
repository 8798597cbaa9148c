//! Conversations and shared prefixes on real checkpoints: greedy outputs with the prefix
//! store on, and with caches continued from the previous turn, equal outputs of a fresh full
//! prefill of every turn's whole prompt — for a sliding-window target (the shipped Mistral,
//! window 64), a full-attention target (the shipped Llama draft used as a target) and a mixed
//! one (the Gemma 3 fixture: 5 sliding layers of window 8, 1 global), both rotating
//! strategies, autoregressive, chain-speculative and tree-speculative (draft model, EAGLE-3
//! and n-gram drafters), turns 1 and 2. Two conversations share a system text longer than every window.
mod common;

use std::sync::Arc;

use common::run::fresh;

use common::checkpoint::{load_on_cpu, repo_path, shipped_on_cpu};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::{ModelCache, PrefixStore, RotatingStrategy};
use specdec::models::{load_eagle3, Model};
use specdec::speculative::{
    generate, CachedSequence, Drafter, Drafting, Eagle3Drafter, GammaPolicy, GenParams,
    GenerationRecord, ModelDrafter, NgramDrafter, ResidualRule, SamplingParams, TreeParams,
};

fn greedy(gamma: usize) -> GenParams {
    GenParams {
        max_new_tokens: 40,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: true,
    }
}

/// Deterministic token ids below `vocab` (the fixtures have no tokenizer).
fn text(seed: u32, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).rotate_left(seed % 31) ^ seed) % (vocab - 1) + 1)
        .collect()
}

/// Two conversations `[system + question 1, answer 1 + question 2]` sharing the system text.
struct Script {
    system: Vec<u32>,
    questions: [[Vec<u32>; 2]; 2],
}

impl Script {
    fn new(vocab: u32) -> Self {
        Self {
            system: text(1, 150, vocab),
            questions: [
                [text(2, 9, vocab), text(3, 7, vocab)],
                [text(4, 6, vocab), text(5, 11, vocab)],
            ],
        }
    }
}

/// How a conversation is decoded.
enum Method {
    Autoregressive,
    Speculative(Box<dyn Drafter>),
    /// Trees of depth 3, width 2, at most [`TREE_BUDGET`] nodes.
    Tree(Box<dyn Drafter>),
}

const TREE_BUDGET: usize = 6;

fn run(
    target: &Model,
    seq: &mut CachedSequence,
    method: &mut Method,
    prompt: &[u32],
) -> GenerationRecord {
    let mut rng = StdRng::seed_from_u64(0);
    match method {
        Method::Autoregressive => {
            generate(target, seq, prompt, &greedy(1), Drafting::None, &mut rng).unwrap()
        }
        Method::Speculative(d) => generate(
            target,
            seq,
            prompt,
            &greedy(3),
            Drafting::chain(d.as_mut()),
            &mut rng,
        )
        .unwrap(),
        Method::Tree(d) => {
            let tree = TreeParams {
                width: 2,
                budget: TREE_BUDGET,
                residual: ResidualRule::Exact,
            };
            let params = greedy(3);
            generate(
                target,
                seq,
                prompt,
                &params,
                Drafting::tree(d.as_mut(), tree),
                &mut rng,
            )
            .unwrap()
        }
    }
}

/// Reference: each turn's whole prompt prefilled from an empty cache, autoregressively.
fn reference(target: &Model, strategy: RotatingStrategy, script: &Script) -> Vec<Vec<u32>> {
    let mut outputs = Vec::new();
    let mut cache: ModelCache = target.new_cache(strategy).unwrap();
    for [q1, q2] in &script.questions {
        let p1 = [script.system.as_slice(), q1].concat();
        let mut rng = StdRng::seed_from_u64(0);
        let a1 = fresh(
            target,
            &mut cache,
            &p1,
            &greedy(1),
            Drafting::None,
            &mut rng,
        )
        .unwrap();
        let p2 = [p1.as_slice(), &a1.output_ids, q2].concat();
        let a2 = fresh(
            target,
            &mut cache,
            &p2,
            &greedy(1),
            Drafting::None,
            &mut rng,
        )
        .unwrap();
        outputs.extend([a1.output_ids, a2.output_ids]);
    }
    outputs
}

/// Both conversations through one sequence (the store, when present, is shared): turn 2
/// continues turn 1's cache; a new conversation starts from the store alone. Checks the
/// reuse counts and returns the four outputs.
fn converse(
    target: &Model,
    seq: &mut CachedSequence,
    method: &mut Method,
    script: &Script,
) -> Vec<Vec<u32>> {
    let mut outputs = Vec::new();
    for (c, [q1, q2]) in script.questions.iter().enumerate() {
        seq.reset();
        if let Method::Speculative(d) | Method::Tree(d) = method {
            d.reset().unwrap();
        }
        let p1 = [script.system.as_slice(), q1].concat();
        let t1 = run(target, seq, method, &p1);
        assert_eq!(
            t1.prefill_tokens_computed + t1.prefill_tokens_reused,
            p1.len()
        );
        // A drafter reading the target's hidden states takes no prefix from the store.
        let reads_states = match method {
            Method::Speculative(d) | Method::Tree(d) => d.target_layers().is_some(),
            Method::Autoregressive => false,
        };
        if c == 1 && seq.store().is_some() && !reads_states {
            assert!(
                t1.prefill_tokens_reused > 0,
                "the system text comes from the store"
            );
        }
        let p2 = [p1.as_slice(), &t1.output_ids, q2].concat();
        let t2 = run(target, seq, method, &p2);
        // Everything turn 1 committed is kept: all of it but its last token.
        let held = p1.len() + t1.output_ids.len() - 1;
        assert!(t2.prefill_tokens_reused >= held, "turn 2 continues turn 1");
        outputs.extend([t1.output_ids, t2.output_ids]);
    }
    outputs
}

fn check_target(target: &Model, drafter: Option<Arc<Model>>, head: Option<&std::path::Path>) {
    let vocab = target.info().vocab_size as u32;
    let script = Script::new(vocab);
    for strategy in [
        RotatingStrategy::Staged,
        // Slack rings roll back the largest block: a tree's nodes.
        RotatingStrategy::Slack {
            max_draft: TREE_BUDGET,
        },
    ] {
        let expected = reference(target, strategy, &script);
        for store in [false, true] {
            let mut methods = vec![
                Method::Autoregressive,
                Method::Speculative(Box::new(NgramDrafter::new("ngram", 1, 3).unwrap())),
                Method::Tree(Box::new(NgramDrafter::new("ngram", 1, 3).unwrap())),
            ];
            if let Some(d) = &drafter {
                let draft = || {
                    let m = ModelDrafter::new("draft", d.clone(), strategy, None).unwrap();
                    if store {
                        m.with_prefix_store(PrefixStore::new(64 << 20), 32)
                    } else {
                        m
                    }
                };
                methods.push(Method::Speculative(Box::new(draft())));
                methods.push(Method::Tree(Box::new(draft())));
            }
            if let Some(dir) = head {
                let head = load_eagle3(dir, target.num_layers(), target.embedding()).unwrap();
                let head = Arc::new(head);
                let eagle = || Box::new(Eagle3Drafter::new("eagle3", Arc::clone(&head)).unwrap());
                methods.push(Method::Speculative(eagle()));
                methods.push(Method::Tree(eagle()));
            }
            for mut method in methods {
                let mut seq = CachedSequence::new(target.new_cache(strategy).unwrap());
                if store {
                    // Checkpoints every 32 tokens: the 150-token system text crosses four.
                    seq.set_store(PrefixStore::new(64 << 20), 32);
                }
                let got = converse(target, &mut seq, &mut method, &script);
                let name = match &method {
                    Method::Autoregressive => "autoregressive".to_string(),
                    Method::Speculative(d) => d.name().to_string(),
                    Method::Tree(d) => format!("{} tree", d.name()),
                };
                assert_eq!(got, expected, "{name} {strategy:?} store={store}");
            }
        }
    }
}

#[test]
fn sliding_window_target_with_store_and_continued_turns_equals_fresh_prefills() {
    check_target(
        &shipped_on_cpu("target"),
        Some(Arc::new(shipped_on_cpu("draft"))),
        Some(&repo_path("models/eagle3")),
    );
}

#[test]
fn full_attention_target_with_store_and_continued_turns_equals_fresh_prefills() {
    let tmp = tempfile::tempdir().unwrap();
    common::eagle3::random_head(tmp.path(), (1024, 128), &[0, 1, 2], 1024, 3);
    check_target(
        &shipped_on_cpu("draft"),
        Some(Arc::new(shipped_on_cpu("draft"))),
        Some(tmp.path()),
    );
}

#[test]
fn mixed_target_with_store_and_continued_turns_equals_fresh_prefills() {
    // A random head over layers of both kinds (vLLM's default ids for six layers: 2, 3, 3).
    let tmp = tempfile::tempdir().unwrap();
    common::eagle3::random_head(tmp.path(), (256, 64), &[2, 3, 3], 200, 5);
    let target = load_on_cpu(&repo_path("tests/fixtures/hf/gemma3"));
    check_target(&target, None, Some(tmp.path()));
}
