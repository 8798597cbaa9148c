//! Hugging Face checkpoints: a model directory (`config.json`, `model.safetensors` or shards
//! with `model.safetensors.index.json`, `tokenizer.json`, optional `generation_config.json`)
//! loaded into the shared [`crate::nn::Decoder`]. Each architecture file only turns its config
//! into a [`DecoderSpec`].

mod base;
mod config;
mod eagle3;
mod gemma3;
mod gguf;
mod llama;
mod mistral;
mod qwen2;
mod qwen3;

use std::path::Path;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor};

pub use config::HfConfig;
pub use eagle3::{is_eagle3, load_eagle3};
pub use gguf::GGUF_ARCHITECTURES;

use crate::cache::{ModelCache, RotatingStrategy};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, GgufTensors};
use crate::nn::{Decoder, DecoderSpec, DeviceTokens, LayerKind, StepIds, Weights};

/// `model_type` values [`Model::load`] accepts.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "gemma3",
];

/// The compute dtype to load weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeChoice {
    /// f32 on the CPU (candle's CPU bf16 matmul is very slow), the checkpoint's dtype on
    /// CUDA and Metal.
    #[default]
    Auto,
    /// 32-bit floats.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
}

impl FromStr for DTypeChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DTypeChoice::Auto),
            "f32" | "float32" => Ok(DTypeChoice::F32),
            "bf16" | "bfloat16" => Ok(DTypeChoice::BF16),
            "f16" | "float16" => Ok(DTypeChoice::F16),
            other => Err(Error::invalid(format!(
                "unknown dtype `{other}` (expected auto, f32, bf16 or f16)"
            ))),
        }
    }
}

/// Where and how to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The device weights live on and forwards run on.
    pub device: Device,
    /// The compute dtype.
    pub dtype: DTypeChoice,
    /// Keep a GGUF file's block-quantized matrices quantized (candle's quantized matmul)
    /// instead of dequantizing them into the compute dtype; only for GGUF files.
    pub quantized: bool,
    /// Ranks of a tensor-parallel split (1: the whole model on `device`). On CUDA rank `r`
    /// runs on `rank_devices[r]`, or by default on the GPU `r` places after `device`'s (NCCL
    /// between them); on the CPU every rank is a thread (for tests and studies of the
    /// split). See [`crate::nn::shard`].
    pub tensor_parallel: usize,
    /// Every rank's device, rank 0 (`device`) first, where the caller places the ranks
    /// (empty: the default above). Devices shared with other models must be the same
    /// [`Device`] values (one stream per GPU: see `experiment::Placement`).
    pub rank_devices: Vec<Device>,
    /// This process runs one rank only, of a group whose other ranks run in other processes
    /// (other hosts): `tensor_parallel` ranks in all, each process running the same program
    /// (see [`crate::nn::Decoder::load_rank`]). `None`: every rank in this process.
    pub rank_group: Option<RankGroup>,
    /// Random weights at the checkpoint's shapes from its `config.json` alone (see
    /// [`Weights::random`]): for speed measurements at published shapes; nothing else is
    /// read from the directory.
    pub random_weights: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DTypeChoice::Auto,
            quantized: false,
            tensor_parallel: 1,
            rank_devices: Vec::new(),
            rank_group: None,
            random_weights: false,
        }
    }
}

/// One rank of a group spread over processes: its index and its end of the group's
/// all-reduce (NCCL between processes: `crate::nn::process_group`; threads in tests).
#[derive(Debug, Clone)]
pub struct RankGroup {
    /// This process's rank, `0..tensor_parallel`.
    pub rank: usize,
    /// Its end of the all-reduce.
    pub reduce: std::sync::Arc<dyn crate::nn::shard::AllReduce>,
}

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The config's `model_type` (`"llama"`, `"gemma3_text"`, ...).
    pub arch: String,
    /// Size of the output distribution.
    pub vocab_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Tokens ending a sequence: the union of `config.json` and `generation_config.json`.
    pub eos_token_ids: Vec<u32>,
    /// The widest sliding window of any layer; `None` when every layer attends fully.
    pub sliding_window: Option<usize>,
    /// The span of each layer.
    pub layer_kinds: Vec<LayerKind>,
    /// Compute dtype.
    pub dtype: DType,
    /// Parameters (tied embeddings counted once).
    pub param_count: usize,
}

