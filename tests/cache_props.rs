//! Property test of the cache layer's invariant: after any sequence of updates, speculations
//! (any commit count, or a drop), snapshots, restores, merges and splits, what attention sees
//! — the K/V of the window in logical order, and the output of attention over what the cache
//! returns with its mask — equals a cache freshly prefilled with the same committed tokens.
//! Run for KV caches and both rotating strategies, with windows small enough that the rings
//! wrap many times.
mod common;

use common::probe::{self, append, attend, close, kv, logical, Kind};
use common::ring_model::Ring;
use proptest::prelude::*;
use specdec::cache::{merge, split, Attend, CacheError, CacheSnapshot, ModelCache};
use specdec::Error;

/// What this test adds to the shared cache kinds.
impl Kind {
    fn rotating(self) -> bool {
        !matches!(self, Kind::Kv { .. })
    }

    /// The independent model of a rotating cache's ring; `None` for a KV cache.
    fn ring(self) -> Option<Ring> {
        match self {
            Kind::Kv { .. } => None,
            Kind::Staged { window } => Some(Ring::new(window, window)),
            Kind::Slack { window, max_draft } => Some(Ring::new(window, window + max_draft + 1)),
        }
    }
}

/// The invariant: `cache` and a fresh prefill of `committed` look the same to attention.
fn check_equivalent(kind: Kind, cache: &ModelCache, committed: &[u8], probe: &[u8]) {
    probe::check_equivalent(kind, cache, committed, probe, attend);
}

/// A snapshot and the model of its contents: the tokens of `[from, to)` and, for rotating
/// caches, the whole committed history at `to` (its window is what it restores) and the first
/// position the ring model says it holds.
struct Snap {
    snap: CacheSnapshot,
    tokens: Vec<u8>,
    history: Vec<u8>,
    held_from: usize,
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<u8>),
    /// Appends inside one speculation, then commit `commit % (total + 1)` or drop.
    Speculate {
        chunks: Vec<Vec<u8>>,
        commit: Option<usize>,
    },
    /// Snapshot from 0, from the offset, or from the end of an earlier snapshot.
    Snapshot(usize),
    Restore {
        snap: Option<usize>,
        back: usize,
    },
    Merge(usize, usize),
    Split(usize, usize),
    /// `expect_tokens(n)`: a sizing hint, invisible to attention.
    Expect(usize),
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
        2 => (prop::option::of(0usize..100), 0usize..6)
            .prop_map(|(snap, back)| Op::Restore { snap, back }),
        1 => (0usize..100, 0usize..100).prop_map(|(a, b)| Op::Merge(a, b)),
        1 => (0usize..100, 0usize..100).prop_map(|(a, b)| Op::Split(a, b)),
        1 => (0usize..40).prop_map(Op::Expect),
    ]
}

fn speculate(
    kind: Kind,
    cache: &mut ModelCache,
    (committed, ring): (&mut Vec<u8>, &mut Option<Ring>),
    chunks: &[Vec<u8>],
    commit: Option<usize>,
) {
    let base = committed.len();
    let mut appended: Vec<u8> = Vec::new();
    let mut spec = cache.speculate().unwrap();
    for chunk in chunks {
        if appended.len() + chunk.len() > kind.max_spec() {
            let err = append_result(spec.cache(), chunk);
            assert!(matches!(
                err,
                Err(Error::Cache(CacheError::SpeculationTooLong { .. }))
            ));
            break;
        }
        let a = append(spec.cache(), chunk);
        // Inside the speculation attention sees history + everything appended so far.
        let mut all = committed.clone();
        all.extend(&appended);
        let mut reference = kind.fresh(&all);
        let r = append(&mut reference, chunk);
        assert!(
            close(&attend(&a, chunk.len()), &attend(&r, chunk.len())),
            "speculative attention"
        );
        // A slack ring is written through; a staged cache keeps the chunk aside.
        if let (Some(r), Kind::Slack { .. }) = (ring.as_mut(), kind) {
            r.write(base + appended.len(), chunk);
        }
        appended.extend(chunk);
    }
    match commit {
        Some(c) => {
            let n = c % (appended.len() + 1);
            spec.commit(n).unwrap();
            committed.extend(&appended[..n]);
            if let Some(r) = ring.as_mut() {
                r.write(base, &appended[..n]);
            }
        }
        None => drop(spec),
    }
}

