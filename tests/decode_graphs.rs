//! Steps replayed as recorded CUDA graphs (the split attention kernel with RoPE and the K/V
//! store fused in, or RoPE's own kernel before it with the engine option `fused_rope` off
//! (`SPECDEC_FUSED_ROPE=0` in the environment, applied by this test), reading the
//! position from the device) compute what ordinary steps compute: a greedy
//! continuation of 300 tokens after a 200-token prompt, across a cache growth (new buffers,
//! new recordings), with a verification block of 5 tokens every 50 steps, a block of 3
//! outside a speculation and a speculation that rolls back, token trees of 6 nodes in two
//! appends every 50 steps (masked and rotated at their depths by the split kernel in
//! recorded steps; a path of some kept), then a greedy chain fed on the device (bitwise equal to the same chain
//! read back and uploaded; the chain's and a verification block's argmaxes taken inside the
//! step by `forward_argmax` equal to those of their logits), with graphs on (every seventh decode step on the ordinary path
//! all the same) and off from identical prefills — logits within `1e-4` relative in f32 and identical tokens. On the
//! shipped draft (full attention), the shipped target (sliding-window layers: rings attended
//! in place, wrapped many times; slack strategy, and staged, whose steps inside a speculation
//! write their K/V to the side buffer the kernel reads after the ring), a random Gemma 3 of head width 32 (five ring layers and a
//! full-attention one in each step; both strategies) and the Qwen3 fixture (q/k norms, which
//! recorded steps apply inside the split attention). The run without graphs also runs the
//! products unfolded (`gemv_fold` off: in half precision the recorded run's norms,
//! activations and adds ride in the GEMVs, Gemma's sandwich norms included). On the CPU both
//! runs take the ordinary path; the GPU pass runs the comparison for real. Then a short
//! prompt's greedy steps on a fresh cache and on a reused one, bit for bit.
//!
//! Its own test binary with one test: recording captures the device's whole stream, so no
//! other test may use the device meanwhile (see `specdec::nn::graphs_enabled`). Switching
//! graphs off and on changes the engine options, so later steps record anew.
mod common;

use candle_core::Tensor;
use common::checkpoint::{load, random_gemma3, shipped};
use common::decode::{argmax_rows, tokens, tolerance, MIN_SCALE, TOL};
use common::host::rel_err;
use specdec::cache::RotatingStrategy;
use specdec::nn::{DeviceTokens, StepIds};

/// Turns graph replay of short CUDA steps on or off (the engine option `cuda_graphs`), and
/// with it the folded products (`gemv_fold`: norms, activations and residual adds inside the
/// GEMVs in half precision): the run without graphs is the plain path throughout.
fn set_cuda_graphs(on: bool) {
    let options = specdec::engine::EngineOptions {
        cuda_graphs: on,
        gemv_fold: on,
        ..specdec::engine::get()
    };
    specdec::engine::set(options).expect("engine options");
}

/// The `tests/fixtures/hf/<name>` checkpoint copied to `dir` with `max_position_embeddings`
/// raised to `positions` (the fixtures stop at 256; this test runs past 500).
fn fixture_with_positions(name: &str, dir: &std::path::Path, positions: usize) {
    let src = common::checkpoint::repo_path(&format!("tests/fixtures/hf/{name}"));
    for entry in std::fs::read_dir(&src).expect("fixture dir") {
        let path = entry.expect("fixture entry").path();
        std::fs::copy(&path, dir.join(path.file_name().expect("file name"))).expect("copy");
    }
    let text = std::fs::read_to_string(dir.join("config.json")).expect("fixture config");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("config json");
    config["max_position_embeddings"] = positions.into();
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config.json");
}

/// Kernels of a recorded step allowed without a programmatic edge into them (candle's own
/// launches and the kernel right after the first of them).
const MAX_ORDINARY_EDGES: usize = 6;

/// Steps of the greedy chain fed on the device at the end of each run.
const CHAIN: usize = 8;

