//! Model loading and forward passes.
//!
//! * Tiny random checkpoints written here (every architecture, both config spellings) check the
//!   cache invariants: incremental decoding (one token at a time, chunks of 5, inside
//!   speculations with partial commits, both rotating strategies, well past the window) gives
//!   the logits of one full forward; and malformed checkpoints give errors naming the culprit.
//! * Fixtures produced by transformers (`tests/fixtures/hf/<case>/`) check parity: logits at
//!   every position and the greedy continuation.
//!
//! Logit tolerance: `max |ours - ref| <= 1e-4 * max |ref|` over the whole `[positions, vocab]`
//! matrix (a relative bound on the largest error, scaled by the largest logit).
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::checkpoint::{load, load_on_cpu, load_with, repo_path};
use common::device;
use common::host::rel_err;
use serde_json::{json, Value};
use specdec::cache::{ModelCache, RotatingStrategy};
use specdec::models::{DTypeChoice, LoadOptions, Model};
use specdec::nn::LayerKind;

/// Relative logit tolerance: 1e-4 in f32. For a half-precision test pass
/// (`SPECDEC_TEST_DTYPE=bf16|f16`, weights and activations rounded to 8 or 11 mantissa bits,
/// unit roundoff 3.9e-3 and 4.9e-4, accumulated over every layer's products, norms and
/// softmax): 1e-1 for bf16 (about 25 bf16 units of the largest logit; the fixtures measured
/// 0.9e-2 to 5.2e-2 on an H200) and 1e-2 for f16.
fn tol() -> f32 {
    match device::dtype_choice() {
        DTypeChoice::BF16 => 1e-1,
        DTypeChoice::F16 => 1e-2,
        DTypeChoice::F32 | DTypeChoice::Auto => 1e-4,
    }
}

/// Floor of the scale in [`rel_err`] (an all-zero reference).
const MIN_SCALE: f32 = 1e-12;

const STRATEGIES: [RotatingStrategy; 2] = [
    RotatingStrategy::Staged,
    RotatingStrategy::Slack { max_draft: 8 },
];

// ---------------------------------------------------------------- helpers

fn assert_close(what: &str, a: &Tensor, b: &Tensor) {
    let (err, tol) = (rel_err(a, b, MIN_SCALE), tol());
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e}");
}

/// Logits of one forward over all of `tokens` from an empty cache.
fn full_logits(model: &Model, tokens: &[u32], strategy: RotatingStrategy) -> Tensor {
    let mut cache = model.new_cache(strategy).unwrap();
    model.forward(tokens, &mut cache).unwrap()
}

/// Logits of `tokens` fed in chunks of the given sizes (cycled), stacked.
fn chunked_logits(
    model: &Model,
    tokens: &[u32],
    chunks: &[usize],
    strategy: RotatingStrategy,
) -> Tensor {
    let mut cache = model.new_cache(strategy).unwrap();
    let mut rows = Vec::new();
    let mut at = 0;
    for &n in chunks.iter().cycle() {
        if at == tokens.len() {
            break;
        }
        let end = (at + n).min(tokens.len());
        rows.push(model.forward(&tokens[at..end], &mut cache).unwrap());
        at = end;
    }
    assert_eq!(cache.offset(), tokens.len());
    Tensor::cat(&rows, 0).unwrap()
}

/// Logits of `tokens` where every step speculates `[next k tokens, junk...]` (6 tokens), keeps
/// the `k` true ones (k cycling 0..=4), and checks them against the forward's rows.
fn speculative_logits(
    model: &Model,
    tokens: &[u32],
    prefill: usize,
    strategy: RotatingStrategy,
) -> Tensor {
    let mut cache = model.new_cache(strategy).unwrap();
    let mut rows = vec![model.forward(&tokens[..prefill], &mut cache).unwrap()];
    let mut at = prefill;
    let mut k = 0;
    while at < tokens.len() {
        let keep = k.min(tokens.len() - at);
        let mut chunk: Vec<u32> = tokens[at..at + keep].to_vec();
        chunk.extend((0..6 - keep).map(|j| (7 * j as u32 + 3) % 50));
        let mut spec = cache.speculate().unwrap();
        let logits = model.forward(&chunk, spec.cache()).unwrap();
        spec.commit(keep).unwrap();
        assert_eq!(cache.offset(), at + keep);
        if keep > 0 {
            rows.push(logits.narrow(0, 0, keep).unwrap());
        }
        at += keep;
        k = (k + 1) % 5;
    }
    Tensor::cat(&rows, 0).unwrap()
}

