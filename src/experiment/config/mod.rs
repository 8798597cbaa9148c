//! The experiment config: strict TOML (unknown keys are errors), a default for every key,
//! and a scalar accepted wherever a list is ([`List`]). The `[engine]` table lives in
//! `engine.rs`, `[prefix_cache]` in `prefix.rs`, validation in `validate.rs`, loading and
//! `--set` overrides in `load.rs`.
pub mod engine;
pub mod list;
pub mod load;
pub mod prefix;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use engine::EngineConfig;
pub use list::List;
pub use prefix::{PrefixCacheConfig, TurnsChoice};

/// One experiment: models, drafters, prompts and the sweep whose cartesian product is run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Names the result folder `experiments/<name>/<run-id>/` (default: the config's file stem).
    #[serde(default = "default_name")]
    pub name: String,
    /// Seeds every generation's RNG together with the sweep point and the prompt.
    #[serde(default)]
    pub seed: u64,
    /// Most new tokens per generation.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: usize,
    /// Stop a generation at the target's end-of-sequence tokens.
    #[serde(default = "yes")]
    pub stop_at_eos: bool,
    /// Run one short untimed generation per model before measuring (allocations, caches).
    #[serde(default = "yes")]
    pub warmup: bool,
    /// How many times every (point, prompt) generation is run; per-point figures are medians
    /// over repeats and speedups medians over paired (repeat, prompt) ratios.
    #[serde(default = "one")]
    pub repeats: usize,
    /// The order generations run in (see [`RunOrder`]).
    #[serde(default)]
    pub order: RunOrder,
    /// Where the models run.
    #[serde(default)]
    pub device: DeviceChoice,
    /// Weight and activation dtype (`auto`: the checkpoint's, f32 on CPU).
    #[serde(default)]
    pub dtype: DtypeChoice,
    /// Draw the target's and the draft models' weights at random from their `config.json`
    /// alone (N(0, 0.02²) matrices, unit norms; no weight files read): for speed studies at
    /// published shapes, e.g. a 70B target no disk here holds. Outputs are meaningless.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub random_weights: bool,
    /// The model whose distribution is sampled.
    #[serde(default)]
    pub target: TargetConfig,
    /// Named drafters the sweep refers to.
    #[serde(default)]
    pub drafters: BTreeMap<String, DrafterConfig>,
    /// The prompts.
    #[serde(default)]
    pub dataset: DatasetConfig,
    /// The grid of settings.
    #[serde(default)]
    pub sweep: SweepConfig,
    /// Reuse of shared prompt prefixes across generations.
    #[serde(default)]
    pub prefix_cache: PrefixCacheConfig,
    /// Engine options (`[engine]`): every key of [`crate::engine::EngineOptions`], a value or
    /// a list (swept); see [`EngineConfig`].
    #[serde(default)]
    pub engine: EngineConfig,
}

fn default_name() -> String {
    "experiment".into()
}
fn default_max_new_tokens() -> usize {
    128
}
fn yes() -> bool {
    true
}

/// `device = "auto" | "cpu" | "cuda" | "metal"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    /// CUDA if compiled in and present, else Metal, else CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA GPU (needs `--features cuda`).
    Cuda,
    /// The first Metal GPU (needs `--features metal`).
    Metal,
}

impl DeviceChoice {
    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Metal => "metal",
        }
    }
}

/// `order = "interleaved" | "grouped"`: the sequence in which generations run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOrder {
    /// For each prompt, the autoregressive point and every speculative point that shares its
    /// sampling, cache and engine options run back to back, their order rotating with the
    /// repeat and the prompt: a paired comparison that slow drift of the machine's speed
    /// cannot bias.
    #[default]
    Interleaved,
    /// Every prompt of one point, then the next point (autoregressive points first), the
    /// whole sweep once per repeat.
    Grouped,
}

impl fmt::Display for RunOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunOrder::Interleaved => "interleaved",
            RunOrder::Grouped => "grouped",
        })
    }
}

/// `dtype = "auto" | "f32" | "bf16" | "f16"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DtypeChoice {
    /// The checkpoint's dtype on GPUs, f32 on the CPU.
    #[default]
    Auto,
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

/// `[target]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json) or a GGUF
    /// file; relative paths are relative to the current directory.
    #[serde(default = "default_target_path")]
    pub path: PathBuf,
    /// Keep a GGUF file's quantized matrices quantized (candle's quantized matmul) instead
    /// of dequantizing them into the compute dtype.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quantized: bool,
    /// Ranks the target is split over (tensor parallelism, one GPU each from `device`'s on,
    /// NCCL between them; on the CPU, threads); 1: not split. Must divide the attention heads
    /// and the MLP width, and divide the KV heads or be a multiple of them.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor_parallel: usize,
    /// The CUDA GPUs of the target's ranks, rank 0 first (one per rank, each once); default:
    /// the first `tensor_parallel` GPUs. Needs `device = "cuda"` (or `"auto"` finding CUDA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<usize>>,
}

