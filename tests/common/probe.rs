//! Helpers of the cache property tests: the cache kinds they run over, K/V that encode token
//! id and position, and the two views compared against a fresh prefill (the logical window,
//! and attention over a probe).
use candle_core::Tensor;
use specdec::cache::{Attend, KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy};

/// A one-layer cache of each kind the property tests cover.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Kv { step: usize },
    Staged { window: usize },
    Slack { window: usize, max_draft: usize },
}

impl Kind {
    pub fn new_cache(self) -> ModelCache {
        let layer = match self {
            Kind::Kv { step } => LayerCache::Kv(KvCache::new(step)),
            Kind::Staged { window } => LayerCache::Rotating(
                RotatingKvCache::new(window, RotatingStrategy::Staged).unwrap(),
            ),
            Kind::Slack { window, max_draft } => LayerCache::Rotating(
                RotatingKvCache::new(window, RotatingStrategy::Slack { max_draft }).unwrap(),
            ),
        };
        ModelCache::new(vec![layer])
    }

    /// The most tokens one speculation may append.
    pub fn max_spec(self) -> usize {
        match self {
            Kind::Slack { max_draft, .. } => max_draft + 2,
            _ => usize::MAX,
        }
    }

    /// A cache of this kind freshly prefilled with `tokens`.
    pub fn fresh(self, tokens: &[u8]) -> ModelCache {
        let mut c = self.new_cache();
        if !tokens.is_empty() {
            append(&mut c, tokens);
        }
        c
    }
}

/// The property tests' invariant: `cache` and a fresh prefill of `committed` look the same to
/// attention — the same logical window, and the same output of `attend` (attention of
/// `probe.len()` query rows) once `probe` is appended to both.
pub fn check_equivalent(
    kind: Kind,
    cache: &ModelCache,
    committed: &[u8],
    probe: &[u8],
    attend: fn(&Attend, usize) -> Vec<f32>,
) {
    assert_eq!(cache.offset(), committed.len(), "offset");
    let reference = kind.fresh(committed);
    assert_eq!(logical(cache), logical(&reference), "logical window K/V");
    let mut a = cache.deep_clone().unwrap();
    let mut b = reference;
    let (ra, rb) = (append(&mut a, probe), append(&mut b, probe));
    let (oa, ob) = (attend(&ra, probe.len()), attend(&rb, probe.len()));
    assert!(close(&oa, &ob), "probe attention {oa:?} != {ob:?}");
}

/// Head dimension of the probe K/V.
pub const HEAD_DIM: usize = 2;

/// K/V of tokens (ids) at positions `[from, from + n)`: K and V depend on id and position.
pub fn kv(tokens: &[u8], from: usize) -> (Tensor, Tensor) {
    let n = tokens.len();
    let mut k = Vec::with_capacity(n * HEAD_DIM);
    let mut v = Vec::with_capacity(n * HEAD_DIM);
    for (i, &t) in tokens.iter().enumerate() {
        let p = (from + i) as f32;
        k.extend([t as f32 * 0.05, p * 0.01]);
        v.extend([t as f32, p]);
    }
    let dev = super::device();
    (
        Tensor::from_vec(k, (1, 1, n, HEAD_DIM), &dev).unwrap(),
        Tensor::from_vec(v, (1, 1, n, HEAD_DIM), &dev).unwrap(),
    )
}

/// Appends `tokens` at the cache's offset to its only layer.
pub fn append(cache: &mut ModelCache, tokens: &[u8]) -> Attend {
    let (k, v) = kv(tokens, cache.offset());
    cache.layer_mut(0).unwrap().append(&k, &v).unwrap()
}

/// softmax(q kᵀ + mask) v for fixed queries, one per new token: `[q_len * HEAD_DIM]`.
pub fn attend(a: &Attend, q_len: usize) -> Vec<f32> {
    let q: Vec<f32> = (0..q_len * HEAD_DIM)
        .map(|i| 1.0 + i as f32 * 0.3)
        .collect();
    attend_queries(a, q)
}

/// softmax(q kᵀ + mask) v for the queries `q` (`q_len * HEAD_DIM` values, a row per new
/// token): `[q_len * HEAD_DIM]`.
pub fn attend_queries(a: &Attend, q: Vec<f32>) -> Vec<f32> {
    let q_len = q.len() / HEAD_DIM;
    let q = Tensor::from_vec(q, (1, 1, q_len, HEAD_DIM), &super::device()).unwrap();
    let (k, v) = a.joined().unwrap();
    let (k, v) = (k.contiguous().unwrap(), v.contiguous().unwrap());
    let mut scores = q.matmul(&k.t().unwrap()).unwrap();
    if let Some(m) = &a.mask_tensor().unwrap() {
        scores = scores.broadcast_add(m).unwrap();
    }
    let p = candle_nn::ops::softmax_last_dim(&scores).unwrap();
    p.matmul(&v)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The window the next query sees, in logical order, flattened.
pub fn logical(c: &ModelCache) -> Option<(Vec<f32>, Vec<f32>)> {
    let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let kv = c.layers()[0].logical_kv().unwrap();
    kv.map(|(k, v)| (flat(k), flat(v)))
}

/// Element-wise equality up to 1e-5 relative.
pub fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}
