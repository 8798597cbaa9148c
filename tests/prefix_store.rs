//! Property test of the prefix store: after any sequence of prefills (store lookups, restores
//! and insertions), generations, evictions and conversation resets, the cache a prefill
//! leaves — and the cache after a generation — is exactly a fresh prefill of the same tokens:
//! every layer's window K/V (which encode token and position) and the prefill's logits.
//! Run on KV-only, rotating-only (both strategies) and mixed models, with windows and
//! checkpoint distances small enough that rings wrap and checkpoints are crossed often.
mod common;

use candle_core::Tensor;
use common::probe::{attend_queries, close, kv, HEAD_DIM};
use proptest::prelude::*;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::{
    KvCache, LayerCache, ModelCache, PrefixStore, RotatingKvCache, RotatingStrategy,
};
use specdec::speculative::{
    generate, CachedSequence, Drafting, GammaPolicy, GenParams, LanguageModel, NgramDrafter,
    SamplingParams,
};

const VOCAB: usize = 4;

/// Layers of a probe model: `None` is full attention, `Some(w)` a sliding window of `w`.
#[derive(Debug, Clone)]
struct Probe {
    layers: Vec<Option<usize>>,
}

impl LanguageModel for Probe {
    /// Every layer appends K/V encoding (token, position); the logits of a row depend on
    /// what each layer's attention returns, so generations follow the cache's contents.
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> specdec::Result<Tensor> {
        let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
        let (k, v) = kv(&bytes, cache.offset());
        let mut mix = vec![0f32; tokens.len()];
        for i in 0..self.layers.len() {
            let att = cache.layer_mut(i)?.append(&k, &v)?;
            let out = attend(&att, tokens, cache.offset() - tokens.len());
            for (row, m) in mix.iter_mut().enumerate() {
                *m += out[row * HEAD_DIM] * 0.37 + out[row * HEAD_DIM + 1] * 0.11;
            }
        }
        let logits: Vec<f32> = mix
            .iter()
            .flat_map(|m| (0..VOCAB).map(move |t| (m * (t as f32 + 1.3)).sin()))
            .collect();
        Ok(Tensor::from_vec(
            logits,
            (tokens.len(), VOCAB),
            &common::device(),
        )?)
    }

    fn new_cache(&self, strategy: RotatingStrategy) -> specdec::Result<ModelCache> {
        let layers = self
            .layers
            .iter()
            .map(|w| match w {
                None => Ok(LayerCache::Kv(KvCache::new(4))),
                Some(w) => Ok(LayerCache::Rotating(RotatingKvCache::new(*w, strategy)?)),
            })
            .collect::<specdec::Result<Vec<_>>>()?;
        Ok(ModelCache::new(layers))
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn eos_token_ids(&self) -> &[u32] {
        &[]
    }
}

/// `cache` holds exactly what a fresh prefill of `tokens` holds, layer by layer.
fn assert_fresh(model: &Probe, strategy: RotatingStrategy, cache: &ModelCache, tokens: &[u32]) {
    assert_eq!(cache.offset(), tokens.len(), "offset");
    let mut fresh = model.new_cache(strategy).unwrap();
    if !tokens.is_empty() {
        model.forward(tokens, &mut fresh).unwrap();
    }
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for (i, (a, b)) in cache.layers().iter().zip(fresh.layers()).enumerate() {
        let (a, b) = (a.logical_kv().unwrap(), b.logical_kv().unwrap());
        let a = a.map(|(k, v)| (flat(&k), flat(&v)));
        let b = b.map(|(k, v)| (flat(&k), flat(&v)));
        assert_eq!(a, b, "layer {i} K/V after {} tokens", tokens.len());
    }
}

/// softmax(q kᵀ + mask) v with each query a function of its token and position (so any
/// chunking of a prefill gives the same rows): `[tokens.len() * HEAD_DIM]`.
fn attend(a: &specdec::cache::Attend, tokens: &[u32], from: usize) -> Vec<f32> {
    let q: Vec<f32> = tokens
        .iter()
        .enumerate()
        .flat_map(|(i, &t)| [1.0 + 0.3 * ((from + i) % 5) as f32, 0.5 + 0.2 * t as f32])
        .collect();
    attend_queries(a, q)
}

#[derive(Debug, Clone)]
enum Op {
    /// Prefill the shared text's first `shared` tokens then `suffix` (a new prompt, or the
    /// next turn of the current conversation when `continue_turn`).
    Prefill {
        text: usize,
        shared: usize,
        suffix: Vec<u32>,
        continue_turn: bool,
    },
    /// Generate this many tokens greedily after the last prefill (speculatively, with
    /// prompt lookup drafting γ = 3, when the flag is set).
    Generate(usize, bool),
    /// Evict this many least-recently-used entries.
    Evict(usize),
    /// Start a new conversation: the cache is emptied (the store is kept).
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            0..2usize,
            0..24usize,
            prop::collection::vec(0..VOCAB as u32, 0..6),
            any::<bool>()
        )
            .prop_map(|(text, shared, suffix, continue_turn)| Op::Prefill {
                text,
                shared,
                suffix,
                continue_turn
            }),
        2 => (1..8usize, any::<bool>()).prop_map(|(n, spec)| Op::Generate(n, spec)),
        1 => (1..4usize).prop_map(Op::Evict),
        1 => Just(Op::Reset),
    ]
}

