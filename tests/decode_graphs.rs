//! Steps replayed as recorded CUDA graphs (the RoPE/K-V store and split attention kernels
//! reading the position from the device) compute what ordinary steps compute: a greedy
//! continuation of 300 tokens after a 200-token prompt, across a cache growth (new buffers,
//! new recordings), with a verification block of 5 tokens every 50 steps and a speculation
//! that rolls back, with graphs on and off from identical prefills — logits within `1e-4` relative in f32 and identical tokens. On the
//! shipped draft (full attention: what a graph step covers) and the shipped target (sliding
//! layers: always the ordinary path, which switching must not disturb). On the CPU both
//! runs take the ordinary path; the GPU pass runs the comparison for real.
//!
//! Its own test binary with one test: recording captures the device's whole stream, so no
//! other test may use the device meanwhile (see `specdec::nn::graphs_enabled`).
use candle_core::Tensor;

#[path = "common/decode.rs"]
mod decode;
#[path = "common/device.rs"]
mod device;

use decode::{argmax_rows, cache, load, rel_err, tokens, tolerance, TOL};

#[test]
fn graph_steps_equal_ordinary_steps() {
    for name in ["draft", "target"] {
        let model = load(name);
        let vocab = model.info().vocab_size;
        let prompt = tokens(200, vocab, 4);
        // 300 steps (across a cache growth at 256 slots) fed the same tokens in both runs —
        // the greedy continuation of the first run — so the runs compare the same histories
        // even where low-precision rounding would flip a near-tie.
        let forced = tokens(300, vocab, 5);
        let run = |graphs: bool| -> (Vec<u32>, Vec<Tensor>) {
            specdec::nn::set_cuda_graphs(graphs);
            let mut c = cache(&model);
            let mut logits = model.forward_last(&prompt, &mut c).unwrap();
            let (mut greedy, mut rows) = (Vec::new(), Vec::new());
            for (step, &next) in forced.iter().enumerate() {
                greedy.push(argmax_rows(&logits)[0]);
                logits = model.forward_last(&[next], &mut c).unwrap();
                if step % 50 == 0 {
                    rows.push(logits.clone());
                    // A verification block of 5 (its own recording), every row's logits,
                    // rolled back.
                    let mut spec = c.speculate().unwrap();
                    let block = tokens(5, vocab, step);
                    rows.push(model.forward(&block, spec.cache()).unwrap());
                }
                // A speculation that rolls back in the middle: the replay must follow the
                // cache's length, not its own count of steps.
                if step == 120 {
                    let mut spec = c.speculate().unwrap();
                    model.forward_last(&[next], spec.cache()).unwrap();
                    model.forward_last(&[next], spec.cache()).unwrap();
                }
            }
            (greedy, rows)
        };
        let (with, with_rows) = run(true);
        let (without, without_rows) = run(false);
        specdec::nn::set_cuda_graphs(true);
        for (a, b) in with_rows.iter().zip(&without_rows) {
            let err = rel_err(a, b);
            assert!(err <= tolerance(), "{name}: graph step differs by {err}");
        }
        if tolerance() == TOL {
            assert_eq!(with, without, "{name}: argmax after each step differs");
        }
    }
}
