//! Property test of whole model caches: one to four layers mixing KV caches and rotating
//! caches of different windows and strategies, driven through appends, speculations, resets,
//! snapshots, restores and failed commits. After every operation each layer looks to attention
//! like a fresh prefill of the committed tokens; a refused restore is refused exactly when an
//! independent model of the rings says the window it needs is gone (never merely accepted);
//! after a failed commit every operation is refused until a reset, which recovers the cache.
mod common;

use candle_core::Tensor;
use common::probe::{attend, close, kv};
use common::ring_model::Ring;
use proptest::prelude::*;
use specdec::cache::{
    Attend, CacheError, CacheSnapshot, KvCache, LayerCache, ModelCache, RotatingKvCache,
    RotatingStrategy,
};
use specdec::Error;

#[derive(Debug, Clone, Copy)]
enum Layer {
    Kv { step: usize },
    Staged { window: usize },
    Slack { window: usize, max_draft: usize },
}

impl Layer {
    fn cache(self) -> LayerCache {
        let rotating = |w, s| LayerCache::Rotating(RotatingKvCache::new(w, s).unwrap());
        match self {
            Layer::Kv { step } => LayerCache::Kv(KvCache::new(step)),
            Layer::Staged { window } => rotating(window, RotatingStrategy::Staged),
            Layer::Slack { window, max_draft } => {
                rotating(window, RotatingStrategy::Slack { max_draft })
            }
        }
    }

    /// The ring model of a rotating layer; `None` for a KV layer.
    fn ring(self) -> Option<Ring> {
        let (window, capacity) = match self {
            Layer::Kv { .. } => return None,
            Layer::Staged { window } => (window, window),
            Layer::Slack { window, max_draft } => (window, window + max_draft + 1),
        };
        Some(Ring::new(window, capacity))
    }
}

/// A snapshot and its model: the committed history when it was taken and, per layer, the
/// first position it holds (rotating layers).
struct Snap {
    snap: CacheSnapshot,
    history: Vec<u8>,
    held_from: Vec<Option<usize>>,
}

/// The test's model of the cache: committed tokens, rings, whether a staged ring exists
/// (kept across resets), and poisoning.
struct Model {
    layers: Vec<Layer>,
    committed: Vec<u8>,
    rings: Vec<Option<Ring>>,
    has_ring: Vec<bool>,
    poisoned: bool,
}

impl Model {
    fn write(&mut self, first: usize, tokens: &[u8], staged_too: bool) {
        for (i, ring) in self.rings.iter_mut().enumerate() {
            let staged = matches!(self.layers[i], Layer::Staged { .. });
            if let Some(ring) = ring.as_mut().filter(|_| staged_too || !staged) {
                ring.write(first, tokens);
                self.has_ring[i] |= !tokens.is_empty();
            }
        }
    }
    fn mixed(&self) -> bool {
        let kv = self.rings.iter().filter(|r| r.is_none()).count();
        kv > 0 && kv < self.rings.len()
    }
    /// The most tokens one speculation may append (slack layers bound it).
    fn max_spec(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                Layer::Slack { max_draft, .. } => max_draft + 2,
                _ => usize::MAX,
            })
            .min()
            .unwrap_or(usize::MAX)
    }
}

fn new_cache(layers: &[Layer]) -> ModelCache {
    ModelCache::new(layers.iter().map(|l| l.cache()).collect())
}

/// Appends `tokens` to every layer (same K/V), returning what each layer attends over.
fn append_all(cache: &mut ModelCache, tokens: &[u8]) -> specdec::Result<Vec<Attend>> {
    let (k, v) = kv(tokens, cache.offset());
    (0..cache.num_layers())
        .map(|i| cache.layer_mut(i)?.append(&k, &v))
        .collect()
}

type Window = Option<(Vec<f32>, Vec<f32>)>;

fn windows(c: &ModelCache) -> Vec<Window> {
    let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    c.layers()
        .iter()
        .map(|l| l.logical_kv().unwrap().map(|(k, v)| (flat(k), flat(v))))
        .collect()
}

