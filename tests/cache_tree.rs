//! Property test of token-tree speculation in the cache layer: for random committed
//! histories (rings that wrap many times), random trees appended one random chunk at a time
//! and random accepted root-to-node paths, (1) inside the speculation every tree node's
//! attention equals a fresh prefill of the history plus its own ancestors, and (2) after the
//! path commit the cache equals a fresh prefill of the committed tokens — its logical window
//! and attention over a probe. KV caches and both rotating strategies, 1000 cases each
//! (`SPECDEC_TEST_CASES` overrides the count).
mod common;

use candle_core::Tensor;
use common::probe::{self, append, attend_queries, close, kv, Kind, HEAD_DIM};
use proptest::prelude::*;
use specdec::cache::{
    Attend, CacheError, KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy,
    TokenTree,
};
use specdec::Error;

/// K/V of `tokens` at the given positions (as [`kv`] encodes them).
fn kv_at(tokens: &[u8], positions: &[usize]) -> (Tensor, Tensor) {
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (&t, &p) in tokens.iter().zip(positions) {
        let (kt, vt) = kv(&[t], p);
        k.push(kt);
        v.push(vt);
    }
    (Tensor::cat(&k, 2).unwrap(), Tensor::cat(&v, 2).unwrap())
}

/// softmax(q kᵀ + mask) v with the same query for every row: `[q_len * HEAD_DIM]`.
fn attend_rows(a: &Attend, q_len: usize) -> Vec<f32> {
    attend_queries(a, [1.0f32, 0.7].repeat(q_len))
}

/// The tokens of the root-to-`node` path, root first.
fn path_to(tree: &TokenTree, node: usize) -> Vec<usize> {
    let mut path = vec![node];
    while let Some(p) = tree.parent(*path.last().unwrap()) {
        path.push(p);
    }
    path.reverse();
    path
}

/// The invariant: `cache` and a fresh prefill of `committed` look the same to attention.
fn check_equivalent(kind: Kind, cache: &ModelCache, committed: &[u8], probe: &[u8]) {
    probe::check_equivalent(kind, cache, committed, probe, attend_rows);
}

/// One tree speculation: `parents[i] % (i + 1)` picks node `i`'s parent (`i` = a root, else
/// node `parents[i] % (i + 1)`), nodes are appended in chunks of the given sizes, and the
/// path to node `leaf % (n + 1)` is committed (`n` = nothing kept).
#[derive(Debug, Clone)]
struct TreeStep {
    tokens: Vec<u8>,
    parents: Vec<usize>,
    chunks: Vec<usize>,
    leaf: usize,
}

fn tree_step(kind: Kind, cache: &mut ModelCache, committed: &mut Vec<u8>, step: &TreeStep) {
    let n = step.tokens.len().min(kind.max_spec());
    let parents: Vec<Option<usize>> = (0..n)
        .map(|i| Some(step.parents[i] % (i + 1)).filter(|&p| p < i))
        .collect();
    let tree = TokenTree::new(parents.clone()).unwrap();
    let base = committed.len();
    let mut spec = cache.speculate().unwrap();
    let mut done = 0;
    for &size in step.chunks.iter().chain([&n]) {
        let end = (done + size.max(1)).min(n);
        if done == end {
            break;
        }
        spec.extend_tree(&parents[done..end]).unwrap();
        let positions: Vec<usize> = (done..end).map(|i| base + tree.depth(i)).collect();
        let layer = spec.cache().layer_mut(0).unwrap();
        assert_eq!(layer.tree_positions(end - done), Some(positions.clone()));
        let (k, v) = kv_at(&step.tokens[done..end], &positions);
        let a = layer.append(&k, &v).unwrap();
        let got = attend_rows(&a, end - done);
        for (row, node) in (done..end).enumerate() {
            // A fresh prefill of history + ancestors, then the node itself as the query.
            let mut seen = committed.clone();
            seen.extend(path_to(&tree, node).iter().map(|&i| step.tokens[i]));
            let last = seen.pop().unwrap();
            let mut reference = kind.fresh(&seen);
            let want = attend_rows(&append(&mut reference, &[last]), 1);
            let got = &got[row * HEAD_DIM..(row + 1) * HEAD_DIM];
            assert!(close(got, &want), "node {node}: {got:?} != {want:?}");
        }
        done = end;
    }
    let path = match step.leaf % (n + 1) {
        leaf if leaf == n => Vec::new(),
        leaf => path_to(&tree, leaf),
    };
    spec.commit_path(&path).unwrap();
    committed.extend(path.iter().map(|&i| step.tokens[i]));
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<u8>),
    Tree(TreeStep),
}

