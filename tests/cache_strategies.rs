//! Every rollback strategy keeps the cache layer's invariant: after any sequence of committed
//! appends and speculative steps (any number kept, including none and all), what attention
//! sees — the K/V of the window in logical order, and attention over a probe appended to a
//! copy — equals a cache freshly prefilled with the committed tokens. Windows are small so
//! the rings wrap many times.
mod common;

use common::probe::{append, attend, close, kv, logical};
use proptest::prelude::*;
use specdec::bench_cache::{Layout, RollbackStrategy, StrategyCache, StrategySpec};
use specdec::cache::{KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy};

/// A plain cache of the strategy's layout freshly prefilled with `tokens`.
fn fresh(spec: StrategySpec, tokens: &[u8]) -> ModelCache {
    let layer = match spec.strategy.layout() {
        Layout::Kv => LayerCache::Kv(KvCache::default()),
        Layout::Rotating => LayerCache::Rotating(
            RotatingKvCache::new(spec.window, RotatingStrategy::Staged).unwrap(),
        ),
    };
    let mut c = ModelCache::new(vec![layer]);
    if !tokens.is_empty() {
        append(&mut c, tokens);
    }
    c
}

/// The invariant: the strategy's cache and a fresh prefill look the same to attention.
fn check_equivalent(spec: StrategySpec, cache: &StrategyCache, committed: &[u8], probe: &[u8]) {
    assert_eq!(cache.offset(), committed.len(), "offset");
    let mut reference = fresh(spec, committed);
    assert_eq!(logical(cache.cache()), logical(&reference), "logical K/V");
    let mut copy = cache.cache().deep_clone().unwrap();
    let (a, b) = (append(&mut copy, probe), append(&mut reference, probe));
    let n = probe.len();
    assert!(close(&attend(&a, n), &attend(&b, n)), "probe attention");
}

#[derive(Debug, Clone)]
enum Op {
    Prefill(Vec<u8>),
    /// A step of these tokens keeping `keep % (len + 1)`.
    Step(Vec<u8>, usize),
}

fn op(max_step: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => prop::collection::vec(0u8..50, 1..6).prop_map(Op::Prefill),
        4 => (prop::collection::vec(0u8..50, 1..=max_step), 0usize..100)
            .prop_map(|(t, keep)| Op::Step(t, keep)),
    ]
}

fn run(spec: StrategySpec, ops: Vec<Op>, probe: Vec<u8>) {
    let mut cache = StrategyCache::new(spec).unwrap();
    let mut committed: Vec<u8> = Vec::new();
    for op in ops {
        match op {
            Op::Prefill(t) => {
                cache.prefill(&[kv(&t, committed.len())]).unwrap();
                committed.extend(&t);
            }
            Op::Step(t, keep) => {
                let t = &t[..t.len().min(spec.max_draft + 1)];
                let keep = keep % (t.len() + 1);
                let cost = cache.step(&[kv(t, committed.len())], keep).unwrap();
                committed.extend(&t[..keep]);
                if matches!(spec.strategy, RollbackStrategy::KvRewind) {
                    assert_eq!((cost.bytes_copied, cost.bytes_held), (0, 0));
                }
            }
        }
        check_equivalent(spec, &cache, &committed, &probe);
    }
}

fn spec_of(strategy: RollbackStrategy) -> impl Strategy<Value = StrategySpec> {
    (1usize..7, 0usize..5).prop_map(move |(window, max_draft)| StrategySpec {
        strategy,
        layers: 1,
        window,
        max_draft,
    })
}

macro_rules! strategy_matches_fresh_prefill {
    ($($name:ident: $strategy:expr;)*) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: common::device::cases(250), ..ProptestConfig::default() })]
            $(
                #[test]
                fn $name(
                    spec in spec_of($strategy),
                    ops in prop::collection::vec(op(6), 1..30),
                    probe in prop::collection::vec(0u8..50, 1..4),
                ) {
                    run(spec, ops, probe);
                }
            )*
        }
    };
}

strategy_matches_fresh_prefill! {
    kv_rewind_matches_fresh_prefill: RollbackStrategy::KvRewind;
    staged_matches_fresh_prefill: RollbackStrategy::Staged;
    slack_ring_matches_fresh_prefill: RollbackStrategy::SlackRing;
    snapshot_kv_matches_fresh_prefill: RollbackStrategy::Snapshot(Layout::Kv);
    snapshot_rotating_matches_fresh_prefill: RollbackStrategy::Snapshot(Layout::Rotating);
    clone_kv_matches_fresh_prefill: RollbackStrategy::CloneTruncate(Layout::Kv);
    clone_rotating_matches_fresh_prefill: RollbackStrategy::CloneTruncate(Layout::Rotating);
    recompute_kv_matches_fresh_prefill: RollbackStrategy::Recompute(Layout::Kv);
    recompute_rotating_matches_fresh_prefill: RollbackStrategy::Recompute(Layout::Rotating);
}