/// Every incremental path equals one full forward.
fn check_incremental(model: &Model, tokens: &[u32], label: &str) {
    let rotating = model.info().sliding_window.is_some();
    let strategies: &[RotatingStrategy] = if rotating {
        &STRATEGIES
    } else {
        &STRATEGIES[..1]
    };
    let full = full_logits(model, tokens, strategies[0]);
    for &strategy in strategies {
        let what = |how: &str| format!("{label}: {how} ({strategy:?})");
        assert_close(&what("full"), &full_logits(model, tokens, strategy), &full);
        let one = chunked_logits(model, tokens, &[7, 1], strategy);
        assert_close(&what("prefill 7 then one at a time"), &one, &full);
        let fives = chunked_logits(model, tokens, &[5], strategy);
        assert_close(&what("chunks of 5"), &fives, &full);
        let spec = speculative_logits(model, tokens, 5, strategy);
        assert_close(&what("speculation with partial commits"), &spec, &full);
    }
}

/// Greedy decoding of `steps` tokens after `prompt`, one token per forward.
fn greedy(model: &Model, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut cache: ModelCache = model.new_cache(RotatingStrategy::Staged).unwrap();
    let mut logits = model.forward(prompt, &mut cache).unwrap();
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        let last = logits.get(logits.dim(0).unwrap() - 1).unwrap();
        let next = last.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        out.push(next);
        logits = model.forward(&[next], &mut cache).unwrap();
    }
    out
}

fn test_tokens(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab).collect()
}

// ---------------------------------------------------------------- tiny checkpoints

/// Deterministic uniform values in `[-scale, scale]`.
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Architecture features of a tiny random checkpoint.
#[derive(Clone, Copy)]
struct Tiny {
    vocab: usize,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    qkv_bias: bool,
    qk_norm: bool,
    gemma: bool,
    tied: bool,
}

const BASE: Tiny = Tiny {
    vocab: 64,
    hidden: 32,
    inter: 48,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 8,
    qkv_bias: false,
    qk_norm: false,
    gemma: false,
    tied: false,
};

impl Tiny {
    fn tensors(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let mut shapes: Vec<(String, Vec<usize>, bool)> = Vec::new(); // (name, shape, is_norm)
        let (h, d, i) = (self.hidden, self.head_dim, self.inter);
        let mut add =
            |name: String, shape: Vec<usize>, norm: bool| shapes.push((name, shape, norm));
        add(
            format!("{prefix}embed_tokens.weight"),
            vec![self.vocab, h],
            false,
        );
        add(format!("{prefix}norm.weight"), vec![h], true);
        if !self.tied {
            add("lm_head.weight".into(), vec![self.vocab, h], false);
        }
        for l in 0..self.layers {
            let p = format!("{prefix}layers.{l}.");
            for (proj, out) in [
                ("q", self.heads * d),
                ("k", self.kv_heads * d),
                ("v", self.kv_heads * d),
            ] {
                add(
                    format!("{p}self_attn.{proj}_proj.weight"),
                    vec![out, h],
                    false,
                );
                if self.qkv_bias {
                    add(format!("{p}self_attn.{proj}_proj.bias"), vec![out], false);
                }
            }
            add(
                format!("{p}self_attn.o_proj.weight"),
                vec![h, self.heads * d],
                false,
            );
            if self.qk_norm {
                add(format!("{p}self_attn.q_norm.weight"), vec![d], true);
                add(format!("{p}self_attn.k_norm.weight"), vec![d], true);
            }
            add(format!("{p}mlp.gate_proj.weight"), vec![i, h], false);
            add(format!("{p}mlp.up_proj.weight"), vec![i, h], false);
            add(format!("{p}mlp.down_proj.weight"), vec![h, i], false);
            add(format!("{p}input_layernorm.weight"), vec![h], true);
            add(format!("{p}post_attention_layernorm.weight"), vec![h], true);
            if self.gemma {
                add(
                    format!("{p}pre_feedforward_layernorm.weight"),
                    vec![h],
                    true,
                );
                add(
                    format!("{p}post_feedforward_layernorm.weight"),
                    vec![h],
                    true,
                );
            }
        }
        shapes
            .into_iter()
            .enumerate()
            .map(|(k, (name, shape, norm))| {
                let n = shape.iter().product();
                let mut v = values(k as u64 + 1, n, if norm { 0.2 } else { 0.3 });
                if norm && !self.gemma {
                    v.iter_mut().for_each(|x| *x += 1.0); // Gemma stores w of (1 + w)
                }
                (name, Tensor::from_vec(v, shape, &Device::Cpu).unwrap())
            })
            .collect()
    }
}