/// A loaded causal language model: weights only (`&self`); per-sequence state is the
/// [`ModelCache`] passed to its forwards ([`Decoder::forward`] and the others, through
/// `Deref`; on the CPU they run on rayon's pool, see [`crate::nn::on_cpu_pool`]).
#[derive(Debug)]
pub struct Model {
    decoder: Decoder,
    info: ModelInfo,
    device: Device,
}

impl Model {
    /// Loads the checkpoint at `path`: a Hugging Face directory or a GGUF file (dequantized
    /// into the compute dtype). Errors name the file and the key or tensor at fault. On the
    /// CPU this pins candle's thread count (see [`crate::nn::pin_cpu_thread_count`]).
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model> {
        if opts.device.is_cpu() {
            crate::nn::pin_cpu_thread_count();
        }
        let (arch, spec, weights, eos_token_ids) = checkpoint_parts(path, opts)?;
        let dtype = weights.dtype();
        if opts.tensor_parallel > 1 && opts.quantized {
            return Err(Error::invalid(format!(
                "{}: tensor_parallel = {} splits dense weights; quantized = true is not supported with it",
                path.display(),
                opts.tensor_parallel
            )));
        }
        let decoder = match (opts.tensor_parallel, &opts.rank_group) {
            (0 | 1, _) => Decoder::load(&spec, &weights)?,
            (world, Some(group)) => {
                let shard = crate::nn::shard::Shard {
                    rank: group.rank,
                    world,
                };
                Decoder::load_rank(&spec, &weights, shard, group.reduce.clone())
                    .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?
            }
            (world, None) => {
                let devices = match opts.rank_devices.as_slice() {
                    [] => rank_devices(&opts.device, world)?,
                    given if given.len() == world && given[0].same_device(&opts.device) => {
                        given.to_vec()
                    }
                    given => {
                        return Err(Error::invalid(format!(
                            "{}: {} rank devices for tensor_parallel = {world}: one per rank is needed, rank 0's the model's device",
                            path.display(),
                            given.len()
                        )))
                    }
                };
                // Each rank maps the checkpoint on its own device (a mapping costs nothing
                // until read; each rank reads only its part).
                Decoder::load_parallel(&spec, &devices, |device| {
                    let opts = LoadOptions {
                        device: device.clone(),
                        ..opts.clone()
                    };
                    Ok(checkpoint_parts(path, &opts)?.2)
                })
                .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?
            }
        };
        let info = ModelInfo {
            arch,
            vocab_size: spec.vocab_size,
            num_layers: spec.layers.len(),
            hidden_size: spec.hidden_size,
            eos_token_ids,
            sliding_window: spec
                .layers
                .iter()
                .filter_map(|k| match k {
                    LayerKind::Sliding { window } => Some(*window),
                    LayerKind::Full => None,
                })
                .max(),
            layer_kinds: spec.layers.clone(),
            dtype,
            param_count: decoder.param_count(),
        };
        Ok(Model {
            decoder,
            info,
            device: opts.device.clone(),
        })
    }

    /// What this model is.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The device weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// The decoder's methods (`forward`, `forward_last`, `new_cache`, `graph_recordings`, ...)
/// are the model's: each is defined once, on [`Decoder`].
impl std::ops::Deref for Model {
    type Target = Decoder;

    fn deref(&self) -> &Decoder {
        &self.decoder
    }
}

/// The decode loop's view of a model: [`Decoder`]'s forwards.
impl crate::speculative::LanguageModel for Model {
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.decoder.forward(tokens, cache)
    }

    fn forward_last(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.decoder.forward_last(tokens, cache)
    }

    fn forward_last_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.decoder.forward_last_device(ids, cache)
    }

    fn forward_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.decoder.forward_device(ids, cache)
    }

    fn forward_argmax(
        &self,
        ids: StepIds<'_>,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<DeviceTokens> {
        self.decoder.forward_argmax(ids, cache, last)
    }

    fn new_cache(&self, strategy: RotatingStrategy) -> Result<ModelCache> {
        self.decoder.new_cache(strategy)
    }

    fn vocab_size(&self) -> usize {
        self.info.vocab_size
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.info.eos_token_ids
    }
}

/// What the checkpoint at `path` (a directory or a GGUF file) loads into: architecture,
/// spec, weights on `opts.device`, end-of-sequence ids.
fn checkpoint_parts(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(String, DecoderSpec, Weights, Vec<u32>)> {
    if crate::gguf::is_gguf(path) && !opts.random_weights {
        gguf_parts(path, opts)
    } else if opts.quantized {
        Err(Error::invalid(format!(
            "{}: quantized = true keeps a GGUF file's quantized matrices; this is not a GGUF file",
            path.display()
        )))
    } else if path.is_dir() {
        directory_parts(path, opts)
    } else {
        let what = if path.exists() {
            "neither a model directory nor a GGUF file"
        } else {
            "model directory or GGUF file not found"
        };
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, what);
        Err(Error::io(path, e))
    }
}

