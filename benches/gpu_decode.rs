//! Where decode time goes, on the device a researcher decodes on (written for the GPU; runs on
//! any device). For each model (`SPECDEC_BENCH_MODEL`, comma-separated directories; default
//! the shipped target and draft), on `SPECDEC_BENCH_DEVICE` (`cuda` when built with it, else
//! `cpu`) in `SPECDEC_BENCH_DTYPE` (`auto`, `f32`, `bf16`, `f16`):
//!
//! 1. **Bandwidth**: a device-to-device copy of 1 GiB, median of 9 (read + write bytes / s;
//!    on CUDA the driver's copy between buffers allocated beforehand), or
//!    `SPECDEC_BENCH_BANDWIDTH` (bytes / s) where set: the memory bound of a decode step is the
//!    weight bytes at this rate.
//! 2. **Context table**: after a prompt of each length (`SPECDEC_BENCH_CONTEXTS`, default
//!    128, 1,024, 4,096 and 8,000, cut at the model's context; into a cache first grown to
//!    `SPECDEC_BENCH_CAPACITY` positions where set, as an engine's caches stay grown from one
//!    prompt to the next), the prompt's prefill time and
//!    `SPECDEC_BENCH_ROUNDS` (default 16) interleaved rounds of 4 decode steps, one
//!    verification forward of 5 tokens (γ = 4) and one of a token tree of 8 nodes (`TREE`:
//!    two children a node, depth 3), each inside a speculation that rolls back; then the
//!    same tree again with its path `TREE_PATH` kept (`commit_path`, timed from the tree's
//!    read-back to the device's completion of the commit: the cache grows 4 tokens a round). Every
//!    forward ends with the argmax of its logits read back to the host — the one device →
//!    host synchronisation a decode step needs — so times are completed work, not queued
//!    work. Also given: the host time until the decode forward returns (enqueue), which is
//!    all of the step when the host, not the device, is the bottleneck; and a chained step
//!    (4 more steps per round, each fed the argmax of the one before where it lies on the
//!    device — `forward_argmax`, the argmax inside the step — and read back once at the
//!    end, as greedy drafting runs them): the step without
//!    the host's round trip. c is the draft's chained step over the target's decode step.
//! 3. **Stages**: one decode step after 128 tokens, `PROFILE_STEPS` times, with the device
//!    synchronised at every stage boundary (`specdec::nn::profile`): per-stage ms per token,
//!    summed over layers. The synchronisations cost time of their own, so the stages add up
//!    to more than a step; they show which stages are slow, not the overlapped total.
//!
//! Rotating (sliding-window) layers keep the slack strategy's caches (room for 8 drafts), or
//! the staged strategy's with `SPECDEC_BENCH_STRATEGY=staged`.
//!
//! `SPECDEC_BENCH_TP` (comma-separated, one per model; default 1) splits a model over that many
//! GPUs (tensor parallelism): its bound is then the weight bytes at that many times the copy
//! rate (the aggregate bound), and the stage tables are skipped (the ranks run on threads of
//! their own); on CUDA a line after its table gives the device time of its all-reduces (two a
//! layer, one row each) run back to back on an NCCL group of their own, and their share of
//! the decode step. `SPECDEC_BENCH_RANDOM=1` loads every model with random weights from its
//! `config.json` alone (no weight files: shapes too large to write to disk).
//!
//! `SPECDEC_BENCH_JSON=path` also writes everything as JSON. `SPECDEC_BENCH_KERNELS=n` does
//! only a prefill of 128 tokens, `n` decode steps of the first model and `n` verification
//! forwards of 5 tokens (each ending in one argmax read back), for a kernel profiler to count
//! and time the launches of a step.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::experiment::context_limit;
use specdec::models::{DTypeChoice, LoadOptions, Model};
use specdec::nn::{QueueMark, StepIds};
use specdec::stats::median;

