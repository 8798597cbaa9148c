//! A forward that fails part-way — here the last layer's cache refuses the append, after the
//! earlier layers have appended — leaves the model cache as it was before the forward, or
//! poisoned so that every later use is refused with a typed error; never with layers at
//! different offsets in use. Injected on the shipped models: full-attention layers (Llama
//! draft) and sliding-window rings (Mistral target, window 64) of both strategies, short and
//! long forwards, outside and inside a speculation.
mod common;

use candle_core::{DType, Device, Tensor};
use common::checkpoint::shipped_on_cpu;
use specdec::cache::{
    CacheError, KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy,
};
use specdec::models::Model;
use specdec::nn::LayerKind;
use specdec::Error;

const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;

/// A cache for `model` holding `held` tokens in every layer, whose last layer was filled
/// with K/V one element too wide per head, so that its next append fails.
fn trapped_cache(model: &Model, strategy: RotatingStrategy, held: usize) -> ModelCache {
    let kinds = &model.info().layer_kinds;
    let layers = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let width = if i + 1 == kinds.len() {
                HEAD_DIM + 1
            } else {
                HEAD_DIM
            };
            let mut layer = match kind {
                LayerKind::Full => LayerCache::Kv(KvCache::new(16)),
                LayerKind::Sliding { window } => {
                    LayerCache::Rotating(RotatingKvCache::new(*window, strategy).unwrap())
                }
            };
            let kv = Tensor::ones((1, KV_HEADS, held, width), DType::F32, &Device::Cpu).unwrap();
            layer.append(&kv, &kv).unwrap();
            layer
        })
        .collect();
    ModelCache::new(layers)
}

fn offsets(cache: &ModelCache) -> Vec<usize> {
    cache.layers().iter().map(LayerCache::offset).collect()
}

fn is_poisoned(e: &Error) -> bool {
    matches!(e, Error::Cache(CacheError::Poisoned))
}

/// Either every layer is back at `held` and usable, or every later use is refused.
fn assert_safe(model: &Model, cache: &mut ModelCache, held: usize) -> bool {
    if cache.is_poisoned() {
        assert!(is_poisoned(&model.forward(&[1], cache).unwrap_err()));
        assert!(is_poisoned(&cache.speculate().unwrap_err()));
        assert!(is_poisoned(&cache.snapshot(0).unwrap_err()));
        assert!(is_poisoned(&cache.restore(None, 0).unwrap_err()));
        assert!(is_poisoned(&cache.layer_mut(0).unwrap_err()));
        true
    } else {
        assert_eq!(offsets(cache), vec![held; cache.num_layers()]);
        // Still usable: the earlier layers accept an append at `held`.
        let kv = Tensor::ones((1, KV_HEADS, 1, HEAD_DIM), DType::F32, &Device::Cpu).unwrap();
        cache.layer_mut(0).unwrap().append(&kv, &kv).unwrap();
        assert_eq!(cache.layers()[0].offset(), held + 1);
        false
    }
}

fn strategies() -> [RotatingStrategy; 2] {
    [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 4 },
    ]
}

#[test]
fn a_failed_forward_rewinds_every_layer_when_it_can() {
    let held = 20;
    for (name, tokens) in [("draft", 3), ("target", 1), ("target", 3)] {
        let model = shipped_on_cpu(name);
        for strategy in strategies() {
            let mut cache = trapped_cache(&model, strategy, held);
            let input: Vec<u32> = (1..=tokens).collect();
            model.forward(&input, &mut cache).unwrap_err();
            let poisoned = assert_safe(&model, &mut cache, held);
            assert!(
                !poisoned,
                "{name} {strategy:?}: a short forward can be undone"
            );
        }
    }
}

#[test]
fn a_failed_forward_that_overwrote_history_poisons_the_cache() {
    let model = shipped_on_cpu("target");
    for strategy in strategies() {
        // 100 tokens into 64-token windows: the rings lose the history before the forward.
        let mut cache = trapped_cache(&model, strategy, 40);
        let input: Vec<u32> = (0..100).map(|i| i % 50 + 1).collect();
        model.forward(&input, &mut cache).unwrap_err();
        assert!(assert_safe(&model, &mut cache, 40), "{strategy:?}");
        // A reset makes it usable again.
        cache.reset();
        assert_eq!(offsets(&cache), vec![0; cache.num_layers()]);
    }
}

#[test]
fn a_failed_forward_inside_a_speculation_poisons_the_cache() {
    for name in ["draft", "target"] {
        let model = shipped_on_cpu(name);
        for strategy in strategies() {
            let mut cache = trapped_cache(&model, strategy, 20);
            {
                let mut spec = cache.speculate().unwrap();
                model.forward(&[1, 2], spec.cache()).unwrap_err();
                assert!(
                    is_poisoned(&spec.commit(1).unwrap_err()),
                    "{name} {strategy:?}"
                );
            }
            assert!(assert_safe(&model, &mut cache, 20), "{name} {strategy:?}");
        }
    }
}