/// Writes `config` and the tensors (in `dtype`, split over `shards` files with an index
/// when `shards > 1`).
fn write_checkpoint(
    dir: &Path,
    config: &Value,
    tensors: &[(String, Tensor)],
    dtype: DType,
    shards: usize,
) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    let cast = |t: &Tensor| t.to_dtype(dtype).unwrap();
    if shards <= 1 {
        let map: HashMap<String, Tensor> =
            tensors.iter().map(|(n, t)| (n.clone(), cast(t))).collect();
        candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
        return;
    }
    let mut weight_map = serde_json::Map::new();
    for s in 0..shards {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let part: HashMap<String, Tensor> = tensors
            .iter()
            .enumerate()
            .filter(|(k, _)| k % shards == s)
            .map(|(_, (n, t))| {
                weight_map.insert(n.clone(), json!(file));
                (n.clone(), cast(t))
            })
            .collect();
        candle_core::safetensors::save(&part, dir.join(&file)).unwrap();
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn common_config(model_type: &str, t: &Tiny) -> Value {
    json!({
        "model_type": model_type,
        "vocab_size": t.vocab, "hidden_size": t.hidden, "intermediate_size": t.inter,
        "num_hidden_layers": t.layers, "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads, "head_dim": t.head_dim,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "tie_word_embeddings": t.tied, "eos_token_id": 2, "bos_token_id": 1,
        "architectures": ["SomethingForCausalLM"], "transformers_version": "4.50.0",
        "some_unknown_key": {"nested": [1, 2, 3]}
    })
}

fn merge(mut base: Value, extra: Value) -> Value {
    let obj = base.as_object_mut().unwrap();
    for (k, v) in extra.as_object().unwrap() {
        obj.insert(k.clone(), v.clone());
    }
    base
}

/// A tiny case: its features and its config in the 4.x and 5.x spellings.
struct TinyCase {
    name: &'static str,
    tiny: Tiny,
    v4: Value,
    v5: Value,
    shards: usize,
}

fn tiny_cases() -> Vec<TinyCase> {
    let llama = Tiny { layers: 2, ..BASE };
    let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16});
    let mistral = BASE;
    let qwen2 = Tiny {
        qkv_bias: true,
        tied: true,
        ..BASE
    };
    let qwen3 = Tiny {
        qk_norm: true,
        head_dim: 16,
        ..BASE
    };
    let gemma = Tiny {
        qk_norm: true,
        gemma: true,
        tied: true,
        layers: 4,
        head_dim: 16,
        ..BASE
    };
    let gemma_common = json!({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 12,
        "sliding_window": 8, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 5.0});
    let qwen_window =
        json!({"sliding_window": 4096, "use_sliding_window": false, "max_window_layers": 1});
    vec![
        TinyCase {
            name: "llama",
            tiny: llama,
            v4: merge(
                common_config("llama", &llama),
                json!({"rope_theta": 500000.0,
                "rope_scaling": llama3.clone()}),
            ),
            v5: merge(
                common_config("llama", &llama),
                json!({"rope_parameters":
                merge(llama3, json!({"rope_theta": 500000.0}))}),
            ),
            shards: 2,
        },
        TinyCase {
            name: "mistral",
            tiny: mistral,
            v4: merge(
                common_config("mistral", &mistral),
                json!({"rope_theta": 10000.0, "sliding_window": 8}),
            ),
            v5: merge(
                common_config("mistral", &mistral),
                json!({"sliding_window": 8,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
            ),
            shards: 1,
        },
        TinyCase {
            name: "qwen2",
            tiny: qwen2,
            v4: merge(
                common_config("qwen2", &qwen2),
                merge(qwen_window.clone(), json!({"rope_theta": 1000000.0})),
            ),
            v5: merge(
                common_config("qwen2", &qwen2),
                json!({"sliding_window": null, "use_sliding_window": false,
                "layer_types": ["full_attention", "full_attention"],
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
            ),
            shards: 1,
        },
        TinyCase {
            name: "qwen3",
            tiny: qwen3,
            v4: merge(
                common_config("qwen3", &qwen3),
                merge(qwen_window, json!({"rope_theta": 1000000.0})),
            ),
            v5: merge(
                common_config("qwen3", &qwen3),
                json!({
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
            ),
            shards: 1,
        },
        TinyCase {
            name: "gemma3",
            tiny: gemma,
            v4: merge(
                merge(common_config("gemma3_text", &gemma), gemma_common.clone()),
                json!({
                "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 2,
                "rope_scaling": {"type": "linear", "factor": 2.0}}),
            ),
            v5: merge(
                merge(common_config("gemma3_text", &gemma), gemma_common),
                json!({
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
            ),
            shards: 1,
        },
    ]
}

fn write_tiny(root: &Path, case: &TinyCase, v5: bool, dtype: DType) -> PathBuf {
    let dir = root.join(format!("{}-{}", case.name, if v5 { "v5" } else { "v4" }));
    let config = if v5 { &case.v5 } else { &case.v4 };
    write_checkpoint(
        &dir,
        config,
        &case.tiny.tensors("model."),
        dtype,
        case.shards,
    );
    dir
}

// ---------------------------------------------------------------- tiny-checkpoint tests

#[test]
fn tiny_models_decode_incrementally_like_a_full_forward() {
    let root = tempfile::tempdir().unwrap();
    for case in tiny_cases() {
        let model = load(&write_tiny(root.path(), &case, true, DType::F32));
        check_incremental(&model, &test_tokens(40, 64), case.name);
    }
}

#[test]
fn forward_last_is_the_last_row_of_a_full_forward_and_fills_the_cache_alike() {
    let root = tempfile::tempdir().unwrap();
    for case in tiny_cases() {
        let model = load(&write_tiny(root.path(), &case, true, DType::F32));
        let tokens = test_tokens(40, 64);
        let strategy = RotatingStrategy::Staged;
        let full = full_logits(&model, &tokens, strategy);
        let mut cache = model.new_cache(strategy).unwrap();
        let last = model.forward_last(&tokens, &mut cache).unwrap();
        assert_eq!(last.dims(), &[1, full.dim(1).unwrap()], "{}", case.name);
        assert_close(
            case.name,
            &last,
            &full.narrow(0, tokens.len() - 1, 1).unwrap(),
        );
        // The cache holds the whole prompt: the next token decodes as after a full forward.
        let next = model.forward_last(&[7], &mut cache).unwrap();
        let mut tokens = tokens;
        tokens.push(7);
        let full = full_logits(&model, &tokens, strategy);
        assert_close(
            case.name,
            &next,
            &full.narrow(0, tokens.len() - 1, 1).unwrap(),
        );
    }
}

#[test]
fn both_config_spellings_give_the_same_model() {
    let root = tempfile::tempdir().unwrap();
    let tokens = test_tokens(24, 64);
    for case in tiny_cases() {
        let v4 = load(&write_tiny(root.path(), &case, false, DType::F32));
        let v5 = load(&write_tiny(root.path(), &case, true, DType::F32));
        assert_eq!(v4.info(), v5.info(), "{}", case.name);
        let (a, b) = (
            full_logits(&v4, &tokens, STRATEGIES[0]),
            full_logits(&v5, &tokens, STRATEGIES[0]),
        );
        assert_eq!(rel_err(&a, &b, MIN_SCALE), 0.0, "{}", case.name);
    }
}

#[test]
fn layer_kinds_follow_the_config() {
    let root = tempfile::tempdir().unwrap();
    let cases = tiny_cases();
    let kinds = |name: &str| {
        let case = cases.iter().find(|c| c.name == name).unwrap();
        load(&write_tiny(root.path(), case, false, DType::F32))
            .info()
            .layer_kinds
            .clone()
    };
    let slide = LayerKind::Sliding { window: 8 };
    assert_eq!(kinds("llama"), vec![LayerKind::Full; 2]);
    assert_eq!(kinds("mistral"), vec![slide; 2]);
    assert_eq!(
        kinds("qwen2"),
        vec![LayerKind::Full; 2],
        "use_sliding_window: false"
    );
    assert_eq!(
        kinds("gemma3"),
        vec![slide, LayerKind::Full, slide, LayerKind::Full]
    );
    let full_only = load(&write_tiny(root.path(), &cases[0], true, DType::F32));
    let cache = full_only.new_cache(STRATEGIES[1]).unwrap();
    assert!(cache
        .layers()
        .iter()
        .all(|l| matches!(l, specdec::cache::LayerCache::Kv(_))));
}

#[test]
fn bf16_checkpoints_load_as_f32_on_cpu() {
    let root = tempfile::tempdir().unwrap();
    let case = &tiny_cases()[0];
    let model = load_on_cpu(&write_tiny(root.path(), case, true, DType::BF16));
    assert_eq!(model.info().dtype, DType::F32);
    let tokens = test_tokens(12, 64);
    // Same weights rounded to bf16 and stored as f32: identical model.
    let rounded: Vec<(String, Tensor)> = case
        .tiny
        .tensors("model.")
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                t.to_dtype(DType::BF16)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap(),
            )
        })
        .collect();
    let dir = root.path().join("rounded");
    write_checkpoint(&dir, &case.v5, &rounded, DType::F32, 1);
    let reference = load_on_cpu(&dir);
    let (a, b) = (
        full_logits(&model, &tokens, STRATEGIES[0]),
        full_logits(&reference, &tokens, STRATEGIES[0]),
    );
    assert_eq!(rel_err(&a, &b, MIN_SCALE), 0.0);
}

#[test]
fn multimodal_gemma3_reads_the_nested_text_model() {
    let root = tempfile::tempdir().unwrap();
    let case = tiny_cases()
        .into_iter()
        .find(|c| c.name == "gemma3")
        .unwrap();
    let text = load(&write_tiny(root.path(), &case, true, DType::F32));
    let config = json!({"model_type": "gemma3", "text_config": case.v5, "eos_token_id": [1, 106]});
    let dir = root.path().join("multimodal");
    let mut tensors = case.tiny.tensors("language_model.model.");
    tensors.push((
        "vision_tower.dummy.weight".into(),
        Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
    ));
    write_checkpoint(&dir, &config, &tensors, DType::F32, 1);
    let multi = load(&dir);
    assert_eq!(multi.info().eos_token_ids, vec![1, 106, 2]);
    let tokens = test_tokens(20, 64);
    let (a, b) = (
        full_logits(&multi, &tokens, STRATEGIES[0]),
        full_logits(&text, &tokens, STRATEGIES[0]),
    );
    assert_eq!(rel_err(&a, &b, MIN_SCALE), 0.0);
}

#[test]
fn gemma3_ignores_attn_logit_softcapping_like_transformers() {
    let root = tempfile::tempdir().unwrap();
    let case = tiny_cases()
        .into_iter()
        .find(|c| c.name == "gemma3")
        .unwrap();
    assert_eq!(case.v5["attn_logit_softcapping"], json!(5.0));
    let capped = load(&write_tiny(root.path(), &case, true, DType::F32));
    let dir = root.path().join("uncapped");
    let config = merge(case.v5.clone(), json!({"attn_logit_softcapping": null}));
    write_checkpoint(&dir, &config, &case.tiny.tensors("model."), DType::F32, 1);
    let tokens = test_tokens(20, 64);
    let (a, b) = (
        full_logits(&capped, &tokens, STRATEGIES[0]),
        full_logits(&load(&dir), &tokens, STRATEGIES[0]),
    );
    assert_eq!(rel_err(&a, &b, MIN_SCALE), 0.0);

    let config = merge(
        case.v5.clone(),
        json!({"use_bidirectional_attention": true}),
    );
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    expect_error(&dir, &["config.json", "use_bidirectional_attention"]);
}

#[test]
fn attention_softcap_decodes_incrementally() {
    use specdec::models::{decoder_spec, HfConfig};
    use specdec::nn::{Decoder, Weights};
    let root = tempfile::tempdir().unwrap();
    let case = tiny_cases()
        .into_iter()
        .find(|c| c.name == "gemma3")
        .unwrap();
    let dir = write_tiny(root.path(), &case, true, DType::F32);
    let mut spec = decoder_spec(&HfConfig::read(&dir.join("config.json")).unwrap()).unwrap();
    let weights = Weights::open(&dir, &Device::Cpu, DType::F32).unwrap();
    let plain = Decoder::load(&spec, &weights).unwrap();
    spec.attn_softcap = Some(0.5);
    let capped = Decoder::load(&spec, &weights).unwrap();
    let tokens = test_tokens(30, 64);
    let run = |decoder: &Decoder, chunk: usize, strategy| {
        let mut cache = decoder.new_cache(strategy).unwrap();
        let rows: Vec<Tensor> = tokens
            .chunks(chunk)
            .map(|c| decoder.forward(c, &mut cache).unwrap())
            .collect();
        Tensor::cat(&rows, 0).unwrap()
    };
    let full = run(&capped, tokens.len(), STRATEGIES[0]);
    assert!(
        rel_err(&run(&plain, tokens.len(), STRATEGIES[0]), &full, MIN_SCALE) > 1e-3,
        "softcap has no effect"
    );
    for strategy in STRATEGIES {
        assert_close(
            "softcap, one token at a time",
            &run(&capped, 1, strategy),
            &full,
        );
        assert_close("softcap, chunks of 5", &run(&capped, 5, strategy), &full);
    }
}

#[test]
fn eos_ids_are_the_union_of_config_and_generation_config() {
    let root = tempfile::tempdir().unwrap();
    let dir = write_tiny(root.path(), &tiny_cases()[1], false, DType::F32);
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [7, 2, 9]}"#,
    )
    .unwrap();
    assert_eq!(load(&dir).info().eos_token_ids, vec![2, 7, 9]);
}

// ---------------------------------------------------------------- errors

/// Loads `dir` expecting an error whose message contains every one of `needles`.
fn expect_error(dir: &Path, needles: &[&str]) {
    let err = match Model::load(dir, &device::load_options()) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    };
    for needle in needles {
        assert!(
            err.contains(needle),
            "error `{err}` does not mention `{needle}`"
        );
    }
}

#[test]
fn malformed_checkpoints_give_errors_naming_the_culprit() {
    let root = tempfile::tempdir().unwrap();
    let case = &tiny_cases()[2]; // qwen2: biases, tied
    let fresh = |name: &str| -> PathBuf {
        let dir = root.path().join(name);
        write_checkpoint(&dir, &case.v4, &case.tiny.tensors("model."), DType::F32, 1);
        dir
    };
    expect_error(&root.path().join("absent"), &["absent", "not found"]);

    let dir = fresh("no-config");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    expect_error(&dir, &["config.json"]);

    let dir = fresh("bad-json");
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"qwen2\",").unwrap();
    expect_error(&dir, &["config.json", "bad JSON"]);

    let dir = fresh("unsupported");
    std::fs::write(
        dir.join("config.json"),
        merge(case.v4.clone(), json!({"model_type": "gpt2"})).to_string(),
    )
    .unwrap();
    expect_error(
        &dir,
        &[
            "config.json",
            "model_type",
            "gpt2",
            "llama, mistral, qwen2, qwen3, gemma3_text",
        ],
    );

    let dir = fresh("bad-key");
    std::fs::write(
        dir.join("config.json"),
        merge(case.v4.clone(), json!({"hidden_size": "wide"})).to_string(),
    )
    .unwrap();
    expect_error(&dir, &["config.json", "hidden_size", "wide"]);

    let dir = fresh("bad-rope");
    let yarn = json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}});
    std::fs::write(
        dir.join("config.json"),
        merge(case.v4.clone(), yarn).to_string(),
    )
    .unwrap();
    expect_error(&dir, &["config.json", "rope_type", "yarn"]);

    let missing = "model.layers.1.self_attn.k_proj.bias";
    let dir = root.path().join("missing-tensor");
    let tensors: Vec<_> = case
        .tiny
        .tensors("model.")
        .into_iter()
        .filter(|(n, _)| n != missing)
        .collect();
    write_checkpoint(&dir, &case.v4, &tensors, DType::F32, 1);
    expect_error(&dir, &[missing, "model.safetensors", "not found"]);

    let wrong = "model.layers.0.mlp.up_proj.weight";
    let dir = root.path().join("wrong-shape");
    let tensors: Vec<_> = case
        .tiny
        .tensors("model.")
        .into_iter()
        .map(|(n, t)| {
            if n == wrong {
                (n, t.narrow(0, 0, 40).unwrap())
            } else {
                (n, t)
            }
        })
        .collect();
    write_checkpoint(&dir, &case.v4, &tensors, DType::F32, 1);
    expect_error(&dir, &[wrong, "[40, 32]", "[48, 32]", "model.safetensors"]);

    let dir = root.path().join("sharded");
    write_checkpoint(&dir, &case.v4, &case.tiny.tensors("model."), DType::F32, 2);
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    expect_error(&dir, &["model-00002-of-00002.safetensors"]);

    let dir = fresh("no-weights");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    expect_error(&dir, &["model.safetensors", "model.safetensors.index.json"]);

    let err = specdec::models::load_tokenizer(&dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    let err = specdec::models::load_tokenizer(&dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[test]
fn forward_refuses_bad_input() {
    let root = tempfile::tempdir().unwrap();
    let cases = tiny_cases();
    let model = load(&write_tiny(root.path(), &cases[1], true, DType::F32));
    let mut cache = model.new_cache(RotatingStrategy::Staged).unwrap();
    assert!(model.forward(&[], &mut cache).is_err());
    let err = model.forward(&[64], &mut cache).unwrap_err().to_string();
    assert!(err.contains("64"), "{err}");
    let other = load(&write_tiny(root.path(), &cases[0], true, DType::F32));
    let mut foreign = other.new_cache(RotatingStrategy::Staged).unwrap();
    let err = model.forward(&[1], &mut foreign).unwrap_err().to_string();
    assert!(err.contains("new_cache"), "{err}");
    assert_eq!(cache.offset(), 0);
}

// ---------------------------------------------------------------- transformers fixtures

const FIXTURE_CASES: [&str; 9] = [
    "llama",
    "llama_tied",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "gemma3_nosoftcap",
    "gemma3_linear",
    "qwen2_sliding",
];

#[derive(serde::Deserialize)]
struct Reference {
    input_ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
}

fn fixture_dir(case: &str) -> PathBuf {
    repo_path("tests/fixtures/hf").join(case)
}

/// The fixture dir as saved (5.x config) and a copy with `config.v4.json` as `config.json`.
fn fixture_variants(case: &str, tmp: &Path) -> Vec<(String, PathBuf)> {
    let dir = fixture_dir(case);
    let mut out = vec![(format!("{case} (config 5.x)"), dir.clone())];
    if !dir.join("config.v4.json").is_file() {
        eprintln!("{case}: no config.v4.json, 4.x spelling not checked");
        return out;
    }
    let copy = tmp.join(case);
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let target = if name == "config.v4.json" {
            "config.json".to_string()
        } else {
            name.clone()
        };
        if name != "config.json" && path.is_file() {
            std::fs::copy(&path, copy.join(target)).unwrap();
        }
    }
    out.push((format!("{case} (config 4.x)"), copy));
    out
}

/// Runs `check` on every fixture case present; reports absent ones.
fn for_each_fixture(check: impl Fn(&str, &Model, &Reference)) {
    for_each_fixture_with(&device::load_options(), check)
}

/// [`for_each_fixture`] with the models loaded under `options`.
fn for_each_fixture_with(options: &LoadOptions, check: impl Fn(&str, &Model, &Reference)) {
    let tmp = tempfile::tempdir().unwrap();
    let mut missing = Vec::new();
    for case in FIXTURE_CASES {
        let dir = fixture_dir(case);
        if !dir.join("reference.json").is_file() {
            missing.push(case);
            continue;
        }
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let reference: Reference = serde_json::from_str(&text).unwrap();
        for (label, variant) in fixture_variants(case, tmp.path()) {
            check(&label, &load_with(&variant, options), &reference);
        }
    }
    if !missing.is_empty() {
        eprintln!("transformers fixtures absent, skipped: {missing:?}");
    }
}

#[test]
fn logits_match_transformers() {
    for_each_fixture(|label, model, reference| {
        let rows = reference.logits.len();
        let flat: Vec<f32> = reference.logits.iter().flatten().copied().collect();
        let expected =
            Tensor::from_vec(flat, (rows, model.info().vocab_size), &Device::Cpu).unwrap();
        let ours = full_logits(model, &reference.input_ids, STRATEGIES[0]);
        eprintln!(
            "{label}: relative error {:e}",
            rel_err(&ours, &expected, MIN_SCALE)
        );
        assert_close(
            &format!("{label}: logits vs transformers"),
            &ours,
            &expected,
        );
    });
}

#[test]
fn greedy_continuation_matches_transformers() {
    // transformers' greedy tokens were taken in f32: the models run in f32 on the test device
    // whatever the test dtype (in half precision a near tie may pick another token).
    let f32 = LoadOptions {
        dtype: DTypeChoice::F32,
        ..device::load_options()
    };
    for_each_fixture_with(&f32, |label, model, reference| {
        let ours = greedy(model, &reference.prompt, reference.greedy.len());
        assert_eq!(ours, reference.greedy, "{label}: greedy continuation");
    });
}

#[test]
fn fixtures_decode_incrementally_like_a_full_forward() {
    for_each_fixture(|label, model, reference| {
        check_incremental(model, &reference.input_ids, label);
    });
}

#[test]
fn half_dtypes_run_on_the_cpu_close_to_f32() {
    let root = tempfile::tempdir().unwrap();
    let case = tiny_cases()
        .into_iter()
        .find(|c| c.name == "gemma3")
        .unwrap();
    let dir = write_tiny(root.path(), &case, true, DType::BF16);
    let tokens = test_tokens(20, 64);
    let f32_logits = full_logits(&load_on_cpu(&dir), &tokens, STRATEGIES[0]);
    for (choice, dtype, tol) in [
        (DTypeChoice::F16, DType::F16, 1e-2),
        (DTypeChoice::BF16, DType::BF16, 5e-2),
    ] {
        let model = load_with(
            &dir,
            &LoadOptions {
                device: Device::Cpu,
                dtype: choice,
                quantized: false,
                ..Default::default()
            },
        );
        assert_eq!(model.info().dtype, dtype);
        let err = rel_err(
            &full_logits(&model, &tokens, STRATEGIES[0]),
            &f32_logits,
            MIN_SCALE,
        );
        assert!(err < tol, "{dtype:?}: relative error {err}");
    }
}
