//! Loading checkpoints: the shipped models (`models/<name>`) and the transformers fixtures
//! (`tests/fixtures/hf/<case>`), on the test device or on the CPU. Every loader panics with
//! the directory and the error when a checkpoint does not load.
use std::path::{Path, PathBuf};

use specdec::models::{LoadOptions, Model};

/// `rel` under the crate root (`models/target`, `tests/fixtures/hf/qwen3`).
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The checkpoint in `dir`, loaded with `options`.
pub fn load_with(dir: &Path, options: &LoadOptions) -> Model {
    Model::load(dir, options).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// The checkpoint in `dir` on the test device, in the test dtype.
pub fn load(dir: &Path) -> Model {
    load_with(dir, &super::device::load_options())
}

/// The checkpoint in `dir` on the CPU, whatever the test device, in its own dtype widened to
/// f32 ([`LoadOptions::default`]): for tests whose expectations were taken there.
pub fn load_on_cpu(dir: &Path) -> Model {
    load_with(dir, &LoadOptions::default())
}

/// The shipped model `name` (`target` or `draft`) on the test device, in the test dtype.
pub fn shipped(name: &str) -> Model {
    load(&repo_path("models").join(name))
}

/// The shipped model `name` (`target` or `draft`) on the CPU (see [`load_on_cpu`]).
pub fn shipped_on_cpu(name: &str) -> Model {
    load_on_cpu(&repo_path("models").join(name))
}

/// A Gemma 3 text checkpoint with seeded random f32 weights (standard deviation 0.02; norm
/// weights 0.1 around Gemma's `1 + w`) written to `dir`: the `tests/fixtures/hf/gemma3` config (five
/// sliding-window layers, then a global one) with `head_dim`, `sliding_window` and
/// `max_position_embeddings` set here. For kernels whose head widths the fixture's 24 does not
/// meet (the CUDA split attention takes 32, 64, 128, 256).
pub fn random_gemma3(dir: &Path, head_dim: usize, window: usize, max_positions: usize) {
    use candle_core::{DType, Device, Tensor};
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let fixture = repo_path("tests/fixtures/hf/gemma3/config.json");
    let text = std::fs::read_to_string(&fixture).expect("gemma3 fixture config");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("config json");
    config["head_dim"] = head_dim.into();
    config["query_pre_attn_scalar"] = head_dim.into();
    config["sliding_window"] = window.into();
    config["max_position_embeddings"] = max_positions.into();
    let get = |k: &str| config[k].as_u64().expect("config key") as usize;
    let (hidden, inter, vocab) = (
        get("hidden_size"),
        get("intermediate_size"),
        get("vocab_size"),
    );
    let (heads, kv, layers) = (
        get("num_attention_heads"),
        get("num_key_value_heads"),
        get("num_hidden_layers"),
    );
    // Uniform weights of the given standard deviation from a seeded generator: the same
    // checkpoint on every run (`SPECDEC_TEST_WEIGHT_SEED` picks another draw).
    let seed = std::env::var("SPECDEC_TEST_WEIGHT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tensors = std::collections::HashMap::new();
    let mut put = |name: String, shape: &[usize], std: f64| {
        let a = (3.0f64).sqrt() * std;
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-a..a) as f32).collect();
        let t = Tensor::from_vec(v, shape, &Device::Cpu).expect("random tensor");
        tensors.insert(name, t.to_dtype(DType::F32).expect("f32"));
    };
    put("model.embed_tokens.weight".into(), &[vocab, hidden], 0.02);
    put("model.norm.weight".into(), &[hidden], 0.1);
    for i in 0..layers {
        let p = format!("model.layers.{i}.");
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            put(format!("{p}{norm}.weight"), &[hidden], 0.1);
        }
        put(
            format!("{p}self_attn.q_proj.weight"),
            &[heads * head_dim, hidden],
            0.02,
        );
        put(
            format!("{p}self_attn.k_proj.weight"),
            &[kv * head_dim, hidden],
            0.02,
        );
        put(
            format!("{p}self_attn.v_proj.weight"),
            &[kv * head_dim, hidden],
            0.02,
        );
        put(
            format!("{p}self_attn.o_proj.weight"),
            &[hidden, heads * head_dim],
            0.02,
        );
        put(format!("{p}self_attn.q_norm.weight"), &[head_dim], 0.1);
        put(format!("{p}self_attn.k_norm.weight"), &[head_dim], 0.1);
        put(format!("{p}mlp.gate_proj.weight"), &[inter, hidden], 0.02);
        put(format!("{p}mlp.up_proj.weight"), &[inter, hidden], 0.02);
        put(format!("{p}mlp.down_proj.weight"), &[hidden, inter], 0.02);
    }
    std::fs::create_dir_all(dir).expect("checkpoint dir");
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).expect("weights");
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).expect("config"),
    )
    .expect("config.json");
}