fn append_result(cache: &mut ModelCache, tokens: &[u8]) -> specdec::Result<Attend> {
    let (k, v) = kv(tokens, cache.offset());
    cache.layer_mut(0)?.append(&k, &v)
}

/// Restores, and checks a refusal happens exactly when the ring model says the window the
/// target needs is gone (a KV cache: when the live prefix before the snapshot is missing).
fn restore(
    kind: Kind,
    cache: &mut ModelCache,
    (committed, ring): (&mut Vec<u8>, &mut Option<Ring>),
    snaps: &[Snap],
    (snap, back): (Option<usize>, usize),
) {
    let before = logical(cache);
    match snap.and_then(|i| snaps.get(i % snaps.len().max(1))) {
        None => {
            let target = committed.len().saturating_sub(back);
            let reachable = ring.as_ref().is_none_or(|r| r.reachable(target, committed));
            match cache.restore(None, target) {
                Ok(()) => {
                    assert!(reachable, "rewind to {target} done though unreachable");
                    committed.truncate(target);
                }
                Err(Error::Cache(CacheError::Unreachable { .. })) => {
                    assert!(!reachable, "rewind to {target} refused though reachable");
                    assert_eq!(logical(cache), before, "refusal changed the cache");
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        Some(s) => {
            let target = s.snap.to().saturating_sub(back).max(s.snap.from());
            let reachable = match ring.as_ref() {
                Some(r) => r.serves(s.held_from, target),
                None => s.snap.from() <= committed.len(),
            };
            let result = cache.restore(Some(&s.snap), target);
            assert_eq!(result.is_ok(), reachable, "restore to {target}: {result:?}");
            match result {
                Ok(()) if kind.rotating() => {
                    *committed = s.history[..target].to_vec();
                    if let Some(r) = ring.as_mut() {
                        r.restore(s.held_from, target, &s.history);
                    }
                }
                Ok(()) => {
                    committed.truncate(s.snap.from());
                    committed.extend(&s.tokens[..target - s.snap.from()]);
                }
                Err(Error::Cache(CacheError::Unreachable { .. })) => {
                    assert_eq!(logical(cache), before, "refusal changed the cache");
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
    }
}

fn run(kind: Kind, ops: Vec<Op>, probe: Vec<u8>) {
    let mut cache = kind.new_cache();
    let mut committed: Vec<u8> = Vec::new();
    let mut ring = kind.ring();
    let mut snaps: Vec<Snap> = Vec::new();
    // The largest `expect_tokens` hint, and the bytes a KV cache held once it had buffers
    // after it: while no sequence passes the hint, the buffers are never reallocated.
    let mut hint: Option<(usize, Option<usize>)> = None;
    for op in ops {
        let mut peak = committed.len();
        match op {
            Op::Append(t) => {
                append(&mut cache, &t);
                if let Some(r) = ring.as_mut() {
                    r.write(committed.len(), &t);
                }
                committed.extend(&t);
            }
            Op::Speculate { chunks, commit } => {
                peak += chunks.iter().map(Vec::len).sum::<usize>();
                let model = (&mut committed, &mut ring);
                speculate(kind, &mut cache, model, &chunks, commit)
            }
            Op::Snapshot(choice) => {
                let from = match choice % 3 {
                    0 => 0,
                    1 => committed.len(),
                    _ => snaps
                        .get(choice % snaps.len().max(1))
                        .map_or(0, |s| s.snap.to())
                        .min(committed.len()),
                };
                let snap = cache.snapshot(from).unwrap();
                assert_eq!((snap.from(), snap.to()), (from, committed.len()));
                let to = committed.len();
                snaps.push(Snap {
                    snap,
                    tokens: committed[from..].to_vec(),
                    history: committed.clone(),
                    held_from: ring.as_ref().map_or(0, |r| r.held_from(to, &committed)),
                });
            }
            Op::Restore { snap, back } => {
                let model = (&mut committed, &mut ring);
                restore(kind, &mut cache, model, &snaps, (snap, back))
            }
            Op::Merge(a, b) if !snaps.is_empty() => {
                let (a, b) = (&snaps[a % snaps.len()], &snaps[b % snaps.len()]);
                match merge(&a.snap, &b.snap) {
                    Ok(m) => {
                        let mut tokens = a.tokens.clone();
                        tokens.extend(&b.tokens);
                        let history = b.history.clone();
                        // A rotating merge keeps the child's window.
                        let held_from = b.held_from;
                        snaps.push(Snap {
                            snap: m,
                            tokens,
                            history,
                            held_from,
                        });
                    }
                    Err(_) => assert_ne!(a.snap.to(), b.snap.from(), "adjacent merge refused"),
                }
            }
            Op::Split(i, at) if !snaps.is_empty() => {
                let s = &snaps[i % snaps.len()];
                let at = s.snap.from() + at % (s.snap.to() - s.snap.from() + 1);
                match split(&s.snap, at) {
                    Ok((l, r)) => {
                        assert!(!kind.rotating(), "rotating split must be refused");
                        let cut = at - s.snap.from();
                        let (lt, rt) = (s.tokens[..cut].to_vec(), s.tokens[cut..].to_vec());
                        let history = s.history.clone();
                        let left = Snap {
                            snap: l,
                            tokens: lt,
                            history: history.clone(),
                            held_from: 0,
                        };
                        snaps.push(left);
                        snaps.push(Snap {
                            snap: r,
                            tokens: rt,
                            history,
                            held_from: 0,
                        });
                    }
                    Err(e) => {
                        assert!(kind.rotating(), "KV split refused: {e}");
                        assert!(matches!(e, Error::Cache(CacheError::SplitRefused(_))));
                    }
                }
            }
            Op::Merge(..) | Op::Split(..) => {}
            Op::Expect(n) => {
                cache.expect_tokens(n).unwrap();
                hint = Some((n.max(hint.map_or(0, |h| h.0)), None));
            }
        }
        peak = peak.max(committed.len());
        if let (Some((n, bytes)), false) = (hint.as_mut(), kind.rotating()) {
            let now = cache.allocated_bytes();
            if peak > *n {
                hint = None;
            } else if now > 0 {
                assert_eq!(
                    *bytes.get_or_insert(now),
                    now,
                    "buffers reallocated under the hint"
                );
            }
        }
        check_equivalent(kind, &cache, &committed, &probe);
    }
}

fn kind_kv() -> impl Strategy<Value = Kind> {
    (1usize..5).prop_map(|step| Kind::Kv { step })
}
fn kind_staged() -> impl Strategy<Value = Kind> {
    (1usize..7).prop_map(|window| Kind::Staged { window })
}
fn kind_slack() -> impl Strategy<Value = Kind> {
    (1usize..7, 0usize..5).prop_map(|(window, max_draft)| Kind::Slack { window, max_draft })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::device::cases(1000), ..ProptestConfig::default() })]

    #[test]
    fn kv_cache_matches_fresh_prefill(kind in kind_kv(), ops in prop::collection::vec(op(), 1..40), probe in tokens(3)) {
        run(kind, ops, probe);
    }

    #[test]
    fn staged_rotating_cache_matches_fresh_prefill(kind in kind_staged(), ops in prop::collection::vec(op(), 1..40), probe in tokens(3)) {
        run(kind, ops, probe);
    }

    #[test]
    fn slack_rotating_cache_matches_fresh_prefill(kind in kind_slack(), ops in prop::collection::vec(op(), 1..40), probe in tokens(3)) {
        run(kind, ops, probe);
    }
}