fn models() -> Vec<(Probe, RotatingStrategy)> {
    let staged = RotatingStrategy::Staged;
    let slack = RotatingStrategy::Slack { max_draft: 3 };
    vec![
        (
            Probe {
                layers: vec![None, None],
            },
            staged,
        ),
        (
            Probe {
                layers: vec![Some(3), Some(5)],
            },
            staged,
        ),
        (
            Probe {
                layers: vec![Some(4)],
            },
            slack,
        ),
        (
            Probe {
                layers: vec![Some(3), None],
            },
            staged,
        ),
        (
            Probe {
                layers: vec![None, Some(4)],
            },
            slack,
        ),
    ]
}

/// The first text prompts start a prefix of.
fn shared_text() -> Vec<u32> {
    texts(0)
}

/// Two texts prompts start a prefix of (they differ from the first token on).
fn texts(which: usize) -> Vec<u32> {
    let v = VOCAB as u32;
    (0..24u32)
        .map(|i| match which {
            0 => (i * 7 + i / 3) % v,
            _ => (i * 5 + i / 2 + 1) % v,
        })
        .collect()
}

fn run_ops(ops: &[Op], budget: usize, checkpoint_every: usize) {
    let greedy = |n| GenParams {
        max_new_tokens: n,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(3),
        stop_at_eos: false,
    };
    for (model, strategy) in models() {
        let cache = model.new_cache(strategy).unwrap();
        let mut seq =
            CachedSequence::new(cache).with_store(PrefixStore::new(budget), checkpoint_every);
        let mut conversation: Vec<u32> = Vec::new();
        let mut rng = StdRng::seed_from_u64(0);
        for op in ops {
            match op {
                Op::Prefill {
                    text,
                    shared,
                    suffix,
                    continue_turn,
                } => {
                    let mut prompt = if *continue_turn {
                        conversation.clone()
                    } else {
                        texts(*text)[..*shared].to_vec()
                    };
                    prompt.extend(suffix);
                    if prompt.is_empty() {
                        continue;
                    }
                    let (logits, stats) = seq.prefill(&model, &prompt).unwrap();
                    assert_eq!(stats.computed + stats.reused, prompt.len());
                    assert!(stats.computed >= 1, "the last token is always computed");
                    assert_fresh(&model, strategy, seq.cache(), &prompt);
                    let mut fresh = model.new_cache(strategy).unwrap();
                    let reference = model.forward(&prompt, &mut fresh).unwrap();
                    let last = reference.get(prompt.len() - 1).unwrap();
                    let (a, b): (Vec<f32>, Vec<f32>) = (
                        logits.flatten_all().unwrap().to_vec1().unwrap(),
                        last.to_vec1().unwrap(),
                    );
                    assert!(close(&a, &b), "prefill logits {a:?} vs fresh {b:?}");
                    conversation = prompt;
                }
                Op::Generate(n, spec) if !conversation.is_empty() => {
                    let (c, p) = (&conversation, &greedy(*n));
                    let out = if *spec {
                        let mut lookup = NgramDrafter::new("lookup", 1, 3).unwrap();
                        generate(
                            &model,
                            &mut seq,
                            c,
                            p,
                            Drafting::chain(&mut lookup),
                            &mut rng,
                        )
                    } else {
                        generate(&model, &mut seq, c, p, Drafting::None, &mut rng)
                    }
                    .unwrap();
                    conversation.extend(&out.output_ids);
                    let held = &conversation[..conversation.len() - 1];
                    assert_eq!(seq.tokens(), held);
                    assert_fresh(&model, strategy, seq.cache(), held);
                }
                Op::Generate(..) => {}
                Op::Evict(n) => {
                    for _ in 0..*n {
                        seq.store_mut().map(PrefixStore::evict_lru);
                    }
                }
                Op::Reset => {
                    seq.reset();
                    conversation.clear();
                }
            }
            let store = seq.store().unwrap();
            assert!(store.bytes() <= store.budget(), "budget kept");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::device::cases(96)))]

    #[test]
    fn restored_caches_equal_fresh_prefills(
        ops in prop::collection::vec(op(), 1..24),
        budget in prop_oneof![Just(usize::MAX), 256..4096usize],
        checkpoint_every in 2..7usize,
    ) {
        run_ops(&ops, budget, checkpoint_every);
    }
}