const DECODES_PER_ROUND: usize = 4;
const VERIFY: usize = 5;
/// The token tree verified beside the chain: the parents of its 8 nodes (a root with two
/// children, two grandchildren under the first, one under the second, one level more).
const TREE: [Option<usize>; 8] = [
    None,
    Some(0),
    Some(0),
    Some(1),
    Some(1),
    Some(2),
    Some(3),
    Some(5),
];
/// The root-to-leaf path of [`TREE`] the benchmark commits: 4 of its 8 nodes, in two runs.
const TREE_PATH: [usize; 4] = [0, 1, 3, 6];
const PROFILE_STEPS: usize = 8;

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn device() -> Device {
    let want = std::env::var("SPECDEC_BENCH_DEVICE").unwrap_or_else(|_| {
        if candle_core::utils::cuda_is_available() {
            "cuda".into()
        } else {
            "cpu".into()
        }
    });
    match want.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => specdec::nn::open_cuda(0).unwrap_or_else(|e| panic!("no CUDA device: {e}")),
        "metal" => Device::new_metal(0).unwrap_or_else(|e| panic!("no Metal device: {e}")),
        other => panic!("SPECDEC_BENCH_DEVICE={other}: expected cpu, cuda or metal"),
    }
}

fn dtype() -> DTypeChoice {
    let name = std::env::var("SPECDEC_BENCH_DTYPE").unwrap_or_else(|_| "auto".into());
    name.parse()
        .unwrap_or_else(|e| panic!("SPECDEC_BENCH_DTYPE={name}: {e}"))
}

/// Device time on rank 0's queue (median of 9 rounds after one warm-up) of `count`
/// all-reduces of one `[1, hidden]` row back to back, on an NCCL group over GPUs
/// `0..ranks` of its own: what a split decode step spends in its all-reduces (two a layer)
/// where none overlapped other work. Each rank queues 4 before the timed ones, so rank 0's
/// clock starts once every rank is in the loop.
fn reduce_ms(ranks: usize, hidden: usize, dtype: DType, count: usize) -> f64 {
    let devices: Vec<Device> = (0..ranks)
        .map(|g| specdec::nn::open_cuda(g).expect("open GPU"))
        .collect();
    let group = specdec::nn::all_reduce_group(&devices).expect("NCCL group");
    let rows: Vec<Tensor> = devices
        .iter()
        .map(|d| Tensor::ones((1, hidden), dtype, d).expect("row"))
        .collect();
    let run = |rank: usize| {
        for _ in 0..4 {
            group[rank].sum(&rows[rank]).expect("all-reduce");
        }
        let start = QueueMark::record(&devices[rank]).expect("mark");
        for _ in 0..count {
            group[rank].sum(&rows[rank]).expect("all-reduce");
        }
        let end = QueueMark::record(&devices[rank]).expect("mark");
        devices[rank].synchronize().expect("sync");
        start.seconds_to(&end).expect("marks")
    };
    let mut times: Vec<f64> = (0..10)
        .map(|_| {
            std::thread::scope(|s| {
                let run = &run;
                let peers: Vec<_> = (1..ranks).map(|r| s.spawn(move || run(r))).collect();
                let mine = run(0);
                for p in peers {
                    p.join().expect("rank thread");
                }
                mine
            })
        })
        .skip(1)
        .collect();
    times.sort_by(f64::total_cmp);
    1e3 * times[times.len() / 2]
}

