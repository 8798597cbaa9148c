//! Parity with transformers past position 2048, where the RoPE tables (first built for 2048
//! positions) grow: the `gemma3_linear` fixture (Gemma 3, linear RoPE scaling on the global
//! layer) holds transformers' logits for positions 2040..2063 of a 2064-token input. One full
//! forward (the table grows once, before any rotation) and a prefill of 2040 tokens followed by
//! one-token steps across 2048 (the table grows mid-decode, for both rotating strategies) must
//! both match them. Tolerance as in `tests/models.rs`: `max |ours - ref| <= 1e-4 max |ref|`.
mod common;

use candle_core::{Device, Tensor};
use common::checkpoint::{load_with, repo_path};
use common::device;
use common::host::rel_err;
use specdec::cache::RotatingStrategy;
use specdec::models::{DTypeChoice, LoadOptions};

const TOL: f32 = 1e-4;
/// Floor of the scale in [`rel_err`] (an all-zero reference).
const MIN_SCALE: f32 = 1e-12;

#[derive(serde::Deserialize)]
struct LongReference {
    long_input_ids: Vec<u32>,
    long_logits_from: usize,
    long_logits: Vec<Vec<f32>>,
}

#[test]
fn gemma3_linear_rope_matches_transformers_past_2048_positions() {
    let dir = repo_path("tests/fixtures/hf/gemma3_linear");
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let r: LongReference = serde_json::from_str(&text).unwrap();
    let (ids, from) = (&r.long_input_ids, r.long_logits_from);
    assert!(
        from < 2048 && ids.len() > 2048,
        "the fixture must cross position 2048"
    );
    // The test device (SPECDEC_TEST_DEVICE) in f32: the tolerance is f32's.
    let options = LoadOptions {
        device: device::device(),
        dtype: DTypeChoice::F32,
        quantized: false,
        ..Default::default()
    };
    // The RoPE tables live in the model: a fresh load for every path, so each one grows them.
    let load = || load_with(&dir, &options);
    let vocab = load().info().vocab_size;
    let flat: Vec<f32> = r.long_logits.iter().flatten().copied().collect();
    let expected = Tensor::from_vec(flat, (ids.len() - from, vocab), &Device::Cpu).unwrap();

    let model = load();
    let mut cache = model.new_cache(RotatingStrategy::Staged).unwrap();
    let full = model.forward(ids, &mut cache).unwrap();
    let full = full.narrow(0, from, ids.len() - from).unwrap();
    let err = rel_err(&full, &expected, MIN_SCALE);
    assert!(err <= TOL, "one forward: relative error {err:e}");

    for strategy in [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 4 },
    ] {
        let model = load();
        let mut cache = model.new_cache(strategy).unwrap();
        model.forward_last(&ids[..from], &mut cache).unwrap();
        let rows: Vec<Tensor> = ids[from..]
            .iter()
            .map(|&t| model.forward(&[t], &mut cache).unwrap())
            .collect();
        let steps = Tensor::cat(&rows, 0).unwrap();
        let err = rel_err(&steps, &expected, MIN_SCALE);
        assert!(
            err <= TOL,
            "{strategy:?}, one token at a time: relative error {err:e}"
        );
    }
}