/// Exact reuse on a shared text of 20 tokens: KV entries are split where prompts leave them;
/// rotating layers resume from the last checkpoint (every 8 tokens), and the second prompt
/// leaves a checkpoint where it left the stored text, from which the third resumes.
#[test]
fn a_shared_prefix_is_prefilled_once() {
    let text: Vec<u32> = shared_text()[..20].to_vec();
    let prompt = |last: u32| [text.as_slice(), &[last, last]].concat();
    let cases = [
        (
            Probe {
                layers: vec![None, None],
            },
            [0, 20, 20, 21],
        ),
        (
            Probe {
                layers: vec![Some(3), None],
            },
            [0, 16, 20, 21],
        ),
    ];
    for (model, expected) in cases {
        let cache = model.new_cache(RotatingStrategy::Staged).unwrap();
        let mut seq = CachedSequence::new(cache).with_store(PrefixStore::new(usize::MAX), 8);
        let mut reused = Vec::new();
        for p in [prompt(0), prompt(1), prompt(2), prompt(2)] {
            // A new conversation each time: only the store can help.
            seq.reset();
            let (_, stats) = seq.prefill(&model, &p).unwrap();
            assert_fresh(&model, RotatingStrategy::Staged, seq.cache(), &p);
            reused.push(stats.reused);
        }
        assert_eq!(reused, expected, "{:?}", model.layers);
    }
}

/// A budget smaller than one entry stores nothing, and restores fall back to full prefills.
#[test]
fn a_store_over_budget_keeps_nothing() {
    let model = Probe {
        layers: vec![Some(3), None],
    };
    let cache = model.new_cache(RotatingStrategy::Staged).unwrap();
    let mut seq = CachedSequence::new(cache).with_store(PrefixStore::new(64), 4);
    let text = shared_text();
    for _ in 0..2 {
        seq.reset();
        let (_, stats) = seq.prefill(&model, &text).unwrap();
        assert_eq!(stats.reused, 0);
        assert!(seq.store().unwrap().bytes() <= 64);
    }
}

/// Eviction is least-recently-used among entries without children: after storing prompts A
/// and B and using A again, a budget that fits only two of the three prompts' entries evicts
/// B's, so A still restores in full and B does not.
#[test]
fn eviction_drops_the_least_recently_used_entry() {
    let model = Probe { layers: vec![None] };
    let prompt = |t: u32| -> Vec<u32> { (0..10).map(|i| (i * 3 + t) % VOCAB as u32).collect() };
    let (a, b, c) = (prompt(0), prompt(1), prompt(2));
    let size = |p: &[u32]| {
        let mut cache = model.new_cache(RotatingStrategy::Staged).unwrap();
        model.forward(p, &mut cache).unwrap();
        cache.snapshot(0).unwrap().bytes()
    };
    // Room for exactly two whole-prompt entries (the three share no first token).
    assert!(a[0] != b[0] && b[0] != c[0] && a[0] != c[0]);
    let budget = size(&a) + size(&b);
    let cache = model.new_cache(RotatingStrategy::Staged).unwrap();
    let mut seq = CachedSequence::new(cache).with_store(PrefixStore::new(budget), 4);
    let reused = |seq: &mut CachedSequence, p: &[u32]| {
        seq.reset();
        seq.prefill(&model, p).unwrap().1.reused
    };
    assert_eq!(reused(&mut seq, &a), 0);
    assert_eq!(reused(&mut seq, &b), 0);
    assert_eq!(
        reused(&mut seq, &a),
        9,
        "A is stored and now the most recent"
    );
    assert_eq!(reused(&mut seq, &c), 0);
    assert_eq!(seq.store().unwrap().len(), 2);
    assert_eq!(reused(&mut seq, &a), 9, "A survived");
    assert_eq!(reused(&mut seq, &b), 0, "B was evicted");
}

/// A store restore after the cache held another prompt: the cache then holds the new
/// prompt's prefix, and what is stored next is keyed by the new prompt's tokens, not by the
/// tokens the cache held before.
#[test]
fn a_restore_over_another_prompt_stores_the_new_prompts_tokens() {
    let (s, t) = (texts(0)[..16].to_vec(), texts(1));
    for layers in [vec![None], vec![Some(3), None]] {
        let model = Probe { layers };
        let cache = model.new_cache(RotatingStrategy::Staged).unwrap();
        let mut seq = CachedSequence::new(cache).with_store(PrefixStore::new(usize::MAX), 4);
        let prompts = [
            [s.as_slice(), &[1, 2]].concat(),
            t.clone(),
            [s.as_slice(), &[3, 3, 3]].concat(),
            [&t[..16], &[3, 3, 3, 0]].concat(),
        ];
        for p in &prompts {
            seq.prefill(&model, p).unwrap();
            assert_fresh(&model, RotatingStrategy::Staged, seq.cache(), p);
            assert_eq!(seq.tokens(), p.as_slice());
        }
    }
}