/// Read + write bytes per second of a 1 GiB device-to-device copy (median of 9) and what
/// copied: on CUDA the driver's copy between two buffers allocated beforehand, elsewhere
/// candle's copy of a tensor. (candle's copy on CUDA allocates its destination inside the
/// timed region and measured 1.15–1.31 TB/s where torch's clone ran 3.96–4.26 TB/s on the
/// same H200.)
fn copy_bandwidth(device: &Device) -> (f64, &'static str) {
    let n = 1usize << 28; // f32 elements: 1 GiB
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let stream = dev.cuda_stream();
        let src = stream.alloc_zeros::<f32>(n).expect("alloc");
        let mut dst = stream.alloc_zeros::<f32>(n).expect("alloc");
        let mut times = Vec::new();
        for _ in 0..10 {
            stream.synchronize().expect("sync");
            let start = Instant::now();
            stream.memcpy_dtod(&src, &mut dst).expect("copy");
            stream.synchronize().expect("sync");
            times.push(start.elapsed().as_secs_f64());
        }
        let rate = 2.0 * (n * 4) as f64 / median(&times[1..]).expect("nine timed copies");
        return (rate, "driver copy of 1 GiB between allocated buffers");
    }
    let a = Tensor::zeros(n, DType::F32, device).expect("alloc");
    let mut times = Vec::new();
    for _ in 0..10 {
        device.synchronize().expect("sync");
        let start = Instant::now();
        let b = a.copy().expect("copy");
        device.synchronize().expect("sync");
        times.push(start.elapsed().as_secs_f64());
        drop(b);
    }
    let rate = 2.0 * (n * 4) as f64 / median(&times[1..]).expect("nine timed copies");
    (rate, "candle copy of 1 GiB")
}

fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + seed * 101 + 11) % vocab) as u32)
        .collect()
}

/// The argmax of the last row, read back: completes the forward.
fn finish(logits: &Tensor) -> u32 {
    let last = logits
        .narrow(0, logits.dim(0).expect("rows") - 1, 1)
        .expect("row");
    specdec::nn::argmax_rows(&last).expect("argmax read back")[0]
}

struct ContextRow {
    context: usize,
    prefill_s: f64,
    decode_ms: f64,
    /// A step fed the step before's argmax on the device, one read-back per round.
    chained_ms: f64,
    enqueue_ms: f64,
    verify_ms: f64,
    verify_ratio: f64,
    tree_ms: f64,
    tree_ratio: f64,
    /// Keeping [`TREE_PATH`] of a verified tree, in decode steps.
    commit_ratio: f64,
}