fn default_target_path() -> PathBuf {
    "models/target".into()
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

impl Default for TargetConfig {
    fn default() -> Self {
        Self {
            path: default_target_path(),
            quantized: false,
            tensor_parallel: 1,
            gpus: None,
        }
    }
}

/// `kind = "model" | "ngram" | "oracle" | "eagle3"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrafterKind {
    /// A smaller model with its own caches.
    Model,
    /// Prompt lookup: copy what followed the last match of the context's suffix.
    Ngram,
    /// An EAGLE-3 head (`path`: its directory, in the authors' or the `speculators` layout)
    /// drafting from the target's hidden states.
    Eagle3,
    /// Synthetic acceptance for speed studies: the target's own greedy continuation, each
    /// token kept with probability `alpha` (greedy sampling only); with `path`, a draft
    /// model's forwards are run for their cost.
    Oracle,
}

/// `[drafters.<name>]`. Which keys apply depends on `kind`; `validate` rejects the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrafterConfig {
    /// What drafts.
    pub kind: DrafterKind,
    /// `model`: the draft's Hugging Face directory; `eagle3`: the head's directory; `oracle`
    /// (optional): a model whose forwards are run for their cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `model`: keep a GGUF draft's quantized matrices quantized (as `target.quantized`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quantized: bool,
    /// `oracle`: probability that each proposed token is the target's own (in `[0, 1]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
    /// `model`: stop drafting before a position where the draft's largest probability is below
    /// this (decided before sampling, so lossless at any temperature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f32>,
    /// `ngram`: shortest suffix to match (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ngram: Option<usize>,
    /// `ngram`: longest suffix to match (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ngram: Option<usize>,
    /// `model`, and `oracle` with a `path`: the CUDA GPU the draft model runs on; default:
    /// beside the target's rank 0. On another GPU than rank 0's, its greedy drafts reach the
    /// target by a device-to-device copy queued after the draft's work (no host round trip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<usize>,
}

/// Default `min_ngram`.
pub const DEFAULT_MIN_NGRAM: usize = 1;
/// Default `max_ngram`.
pub const DEFAULT_MAX_NGRAM: usize = 3;

/// `[dataset]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// JSONL of `{"id", "prompt"}` or Spec-Bench `{"question_id", "category", "turns"}`.
    #[serde(default = "default_dataset_path")]
    pub path: PathBuf,
    /// Use at most this many prompts (after the category filter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Keep only prompts of these categories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<List<String>>,
    /// Keep the first N prompts of each category, in file order (after the category filter,
    /// before `limit`): a sample across a benchmark's tasks rather than the first of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_category: Option<usize>,
    /// Wrap the first turn in the target's chat template before encoding.
    #[serde(default)]
    pub chat_template: bool,
    /// Which user turns to generate for: `first`, or `all` (conversations).
    #[serde(default)]
    pub turns: TurnsChoice,
}

fn default_dataset_path() -> PathBuf {
    "configs/prompts/code.jsonl".into()
}

impl Default for DatasetConfig {
    fn default() -> Self {
        Self {
            path: default_dataset_path(),
            limit: None,
            categories: None,
            per_category: None,
            chat_template: false,
            turns: TurnsChoice::First,
        }
    }
}

/// `method = "autoregressive" | "speculative"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// One target forward per token: the baseline.
    Autoregressive,
    /// Draft, then verify in one target forward.
    Speculative,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Autoregressive => "autoregressive",
            Method::Speculative => "speculative",
        })
    }
}

/// `cache = "staged" | "slack"`: how rotating (sliding-window) layers roll back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheChoice {
    /// Pending K/V beside the ring; commit appends the accepted prefix.
    Staged,
    /// Spare ring capacity (the sweep's largest γ); rollback moves the cursor.
    Slack,
}

impl fmt::Display for CacheChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheChoice::Staged => "staged",
            CacheChoice::Slack => "slack",
        })
    }
}

/// One `gamma` value: a fixed draft length or the adaptive schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GammaChoice {
    /// Always draft this many tokens.
    Fixed(usize),
    /// `[sweep.adaptive]`: +2 after a fully accepted step, -1 otherwise.
    Adaptive,
}

