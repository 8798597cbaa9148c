//! CPU throughput of the default target model (`models/target`, or the directory in
//! `SPECDEC_BENCH_MODEL`): prefill of 128 tokens; single-token decode at positions 128..256
//! (the cache is re-seeded from a prefilled copy, untimed, when it reaches 256); and
//! verification forwards of 2, 5 and 9 tokens after the 128-token prompt, rolled back after
//! each (what one speculative step with γ = 1, 4, 8 costs the target).
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use specdec::cache::RotatingStrategy;
use specdec::models::{LoadOptions, Model};

const PROMPT: usize = 128;
const DECODE_SPAN: usize = 128;

fn model_dir() -> PathBuf {
    std::env::var_os("SPECDEC_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/target"))
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

fn bench(c: &mut Criterion) {
    let dir = model_dir();
    if !dir.join("config.json").is_file() {
        println!("model_decode: no model at {}, skipping", dir.display());
        return;
    }
    let model = match Model::load(&dir, &LoadOptions::default()) {
        Ok(model) => model,
        Err(e) => {
            println!("model_decode: cannot load {}: {e}", dir.display());
            return;
        }
    };
    let info = model.info();
    let prompt = tokens(PROMPT, info.vocab_size);
    let strategy = RotatingStrategy::Slack { max_draft: 8 };
    let name = format!("{} {}M params", info.arch, info.param_count / 1_000_000);

    let mut group = c.benchmark_group(format!("model_decode/{name}"));
    group.throughput(Throughput::Elements(PROMPT as u64));
    group.bench_function(format!("prefill_{PROMPT}"), |b| {
        b.iter(|| {
            let mut cache = model.new_cache(strategy).expect("cache");
            model.forward(&prompt, &mut cache).expect("forward")
        })
    });

    let mut seeded = model.new_cache(strategy).expect("cache");
    model.forward(&prompt, &mut seeded).expect("prefill");
    group.throughput(Throughput::Elements(1));
    group.bench_function("decode_1", |b| {
        b.iter_custom(|iters| {
            let mut cache = seeded.deep_clone().expect("clone");
            let mut spent = Duration::ZERO;
            for i in 0..iters {
                if cache.offset() >= PROMPT + DECODE_SPAN {
                    cache = seeded.deep_clone().expect("clone");
                }
                let token = prompt[i as usize % PROMPT];
                let start = Instant::now();
                let logits = model.forward(&[token], &mut cache).expect("forward");
                std::hint::black_box(logits);
                spent += start.elapsed();
            }
            spent
        })
    });
    for t in [2usize, 5, 9] {
        let block = tokens(t, info.vocab_size);
        group.bench_function(format!("verify_{t}"), |b| {
            b.iter(|| {
                let mut spec = seeded.speculate().expect("speculate");
                let logits = model.forward(&block, spec.cache()).expect("forward");
                std::hint::black_box(logits)
                // `spec` drops here: the cache rolls back to the prompt.
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5));
    targets = bench
}
// The benches run on rayon's pool, as `exp` does (see `specdec::nn::on_cpu_pool`): forwards
// called from outside it would pay a thread handoff each.
fn main() {
    specdec::nn::on_cpu_pool(benches);
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