/// The device of each rank of a `world`-rank split whose rank 0 is on `device`: the CPU for
/// every rank, or the GPUs from `device`'s on.
fn rank_devices(device: &Device, world: usize) -> Result<Vec<Device>> {
    match device {
        Device::Cpu => Ok(vec![Device::Cpu; world]),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            let first = dev.cuda_stream().context().ordinal();
            let count = candle_core::cuda_backend::cudarc::driver::CudaContext::device_count()
                .map_err(|e| Error::invalid(format!("counting GPUs: {e}")))?
                as usize;
            if first + world > count {
                return Err(Error::invalid(format!(
                    "tensor_parallel = {world} needs GPUs {first}..{}; this machine has {count}",
                    first + world - 1
                )));
            }
            let mut devices = vec![device.clone()];
            for ordinal in first + 1..first + world {
                devices.push(crate::nn::open_cuda(ordinal)?);
            }
            Ok(devices)
        }
        other => Err(Error::invalid(format!(
            "tensor_parallel runs on the CPU or on CUDA GPUs, not on {:?}",
            other.location()
        ))),
    }
}

/// What a checkpoint directory loads into: architecture, spec, weights, end-of-sequence ids.
fn directory_parts(
    dir: &Path,
    opts: &LoadOptions,
) -> Result<(String, DecoderSpec, Weights, Vec<u32>)> {
    let cfg = HfConfig::read(&dir.join("config.json"))?;
    let (arch, mut spec, text_cfg) = arch_spec(&cfg)?;
    if opts.random_weights {
        let dtype = resolve_dtype(opts, None, &text_cfg)?;
        let eos = eos_token_ids(dir, &cfg, &text_cfg)?;
        return Ok((arch, spec, Weights::random(&opts.device, dtype), eos));
    }
    let weights = Weights::open(dir, &opts.device, DType::F32)?;
    if arch == "gemma3" {
        spec.prefix = multimodal_prefix(dir, &weights)?;
    }
    let stored = weights.stored_dtype(&format!("{}embed_tokens.weight", spec.prefix));
    let dtype = resolve_dtype(opts, stored, &text_cfg)?;
    let eos = eos_token_ids(dir, &cfg, &text_cfg)?;
    Ok((arch, spec, weights.with_dtype(dtype), eos))
}