impl fmt::Display for GammaChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GammaChoice::Fixed(g) => write!(f, "{g}"),
            GammaChoice::Adaptive => f.write_str("adaptive"),
        }
    }
}

impl Serialize for GammaChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            GammaChoice::Fixed(g) => s.serialize_u64(*g as u64),
            GammaChoice::Adaptive => s.serialize_str("adaptive"),
        }
    }
}

impl<'de> Deserialize<'de> for GammaChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct GammaVisitor;
        impl Visitor<'_> for GammaVisitor {
            type Value = GammaChoice;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a draft length >= 1 or \"adaptive\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GammaChoice, E> {
                usize::try_from(v)
                    .map(GammaChoice::Fixed)
                    .map_err(|_| E::custom(format!("gamma = {v}: must be >= 1 or \"adaptive\"")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GammaChoice, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GammaChoice, E> {
                match v {
                    "adaptive" => Ok(GammaChoice::Adaptive),
                    _ => Err(E::custom(format!(
                        "gamma = \"{v}\": allowed values are numbers >= 1 and \"adaptive\""
                    ))),
                }
            }
        }
        d.deserialize_any(GammaVisitor)
    }
}

/// `[sweep.adaptive]`: the adaptive γ schedule's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveGamma {
    /// Smallest γ.
    #[serde(default = "one")]
    pub min: usize,
    /// Largest γ.
    #[serde(default = "twelve")]
    pub max: usize,
    /// First γ.
    #[serde(default = "four")]
    pub start: usize,
}

fn one() -> usize {
    1
}
fn four() -> usize {
    4
}
fn twelve() -> usize {
    12
}

impl Default for AdaptiveGamma {
    fn default() -> Self {
        Self {
            min: 1,
            max: 12,
            start: 4,
        }
    }
}

/// `[sweep]`: every combination is run. Autoregressive points ignore `drafter` and `gamma`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Decoding methods (default: autoregressive, plus speculative when a drafter is
    /// defined; filled in by [`ExperimentConfig::resolve_defaults`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<List<Method>>,
    /// Drafter names (default: every drafter defined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<List<String>>,
    /// Draft lengths, or "adaptive".
    #[serde(default = "default_gamma")]
    pub gamma: List<GammaChoice>,
    /// Sampling temperatures (0 = greedy).
    #[serde(default = "default_temperature")]
    pub temperature: List<f64>,
    /// Top-k filters (0 = off).
    #[serde(default = "default_top_k")]
    pub top_k: List<usize>,
    /// Nucleus filters (1 = off).
    #[serde(default = "default_top_p")]
    pub top_p: List<f64>,
    /// Rotating-cache strategies.
    #[serde(default = "default_cache")]
    pub cache: List<CacheChoice>,
    /// Bounds of `gamma = "adaptive"`.
    #[serde(default)]
    pub adaptive: AdaptiveGamma,
    /// Draft tree widths: children per expanded node (1 = chain).
    #[serde(default = "default_tree_width")]
    pub tree_width: List<usize>,
    /// Most drafted nodes per step of a tree (width > 1); default: γ (for adaptive γ, its
    /// `max`). Chains ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_budget: Option<List<usize>>,
}

fn default_tree_width() -> List<usize> {
    List(vec![1])
}

fn default_gamma() -> List<GammaChoice> {
    List(vec![GammaChoice::Fixed(4)])
}
fn default_temperature() -> List<f64> {
    List(vec![0.0])
}
fn default_top_k() -> List<usize> {
    List(vec![0])
}
fn default_top_p() -> List<f64> {
    List(vec![1.0])
}
fn default_cache() -> List<CacheChoice> {
    List(vec![CacheChoice::Staged])
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            method: None,
            drafter: None,
            gamma: default_gamma(),
            temperature: default_temperature(),
            top_k: default_top_k(),
            top_p: default_top_p(),
            cache: default_cache(),
            adaptive: AdaptiveGamma::default(),
            tree_width: default_tree_width(),
            tree_budget: None,
        }
    }
}

impl SweepConfig {
    /// The methods to run (see `method`).
    pub fn methods(&self) -> &[Method] {
        self.method.as_deref().unwrap_or(&[Method::Autoregressive])
    }
}

impl ExperimentConfig {
    /// Fills in defaults that depend on other keys: `sweep.method` is autoregressive plus
    /// speculative when any drafter is defined, autoregressive alone otherwise.
    pub fn resolve_defaults(&mut self) {
        if self.sweep.method.is_none() {
            let mut methods = vec![Method::Autoregressive];
            if !self.drafters.is_empty() {
                methods.push(Method::Speculative);
            }
            self.sweep.method = Some(List(methods));
        }
    }
}