fn context_row(model: &Model, context: usize, rounds: usize) -> ContextRow {
    let vocab = model.info().vocab_size;
    let prompt = tokens(context, vocab, 0);
    // Warm-up: kernels loaded, buffers of this size allocated once.
    let mut cache = new_cache(model);
    finish(&model.forward_last(&prompt, &mut cache).expect("prefill"));
    let mut cache = new_cache(model);
    // SPECDEC_BENCH_CAPACITY=n: the cache first grown to n positions (a prefill, then a reset
    // that keeps the buffers), as an engine's caches stay grown from one prompt to the next.
    let grown = env_list("SPECDEC_BENCH_CAPACITY", &[0])[0];
    if grown > 0 {
        finish(
            &model
                .forward_last(&tokens(grown, vocab, 5), &mut cache)
                .expect("growing prefill"),
        );
        cache.reset();
    }
    model.device().synchronize().expect("sync");
    let start = Instant::now();
    let mut next = finish(&model.forward_last(&prompt, &mut cache).expect("prefill"));
    let prefill_s = start.elapsed().as_secs_f64();

    let block = tokens(VERIFY, vocab, 1);
    let tree_block = tokens(TREE.len(), vocab, 2);
    let (mut decode, mut chained, mut enqueue, mut verify, mut ratio) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut tree, mut tree_ratio, mut commit_ratio) = (vec![], vec![], vec![]);
    for round in 0..rounds + 1 {
        let mut spent = Duration::ZERO;
        let mut queued = Duration::ZERO;
        for _ in 0..DECODES_PER_ROUND {
            let start = Instant::now();
            let logits = model.forward_last(&[next], &mut cache).expect("decode");
            queued += start.elapsed();
            next = finish(&logits);
            spent += start.elapsed();
        }
        // As many steps chained as a greedy draft chains them: each fed the argmax of the one
        // before where it lies on the device, read back once at the end.
        let start = Instant::now();
        let mut ids = model
            .forward_argmax(StepIds::Host(&[next]), &mut cache, true)
            .expect("decode");
        for _ in 1..DECODES_PER_ROUND {
            ids = model
                .forward_argmax(StepIds::Device(&ids), &mut cache, true)
                .expect("decode");
        }
        next = ids.to_vec().expect("read back")[0];
        let c = start.elapsed().as_secs_f64() / DECODES_PER_ROUND as f64;
        let start = Instant::now();
        {
            let mut spec = cache.speculate().expect("speculate");
            finish(&model.forward(&block, spec.cache()).expect("verify"));
            // `spec` drops: the cache rolls back.
        }
        let v = start.elapsed().as_secs_f64();
        let start = Instant::now();
        {
            let mut spec = cache.speculate().expect("speculate");
            spec.extend_tree(&TREE).expect("tree");
            finish(&model.forward(&tree_block, spec.cache()).expect("tree"));
        }
        let tv = start.elapsed().as_secs_f64();
        let cv = {
            let mut spec = cache.speculate().expect("speculate");
            spec.extend_tree(&TREE).expect("tree");
            finish(&model.forward(&tree_block, spec.cache()).expect("tree"));
            let start = Instant::now();
            spec.commit_path(&TREE_PATH).expect("commit path");
            model.device().synchronize().expect("sync");
            start.elapsed().as_secs_f64()
        };
        if round == 0 {
            continue; // warm-up round
        }
        let d = spent.as_secs_f64() / DECODES_PER_ROUND as f64;
        decode.push(d);
        chained.push(c);
        enqueue.push(queued.as_secs_f64() / DECODES_PER_ROUND as f64);
        verify.push(v);
        ratio.push(v / d);
        tree.push(tv);
        tree_ratio.push(tv / d);
        commit_ratio.push(cv / d);
    }
    let timed = |v: &[f64]| median(v).expect("a timed round: SPECDEC_BENCH_ROUNDS >= 2");
    ContextRow {
        context,
        prefill_s,
        decode_ms: 1e3 * timed(&decode),
        chained_ms: 1e3 * timed(&chained),
        enqueue_ms: 1e3 * timed(&enqueue),
        verify_ms: 1e3 * timed(&verify),
        verify_ratio: timed(&ratio),
        tree_ms: 1e3 * timed(&tree),
        tree_ratio: timed(&tree_ratio),
        commit_ratio: timed(&commit_ratio),
    }
}

/// The rotating caches' strategy: `SPECDEC_BENCH_STRATEGY` (`slack`, the default, with room
/// for 8 drafts; or `staged`).
fn strategy() -> RotatingStrategy {
    match std::env::var("SPECDEC_BENCH_STRATEGY").as_deref() {
        Err(_) | Ok("slack") => RotatingStrategy::Slack { max_draft: 8 },
        Ok("staged") => RotatingStrategy::Staged,
        Ok(other) => panic!("SPECDEC_BENCH_STRATEGY={other}: expected slack or staged"),
    }
}

fn new_cache(model: &Model) -> ModelCache {
    model.new_cache(strategy()).expect("cache")
}

/// Per-stage ms per decode step after 128 tokens, device synchronised at every stage.
fn stages(model: &Model) -> Vec<(String, f64)> {
    let vocab = model.info().vocab_size;
    let mut cache = new_cache(model);
    let mut next = finish(
        &model
            .forward_last(&tokens(128, vocab, 2), &mut cache)
            .expect("prefill"),
    );
    next = finish(&model.forward_last(&[next], &mut cache).expect("warm"));
    // Stages exist on the ordinary path only (a replayed graph is one launch).
    let graphs = specdec::nn::graphs_enabled();
    set_cuda_graphs(false);
    specdec::nn::profile::enable(true);
    for _ in 0..PROFILE_STEPS {
        next = finish(&model.forward_last(&[next], &mut cache).expect("decode"));
    }
    let times = specdec::nn::profile::take();
    specdec::nn::profile::enable(false);
    set_cuda_graphs(graphs);
    times
        .into_iter()
        .map(|(name, spent, _)| {
            (
                name.to_string(),
                1e3 * spent.as_secs_f64() / PROFILE_STEPS as f64,
            )
        })
        .collect()
}

