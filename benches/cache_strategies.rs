//! Time of one speculative step (append γ+1 K/V, then commit or roll back) per rollback
//! strategy × cache length × γ × acceptance pattern, on one layer of 8 KV heads × 128
//! head_dim in f32 on the CPU. `exp bench-cache` runs the same grid with its own timing loop
//! and also reports bytes copied and memory held.
//!
//! Filter with criterion's usual argument, e.g. `cargo bench --bench cache_strategies --
//! 'kv-rewind/32768'`.
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::{rngs::StdRng, Rng, SeedableRng};
use specdec::bench_cache::{prefilled, step_kv, BenchConfig, Pattern};
use specdec::bench_cache::{Layout, StrategyCache, StrategySpec};

fn bench(c: &mut Criterion) {
    let config = BenchConfig::default();
    let strategies = config.strategy_list().expect("default strategies");
    let max_draft = config.gammas.iter().copied().max().unwrap_or(1);
    for &length in &config.lengths {
        for layout in [Layout::Kv, Layout::Rotating] {
            let (snapshot, offset) = prefilled(layout, length, &config).expect("prefill");
            for &strategy in strategies.iter().filter(|s| s.layout() == layout) {
                let spec = StrategySpec {
                    strategy,
                    layers: config.layers,
                    window: length,
                    max_draft,
                };
                let mut cache = StrategyCache::new(spec).expect("cache");
                cache.restore_from(&snapshot, offset).expect("restore");
                let mut group = c.benchmark_group(format!("{}/{length}", strategy.name()));
                for &gamma in &config.gammas {
                    let kv = step_kv(&config, gamma).expect("step K/V");
                    // Tree path commits are timed by `exp bench-cache` (pattern `path`).
                    let chains = config.patterns.iter().filter(|&&p| p != Pattern::Path);
                    for &pattern in chains {
                        let id = BenchmarkId::new(pattern.name(), format!("g{gamma}"));
                        let mut rng = StdRng::seed_from_u64(config.seed);
                        group.bench_function(id, |b| {
                            // Steps are timed one by one: KV layouts rewind to the prefill
                            // between them, untimed.
                            b.iter_custom(|iters| {
                                let mut spent = Duration::ZERO;
                                for _ in 0..iters {
                                    let keep = match pattern {
                                        Pattern::All | Pattern::Path => gamma + 1,
                                        Pattern::None => 1,
                                        Pattern::Random => rng.random_range(1..=gamma + 1),
                                    };
                                    let start = Instant::now();
                                    cache.step(&kv, keep).expect("step");
                                    spent += start.elapsed();
                                    if layout == Layout::Kv {
                                        cache.rewind(offset).expect("rewind");
                                    }
                                }
                                spent
                            })
                        });
                    }
                }
                group.finish();
            }
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(50))
        .measurement_time(Duration::from_millis(200));
    targets = bench
}
criterion_main!(benches);
