//! CPU cost of the forwards speculative decoding is made of, for the shipped target and draft
//! (`models/target`, `models/draft`; or only the directory in `SPECDEC_BENCH_MODEL`).
//!
//! 1. **Paired table** (printed first): after a prompt of each context length (128, 1,024 and
//!    3,000 tokens, or `SPECDEC_BENCH_CONTEXTS=128,512`; lengths past the model's
//!    `max_position_embeddings` are left out), a one-token decode step and verification
//!    forwards of 2, 5 and 9 tokens (γ = 1, 4, 8; other lengths with
//!    `SPECDEC_BENCH_ROWS=3,4`), interleaved: each round times
//!    [`PER_ROUND`] forwards of every kind in an order that rotates per round; the table
//!    gives the median over rounds of each kind's mean forward time and of its ratio to the
//!    decode step of the same round (a paired ratio, so drift of the machine's speed cancels).
//!    Decode steps advance a copy of the prefilled cache, as autoregressive decoding does;
//!    verifications run inside a speculation that rolls back.
//!    Beside the decode step: the bytes a decode step must read (weights in the compute dtype,
//!    the embedding table only where it is also the LM head, and the K/V held after the
//!    prompt), the read bandwidth measured in the same run (both cores summing a 2 GiB
//!    buffer, far past the last-level cache; median of 5, taken between rows), and the
//!    decode step's share of that memory bound.
//!    A GGUF file's table is printed twice: dequantized, then with its quantized matrices
//!    kept quantized (`quantized = true`, candle's quantized matmul), in one run.
//! 2. **criterion** (target only): prefill of 128 tokens, decode and verify 2 / 5 / 9 after 128.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::experiment::context_limit;
use specdec::models::{LoadOptions, Model};
use specdec::stats::median;

const PROMPT: usize = 128;
const DECODE_SPAN: usize = 128;
/// Forwards of each kind per round of the paired table.
const PER_ROUND: usize = 8;
/// Rounds of the paired table.
const ROUNDS: usize = 15;
/// Forward lengths of the paired table: a decode step, then verifications of γ + 1 tokens
/// (2, 5 and 9, or `SPECDEC_BENCH_ROWS=3,4`).
fn kinds() -> Vec<usize> {
    let verify = match std::env::var("SPECDEC_BENCH_ROWS") {
        Ok(list) => list
            .split(',')
            .map(|x| match x.trim().parse::<usize>() {
                Ok(n) if n > 1 => n,
                _ => {
                    eprintln!("error: SPECDEC_BENCH_ROWS={list}: {x:?} is not a row count above 1");
                    std::process::exit(2)
                }
            })
            .collect(),
        Err(_) => vec![2, 5, 9],
    };
    std::iter::once(1).chain(verify).collect()
}

fn strategy() -> RotatingStrategy {
    RotatingStrategy::Slack { max_draft: 8 }
}

fn model_dirs() -> Vec<PathBuf> {
    match std::env::var_os("SPECDEC_BENCH_MODEL") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => ["models/target", "models/draft"]
            .iter()
            .map(|d| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(d))
            .collect(),
    }
}