/// Every layer of `cache` looks like a fresh prefill of the committed tokens.
fn check(m: &Model, cache: &ModelCache, probe: &[u8]) {
    assert_eq!(cache.offset(), m.committed.len(), "offset");
    let mut reference = new_cache(&m.layers);
    if !m.committed.is_empty() {
        append_all(&mut reference, &m.committed).unwrap();
    }
    assert_eq!(windows(cache), windows(&reference), "logical windows");
    let mut a = cache.deep_clone().unwrap();
    let (ra, rb) = (
        append_all(&mut a, probe).unwrap(),
        append_all(&mut reference, probe).unwrap(),
    );
    for (x, y) in ra.iter().zip(&rb) {
        assert!(
            close(&attend(x, probe.len()), &attend(y, probe.len())),
            "probe"
        );
    }
}

fn is_poisoned<T>(r: specdec::Result<T>) -> bool {
    matches!(r, Err(Error::Cache(CacheError::Poisoned)))
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<u8>),
    Speculate {
        chunks: Vec<Vec<u8>>,
        commit: Option<usize>,
    },
    Snapshot(usize),
    Restore {
        snap: Option<usize>,
        back: usize,
    },
    Reset,
    /// A speculation whose commit fails half-way (one staged layer got K/V of another shape).
    FailCommit(Vec<u8>),
}

fn tokens(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..50, 1..=max)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => tokens(6).prop_map(Op::Append),
        4 => (prop::collection::vec(tokens(3), 1..4), prop::option::weighted(0.8, 0usize..100))
            .prop_map(|(chunks, commit)| Op::Speculate { chunks, commit }),
        2 => (0usize..100).prop_map(Op::Snapshot),
        3 => (prop::option::of(0usize..100), 0usize..8)
            .prop_map(|(snap, back)| Op::Restore { snap, back }),
        1 => Just(Op::Reset),
        1 => tokens(3).prop_map(Op::FailCommit),
    ]
}

fn speculate(m: &mut Model, cache: &mut ModelCache, chunks: &[Vec<u8>], commit: Option<usize>) {
    let base = m.committed.len();
    let mut appended: Vec<u8> = Vec::new();
    let mut spec = cache.speculate().unwrap();
    for chunk in chunks {
        if appended.len() + chunk.len() > m.max_spec() {
            break;
        }
        append_all(spec.cache(), chunk).unwrap();
        // Slack rings are written through; staged layers keep the chunk aside.
        m.write(base + appended.len(), chunk, false);
        appended.extend(chunk);
    }
    if let Some(c) = commit {
        let n = c % (appended.len() + 1);
        spec.commit(n).unwrap();
        m.write(base, &appended[..n], true);
        m.committed.extend(&appended[..n]);
    }
}

