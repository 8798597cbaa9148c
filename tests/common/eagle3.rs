//! Random EAGLE-3 heads in the EAGLE authors' layout (`config.json` + `model.safetensors`
//! with `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`), for tests on any target.
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Writes a head for a target of `vocab` ids and `target_hidden` wide states to `dir`:
/// the target's width (it embeds with the target's table), 4 heads, 2 KV heads, fusing `layers`, with `draft_vocab` draft ids (a
/// seeded subset of the target's, always containing id 0..4). Uniform weights from `seed`.
pub fn random_head(
    dir: &Path,
    (vocab, target_hidden): (usize, usize),
    layers: &[usize],
    draft_vocab: usize,
    seed: u64,
) {
    let (hidden, heads, kv) = (target_hidden, 4usize, 2usize);
    let (d, inter) = (hidden / heads, 2 * hidden);
    std::fs::create_dir_all(dir).expect("head dir");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": d,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": target_hidden,
        "eagle_aux_hidden_state_layer_ids": layers,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tensors = std::collections::HashMap::new();
    let mut put = |name: &str, shape: &[usize], mean: f64, std: f64| {
        let a = 3f64.sqrt() * std;
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| (mean + rng.random_range(-a..a)) as f32)
            .collect();
        tensors.insert(
            name.to_string(),
            Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor"),
        );
    };
    let fused = layers.len() * target_hidden;
    put(
        "fc.weight",
        &[hidden, fused],
        0.0,
        (fused as f64).powf(-0.5),
    );
    for n in ["hidden_norm", "input_layernorm", "post_attention_layernorm"] {
        put(&format!("midlayer.{n}.weight"), &[hidden], 1.0, 0.1);
    }
    let w = (2.0 * hidden as f64).powf(-0.5);
    put(
        "midlayer.self_attn.q_proj.weight",
        &[heads * d, 2 * hidden],
        0.0,
        w,
    );
    put(
        "midlayer.self_attn.k_proj.weight",
        &[kv * d, 2 * hidden],
        0.0,
        w,
    );
    put(
        "midlayer.self_attn.v_proj.weight",
        &[kv * d, 2 * hidden],
        0.0,
        w,
    );
    let w = (hidden as f64).powf(-0.5);
    put(
        "midlayer.self_attn.o_proj.weight",
        &[hidden, heads * d],
        0.0,
        w,
    );
    put("midlayer.mlp.gate_proj.weight", &[inter, hidden], 0.0, w);
    put("midlayer.mlp.up_proj.weight", &[inter, hidden], 0.0, w);
    put(
        "midlayer.mlp.down_proj.weight",
        &[hidden, inter],
        0.0,
        (inter as f64).powf(-0.5),
    );
    put("norm.weight", &[hidden], 1.0, 0.1);
    put("lm_head.weight", &[draft_vocab, hidden], 0.0, 2.0 * w);
    // A seeded subset of the target's ids, in order: d2t[i] = id - i.
    let mut ids: Vec<usize> = (0..4.min(draft_vocab)).collect();
    while ids.len() < draft_vocab {
        let id = rng.random_range(0..vocab);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    let d2t: Vec<i64> = ids
        .iter()
        .enumerate()
        .map(|(i, &t)| t as i64 - i as i64)
        .collect();
    let mut t2d = vec![0u8; vocab];
    ids.iter().for_each(|&t| t2d[t] = 1);
    tensors.insert(
        "d2t".into(),
        Tensor::from_vec(d2t, draft_vocab, &Device::Cpu).expect("d2t"),
    );
    tensors.insert(
        "t2d".into(),
        Tensor::from_vec(t2d, vocab, &Device::Cpu)
            .expect("t2d")
            .to_dtype(DType::U8)
            .expect("u8"),
    );
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).expect("save");
}