/// Per-stage seconds of one prefill of `n` tokens (device synchronised per stage).
fn prefill_stages(model: &Model, n: usize) -> Vec<(String, f64)> {
    let prompt = tokens(n, model.info().vocab_size, 3);
    let graphs = specdec::nn::graphs_enabled();
    set_cuda_graphs(false);
    specdec::nn::profile::enable(true);
    finish(
        &model
            .forward_last(&prompt, &mut new_cache(model))
            .expect("prefill"),
    );
    let times = specdec::nn::profile::take();
    specdec::nn::profile::enable(false);
    set_cuda_graphs(graphs);
    times
        .into_iter()
        .map(|(name, spent, _)| (name.to_string(), spent.as_secs_f64()))
        .collect()
}

/// Turns graph replay of short CUDA steps on or off (the engine option `cuda_graphs`; a
/// change makes the model record its steps anew).
fn set_cuda_graphs(on: bool) {
    let options = specdec::engine::EngineOptions {
        cuda_graphs: on,
        ..specdec::engine::get()
    };
    specdec::engine::set(options).unwrap_or_else(|e| panic!("engine options: {e}"));
}

fn main() {
    // Single-threaded, like `exp`: graph replay on unless SPECDEC_CUDA_GRAPHS=0 (every
    // engine option's `SPECDEC_*` override applies).
    let options = specdec::engine::env::overrides(specdec::engine::EngineOptions {
        cuda_graphs: true,
        ..specdec::engine::get()
    })
    .unwrap_or_else(|e| panic!("engine options from the environment: {e}"));
    specdec::engine::set(options).unwrap_or_else(|e| panic!("engine options: {e}"));
    let device = device();
    let dirs: Vec<PathBuf> = match std::env::var("SPECDEC_BENCH_MODEL") {
        Ok(s) => s.split(',').map(PathBuf::from).collect(),
        Err(_) => ["models/target", "models/draft"]
            .iter()
            .map(|d| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(d))
            .collect(),
    };
    let contexts = env_list("SPECDEC_BENCH_CONTEXTS", &[128, 1024, 4096, 8000]);
    let rounds = env_list("SPECDEC_BENCH_ROUNDS", &[16])[0].max(1);
    #[cfg(feature = "cuda")]
    if let Ok(n) = std::env::var("SPECDEC_BENCH_TRACE") {
        let n: usize = n.parse().expect("SPECDEC_BENCH_TRACE: a step count");
        for dir in &dirs {
            trace(dir, &device, n);
        }
        return;
    }
    if let Ok(n) = std::env::var("SPECDEC_BENCH_KERNELS") {
        let n: usize = n.parse().expect("SPECDEC_BENCH_KERNELS: a step count");
        let opts = LoadOptions {
            device: device.clone(),
            dtype: dtype(),
            quantized: false,
            ..Default::default()
        };
        let model = Model::load(&dirs[0], &opts).expect("load");
        let mut cache = new_cache(&model);
        let vocab = model.info().vocab_size;
        let mut next = finish(
            &model
                .forward_last(&tokens(128, vocab, 0), &mut cache)
                .expect("prefill"),
        );
        for _ in 0..n {
            next = finish(&model.forward_last(&[next], &mut cache).expect("decode"));
        }
        // Then as many verification forwards of VERIFY tokens, each rolled back.
        let block = tokens(VERIFY, vocab, 1);
        for _ in 0..n {
            let mut spec = cache.speculate().expect("speculate");
            finish(&model.forward(&block, spec.cache()).expect("verify"));
        }
        return;
    }
    // A reference copy rate measured outside where given, else the copy measured here.
    let (bandwidth, source) = match std::env::var("SPECDEC_BENCH_BANDWIDTH") {
        Ok(v) => (
            v.trim()
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("SPECDEC_BENCH_BANDWIDTH={v}: {e}")),
            "SPECDEC_BENCH_BANDWIDTH",
        ),
        Err(_) => copy_bandwidth(&device),
    };
    println!(
        "gpu_decode on {device:?}: device-to-device copy {:.1} GB/s (read + write; {source}); rotating caches {:?}",
        bandwidth / 1e9,
        strategy()
    );
    let mut json = Vec::new();
    let mut decode_128 = Vec::new();
    let splits = env_list("SPECDEC_BENCH_TP", &[1]);
    let random = std::env::var("SPECDEC_BENCH_RANDOM").is_ok_and(|v| v == "1");
    for (i, dir) in dirs.iter().enumerate() {
        let ranks = splits.get(i).copied().unwrap_or(1).max(1);
        let opts = LoadOptions {
            device: device.clone(),
            dtype: dtype(),
            tensor_parallel: ranks,
            random_weights: random,
            ..Default::default()
        };
        let loading = Instant::now();
        let model = Model::load(dir, &opts)
            .unwrap_or_else(|e| panic!("cannot load {}: {e}", dir.display()));
        let load_s = loading.elapsed().as_secs_f64();
        let info = model.info().clone();
        let bytes = info.param_count * info.dtype.size_in_bytes();
        // A step reads every weight once except an untied embedding table, of which it
        // gathers one row per token.
        let tied = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|c| c.get("tie_word_embeddings").and_then(|v| v.as_bool()))
            .unwrap_or(false);
        let embedding = info.vocab_size * info.hidden_size * info.dtype.size_in_bytes();
        let read = if tied { bytes } else { bytes - embedding };
        let bound_ms = 1e3 * read as f64 / (bandwidth * ranks as f64);
        let limit = context_limit(dir).ok().flatten().unwrap_or(usize::MAX);
        println!(
            "\n{}{} ({}, {} layers, {:.1}M params, {:?}: {:.3} GB of weights, {:.3} GB read per step; bound {:.3} ms/token = {:.0} tok/s; loaded in {load_s:.1} s)",
            dir.display(),
            if ranks > 1 { format!(" split over {ranks} ranks (aggregate bound: {ranks} x the copy rate)") } else { String::new() },
            info.arch,
            info.num_layers,
            info.param_count as f64 / 1e6,
            info.dtype,
            bytes as f64 / 1e9,
            read as f64 / 1e9,
            bound_ms,
            1e3 / bound_ms
        );
        println!("| context | prefill s | decode ms/token | tok/s | % of bound | host enqueue ms | chained ms/step | verify 5 ms | verify 5 / decode | tree 8 ms | tree 8 / decode | path commit / decode |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut rows_json = Vec::new();
        for &context in contexts.iter().filter(|&&c| {
            c + (rounds + 1) * (2 * DECODES_PER_ROUND + TREE_PATH.len()) + TREE.len() < limit
        }) {
            let r = context_row(&model, context, rounds);
            println!(
                "| {} | {:.3} | {:.3} | {:.1} | {:.0}% | {:.3} | {:.3} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2} |",
                r.context,
                r.prefill_s,
                r.decode_ms,
                1e3 / r.decode_ms,
                100.0 * bound_ms / r.decode_ms,
                r.enqueue_ms,
                r.chained_ms,
                r.verify_ms,
                r.verify_ratio,
                r.tree_ms,
                r.tree_ratio,
                r.commit_ratio
            );
            if context == contexts[0] {
                decode_128.push((r.decode_ms, r.chained_ms));
            }
            rows_json.push(serde_json::json!({
                "context": r.context, "prefill_s": r.prefill_s, "decode_ms": r.decode_ms,
                "enqueue_ms": r.enqueue_ms, "chained_ms": r.chained_ms, "verify5_ms": r.verify_ms,
                "verify5_over_decode": r.verify_ratio,
                "tree8_ms": r.tree_ms, "tree8_over_decode": r.tree_ratio,
                "path_commit_over_decode": r.commit_ratio,
            }));
        }
        let reduce = (ranks > 1 && device.is_cuda()).then(|| {
            let ms = reduce_ms(ranks, info.hidden_size, info.dtype, 2 * info.num_layers);
            let step = decode_128.last().map_or(f64::NAN, |(d, _)| *d);
            println!(
                "\nall-reduces: {} of one [1, {}] {:?} row back to back on {ranks} GPUs: {ms:.3} ms of device time on rank 0 = {:.0}% of the decode step at {}",
                2 * info.num_layers,
                info.hidden_size,
                info.dtype,
                100.0 * ms / step,
                contexts[0]
            );
            ms
        });
        let profiled = ranks == 1;
        let stages = if profiled { stages(&model) } else { Vec::new() };
        let total: f64 = stages.iter().map(|(_, ms)| ms).sum();
        println!("\nstages of one decode step after 128 tokens (device synchronised per stage; sum {total:.3} ms):");
        println!("| stage | ms/token | share |");
        println!("|---|---:|---:|");
        for (name, ms) in &stages {
            println!("| {name} | {ms:.3} | {:.0}% |", 100.0 * ms / total);
        }
        let longest = contexts
            .iter()
            .copied()
            .filter(|&c| c < limit)
            .max()
            .unwrap_or(0);
        let prefill = if longest > 0 && profiled {
            prefill_stages(&model, longest)
        } else {
            Vec::new()
        };
        let total: f64 = prefill.iter().map(|(_, s)| s).sum();
        println!("\nstages of one prefill of {longest} tokens (device synchronised per stage; sum {total:.3} s):");
        println!("| stage | s | share |");
        println!("|---|---:|---:|");
        for (name, secs) in &prefill {
            println!("| {name} | {secs:.4} | {:.0}% |", 100.0 * secs / total);
        }
        json.push(serde_json::json!({
            "prefill_stages_s": prefill.iter().map(|(n, s)| serde_json::json!({"stage": n, "s": s})).collect::<Vec<_>>(),
            "model": dir.display().to_string(), "arch": info.arch, "layers": info.num_layers,
            "tensor_parallel": ranks, "random_weights": random, "load_s": load_s,
            "all_reduces_ms": reduce,
            "params": info.param_count, "dtype": format!("{:?}", info.dtype),
            "weight_bytes": bytes, "read_bytes": read, "bound_ms": bound_ms, "contexts": rows_json,
            "stages_ms": stages.iter().map(|(n, ms)| serde_json::json!({"stage": n, "ms": ms})).collect::<Vec<_>>(),
        }));
    }
    if let [(target, _), (draft, draft_chained)] = decode_128[..] {
        println!(
            "\ndraft/target cost ratio c at context {}: {:.3} (draft steps read back each: {:.3})",
            contexts[0],
            draft_chained / target,
            draft / target
        );
    }
    if let Ok(path) = std::env::var("SPECDEC_BENCH_JSON") {
        let doc = serde_json::json!({
            "device": format!("{device:?}"), "copy_bandwidth_bytes_per_s": bandwidth, "models": json,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("json"))
            .unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    }
}