fn restore(
    m: &mut Model,
    cache: &mut ModelCache,
    snaps: &[Snap],
    snap: Option<usize>,
    back: usize,
) {
    let before = windows(cache);
    let len = m.committed.len();
    let (result, reachable) = match snap.and_then(|i| snaps.get(i % snaps.len().max(1))) {
        None => {
            let target = len.saturating_sub(back);
            let ok = m
                .rings
                .iter()
                .flatten()
                .all(|r| r.reachable(target, &m.committed));
            let result = cache.restore(None, target);
            if result.is_ok() {
                m.committed.truncate(target);
            }
            (result, ok)
        }
        Some(s) => {
            let (from, to) = (s.snap.from(), s.snap.to());
            // Mixed models restore KV layers onto the live prefix and rotating layers from
            // the snapshot's history: only comparable when the two agree.
            if m.mixed() && (from > len || s.history[..from] != m.committed[..from]) {
                return;
            }
            let target = to.saturating_sub(back).max(from);
            let ok = m.rings.iter().zip(&s.held_from).all(|(r, h)| match (r, h) {
                (Some(r), Some(h)) => r.serves(*h, target),
                _ => from <= len,
            });
            let result = cache.restore(Some(&s.snap), target);
            if result.is_ok() {
                // KV layers keep the live prefix before `from`; rotating layers take the
                // snapshot's history (equal in mixed models, see above).
                let keep = if m.rings.iter().all(Option::is_some) {
                    0
                } else {
                    from
                };
                let mut committed = m.committed[..keep].to_vec();
                committed.extend(&s.history[keep..target]);
                m.committed = committed;
                for (ring, held) in m.rings.iter_mut().zip(&s.held_from) {
                    if let (Some(ring), Some(h)) = (ring, held) {
                        ring.restore(*h, target, &s.history);
                    }
                }
            }
            (result, ok)
        }
    };
    match result {
        Ok(()) => assert!(reachable, "restore done though the model says unreachable"),
        Err(Error::Cache(CacheError::Unreachable { .. })) => {
            assert!(!reachable, "restore refused though reachable");
            assert_eq!(windows(cache), before, "a refusal changed the cache");
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

/// Opens a speculation, gives the first staged layer that has a ring K/V of head dim 3, the
/// others correct K/V, and commits: the staged layer fails, the cache must be poisoned.
fn fail_commit(m: &mut Model, cache: &mut ModelCache, chunk: &[u8]) {
    let Some(bad) =
        (0..m.layers.len()).find(|&i| matches!(m.layers[i], Layer::Staged { .. }) && m.has_ring[i])
    else {
        return;
    };
    if chunk.len() > m.max_spec() {
        return;
    }
    let (k, v) = kv(chunk, cache.offset());
    let wrong = Tensor::zeros(
        (1, 1, chunk.len(), 3),
        candle_core::DType::F32,
        &common::device(),
    );
    let wrong = wrong.unwrap();
    let mut spec = cache.speculate().unwrap();
    for i in 0..m.layers.len() {
        let (k, v) = if i == bad { (&wrong, &wrong) } else { (&k, &v) };
        spec.cache().layer_mut(i).unwrap().append(k, v).unwrap();
    }
    assert!(
        spec.commit(chunk.len()).is_err(),
        "a mismatched staged commit must fail"
    );
    m.poisoned = true;
}

/// While poisoned, every operation but a reset is refused.
fn assert_refused(cache: &mut ModelCache, snaps: &[Snap]) {
    assert!(is_poisoned(cache.layer_mut(0).map(|_| ())));
    assert!(is_poisoned(cache.speculate().map(|_| ())));
    assert!(is_poisoned(cache.snapshot(0)));
    assert!(is_poisoned(cache.restore(None, 0)));
    if let Some(s) = snaps.last() {
        assert!(is_poisoned(cache.restore(Some(&s.snap), s.snap.from())));
    }
}

fn run(layers: Vec<Layer>, ops: Vec<Op>, probe: Vec<u8>) {
    let mut cache = new_cache(&layers);
    let mut m = Model {
        rings: layers.iter().map(|l| l.ring()).collect(),
        has_ring: vec![false; layers.len()],
        layers,
        committed: Vec::new(),
        poisoned: false,
    };
    let mut snaps: Vec<Snap> = Vec::new();
    for op in ops {
        if m.poisoned && !matches!(op, Op::Reset) {
            assert_refused(&mut cache, &snaps);
            continue;
        }
        match op {
            Op::Append(t) => {
                append_all(&mut cache, &t).unwrap();
                let first = m.committed.len();
                m.write(first, &t, true);
                m.committed.extend(&t);
            }
            Op::Speculate { chunks, commit } => speculate(&mut m, &mut cache, &chunks, commit),
            Op::Snapshot(choice) => {
                let from = if choice % 2 == 0 {
                    0
                } else {
                    m.committed.len()
                };
                let to = m.committed.len();
                let held_from = m
                    .rings
                    .iter()
                    .map(|r| r.as_ref().map(|r| r.held_from(to, &m.committed)))
                    .collect();
                snaps.push(Snap {
                    snap: cache.snapshot(from).unwrap(),
                    history: m.committed.clone(),
                    held_from,
                });
            }
            Op::Restore { snap, back } => restore(&mut m, &mut cache, &snaps, snap, back),
            Op::Reset => {
                cache.reset();
                m.committed.clear();
                m.poisoned = false;
                for ring in m.rings.iter_mut().flatten() {
                    ring.clear();
                }
            }
            Op::FailCommit(chunk) => fail_commit(&mut m, &mut cache, &chunk),
        }
        if !m.poisoned {
            check(&m, &cache, &probe);
        }
    }
}

fn layer() -> impl Strategy<Value = Layer> {
    prop_oneof![
        (1usize..5).prop_map(|step| Layer::Kv { step }),
        (1usize..7).prop_map(|window| Layer::Staged { window }),
        (1usize..7, 0usize..5).prop_map(|(window, max_draft)| Layer::Slack { window, max_draft }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::device::cases(400), ..ProptestConfig::default() })]

    #[test]
    fn model_caches_of_mixed_layers_match_fresh_prefill(
        layers in prop::collection::vec(layer(), 1..5),
        ops in prop::collection::vec(op(), 1..40),
        probe in tokens(3),
    ) {
        run(layers, ops, probe);
    }
}