#[test]
fn names_round_trip() {
    for s in RollbackStrategy::ALL {
        assert_eq!(RollbackStrategy::from_name(s.name()), Some(s));
    }
    assert_eq!(RollbackStrategy::from_name("rewind"), None);
}

#[test]
fn overlong_step_and_keep_are_refused() {
    let spec = StrategySpec {
        strategy: RollbackStrategy::SlackRing,
        layers: 1,
        window: 4,
        max_draft: 2,
    };
    let mut cache = StrategyCache::new(spec).unwrap();
    cache.prefill(&[kv(&[1, 2, 3], 0)]).unwrap();
    assert!(cache.step(&[kv(&[1, 2, 3, 4], 3)], 1).is_err());
    assert!(cache.step(&[kv(&[1, 2], 3)], 3).is_err());
    assert_eq!(cache.offset(), 3);
}

/// `exp bench-cache` end to end on a tiny grid: the result folder holds the CSV with every
/// column and one row per cell, the summary table and the plots.
#[test]
fn bench_cache_writes_csv_summary_and_plots() {
    use specdec::bench_cache::{measure, write_results, BenchConfig};
    let tmp = tempfile::tempdir().unwrap();
    let config_path = tmp.path().join("grid.toml");
    let grid = "strategies = [\"kv-rewind\", \"staged\", \"slack-ring\", \"clone-rot\"]\n\
                lengths = [16, 64]\ngammas = [1, 3]\npatterns = [\"all\", \"random\"]\n\
                kv_heads = 2\nhead_dim = 4\nmin_runs = 2\nmax_runs = 3\ntarget_ms = 1\n";
    std::fs::write(&config_path, grid).unwrap();
    let config = BenchConfig::load(&config_path).unwrap();
    let rows = measure(&config, |_| {}).unwrap();
    assert_eq!(rows.len(), 4 * 2 * 2 * 2);
    let out = tmp.path().join("run");
    let outcome = write_results(&config, &rows, Some(out.clone())).unwrap();
    assert_eq!(outcome.dir, out);

    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        header,
        [
            "strategy",
            "length",
            "gamma",
            "pattern",
            "runs",
            "step_us",
            "rollback_us",
            "bytes_copied_per_step",
            "extra_bytes_held"
        ]
    );
    let body: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(body.len(), rows.len());
    assert!(body.iter().all(|r| r.len() == header.len()));
    // KV rewind copies and holds nothing; a slack ring holds γmax + 1 = 4 spare slots of
    // 2 heads × 4 dims × 4 bytes × (K + V) = 64 bytes each, the staged side buffer its 16.
    for r in &body {
        match r[0] {
            "kv-rewind" => assert_eq!((r[7], r[8]), ("0", "0")),
            "slack-ring" => assert_eq!((r[7], r[8]), ("0", "256")),
            "staged" => assert_eq!(r[8], "1024"),
            _ => {}
        }
    }

    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| strategy | length | γ | pattern | µs/step |"));
    assert!(summary.contains("| clone-rot | 64 | 3 | random |"));
    assert!(summary.contains("Growth from length 16 to 64"));
    let plots = std::fs::read_dir(out.join("plots")).unwrap().count();
    assert_eq!(plots, 2 * 2 * 2, "step and rollback plot per γ × pattern");
    assert!(out.join("plots/step_g3_random.svg").is_file());
}

#[test]
fn bench_config_is_strict() {
    use specdec::bench_cache::BenchConfig;
    let parse = |text: &str| toml::from_str::<BenchConfig>(text);
    assert!(parse("lenghts = [1]").is_err(), "unknown key");
    let unknown: BenchConfig = parse("strategies = [\"rewind\"]").unwrap();
    assert!(unknown.validate().is_err());
    let repeated: BenchConfig = parse("gammas = [1, 1]").unwrap();
    assert!(repeated.validate().is_err());
    let zero: BenchConfig = parse("lengths = [0]").unwrap();
    assert!(zero.validate().is_err());
    BenchConfig::default().validate().unwrap();
}