fn op() -> impl Strategy<Value = Op> {
    let tokens = |max: usize| prop::collection::vec(0u8..50, 1..=max);
    let step = (tokens(10), prop::collection::vec(0usize..100, 10))
        .prop_flat_map(move |(tokens, parents)| {
            (
                Just(tokens),
                Just(parents),
                prop::collection::vec(1usize..5, 0..5),
                0usize..100,
            )
        })
        .prop_map(|(tokens, parents, chunks, leaf)| {
            Op::Tree(TreeStep {
                tokens,
                parents,
                chunks,
                leaf,
            })
        });
    prop_oneof![2 => tokens(6).prop_map(Op::Append), 3 => step]
}

fn run(kind: Kind, ops: Vec<Op>, probe: Vec<u8>) {
    let mut cache = kind.new_cache();
    let mut committed: Vec<u8> = Vec::new();
    for op in ops {
        match op {
            Op::Append(t) => {
                append(&mut cache, &t);
                committed.extend(&t);
            }
            Op::Tree(step) => tree_step(kind, &mut cache, &mut committed, &step),
        }
        check_equivalent(kind, &cache, &committed, &probe);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::device::cases(1000), ..ProptestConfig::default() })]

    #[test]
    fn kv_tree_path_commit_matches_fresh_prefill(step in 1usize..5, ops in prop::collection::vec(op(), 1..12), probe in prop::collection::vec(0u8..50, 1..3)) {
        run(Kind::Kv { step }, ops, probe);
    }

    #[test]
    fn staged_tree_path_commit_matches_fresh_prefill(window in 1usize..7, ops in prop::collection::vec(op(), 1..12), probe in prop::collection::vec(0u8..50, 1..3)) {
        run(Kind::Staged { window }, ops, probe);
    }

    #[test]
    fn slack_tree_path_commit_matches_fresh_prefill(window in 1usize..7, max_draft in 0usize..9, ops in prop::collection::vec(op(), 1..12), probe in prop::collection::vec(0u8..50, 1..3)) {
        run(Kind::Slack { window, max_draft }, ops, probe);
    }
}

/// Bad trees and paths are refused, and the refusal leaves the cache as it was.
#[test]
fn bad_trees_and_paths_are_refused() {
    let mut cache = Kind::Kv { step: 4 }.fresh(&[1, 2, 3]);
    let mut spec = cache.speculate().unwrap();
    let bad = spec.extend_tree(&[None, Some(1)]);
    assert!(matches!(bad, Err(Error::Cache(CacheError::BadTree(_)))));
    spec.extend_tree(&[None, Some(0), Some(0)]).unwrap();
    let (k, v) = kv(&[4, 5], 3);
    spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
    let (k, v) = kv(&[6, 7], 5);
    let past = spec.cache().layer_mut(0).unwrap().append(&k, &v);
    assert!(matches!(past, Err(Error::Cache(CacheError::BadTree(_)))));
    // Node 2 is declared but not appended; [0, 2] is a path of the tree.
    assert!(spec.commit_path(&[0, 2]).is_err());
    assert_eq!(cache.offset(), 3, "a refused commit rolls back");
    let mut spec = cache.speculate().unwrap();
    spec.extend_tree(&[None, Some(0), Some(0)]).unwrap();
    let (k, v) = kv(&[4, 5, 6], 3);
    spec.cache().layer_mut(0).unwrap().append(&k, &v).unwrap();
    assert!(spec.commit_path(&[1]).is_err(), "node 1 is not a root");
    assert_eq!(cache.offset(), 3);
}

