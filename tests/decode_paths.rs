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
use std::path::Path;

use candle_core::{Device, Tensor, D};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::models::Model;
use specdec::nn::PREFILL_CHUNK;

#[path = "common/device.rs"]
mod device;

const TOL: f32 = 1e-4;

fn load(name: &str) -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name);
    Model::load(&dir, &device::load_options()).expect("shipped model loads")
}

fn cache(model: &Model) -> ModelCache {
    model
        .new_cache(RotatingStrategy::Slack { max_draft: 8 })
        .expect("cache")
}

fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729 + 17) % vocab) as u32)
        .collect()
}

/// `max |a - b| / max |b|`, in f32 on the CPU.
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let host = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let (a, b) = (host(a), host(b));
    let scale = b
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn argmax_rows(t: &Tensor) -> Vec<u32> {
    t.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap()
}

fn tolerance() -> f32 {
    match device::dtype_choice() {
        specdec::models::DTypeChoice::BF16 | specdec::models::DTypeChoice::F16 => 1e-1,
        _ => TOL,
    }
}

#[test]
fn a_chunked_prefill_equals_a_prefill_in_pieces() {
    for name in ["target", "draft"] {
        let model = load(name);
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
        let err = rel_err(&one, &parts);
        assert!(
            err <= tolerance(),
            "{name}: chunked prefill differs by {err}"
        );
        // And the caches agree: the next step sees the same history.
        let next = [prompt[0]];
        let a = model.forward(&next, &mut whole).unwrap();
        let b = model.forward(&next, &mut pieces).unwrap();
        let err = rel_err(&a, &b);
        assert!(
            err <= tolerance(),
            "{name}: step after the prefill differs by {err}"
        );
    }
}

#[test]
fn a_verification_block_equals_single_steps() {
    for name in ["target", "draft"] {
        let model = load(name);
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
        let err = rel_err(&together, &singles);
        assert!(err <= tolerance(), "{name}: block vs steps differ by {err}");
        assert_eq!(argmax_rows(&together), argmax_rows(&singles), "{name}");
    }
}