/// What a GGUF file loads into. Its norms already hold Gemma's `+ 1`; q and k rows of a
/// `llama`-architecture file are put back in transformers' order (see [`GgufTensors`]). The
/// end-of-sequence ids are the metadata's EOS and end-of-turn tokens.
fn gguf_parts(path: &Path, opts: &LoadOptions) -> Result<(String, DecoderSpec, Weights, Vec<u32>)> {
    let file = GgufFile::open(path)?;
    let cfg = gguf::hf_config(&file)?;
    let (arch, mut spec, text_cfg) = arch_spec(&cfg)?;
    spec.norm_plus_one = false;
    let unpermute = (file.str("general.architecture")? == Some("llama"))
        .then_some((spec.heads.num_heads, spec.heads.num_kv_heads));
    let mut eos = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = file.u64(key)? {
            let id = u32::try_from(id).map_err(|_| file.key_error(key, "too large"))?;
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let dtype = resolve_dtype(opts, None, &text_cfg)?;
    let tensors = GgufTensors::new(file, unpermute, &spec.prefix);
    Ok((
        arch,
        spec,
        Weights::from_gguf(tensors, &opts.device, dtype).keeping_quantized(opts.quantized),
        eos,
    ))
}

/// The decoder a config describes, for inspection or for building a variant by hand (the
/// tensor prefix of a multimodal Gemma 3 is only settled by [`Model::load`]).
pub fn decoder_spec(cfg: &HfConfig) -> Result<DecoderSpec> {
    Ok(arch_spec(cfg)?.1)
}

/// The architecture named by `model_type`, its decoder spec, and the config object the text
/// model reads (the nested `text_config` of a multimodal Gemma 3).
fn arch_spec(cfg: &HfConfig) -> Result<(String, DecoderSpec, HfConfig)> {
    let model_type = cfg
        .str("model_type")?
        .ok_or_else(|| cfg.error("model_type", "missing"))?
        .to_string();
    let spec = match model_type.as_str() {
        "llama" => llama::spec(cfg)?,
        "mistral" => mistral::spec(cfg)?,
        "qwen2" => qwen2::spec(cfg)?,
        "qwen3" => qwen3::spec(cfg)?,
        "gemma3_text" => gemma3::spec(cfg)?,
        "gemma3" => {
            let text = cfg.nested("text_config")?.ok_or_else(|| {
                cfg.error(
                    "text_config",
                    "missing (a multimodal gemma3 config nests the text model there)",
                )
            })?;
            return Ok((model_type, gemma3::spec(&text)?, text));
        }
        other => {
            return Err(cfg.error(
                "model_type",
                format!(
                    "unsupported model type `{other}` (supported: {})",
                    SUPPORTED_MODEL_TYPES.join(", ")
                ),
            ))
        }
    };
    Ok((model_type, spec, cfg.clone()))
}

/// Where a multimodal Gemma 3 checkpoint keeps its text decoder.
fn multimodal_prefix(dir: &Path, weights: &Weights) -> Result<String> {
    const CANDIDATES: [&str; 3] = ["language_model.model.", "model.language_model.", "model."];
    CANDIDATES
        .iter()
        .find(|p| weights.contains(&format!("{p}embed_tokens.weight")))
        .map(|p| p.to_string())
        .ok_or_else(|| {
            Error::invalid(format!(
                "{}: multimodal gemma3 checkpoint without a text decoder: none of {} found",
                dir.display(),
                CANDIDATES
                    .map(|p| format!("`{p}embed_tokens.weight`"))
                    .join(", ")
            ))
        })
}

/// The compute dtype: `Auto` is f32 on the CPU, else the stored dtype of the embedding
/// (falling back to the config's `dtype`/`torch_dtype`). Refused when the device cannot
/// multiply matrices of that dtype.
fn resolve_dtype(opts: &LoadOptions, stored: Option<DType>, cfg: &HfConfig) -> Result<DType> {
    let dtype = match opts.dtype {
        DTypeChoice::F32 => DType::F32,
        DTypeChoice::BF16 => DType::BF16,
        DTypeChoice::F16 => DType::F16,
        DTypeChoice::Auto if opts.device.is_cpu() => DType::F32,
        DTypeChoice::Auto => match stored {
            Some(dt @ (DType::F32 | DType::BF16 | DType::F16)) => dt,
            _ => config_dtype(cfg)?.unwrap_or(DType::F32),
        },
    };
    let probe = || -> candle_core::Result<Tensor> {
        let a = Tensor::ones((2, 2), dtype, &opts.device)?;
        a.matmul(&a)
    };
    probe().map_err(|e| {
        Error::invalid(format!(
            "dtype {dtype:?} cannot run on {:?}: {e}",
            opts.device.location()
        ))
    })?;
    Ok(dtype)
}

/// `dtype` (5.x) or `torch_dtype` (4.x), when it names a float type.
fn config_dtype(cfg: &HfConfig) -> Result<Option<DType>> {
    let name = match cfg.str("dtype")? {
        Some(name) => Some(name),
        None => cfg.str("torch_dtype")?,
    };
    Ok(match name {
        Some("bfloat16") => Some(DType::BF16),
        Some("float16") => Some(DType::F16),
        Some("float32") => Some(DType::F32),
        _ => None,
    })
}

/// End-of-sequence ids: `eos_token_id` of `config.json` (top level and the text config) and of
/// `generation_config.json` when present, each an int or a list; their union, in order.
fn eos_token_ids(dir: &Path, cfg: &HfConfig, text_cfg: &HfConfig) -> Result<Vec<u32>> {
    let mut ids = cfg.token_ids("eos_token_id")?;
    ids.extend(text_cfg.token_ids("eos_token_id")?);
    let generation = dir.join("generation_config.json");
    if generation.is_file() {
        ids.extend(HfConfig::read(&generation)?.token_ids("eos_token_id")?);
    }
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    Ok(ids)
}

/// The tokenizer of the checkpoint at `path`: a GGUF file's own (from its metadata), else
/// `path/tokenizer.json`; errors name the file.
pub fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer> {
    if crate::gguf::is_gguf(path) {
        return crate::gguf::tokenizer::from_gguf(&GgufFile::open(path)?);
    }
    let path = path.join("tokenizer.json");
    if !path.is_file() {
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json not found");
        return Err(Error::io(path, e));
    }
    tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))
}
