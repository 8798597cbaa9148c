//! The forward takes different paths by block length and device — a one-token step (a
//! replayed CUDA graph on the GPU), a short block (the split attention kernel on the GPU),
//! a long prefill (attention in chunks of `PREFILL_CHUNK` queries, on every device) — and
//! every path must compute the same logits as the others for the same positions:
//!
//! * a prompt prefilled in one forward (chunked past `PREFILL_CHUNK`) vs the same prompt in
//!   pieces shorter than a chunk;
//! * a block of 5 tokens in one forward vs the same tokens one step at a time;
//!
//! (One-token steps replayed as CUDA graphs vs ordinary steps: `tests/decode_graphs.rs`, a
//! binary of its own because recording needs the device to itself.)
//! On the shipped target (Mistral-style, sliding-window layers in rotating caches) and the
//! shipped draft (Llama-style, full attention: the layers a graph step covers), on the test
//! device. Tolerance: `max |a - b| <= 1e-4 max |b|` in f32 (summation orders differ by path),
//! and the greedy tokens must agree.
mod common;

use candle_core::Tensor;
use common::checkpoint::shipped;
use common::decode::{argmax_rows, cache, tokens, tolerance, MIN_SCALE};
use common::host::rel_err;
use specdec::nn::PREFILL_CHUNK;

#[test]
fn a_chunked_prefill_equals_a_prefill_in_pieces() {
    for name in ["target", "draft"] {
        let model = shipped(name);
        let n = PREFILL_CHUNK + PREFILL_CHUNK / 2 + 3;
        let prompt = tokens(n, model.info().vocab_size, 1);
        let mut whole = cache(&model);
        let one = model.forward(&prompt, &mut whole).unwrap();
        let mut pieces = cache(&model);
        let mut parts = Vec::new();
        for piece in prompt.chunks(PREFILL_CHUNK / 2) {
            parts.push(model.forward(piece, &mut pieces).unwrap());
        }
        let parts = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0).unwrap();
        let err = rel_err(&one, &parts, MIN_SCALE);
        assert!(
            err <= tolerance(),
            "{name}: chunked prefill differs by {err}"
        );
        // And the caches agree: the next step sees the same history.
        let next = [prompt[0]];
        let a = model.forward(&next, &mut whole).unwrap();
        let b = model.forward(&next, &mut pieces).unwrap();
        let err = rel_err(&a, &b, MIN_SCALE);
        assert!(
            err <= tolerance(),
            "{name}: step after the prefill differs by {err}"
        );
    }
}

#[test]
fn a_verification_block_equals_single_steps() {
    for name in ["target", "draft"] {
        let model = shipped(name);
        let vocab = model.info().vocab_size;
        let mut base = cache(&model);
        model.forward(&tokens(300, vocab, 2), &mut base).unwrap();
        let block = tokens(5, vocab, 3);
        let mut blocked = base.deep_clone().unwrap();
        let together = {
            let mut spec = blocked.speculate().unwrap();
            let logits = model.forward(&block, spec.cache()).unwrap();
            spec.commit(block.len()).unwrap();
            logits
        };
        let mut stepped = base.deep_clone().unwrap();
        let singles: Vec<Tensor> = block
            .iter()
            .map(|&t| model.forward(&[t], &mut stepped).unwrap())
            .collect();
        let singles = Tensor::cat(&singles.iter().collect::<Vec<_>>(), 0).unwrap();
        let err = rel_err(&together, &singles, MIN_SCALE);
        assert!(err <= tolerance(), "{name}: block vs steps differ by {err}");
        assert_eq!(argmax_rows(&together), argmax_rows(&singles), "{name}");
    }
}