#[test]
fn graph_steps_equal_ordinary_steps() {
    // The environment's `SPECDEC_*` overrides (`scripts/gpu-tests.sh` runs this test again
    // under other kernel choices).
    let options =
        specdec::engine::env::overrides(specdec::engine::get()).expect("SPECDEC_* overrides");
    specdec::engine::set(options).expect("engine options");
    specdec::nn::count_graph_censuses(true);
    let gemma = tempfile::tempdir().expect("temp dir");
    random_gemma3(gemma.path(), 32, 16, 1024);
    // Qwen3: q/k norms (applied inside the split attention in recorded steps) in a pre-norm
    // model.
    let qwen3 = tempfile::tempdir().expect("temp dir");
    fixture_with_positions("qwen3", qwen3.path(), 1024);
    // The rings under both strategies: the staged strategy's steps are recorded inside a
    // speculation too (its K/V go to the side buffer beside the ring, read in place).
    let (slack, staged) = (
        RotatingStrategy::Slack { max_draft: 8 },
        RotatingStrategy::Staged,
    );
    let cases = [
        ("draft", slack),
        ("target", slack),
        ("target", staged),
        ("gemma3", slack),
        ("gemma3", staged),
        ("qwen3", slack),
    ];
    for (name, strategy) in cases {
        let model = match name {
            "gemma3" => load(gemma.path()),
            "qwen3" => load(qwen3.path()),
            _ => shipped(name),
        };
        let label = format!("{name}, {strategy:?}");
        let cache = |model: &specdec::models::Model| model.new_cache(strategy).unwrap();
        let vocab = model.info().vocab_size;
        let prompt = tokens(200, vocab, 4);
        // 300 steps (across a cache growth at 256 slots) fed the same tokens in both runs —
        // the greedy continuation of the first run — so the runs compare the same histories
        // even where low-precision rounding would flip a near-tie.
        let forced = tokens(300, vocab, 5);
        let run = |graphs: bool| -> (Vec<u32>, Vec<Tensor>, u32) {
            set_cuda_graphs(graphs);
            let mut c = cache(&model);
            let mut logits = model.forward_last(&prompt, &mut c).unwrap();
            let (mut greedy, mut rows) = (Vec::new(), Vec::new());
            for (step, &next) in forced.iter().enumerate() {
                greedy.push(argmax_rows(&logits)[0]);
                // Every seventh step of the graph run takes the ordinary path (as a prefill or
                // a tree does between replays): the caches the two paths write must agree.
                set_cuda_graphs(graphs && step % 7 != 3);
                logits = model.forward_last(&[next], &mut c).unwrap();
                set_cuda_graphs(graphs);
                if step % 50 == 0 {
                    rows.push(logits.clone());
                    // A verification block of 5 (its own recording), every row's logits,
                    // rolled back.
                    let mut spec = c.speculate().unwrap();
                    let block = tokens(5, vocab, step);
                    rows.push(model.forward(&block, spec.cache()).unwrap());
                }
                // A token tree of 6 nodes appended as 4 and 2 (recorded steps of their own: the
                // kernel masks each row's non-ancestors and rotates it at its depth), every
                // row's logits; a root-to-leaf path kept twice, else rolled back.
                if step % 50 == 25 {
                    let mut spec = c.speculate().unwrap();
                    spec.extend_tree(&[None, Some(0), Some(0), Some(1)])
                        .unwrap();
                    rows.push(
                        model
                            .forward(&tokens(4, vocab, step + 1), spec.cache())
                            .unwrap(),
                    );
                    spec.extend_tree(&[Some(2), Some(3)]).unwrap();
                    rows.push(
                        model
                            .forward(&tokens(2, vocab, step + 2), spec.cache())
                            .unwrap(),
                    );
                    match step {
                        75 => spec.commit_path(&[0, 1, 3, 5]).unwrap(),
                        175 => spec.commit_path(&[0, 2, 4]).unwrap(),
                        _ => drop(spec),
                    }
                }
                // A block of 3 outside a speculation (a staged ring takes it beside the ring
                // and copies it in after the step), every row's logits.
                if step == 150 {
                    rows.push(model.forward(&tokens(3, vocab, 11), &mut c).unwrap());
                }
                // A speculation that rolls back in the middle: the replay must follow the
                // cache's length, not its own count of steps.
                if step == 120 {
                    let mut spec = c.speculate().unwrap();
                    model.forward_last(&[next], spec.cache()).unwrap();
                    model.forward_last(&[next], spec.cache()).unwrap();
                }
            }
            // A greedy chain of 8 steps from here, each fed the argmax of the step before
            // where it lies on the device (as greedy drafting feeds it), in a speculation
            // that rolls back; then the same chain with every argmax read back and uploaded:
            // the same kernels, so bitwise the same logits.
            let chain = |c: &mut specdec::cache::ModelCache, on_device: bool| -> Vec<Tensor> {
                let mut spec = c.speculate().unwrap();
                let mut last = logits.clone();
                let mut out = Vec::new();
                for _ in 0..CHAIN {
                    let next = DeviceTokens::argmax(&last).unwrap();
                    last = if on_device {
                        model.forward_last_device(&next, spec.cache()).unwrap()
                    } else {
                        model
                            .forward_last(&next.to_vec().unwrap(), spec.cache())
                            .unwrap()
                    };
                    out.push(last.clone());
                }
                out
            };
            let fed = chain(&mut c, true);
            let uploaded = chain(&mut c, false);
            for (i, (a, b)) in fed.iter().zip(&uploaded).enumerate() {
                let (a, b) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
                assert_eq!(
                    a.to_vec1::<f32>().unwrap(),
                    b.to_vec1::<f32>().unwrap(),
                    "{label} (graphs {graphs}): chain step {i} fed on the device differs"
                );
            }
            // The same chain through `forward_argmax` (a replayed graph ends in the argmax; no
            // logits leave it): each step's ids are `DeviceTokens::argmax` of the fed chain's
            // logits (the first index on ties, which half-precision logits have: candle's
            // argmax may pick another). Then a verification block's, every row's.
            let mut spec = c.speculate().unwrap();
            let mut next = DeviceTokens::argmax(&logits).unwrap();
            for (i, l) in fed.iter().enumerate() {
                next = model
                    .forward_argmax(StepIds::Device(&next), spec.cache(), true)
                    .unwrap();
                assert_eq!(
                    next.to_vec().unwrap(),
                    DeviceTokens::argmax(l).unwrap().to_vec().unwrap(),
                    "{label} (graphs {graphs}): chain step {i}'s argmax differs from its logits'"
                );
            }
            drop(spec);
            let block = tokens(5, vocab, 9);
            let mut spec = c.speculate().unwrap();
            let ids = model
                .forward_argmax(StepIds::Host(&block), spec.cache(), false)
                .unwrap();
            drop(spec);
            let mut spec = c.speculate().unwrap();
            let block_logits = model.forward(&block, spec.cache()).unwrap();
            drop(spec);
            assert_eq!(
                ids.to_vec().unwrap(),
                DeviceTokens::argmax(&block_logits).unwrap().to_vec().unwrap(),
                "{label} (graphs {graphs}): a verification block's argmaxes differ from its logits'"
            );
            rows.extend(fed);
            // The chain's first id, as it was fed (the first index on ties).
            let start = DeviceTokens::argmax(&logits).unwrap().to_vec().unwrap()[0];
            (greedy, rows, start)
        };
        let (with, with_rows, with_start) = run(true);
        // On CUDA every model's steps must really have replayed graphs (rings only with the
        // fused RoPE, which writes their K/V): a recording that failed falls back to the
        // ordinary path, which would pass unseen.
        let options = specdec::engine::get();
        let rings_graphed = options.fused_rope && options.ring_in_place;
        let full_attention = name == "draft" || name == "qwen3";
        if model.device().is_cuda() && (full_attention || rings_graphed) {
            assert!(
                model.graph_recordings() > 0,
                "{label}: no CUDA graph was recorded (see the recording warning above)"
            );
            // Where recordings ask for programmatic edges (compute capability 9.0+), every
            // kernel but a few of candle's (the embedding, a norm, a cast, the logits' copy)
            // gets one, in decode steps and verification blocks alike: a kernel the capture
            // joined by an ordinary edge (behind a memory node or an ordinary launch) waits
            // for the whole kernel before it, which only shows up as lost speed.
            let censuses = model.graph_censuses();
            eprintln!("{label}: recordings (rows, census): {censuses:?}");
            assert!(!censuses.is_empty(), "{label}: no census was counted");
            // Blocks of 5 rows run only inside speculations (the last ones of the run are
            // among the recordings kept): recorded on every cache kind and strategy.
            assert!(
                censuses.iter().any(|(rows, _)| *rows == 5),
                "{label}: no verification block inside a speculation was recorded"
            );
            // Token trees' steps were recorded (words past the length: the tree's), both
            // appends, on every cache kind and strategy, where the kernel fuses RoPE.
            if options.fused_rope && options.tree_in_place {
                let made = model.graph_steps_made();
                for rows in [4, 2] {
                    assert!(
                        made.iter().any(|&(r, words)| r == rows && words > 1),
                        "{label}: no token tree step of {rows} rows was recorded: {made:?}"
                    );
                }
            }
            // The draft's layers run our kernels only; the others' steps also run candle's
            // ops where theirs are not folded (Gemma's sandwich norms, its GELU), ordinary
            // launches by design.
            if specdec::nn::graph_pdl(model.device()) && name == "draft" {
                for (rows, c) in &censuses {
                    assert!(
                        c.programmatic > 0 && c.kernels - c.programmatic <= MAX_ORDINARY_EDGES,
                        "{label}: a recording of {rows} rows has {} kernels but only {} programmatic edges",
                        c.kernels,
                        c.programmatic
                    );
                }
            }
        }
        let (without, without_rows, without_start) = run(false);
        set_cuda_graphs(true);
        // The last CHAIN rows are the greedy chain, fed each run's own argmaxes: in half
        // precision a near-tie may send the two runs' chains apart (a random model's logits
        // have them), and rows after that have other histories, so the comparison stops
        // there; in f32 the chains must agree throughout.
        let history = with_rows.len() - CHAIN;
        let mut same_chain = with_start == without_start;
        for (i, (a, b)) in with_rows.iter().zip(&without_rows).enumerate() {
            if i >= history && !same_chain {
                assert!(
                    tolerance() != TOL,
                    "{label}: the greedy chain diverged in f32 at row {i}"
                );
                break;
            }
            let err = rel_err(a, b, MIN_SCALE);
            assert!(
                err <= tolerance(),
                "{label}: compared logits {i} (of {}, shape {:?}) differ by {err}",
                with_rows.len(),
                a.dims()
            );
            if i >= history {
                // The ids each run fed its next chain step (the first index on ties, which
                // candle's argmax may not pick).
                let fed = |l: &Tensor| DeviceTokens::argmax(l).unwrap().to_vec().unwrap();
                same_chain &= fed(a) == fed(b);
            }
        }
        if tolerance() == TOL {
            assert_eq!(with, without, "{label}: argmax after each step differs");
        }

        // A short prompt (at most GRAPH_MAX_ROWS tokens) and 6 greedy steps, graphs on, on a
        // fresh cache and on one reset after an earlier generation (its buffers kept, its
        // steps recorded): bit for bit the same logits, in any precision. The path a step
        // takes may depend on the cache's state, never on its history (a reused cache's short
        // prefill once took the recorded path, a fresh one's the ordinary path: other bf16
        // roundings, and the oracle benchmark's references left the runs they were for).
        let short = tokens(specdec::nn::GRAPH_MAX_ROWS - 3, vocab, 6);
        let generate = |c: &mut specdec::cache::ModelCache| -> Vec<Vec<f32>> {
            let mut logits = model.forward_last(&short, c).unwrap();
            let mut out = Vec::new();
            for _ in 0..6 {
                out.push(logits.flatten_all().unwrap().to_vec1::<f32>().unwrap());
                let next = argmax_rows(&logits)[0];
                logits = model.forward_last(&[next], c).unwrap();
            }
            out
        };
        let fresh = generate(&mut cache(&model));
        let mut used = cache(&model);
        model
            .forward_last(&tokens(40, vocab, 7), &mut used)
            .unwrap();
        for t in tokens(20, vocab, 8) {
            model.forward_last(&[t], &mut used).unwrap();
        }
        used.reset();
        let reused = generate(&mut used);
        for (i, (a, b)) in fresh.iter().zip(&reused).enumerate() {
            assert!(
                a == b,
                "{label}: step {i} after a short prompt differs between a fresh and a reused cache"
            );
        }
    }
}