fn contexts() -> Vec<usize> {
    std::env::var("SPECDEC_BENCH_CONTEXTS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![128, 1024, 3000])
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

fn load(dir: &Path) -> Option<Model> {
    load_with(dir, false)
}

fn load_with(dir: &Path, quantized: bool) -> Option<Model> {
    if !dir.join("config.json").is_file() && !specdec::gguf::is_gguf(dir) {
        println!("model_decode: no model at {}, skipping", dir.display());
        return None;
    }
    let options = LoadOptions {
        quantized,
        ..LoadOptions::default()
    };
    Model::load(dir, &options)
        .map_err(|e| println!("model_decode: cannot load {}: {e}", dir.display()))
        .ok()
}

/// Mean seconds per forward of `len` tokens, `PER_ROUND` forwards after `seeded`'s prompt.
fn time_kind(model: &Model, seeded: &ModelCache, len: usize, vocab: usize) -> f64 {
    let block = tokens(len, vocab);
    let mut spent = Duration::ZERO;
    if len == 1 {
        let mut cache = seeded.deep_clone().expect("clone");
        for token in tokens(PER_ROUND, vocab) {
            let start = Instant::now();
            std::hint::black_box(model.forward_last(&[token], &mut cache).expect("forward"));
            spent += start.elapsed();
        }
    } else {
        let mut cache = seeded.deep_clone().expect("clone");
        for _ in 0..PER_ROUND {
            let mut spec = cache.speculate().expect("speculate");
            let start = Instant::now();
            std::hint::black_box(model.forward(&block, spec.cache()).expect("forward"));
            spent += start.elapsed();
            // `spec` drops here: the cache rolls back to the prompt.
        }
    }
    spent.as_secs_f64() / PER_ROUND as f64
}

/// DRAM read bandwidth in bytes per second: the median of 5 passes of rayon's pool summing a
/// 2 GiB buffer of u64 (vectorised integer adds: the loads, not the adds, bound it).
fn read_bandwidth() -> f64 {
    use rayon::prelude::*;
    let words = vec![1u64; (2usize << 30) / 8];
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let sum: u64 = words
                .par_chunks(1 << 20)
                .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
                .sum();
            std::hint::black_box(sum);
            (words.len() * 8) as f64 / start.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[2]
}

/// Bytes one decode step reads after `cache`'s prompt: every weight once in the compute
/// dtype (the embedding table only when it is the tied LM head; a lookup reads one row) and
/// the K/V the cache holds.
fn step_bytes(model: &Model, cache: &ModelCache) -> f64 {
    let info = model.info();
    let untied_embedding = if model.lm_head_is_embedding() {
        0
    } else {
        info.vocab_size * info.hidden_size
    };
    let weights = (info.param_count - untied_embedding) * info.dtype.size_in_bytes();
    let kv = cache.snapshot(0).map_or(0, |s| s.bytes());
    (weights + kv) as f64
}

/// One row of the paired table: `context`, then per kind (median ms, median ratio to decode).
fn paired_row(model: &Model, context: usize) -> Vec<(f64, f64)> {
    let vocab = model.info().vocab_size;
    let mut seeded = model.new_cache(strategy()).expect("cache");
    model
        .forward_last(&tokens(context, vocab), &mut seeded)
        .expect("prefill");
    let bytes = step_bytes(model, &seeded);
    let kinds = kinds();
    let mut times = vec![Vec::new(); kinds.len()];
    for round in 0..ROUNDS {
        for i in 0..kinds.len() {
            let k = (i + round) % kinds.len();
            times[k].push(time_kind(model, &seeded, kinds[k], vocab));
        }
    }
    let bandwidth = read_bandwidth();
    let mut row: Vec<(f64, f64)> = (0..kinds.len())
        .map(|k| {
            let ratios = times[k].iter().zip(&times[0]).map(|(t, d)| t / d);
            (
                1e3 * median(&times[k]).expect("ROUNDS > 0"),
                median(&ratios.collect::<Vec<_>>()).expect("ROUNDS > 0"),
            )
        })
        .collect();
    row.push((bytes, bandwidth));
    row
}

fn paired_table(dir: &Path, model: &Model) {
    let info = model.info();
    let limit = context_limit(dir).ok().flatten().unwrap_or(usize::MAX);
    println!(
        "\nmodel_decode paired: {} ({}, {:.1}M params, window {:?}, max_position_embeddings {limit})",
        dir.display(),
        info.arch,
        info.param_count as f64 / 1e6,
        info.sliding_window
    );
    let kinds = kinds();
    let verify: String = kinds[1..]
        .iter()
        .map(|k| format!(" verify {k} ms (×decode) |"))
        .collect();
    println!("| context | decode ms |{verify} MB read per step | read GB/s | bound ms | decode % of bound |");
    println!(
        "|---:|---:|{}---:|---:|---:|---:|",
        "---:|".repeat(kinds.len() - 1)
    );
    let longest = kinds.iter().max().copied().unwrap_or(1);
    for context in contexts()
        .into_iter()
        .filter(|c| c + longest + PER_ROUND <= limit)
    {
        let row = paired_row(model, context);
        let (bytes, bandwidth) = row[kinds.len()];
        let cells: Vec<String> = row[1..kinds.len()]
            .iter()
            .map(|(ms, x)| format!("{ms:.3} ({x:.2}×)"))
            .collect();
        let bound_ms = 1e3 * bytes / bandwidth;
        // The bytes of quantized blocks are not counted here: no bound for such a model.
        let bound = if model.is_quantized() {
            format!("— | {:.1} | — | —", bandwidth / 1e9)
        } else {
            format!(
                "{:.1} | {:.1} | {bound_ms:.3} | {:.0}%",
                bytes / 1e6,
                bandwidth / 1e9,
                100.0 * bound_ms / row[0].0
            )
        };
        println!(
            "| {context} | {:.3} | {} | {bound} |",
            row[0].0,
            cells.join(" | ")
        );
    }
}

fn bench(c: &mut Criterion) {
    let Some(dir) = model_dirs().into_iter().next() else {
        return;
    };
    let Some(model) = load(&dir) else { return };
    let info = model.info();
    let prompt = tokens(PROMPT, info.vocab_size);
    let name = format!("{} {}M params", info.arch, info.param_count / 1_000_000);

    let mut group = c.benchmark_group(format!("model_decode/{name}"));
    group.throughput(Throughput::Elements(PROMPT as u64));
    group.bench_function(format!("prefill_{PROMPT}"), |b| {
        b.iter(|| {
            let mut cache = model.new_cache(strategy()).expect("cache");
            model.forward(&prompt, &mut cache).expect("forward")
        })
    });

    let mut seeded = model.new_cache(strategy()).expect("cache");
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
    // Rejects a bad SPECDEC_BENCH_ROWS before any model loads.
    kinds();
    specdec::nn::on_cpu_pool(|| {
        for dir in model_dirs() {
            if let Some(model) = load(&dir) {
                paired_table(&dir, &model);
            }
            if specdec::gguf::is_gguf(&dir) {
                if let Some(model) = load_with(&dir, true) {
                    println!("\n(quantized = true)");
                    paired_table(&dir, &model);
                }
            }
        }
        println!();
    });
    if std::env::var_os("SPECDEC_BENCH_PAIRED_ONLY").is_some() {
        return;
    }
    specdec::nn::on_cpu_pool(benches);
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
