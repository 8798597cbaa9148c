//! Helpers of the cache property tests: K/V that encode token id and position, and the two
//! views compared against a fresh prefill (the logical window, and attention over a probe).
use candle_core::Tensor;
use specdec::cache::{Attend, ModelCache};

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
