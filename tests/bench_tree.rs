//! `exp bench-cache` times tree path commits: the `path` pattern runs on the speculation
//! strategies only (the baselines have no tree commit), and a path step leaves the cache
//! holding exactly the path's tokens.
use candle_core::{Device, Tensor};
use specdec::bench_cache::{measure, BenchConfig, Pattern};
use specdec::bench_cache::{Layout, RollbackStrategy, StrategyCache, StrategySpec};

#[test]
fn path_pattern_runs_on_speculation_strategies_only() {
    let grid = "strategies = [\"kv-rewind\", \"staged\", \"slack-ring\", \"clone-rot\"]\n\
                lengths = [16]\ngammas = [3, 6]\npatterns = [\"path\", \"all\"]\n\
                kv_heads = 2\nhead_dim = 4\nmin_runs = 2\nmax_runs = 3\ntarget_ms = 1\n";
    let config: BenchConfig = toml::from_str(grid).unwrap();
    let rows = measure(&config, |_| {}).unwrap();
    let path_rows: Vec<_> = rows.iter().filter(|r| r.pattern == Pattern::Path).collect();
    assert_eq!(
        path_rows.len(),
        3 * 2,
        "three speculation strategies × two γ"
    );
    assert!(path_rows
        .iter()
        .all(|r| r.strategy.transactional() && r.runs >= 2));
    assert_eq!(rows.len() - path_rows.len(), 4 * 2, "`all` runs everywhere");
}

#[test]
fn a_path_step_keeps_the_path() {
    for strategy in [
        RollbackStrategy::KvRewind,
        RollbackStrategy::Staged,
        RollbackStrategy::SlackRing,
    ] {
        let spec = StrategySpec {
            strategy,
            layers: 2,
            window: 8,
            max_draft: 6,
        };
        let mut cache = StrategyCache::new(spec).unwrap();
        let kv = |n: usize| {
            let t = Tensor::randn(0f32, 1.0, (1, 2, n, 4), &Device::Cpu).unwrap();
            vec![(t.clone(), t.clone()), (t.clone(), t)]
        };
        cache.prefill(&kv(11)).unwrap();
        // 0 ─ 1 ─ 3 ─ 5, and 0 ─ 2 ─ 4 ─ 6.
        let parents = [None, Some(0), Some(0), Some(1), Some(2), Some(3), Some(4)];
        cache.step_path(&kv(7), &parents, &[0, 2, 4, 6]).unwrap();
        assert_eq!(cache.offset(), 15, "{strategy:?}");
        let bad = cache.step_path(&kv(7), &parents, &[0, 1, 4]);
        assert!(bad.is_err(), "{strategy:?}: not a path");
        assert_eq!(
            cache.offset(),
            15,
            "{strategy:?}: a refused commit rolls back"
        );
    }
    let spec = StrategySpec {
        strategy: RollbackStrategy::CloneTruncate(Layout::Kv),
        layers: 1,
        window: 8,
        max_draft: 6,
    };
    let mut clone = StrategyCache::new(spec).unwrap();
    let t = Tensor::zeros((1, 2, 2, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(clone
        .step_path(&[(t.clone(), t)], &[None, Some(0)], &[0])
        .is_err());
}
