//! Exact-value tests of each cache operation on tiny tensors (`[1, 1, seq, 1]`, K = position,
//! V = 10 × position), so every expected tensor can be written out literally.
mod common;

use candle_core::Tensor;
use common::device;
use specdec::cache::{
    merge, split, CacheError, KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy,
};
use specdec::Error;

/// K/V for positions `[from, from + n)`: K = position, V = 10 × position.
fn kv(from: usize, n: usize) -> (Tensor, Tensor) {
    let k: Vec<f32> = (from..from + n).map(|p| p as f32).collect();
    let v: Vec<f32> = k.iter().map(|x| x * 10.0).collect();
    let dev = device::device();
    (
        Tensor::from_vec(k, (1, 1, n, 1), &dev).unwrap(),
        Tensor::from_vec(v, (1, 1, n, 1), &dev).unwrap(),
    )
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// Mask rows as 0/1 visibility for readability.
fn visible(mask: &Option<Tensor>) -> Option<Vec<Vec<u8>>> {
    mask.as_ref().map(|m| {
        m.to_vec2::<f32>()
            .unwrap()
            .iter()
            .map(|r| r.iter().map(|&x| (x == 0.0) as u8).collect())
            .collect()
    })
}

fn push(cache: &mut LayerCache, from: usize, n: usize) -> specdec::cache::Attend {
    let (k, v) = kv(from, n);
    cache.append(&k, &v).unwrap()
}

#[test]
fn kv_append_grows_in_steps_and_returns_everything_with_a_causal_mask() {
    let mut c = KvCache::new(4);
    let (k, v) = kv(0, 3);
    let a = c.append(&k, &v).unwrap();
    assert_eq!(flat(&a.k), [0., 1., 2.]);
    assert_eq!(flat(&a.v), [0., 10., 20.]);
    assert_eq!(
        visible(&a.mask_tensor().unwrap()),
        Some(vec![vec![1, 0, 0], vec![1, 1, 0], vec![1, 1, 1]])
    );
    assert_eq!(c.capacity(), 4);
    let (k, v) = kv(3, 1);
    let a = c.append(&k, &v).unwrap();
    assert_eq!(flat(&a.k), [0., 1., 2., 3.]);
    assert!(a.mask.hides_nothing(), "one decode token sees everything");
    assert_eq!(c.capacity(), 4, "decode wrote in place");
    let (k, v) = kv(4, 2);
    let a = c.append(&k, &v).unwrap();
    assert_eq!(flat(&a.k), [0., 1., 2., 3., 4., 5.]);
    assert_eq!(c.capacity(), 8);
    assert_eq!(c.offset(), 6);
}

#[test]
fn kv_expect_tokens_sizes_the_buffers_once_and_keeps_their_contents() {
    let mut c = KvCache::new(4);
    c.expect_tokens(10).unwrap();
    assert_eq!(
        c.capacity(),
        0,
        "no buffer before the first write gives it a shape"
    );
    let (k, v) = kv(0, 1);
    c.append(&k, &v).unwrap();
    assert_eq!(
        c.capacity(),
        12,
        "the first allocation takes the hint, in whole steps"
    );
    for p in 1..10 {
        let (k, v) = kv(p, 1);
        c.append(&k, &v).unwrap();
        assert_eq!(c.capacity(), 12, "no growth up to the hint");
    }
    c.expect_tokens(5).unwrap();
    assert_eq!(c.capacity(), 12, "a smaller hint never shrinks");
    c.expect_tokens(30).unwrap();
    assert_eq!(
        c.capacity(),
        32,
        "a larger hint grows existing buffers at once"
    );
    let (k, _) = c.logical_kv().unwrap().unwrap();
    assert_eq!(flat(&k), (0..10).map(|p| p as f32).collect::<Vec<_>>());
    c.reset();
    let (k, v) = kv(0, 3);
    c.append(&k, &v).unwrap();
    assert_eq!(c.capacity(), 32, "a reset keeps the sized buffers");
}

#[test]
fn rotating_decode_wraps_and_prefill_keeps_the_window() {
    let mut c = LayerCache::Rotating(RotatingKvCache::new(3, RotatingStrategy::Staged).unwrap());
    // Prefill 5 tokens: all returned in logical order with the sliding-window causal mask.
    let a = push(&mut c, 0, 5);
    assert_eq!(flat(&a.k), [0., 1., 2., 3., 4.]);
    assert_eq!(
        visible(&a.mask_tensor().unwrap()),
        Some(vec![
            vec![1, 0, 0, 0, 0],
            vec![1, 1, 0, 0, 0],
            vec![1, 1, 1, 0, 0],
            vec![0, 1, 1, 1, 0],
            vec![0, 0, 1, 1, 1],
        ])
    );
    // Ring of 3 holds positions 3, 4, 2 in slots 0, 1, 2. Decode position 5 → slot 2.
    let a = push(&mut c, 5, 1);
    assert_eq!(flat(&a.k), [3., 4., 5.], "ring order");
    assert!(
        a.mask.hides_nothing(),
        "a full ring of exactly the window hides nothing"
    );
    let a = push(&mut c, 6, 1);
    assert_eq!(flat(&a.k), [6., 4., 5.]);
    // A multi-token update linearises: last window-1 = 2 old tokens, then the new ones.
    let a = push(&mut c, 7, 2);
    assert_eq!(flat(&a.k), [5., 6., 7., 8.]);
    assert_eq!(
        visible(&a.mask_tensor().unwrap()),
        Some(vec![vec![1, 1, 1, 0], vec![0, 1, 1, 1]])
    );
    assert_eq!(flat(&c.logical_kv().unwrap().unwrap().0), [7., 8.]);
}

#[test]
fn slack_ring_masks_the_window_in_ring_order() {
    // window 2, max_draft 1 → capacity 4.
    let mut c = LayerCache::Rotating(
        RotatingKvCache::new(2, RotatingStrategy::Slack { max_draft: 1 }).unwrap(),
    );
    push(&mut c, 0, 5); // ring: slot0=4, slot1=1, slot2=2, slot3=3
    let a = push(&mut c, 5, 1); // slot1 = 5
    assert_eq!(flat(&a.k), [4., 5., 2., 3.]);
    assert_eq!(
        visible(&a.mask_tensor().unwrap()),
        Some(vec![vec![1, 1, 0, 0]])
    );
}

fn model_cache(layer: LayerCache) -> ModelCache {
    ModelCache::new(vec![layer])
}

fn logical_k(c: &ModelCache) -> Vec<f32> {
    c.layers()[0]
        .logical_kv()
        .unwrap()
        .map_or(vec![], |(k, _)| flat(&k))
}

#[test]
fn speculation_commits_exactly_the_prefix_and_drop_rolls_back() {
    for layer in [
        LayerCache::Kv(KvCache::new(2)),
        LayerCache::Rotating(RotatingKvCache::new(4, RotatingStrategy::Staged).unwrap()),
        LayerCache::Rotating(
            RotatingKvCache::new(4, RotatingStrategy::Slack { max_draft: 3 }).unwrap(),
        ),
    ] {
        let mut c = model_cache(layer);
        let (k, v) = kv(0, 6);
        c.layer_mut(0).unwrap().append(&k, &v).unwrap();
        {
            let mut spec = c.speculate().unwrap();
            // Verification-style: 4 tokens at once (positions 6..10) with wrong contents.
            let (k, v) = kv(100, 4);
            let a = spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
            assert!(
                flat(&a.k).len() >= 4,
                "attends over history and the new tokens"
            );
            assert_eq!(spec.appended(), 4);
            // dropped: rolled back
        }
        assert_eq!(c.offset(), 6);
        let tail: Vec<f32> = logical_k(&c);
        assert_eq!(tail.last(), Some(&5.0));
        let mut spec = c.speculate().unwrap();
        let (k, v) = kv(6, 1);
        spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
        let (k, v) = kv(7, 1);
        spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
        let (k, v) = kv(99, 1);
        spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
        spec.commit(2).unwrap();
        assert_eq!(c.offset(), 8);
        let k = logical_k(&c);
        assert_eq!(&k[k.len() - 3..], [5., 6., 7.]);
    }
}

#[test]
fn commit_longer_than_appended_is_refused_and_rolls_back() {
    let mut c = model_cache(LayerCache::Kv(KvCache::default()));
    let mut spec = c.speculate().unwrap();
    let (k, v) = kv(0, 2);
    spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
    let err = spec.commit(3).unwrap_err();
    assert!(matches!(
        err,
        Error::Cache(CacheError::CommitTooLong { n: 3, appended: 2 })
    ));
    assert_eq!(c.offset(), 0);
}

#[test]
fn nested_speculation_and_snapshot_inside_one_are_refused() {
    let mut c = model_cache(LayerCache::Kv(KvCache::default()));
    let mut spec = c.speculate().unwrap();
    assert!(matches!(
        spec.cache().speculate().map(|_| ()).unwrap_err(),
        Error::Cache(CacheError::SpeculationOpen)
    ));
    assert!(spec.cache().snapshot(0).is_err());
}

#[test]
fn slack_ring_refuses_speculation_beyond_its_slack() {
    let mut c = model_cache(LayerCache::Rotating(
        RotatingKvCache::new(3, RotatingStrategy::Slack { max_draft: 2 }).unwrap(),
    ));
    let (k, v) = kv(0, 10);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let mut spec = c.speculate().unwrap();
    let (k, v) = kv(10, 5);
    let err = spec
        .cache()
        .layer_mut(0)
        .unwrap()
        .append(&k, &v)
        .unwrap_err();
    assert!(matches!(
        err,
        Error::Cache(CacheError::SpeculationTooLong { len: 5, max: 4 })
    ));
    drop(spec);
    assert_eq!(logical_k(&c), [8., 9.]);
}

#[test]
fn kv_snapshot_restore_merge_split() {
    let mut c = model_cache(LayerCache::Kv(KvCache::new(4)));
    let (k, v) = kv(0, 3);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let a = c.snapshot(0).unwrap(); // [0, 3)
    let (k, v) = kv(3, 2);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let b = c.snapshot(3).unwrap(); // [3, 5)
    let ab = merge(&a, &b).unwrap();
    assert_eq!((ab.from(), ab.to()), (0, 5));
    assert!(merge(&b, &a).is_err(), "not adjacent");
    let (left, right) = split(&ab, 2).unwrap();
    assert_eq!(
        (left.from(), left.to(), right.from(), right.to()),
        (0, 2, 2, 5)
    );
    // Overwrite the live cache from position 1 with other contents, then restore.
    c.restore(None, 1).unwrap();
    let (k, v) = kv(50, 4);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    assert_eq!(logical_k(&c), [0., 50., 51., 52., 53.]);
    c.restore(Some(&right), 4).unwrap();
    assert_eq!(logical_k(&c), [0., 50., 2., 3.]);
    c.restore(Some(&ab), 5).unwrap();
    assert_eq!(logical_k(&c), [0., 1., 2., 3., 4.]);
    assert!(c.restore(None, 6).is_err(), "cannot rewind forward");
    assert!(c.restore(Some(&ab), 6).is_err(), "past the snapshot");
    assert_eq!(
        logical_k(&c),
        [0., 1., 2., 3., 4.],
        "refusals change nothing"
    );
}

#[test]
fn a_snapshot_is_unchanged_by_later_writes_to_the_live_cache() {
    for layer in [
        LayerCache::Kv(KvCache::new(8)),
        LayerCache::Rotating(RotatingKvCache::new(3, RotatingStrategy::Staged).unwrap()),
        LayerCache::Rotating(
            RotatingKvCache::new(3, RotatingStrategy::Slack { max_draft: 2 }).unwrap(),
        ),
    ] {
        let mut c = model_cache(layer);
        let (k, v) = kv(0, 4);
        c.layer_mut(0).unwrap().append(&k, &v).unwrap();
        let snap = c.snapshot(0).unwrap();
        // Overwrite every slot the snapshot could share: rewind where possible, then write.
        let _ = c.restore(None, 3);
        for p in 0..6 {
            let (k, v) = kv(200 + p, 1);
            c.layer_mut(0).unwrap().append(&k, &v).unwrap();
        }
        c.restore(Some(&snap), 4).unwrap();
        let k = logical_k(&c);
        assert_eq!(
            &k[k.len() - 2..],
            [2., 3.],
            "snapshot data survived later writes"
        );
    }
}

#[test]
fn rotating_rewind_is_refused_once_the_ring_has_wrapped() {
    let mut c = model_cache(LayerCache::Rotating(
        RotatingKvCache::new(3, RotatingStrategy::Staged).unwrap(),
    ));
    let (k, v) = kv(0, 10);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let err = c.restore(None, 7).unwrap_err();
    assert!(matches!(
        err,
        Error::Cache(CacheError::Unreachable { target: 7, .. })
    ));
    assert_eq!(logical_k(&c), [8., 9.]);
    // One step back is reachable: the ring of `window` slots still holds what position 9 needs.
    c.restore(None, 9).unwrap();
    assert_eq!(logical_k(&c), [7., 8.]);
}

#[test]
fn rotating_snapshots_merge_keeps_the_child_and_split_is_refused() {
    let mut c = model_cache(LayerCache::Rotating(
        RotatingKvCache::new(3, RotatingStrategy::Staged).unwrap(),
    ));
    let (k, v) = kv(0, 5);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let a = c.snapshot(0).unwrap();
    let (k, v) = kv(5, 3);
    c.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let b = c.snapshot(5).unwrap();
    let ab = merge(&a, &b).unwrap();
    assert_eq!((ab.from(), ab.to()), (0, 8));
    assert!(matches!(
        split(&ab, 4).map(|_| ()).unwrap_err(),
        Error::Cache(CacheError::SplitRefused(_))
    ));
    c.reset();
    c.restore(Some(&ab), 8).unwrap();
    assert_eq!(logical_k(&c), [6., 7.]);
    c.restore(Some(&a), 5).unwrap();
    assert_eq!(logical_k(&c), [3., 4.]);
    // A KV snapshot given to a rotating cache is a typed refusal.
    let mut kvc = model_cache(LayerCache::Kv(KvCache::default()));
    let (k, v) = kv(0, 2);
    kvc.layer_mut(0).unwrap().append(&k, &v).unwrap();
    let kv_snap = kvc.snapshot(0).unwrap();
    assert!(matches!(
        c.restore(Some(&kv_snap), 2).unwrap_err(),
        Error::Cache(CacheError::KindMismatch(_))
    ));
}

#[test]
fn reset_inside_a_speculation_empties_the_cache_without_panicking() {
    for layer in [
        LayerCache::Kv(KvCache::default()),
        LayerCache::Rotating(RotatingKvCache::new(3, RotatingStrategy::Staged).unwrap()),
        LayerCache::Rotating(
            RotatingKvCache::new(3, RotatingStrategy::Slack { max_draft: 2 }).unwrap(),
        ),
    ] {
        let mut c = model_cache(layer);
        let (k, v) = kv(0, 5);
        c.layer_mut(0).unwrap().append(&k, &v).unwrap();
        let mut spec = c.speculate().unwrap();
        let (k, v) = kv(5, 2);
        spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
        spec.cache().reset();
        assert_eq!(spec.appended(), 0);
        spec.commit(0).unwrap();
        assert_eq!(c.offset(), 0);
        assert!(logical_k(&c).is_empty());
        c.speculate().unwrap().commit(0).unwrap();
    }
}