/// `SPECDEC_BENCH_TRACE=n` with a diagnostics build (`SPECDEC_KERNEL_TRACE=1`): `n` chained
/// decode steps after 128 tokens, then `n` with the step's id uploaded from the host (as the
/// oracle feeds its cost model), then `n` verifications of 5 tokens (each rolled back; all
/// but the first chained, the first a decode step), each block's PDL release recorded: per launch of our kernels
/// (in release order) the blocks, the first block's entry and release, and the time to the
/// next launch's release; then, per launch position within a step, the mean of that time.
/// Gaps hold what is not ours (candle's copies, casts, the embedding; uploads).
#[cfg(feature = "cuda")]
fn trace(dir: &std::path::Path, device: &Device, n: usize) {
    let Device::Cuda(dev) = device else {
        panic!("SPECDEC_BENCH_TRACE needs a CUDA device");
    };
    let opts = LoadOptions {
        device: device.clone(),
        dtype: dtype(),
        quantized: false,
        ..Default::default()
    };
    let model =
        Model::load(dir, &opts).unwrap_or_else(|e| panic!("cannot load {}: {e}", dir.display()));
    let vocab = model.info().vocab_size;
    let mut cache = new_cache(&model);
    let mut next = finish(
        &model
            .forward_last(&tokens(128, vocab, 0), &mut cache)
            .expect("prefill"),
    );
    let block = tokens(VERIFY, vocab, 1);
    for kind in ["device ids", "host ids", "verifications of 5"] {
        for _ in 0..4 {
            next = finish(&model.forward_last(&[next], &mut cache).expect("warm"));
        }
        specdec::nn::kernel_trace(dev).expect("trace reset");
        let mut ids = model
            .forward_argmax(StepIds::Host(&[next]), &mut cache, true)
            .expect("decode");
        for i in 1..n {
            ids = match kind {
                "device ids" => model.forward_argmax(StepIds::Device(&ids), &mut cache, true),
                "host ids" => {
                    model.forward_argmax(StepIds::Host(&[(i % vocab) as u32]), &mut cache, true)
                }
                _ => {
                    let mut spec = cache.speculate().expect("speculate");
                    model.forward_argmax(StepIds::Host(&block), spec.cache(), false)
                }
            }
            .expect("decode");
        }
        next = ids.to_vec().expect("read back")[0];
        let recs = specdec::nn::kernel_trace(dev).expect("trace read");
        // Per launch: grid, blocks, first entry, first release, last release. A graph's
        // replays reuse its kernels' grid ids, so a grid's blocks split into launches where
        // their releases lie more than 150 us apart (no kernel here takes that long; a step
        // does).
        let mut recs = recs;
        recs.sort_by_key(|r| (r.grid, r.release_ns));
        let mut launches: Vec<(u64, usize, u64, u64, u64)> = Vec::new();
        for r in &recs {
            match launches.last_mut() {
                Some(l) if l.0 == r.grid && r.release_ns < l.4 + 150_000 => {
                    l.1 += 1;
                    l.2 = l.2.min(r.entry_ns);
                    l.4 = l.4.max(r.release_ns);
                }
                _ => launches.push((r.grid, 1, r.entry_ns, r.release_ns, r.release_ns)),
            }
        }
        launches.sort_by_key(|l| l.3);
        let per_step = launches.len() / n.max(1);
        println!(
            "\n{} ({kind}): {} blocks, {} launches of ours, {per_step} a step",
            dir.display(),
            recs.len(),
            launches.len()
        );
        let t0 = launches.first().map_or(0, |l| l.3);
        let us = |a: u64, b: u64| (a as f64 - b as f64) / 1e3;
        println!("| # | blocks | entry us | release us | last release us | to next release us |");
        println!("|---|---:|---:|---:|---:|---:|");
        let mut mean = vec![0.0; per_step.max(1)];
        for (i, l) in launches.iter().enumerate() {
            let gap = launches.get(i + 1).map_or(0.0, |m| us(m.3, l.3));
            if i + 2 * per_step >= launches.len() {
                println!(
                    "| {i} | {} | {:.2} | {:.2} | {:.2} | {gap:.2} |",
                    l.1,
                    us(l.2, t0),
                    us(l.3, t0),
                    us(l.4, t0)
                );
            }
            if per_step > 0 && i / per_step + 1 < n {
                mean[i % per_step] += gap / (n - 1) as f64;
            }
        }
        println!(
            "mean time to the next release by position in the step (us): {}",
            mean.iter()
                .map(|m| format!("{m:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!("mean step: {:.1} us", mean.iter().sum::<f64>());
    }
}
