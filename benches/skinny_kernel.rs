//! The CPU's few-row product (`specdec::nn::skinny_matmul`, the kernel of every decode step and
//! verification on the CPU) against the machine's multiply-add peak: how far a verification of
//! `t` tokens can get below `t` times the work of a decode step.
//!
//! 1. **Peak**: one AVX-512 multiply-add chain set (12 independent 16-lane accumulators) per
//!    thread, on 1 and on all of rayon's threads: multiply-adds per second the cores retire.
//! 2. **Products**: `[t, in] × [out, in]ᵀ` for the shipped target's shapes (q/k/v, output,
//!    gate/up, down, LM head: `[320|256|1536|256|1024, 256|768]`; other shapes with
//!    `SPECDEC_BENCH_SHAPES`), t = 1, 2, 3, 4, 5, 9, on rayon's pool as a forward runs them,
//!    weights hot (one matrix, repeated), streamed (16 copies in turn, 25 MB for gate/up: from
//!    L3 or memory) and from memory (copies filling 256 MB): median µs of 15 rounds,
//!    multiply-adds per second, and the share of the peak; then the same on one thread (a pool
//!    of one, where the op does not split) against the one-thread peak.
//!
//! `cargo bench --bench skinny_kernel`. x86_64 with AVX-512 for the peak row; the products run
//! anywhere.
use std::time::Instant;

use candle_core::{Device, Tensor};
use specdec::nn::{on_cpu_pool, pin_cpu_thread_count, skinny_matmul, SkinnyWeight};
use specdec::stats::median;

const ROUNDS: usize = 15;

/// Multiply-adds per second of `threads` threads each running independent AVX-512 chains.
#[cfg(target_arch = "x86_64")]
fn peak(threads: usize) -> Option<f64> {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx512f")]
    fn chains(n: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); 12];
        let (a, b) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999_999_9));
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        acc.iter().map(|x| _mm512_reduce_add_ps(*x)).sum()
    }
    if !is_x86_feature_detected!("avx512f") {
        return None;
    }
    let n = 20_000_000;
    let start = Instant::now();
    let sums: Vec<f32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            // SAFETY: AVX-512F was detected above.
            .map(|_| s.spawn(move || unsafe { chains(n) }))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("peak thread"))
            .collect()
    });
    std::hint::black_box(sums);
    Some((threads * n * 12 * 16) as f64 / start.elapsed().as_secs_f64())
}

#[cfg(not(target_arch = "x86_64"))]
fn peak(_threads: usize) -> Option<f64> {
    None
}

/// Median seconds per product of `x` with the `ws` in turn, on the current pool.
fn time_products(x: &Tensor, ws: &[SkinnyWeight]) -> f64 {
    let per = 32 * ws.len();
    let times: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            on_cpu_pool(|| {
                let start = Instant::now();
                for i in 0..per {
                    std::hint::black_box(skinny_matmul(x, &ws[i % ws.len()]).expect("product"));
                }
                start.elapsed().as_secs_f64() / per as f64
            })
        })
        .collect();
    median(&times).expect("ROUNDS > 0")
}

/// `[out, in]` of the products timed: the shipped target's, or `SPECDEC_BENCH_SHAPES` as
/// `OUTxIN,...` (e.g. SmolLM2-135M's `960x576,576x576,3072x576,576x1536,49152x576`).
fn shapes() -> Vec<(usize, usize)> {
    let parse = |s: &str| {
        let (o, i) = s.trim().split_once('x')?;
        Some((o.parse().ok()?, i.parse().ok()?)).filter(|&(o, i): &(usize, usize)| o > 0 && i > 0)
    };
    match std::env::var("SPECDEC_BENCH_SHAPES") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                parse(s).unwrap_or_else(|| {
                    eprintln!(
                        "error: SPECDEC_BENCH_SHAPES={list}: {s:?} is not OUTxIN (e.g. 960x576)"
                    );
                    std::process::exit(2)
                })
            })
            .collect(),
        Err(_) => vec![(320, 256), (256, 256), (1536, 256), (256, 768), (1024, 256)],
    }
}

fn main() {
    let shapes = shapes();
    pin_cpu_thread_count();
    let threads = rayon::current_num_threads();
    let (one, all) = (peak(1), peak(threads));
    match (one, all) {
        (Some(one), Some(all)) => println!(
            "multiply-add peak: {:.1} GMAC/s on one thread, {:.1} on {threads}",
            one / 1e9,
            all / 1e9
        ),
        _ => println!("multiply-add peak: not measured (no AVX-512)"),
    }
    let single = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let share = |rate: f64, peak: Option<f64>| {
        peak.map_or("—".to_string(), |p| format!("{:.0}%", 100.0 * rate / p))
    };
    let dev = Device::Cpu;
    println!(
        "| weight [out, in] | weights | t | µs, {threads} threads | GMAC/s | of the peak | µs, one thread | GMAC/s | of one's peak |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (out, inp) in shapes {
        // "memory": enough copies for 256 MB (at least two), far past any last-level cache.
        let from_memory = ((256 << 20) / (4 * out * inp)).max(2);
        for (label, copies) in [("hot", 1usize), ("streamed", 16), ("memory", from_memory)] {
            let ws: Vec<SkinnyWeight> = (0..copies)
                .map(|_| {
                    let w = Tensor::randn(0f32, 1.0, (out, inp), &dev).expect("weight");
                    SkinnyWeight::new(&w)
                        .expect("weight")
                        .expect("an f32 weight on the CPU")
                })
                .collect();
            for t in [1usize, 2, 3, 4, 5, 9] {
                let x = Tensor::randn(0f32, 1.0, (t, inp), &dev).expect("x");
                let macs = (t * out * inp) as f64;
                let s = time_products(&x, &ws);
                let s1 = single.install(|| time_products(&x, &ws));
                println!(
                    "| [{out}, {inp}] | {label} | {t} | {:.2} | {:.1} | {} | {:.2} | {:.1} | {} |",
                    s * 1e6,
                    macs / s / 1e9,
                    share(macs / s, all),
                    s1 * 1e6,
                    macs / s1 / 1e9,
                    share(macs / s1, one),
                );
            }
        }
    }
}