/// K/V rows `[1, 2, n, 8]` (two heads of eight f32: rows of 32 bytes, which the CUDA build
/// copies in one launch for every layer at a path commit) of `tokens` at `positions`, layer
/// `l`'s own values.
fn wide_kv(l: usize, tokens: &[u8], positions: &[usize]) -> (Tensor, Tensor) {
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for h in 0..2 {
        for (&t, &p) in tokens.iter().zip(positions) {
            for e in 0..8 {
                let x = (l * 7 + h * 3 + e) as f32;
                k.push(t as f32 * 0.5 + p as f32 * 0.01 + x);
                v.push(t as f32 - p as f32 * 0.02 + x * 0.1);
            }
        }
    }
    let n = tokens.len();
    let dev = common::device();
    (
        Tensor::from_vec(k, (1, 2, n, 8), &dev).unwrap(),
        Tensor::from_vec(v, (1, 2, n, 8), &dev).unwrap(),
    )
}

/// A model cache of a KV layer, a staged ring and a slack ring (window 5), rows of 32 bytes.
fn wide_cache() -> ModelCache {
    ModelCache::new(vec![
        LayerCache::Kv(KvCache::new(4)),
        LayerCache::Rotating(RotatingKvCache::new(5, RotatingStrategy::Staged).unwrap()),
        LayerCache::Rotating(
            RotatingKvCache::new(5, RotatingStrategy::Slack { max_draft: 12 }).unwrap(),
        ),
    ])
}

fn wide_append(c: &mut ModelCache, tokens: &[u8], positions: &[usize]) {
    for l in 0..3 {
        let (k, v) = wide_kv(l, tokens, positions);
        c.layer_mut(l).unwrap().append(&k, &v).unwrap();
    }
}

/// A tree's kept path over layers of every kind at once (on CUDA one launch copies every
/// layer's path rows) leaves each layer what a fresh prefill of the committed tokens gives:
/// random histories (the rings wrapped), random trees appended in two chunks, random paths.
#[test]
fn path_commits_over_every_layer_kind_match_fresh_prefill() {
    let mut state = 11u64;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize % n
    };
    for case in 0..40 {
        let history: Vec<u8> = (0..3 + next(20)).map(|_| next(50) as u8).collect();
        let nodes = 2 + next(11);
        let parents: Vec<Option<usize>> = (0..nodes)
            .map(|i| if i == 0 { None } else { Some(next(i)) })
            .collect();
        let tree = TokenTree::new(parents.clone()).unwrap();
        let tokens: Vec<u8> = (0..nodes).map(|_| next(50) as u8).collect();
        // A path from the root to a random node.
        let path = path_to(&tree, next(nodes));
        let mut c = wide_cache();
        let hist_pos: Vec<usize> = (0..history.len()).collect();
        wide_append(&mut c, &history, &hist_pos);
        let base = history.len();
        let positions: Vec<usize> = (0..nodes).map(|i| base + tree.depth(i)).collect();
        let split = 1 + next(nodes);
        {
            let mut spec = c.speculate().unwrap();
            spec.extend_tree(&parents[..split]).unwrap();
            wide_append(spec.cache(), &tokens[..split], &positions[..split]);
            if split < nodes {
                spec.extend_tree(&parents[split..]).unwrap();
                wide_append(spec.cache(), &tokens[split..], &positions[split..]);
            }
            spec.commit_path(&path).unwrap();
        }
        let mut committed = history.clone();
        committed.extend(path.iter().map(|&i| tokens[i]));
        let mut want = wide_cache();
        wide_append(
            &mut want,
            &committed,
            &(0..committed.len()).collect::<Vec<_>>(),
        );
        assert_eq!(c.offset(), want.offset(), "case {case}");
        let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for l in 0..3 {
            let got = c.layers()[l].logical_kv().unwrap().unwrap();
            let exp = want.layers()[l].logical_kv().unwrap().unwrap();
            assert_eq!(flat(got.0), flat(exp.0), "case {case}, layer {l}: keys");
            assert_eq!(flat(got.1), flat(exp.1), "case {case}, layer {l}: values");
        }
    }
}
