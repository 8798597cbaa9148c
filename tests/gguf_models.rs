//! Real GGUF checkpoints against transformers reading the same files.
mod common;

use candle_core::DType;
use specdec::cache::RotatingStrategy;
use specdec::models::LoadOptions;

#[test]
fn smollm2_smoke() {
    let Some(path) = common::real::real_model("smollm2_smoke", common::real::SMOLLM2) else {
        return;
    };
    let m = common::checkpoint::load_with(&path, &LoadOptions::default());
    let mut cache = m.new_cache(RotatingStrategy::Staged).unwrap();
    let t = std::time::Instant::now();
    let logits = m.forward(&[504, 3575, 282, 4649, 314], &mut cache).unwrap();
    eprintln!("forward {:?}", t.elapsed());
    let last = logits
        .get(4)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    eprintln!("{:?}", &last[..8]);
    let am = last
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0;
    assert_eq!(am, 7042);
}

#[test]
fn gemma3_smoke() {
    let Some(path) = common::real::real_model("gemma3_smoke", common::real::GEMMA3) else {
        return;
    };
    let m = common::checkpoint::load_with(&path, &LoadOptions::default());
    let mut cache = m.new_cache(RotatingStrategy::Staged).unwrap();
    let logits = m
        .forward(&[2, 818, 5279, 529, 7001, 563], &mut cache)
        .unwrap();
    let last = logits
        .get(5)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    eprintln!("{:?}", &last[..8]);
    let am = last
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0;
    assert_eq!(am, 506);
}
