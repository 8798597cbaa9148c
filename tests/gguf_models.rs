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

/// The quantized option (candle's quantized matmul over the file's blocks) against the same
/// file dequantized: candle's CPU kernels quantize the activations to 8 bits, so logits
/// differ by that rounding only; the tolerance and the top-1 agreement are what it allows.
fn quantized_matches_dequantized(test: &str, file: &str, prompt: &[u32]) {
    let Some(path) = common::real::real_model(test, file) else {
        return;
    };
    let device = common::device();
    let dense = common::checkpoint::load_with(
        &path,
        &LoadOptions {
            device: device.clone(),
            dtype: specdec::models::DTypeChoice::F32,
            quantized: false,
        },
    );
    let quant = common::checkpoint::load_with(
        &path,
        &LoadOptions {
            device,
            dtype: specdec::models::DTypeChoice::F32,
            quantized: true,
        },
    );
    assert!(quant.is_quantized() && !dense.is_quantized());
    let logits = |m: &specdec::models::Model| {
        let mut cache = m.new_cache(RotatingStrategy::Staged).unwrap();
        m.forward(prompt, &mut cache).unwrap()
    };
    let (a, b) = (logits(&quant), logits(&dense));
    let err = common::host::rel_err(&a, &b, 1.0);
    let top = |t: &candle_core::Tensor| t.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    let (ta, tb) = (top(&a), top(&b));
    let agree = ta.iter().zip(&tb).filter(|(x, y)| x == y).count();
    eprintln!(
        "{test}: rel err {err:.4}, top-1 agreement {agree}/{}",
        ta.len()
    );
    assert!(err < 0.05, "quantized logits differ by {err}");
    assert!(
        agree * 10 >= ta.len() * 9,
        "top-1 agrees at {agree} of {} positions",
        ta.len()
    );
}

#[test]
fn smollm2_quantized_matches_dequantized() {
    let prompt: Vec<u32> = (0..48).map(|i| (i * 997 + 17) % 49_000).collect();
    quantized_matches_dequantized(
        "smollm2_quantized_matches_dequantized",
        common::real::SMOLLM2,
        &prompt,
    );
}

#[test]
fn gemma3_quantized_matches_dequantized() {
    let prompt: Vec<u32> = (0..48).map(|i| (i * 4099 + 2) % 262_000).collect();
    quantized_matches_dequantized(
        "gemma3_quantized_matches_dequantized",
        common::real::GEMMA3,
        &prompt,
    );
}
