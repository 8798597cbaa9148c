//! The attention logit softcap (`tanh(scores / cap) * cap` after scaling, before the mask, as
//! Gemma 2 applies it) against transformers: the `gemma3_attn_softcap` fixture's reference was
//! computed with Gemma 3's attention patched to apply `attn_logit_softcapping` (transformers'
//! Gemma 3, like our loader, ignores the key). A decoder built from the fixture's config with
//! the softcap switched on must match it, in one forward and decoding one token at a time
//! under both rotating strategies; the plain loader must not (the fixture is sensitive to it).
mod common;

use candle_core::{DType, Device, Tensor};
use common::checkpoint::{load_on_cpu, repo_path};
use common::host::rel_err;
use specdec::cache::RotatingStrategy;
use specdec::models::{decoder_spec, HfConfig};
use specdec::nn::{Decoder, Weights};

const TOL: f32 = 1e-4;
/// Floor of the scale in [`rel_err`] (an all-zero reference).
const MIN_SCALE: f32 = 1e-12;

#[derive(serde::Deserialize)]
struct Reference {
    input_ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

#[test]
fn attention_softcap_matches_transformers() {
    let dir = repo_path("tests/fixtures/hf/gemma3_attn_softcap");
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let r: Reference = serde_json::from_str(&text).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let cap = config["attn_logit_softcapping"].as_f64().unwrap();
    let vocab = r.logits[0].len();
    let flat: Vec<f32> = r.logits.iter().flatten().copied().collect();
    let expected = Tensor::from_vec(flat, (r.logits.len(), vocab), &Device::Cpu).unwrap();

    let mut spec = decoder_spec(&HfConfig::read(&dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        spec.attn_softcap, None,
        "Gemma 3 configs do not enable it by themselves"
    );
    spec.attn_softcap = Some(cap);
    let weights = Weights::open(&dir, &Device::Cpu, DType::F32).unwrap();
    let capped = Decoder::load(&spec, &weights).unwrap();
    for strategy in [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 4 },
    ] {
        let mut cache = capped.new_cache(strategy).unwrap();
        let full = capped.forward(&r.input_ids, &mut cache).unwrap();
        let err = rel_err(&full, &expected, MIN_SCALE);
        assert!(
            err <= TOL,
            "{strategy:?}, one forward: relative error {err:e}"
        );
        let mut cache = capped.new_cache(strategy).unwrap();
        let rows: Vec<Tensor> = r
            .input_ids
            .iter()
            .map(|&t| capped.forward(&[t], &mut cache).unwrap())
            .collect();
        let err = rel_err(&Tensor::cat(&rows, 0).unwrap(), &expected, MIN_SCALE);
        assert!(
            err <= TOL,
            "{strategy:?}, one token at a time: relative error {err:e}"
        );
    }

    let plain = load_on_cpu(&dir);
    let mut cache = plain.new_cache(RotatingStrategy::Staged).unwrap();
    let err = rel_err(
        &plain.forward(&r.input_ids, &mut cache).unwrap(),
        &expected,
        MIN_SCALE,
    );
    assert!(
        err > 100.0 * TOL,
        "the fixture does not depend on the softcap: {err:e}"
    );
}
