//! The engine's own cost: time per speculative generation spent outside the model forwards
//! (sampling, verification, cache commits, drafting bookkeeping), side by side with the
//! whole generation, on the default model pair on CPU (`models/target`, `models/draft`).
//!
//! Two measurements of the same runs: `total` (wall time) and `engine` (wall time minus the
//! time inside target and draft forwards). Their ratio is the engine's overhead; the bench
//! prints it after the runs (the target is under 5%).
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use criterion::{criterion_group, Criterion};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::models::{LoadOptions, Model};
use specdec::speculative::{
    generate, CachedSequence, Drafter, Drafting, GammaPolicy, GenParams, LanguageModel,
    ModelDrafter, SamplingParams,
};

/// A model that adds the time spent in its forwards to a shared counter.
struct Timed {
    model: Model,
    spent: Arc<TimeCell>,
}

/// Nanoseconds spent in forwards.
#[derive(Default)]
struct TimeCell(AtomicU64);

impl TimeCell {
    fn add(&self, d: Duration) {
        self.0.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
    fn take(&self) -> Duration {
        Duration::from_nanos(self.0.swap(0, Ordering::Relaxed))
    }
}

impl LanguageModel for Timed {
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> specdec::Result<Tensor> {
        let start = Instant::now();
        let out = self.model.forward(tokens, cache);
        self.spent.add(start.elapsed());
        out
    }
    fn new_cache(&self, strategy: RotatingStrategy) -> specdec::Result<ModelCache> {
        self.model.new_cache(strategy)
    }
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }
    fn eos_token_ids(&self) -> &[u32] {
        self.model.eos_token_ids()
    }
}

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let load = |name: &str| Model::load(&root.join(name), &LoadOptions::default());
    let (target, draft) = match (load("target"), load("draft")) {
        (Ok(t), Ok(d)) => (t, d),
        (Err(e), _) | (_, Err(e)) => {
            println!("engine_overhead: default models not loadable ({e}); skipping");
            return;
        }
    };
    let spent = Arc::new(TimeCell::default());
    let target = Timed {
        model: target,
        spent: spent.clone(),
    };
    let draft = Arc::new(Timed {
        model: draft,
        spent: spent.clone(),
    });
    let strategy = RotatingStrategy::Slack { max_draft: 4 };
    let mut drafter = ModelDrafter::new("draft", draft, strategy, None).expect("drafter");
    let mut seq = CachedSequence::new(target.new_cache(strategy).expect("cache"));
    let prompt: Vec<u32> = (0..32).map(|i| (i * 7 + 3) % 200).collect();
    let params = GenParams {
        max_new_tokens: 64,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(4),
        stop_at_eos: false,
    };
    let mut run = || {
        spent.take();
        let start = Instant::now();
        let mut rng = StdRng::seed_from_u64(0);
        // A fresh generation each time: nothing reused from the previous one.
        seq.reset();
        drafter.reset().expect("reset");
        generate(
            &target,
            &mut seq,
            &prompt,
            &params,
            Drafting::chain(&mut drafter),
            &mut rng,
        )
        .expect("generation");
        (start.elapsed(), spent.take())
    };
    let (mut wall_sum, mut engine_sum) = (Duration::ZERO, Duration::ZERO);
    let mut group = c.benchmark_group("engine_overhead/64 tokens, γ=4, greedy");
    group.sample_size(20);
    group.bench_function("total", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| run().0).sum())
    });
    group.bench_function("engine", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let (wall, forwards) = run();
                    wall_sum += wall;
                    engine_sum += wall.saturating_sub(forwards);
                    wall.saturating_sub(forwards)
                })
                .sum()
        })
    });
    group.finish();
    println!(
        "engine_overhead: engine work is {:.2}% of a speculative generation",
        100.0 * engine_sum.as_secs_f64() / wall_sum.as_secs_f64().max(f64::EPSILON)
    );
}

criterion_group!(benches, bench);
// The benches run on rayon's pool, as `exp` does (see `specdec::nn::on_cpu_pool`): forwards
// called from outside it would pay a thread handoff each.
fn main() {
    specdec::nn::on_cpu_pool(benches);
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
