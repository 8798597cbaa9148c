//! Loading what a config names: the device, the target and draft models (with the check that
//! a draft shares the target's vocabulary), the tokenizer.
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use tokenizers::Tokenizer;

use super::config::{DeviceChoice, DtypeChoice};
use crate::cache::{ModelCache, RotatingStrategy};
use crate::error::{Error, Result};
use crate::models::{load_tokenizer, DTypeChoice, LoadOptions, Model};
use crate::nn::{DeviceTokens, StepIds};
use crate::speculative::LanguageModel;

/// The device `choice` names (CUDA: GPU `gpu`, the target's rank 0's); an explicit GPU that
/// is not available is an error, `auto` takes the first of CUDA, Metal and the CPU that works.
pub fn select_device(choice: DeviceChoice, gpu: usize) -> Result<Device> {
    let unavailable = |name: &str, feature: &str, e: candle_core::Error| {
        Error::invalid(format!(
            "device = \"{name}\": not available ({e}); build with `--features {feature}` on a machine that has one, or use device = \"cpu\""
        ))
    };
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda => crate::nn::open_cuda(gpu).map_err(|e| unavailable("cuda", "cuda", e)),
        DeviceChoice::Metal => Device::new_metal(0).map_err(|e| unavailable("metal", "metal", e)),
        // `*_is_available` only says the backend was compiled in; a build with CUDA on a
        // machine without a GPU falls back to the CPU.
        DeviceChoice::Auto => Ok(candle_core::utils::cuda_is_available()
            .then(|| crate::nn::open_cuda(gpu).ok())
            .flatten()
            .or_else(|| {
                candle_core::utils::metal_is_available()
                    .then(|| Device::new_metal(0).ok())
                    .flatten()
            })
            .unwrap_or(Device::Cpu)),
    }
}

/// Where a run's models go: the target's ranks and each draft model on CUDA GPUs named by
/// the config (`target.gpus`, `drafters.<name>.gpu`), else everything on the run's device.
/// Each GPU is opened once, so models sharing a GPU share its one stream: a draft beside a
/// rank other than 0 queues its work where that rank does, and the drafts it hands to rank
/// 0's GPU are copied after that work (a copy between two streams of one GPU would not
/// wait).
pub struct Placement {
    device: Device,
    gpus: std::collections::BTreeMap<usize, Device>,
}

impl Placement {
    /// Placement on the run's `device` (its GPU, if CUDA, is the first opened).
    pub fn new(device: Device) -> Self {
        let mut gpus = std::collections::BTreeMap::new();
        if let Some(ordinal) = crate::nn::cuda_ordinal(&device) {
            gpus.insert(ordinal, device.clone());
        }
        Self { device, gpus }
    }

    /// GPU `ordinal`, opened once; `key` (the config key naming it) heads the errors.
    fn gpu(&mut self, ordinal: usize, key: &str) -> Result<Device> {
        if crate::nn::cuda_ordinal(&self.device).is_none() {
            return Err(Error::invalid(format!(
                "{key}: names CUDA GPU {ordinal}; this run's device is {:?}",
                self.device.location()
            )));
        }
        if let Some(d) = self.gpus.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = crate::nn::open_cuda(ordinal).map_err(|e| {
            Error::invalid(format!("{key}: CUDA GPU {ordinal} cannot be opened: {e}"))
        })?;
        self.gpus.insert(ordinal, d.clone());
        Ok(d)
    }

    /// The device of each of the target's `config.tensor_parallel` ranks, rank 0 first:
    /// `config.gpus`, or the run's device and (CUDA) the GPUs after it.
    pub fn target(&mut self, config: &super::config::TargetConfig) -> Result<Vec<Device>> {
        let n = config.tensor_parallel;
        if let Some(gpus) = &config.gpus {
            return gpus
                .iter()
                .map(|&g| self.gpu(g, &format!("target.gpus = {gpus:?}")))
                .collect();
        }
        match crate::nn::cuda_ordinal(&self.device) {
            Some(first) => (first..first + n)
                .map(|g| self.gpu(g, &format!("target.tensor_parallel = {n}")))
                .collect(),
            None => Ok(vec![self.device.clone(); n]),
        }
    }

    /// Draft `name`'s device: its `gpu`, else `beside` (the target's rank 0's).
    pub fn draft(&mut self, name: &str, gpu: Option<usize>, beside: &Device) -> Result<Device> {
        match gpu {
            Some(g) => self.gpu(g, &format!("drafters.{name}.gpu = {g}")),
            None => Ok(beside.clone()),
        }
    }
}

/// The loader's dtype for the config's.
pub fn load_options(device: Device, dtype: DtypeChoice) -> LoadOptions {
    let dtype = match dtype {
        DtypeChoice::Auto => DTypeChoice::Auto,
        DtypeChoice::F32 => DTypeChoice::F32,
        DtypeChoice::Bf16 => DTypeChoice::BF16,
        DtypeChoice::F16 => DTypeChoice::F16,
    };
    LoadOptions {
        device,
        dtype,
        quantized: false,
        ..Default::default()
    }
}

/// A loaded model whose logits may be cut to the first `vocab` ids: checkpoints of one family
/// pad their embeddings to different sizes (Qwen2.5 0.5B: 151936 rows, 7B: 152064) though
/// their tokenizers are identical; the ids past the tokenizer are never produced by it, and
/// target and draft must score the same ids for verification.
pub struct LoadedModel {
    /// The model.
    pub model: Model,
    /// The directory it came from.
    pub dir: PathBuf,
    vocab: Option<usize>,
}

impl LoadedModel {
    /// Loads the checkpoint in `dir`; errors name the directory.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let model = Model::load(dir, opts)
            .map_err(|e| Error::invalid(format!("loading {}: {e}", dir.display())))?;
        Ok(Self {
            model,
            dir: dir.to_path_buf(),
            vocab: None,
        })
    }

    /// Cuts the logits to the first `vocab` ids (no-op when the model has exactly that many).
    pub fn limit_vocab(&mut self, vocab: usize) {
        self.vocab = (vocab < self.model.info().vocab_size).then_some(vocab);
    }
}

impl LoadedModel {
    /// Logits cut to the vocabulary width shared with the other models.
    fn shared_width(&self, logits: Tensor) -> Result<Tensor> {
        match self.vocab {
            Some(v) => Ok(logits.narrow(1, 0, v)?),
            None => Ok(logits),
        }
    }
}

impl LanguageModel for LoadedModel {
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.shared_width(self.model.forward(tokens, cache)?)
    }

    fn forward_last(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.shared_width(self.model.forward_last(tokens, cache)?)
    }

    // Device ids stay where they are (the trait's defaults would read them back: a device →
    // host round trip per greedy draft).
    fn forward_last_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.shared_width(self.model.forward_last_device(ids, cache)?)
    }

    fn forward_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.shared_width(self.model.forward_device(ids, cache)?)
    }

    // The model's own argmax only where no width is cut: over a shared vocabulary the argmax
    // must range over the kept columns alone.
    fn forward_argmax(
        &self,
        ids: StepIds<'_>,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<DeviceTokens> {
        if self.vocab.is_some() {
            return crate::speculative::argmax_of_logits(self, ids, cache, last);
        }
        self.model.forward_argmax(ids, cache, last)
    }

    fn new_cache(&self, strategy: RotatingStrategy) -> Result<ModelCache> {
        self.model.new_cache(strategy)
    }

    fn vocab_size(&self) -> usize {
        self.vocab.unwrap_or(self.model.info().vocab_size)
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.model.info().eos_token_ids
    }
}

/// Checks that `draft` shares the target's vocabulary: when the draft ships a tokenizer
/// (tokenizer.json, or a GGUF file's own),
/// both tokenizers must have the same size and token → id map (output sizes may then differ
/// by embedding padding, see [`align_vocabularies`]); without one, the output sizes must be
/// equal. `name` is the drafter's config name.
pub fn check_vocabulary(
    name: &str,
    target: (&LoadedModel, &Tokenizer),
    draft: &LoadedModel,
) -> Result<()> {
    let (target, target_tok) = target;
    let tokenizer_file = |dir: &Path| match crate::gguf::is_gguf(dir) {
        true => dir.to_path_buf(),
        false => dir.join("tokenizer.json"),
    };
    let target_file = tokenizer_file(&target.dir);
    let draft_file = tokenizer_file(&draft.dir);
    let (tv, dv) = (
        target.model.info().vocab_size,
        draft.model.info().vocab_size,
    );
    if draft_file.is_file() {
        let draft_tok = load_tokenizer(&draft.dir)?;
        if let Some(why) = tokenizer_difference(target_tok, &draft_tok) {
            return Err(Error::invalid(format!(
                "drafters.{name}: the draft's vocabulary differs from the target's ({why}): {} has {} tokens, {} has {} tokens (model vocab_size: draft {dv}, target {tv})",
                draft_file.display(),
                draft_tok.get_vocab_size(true),
                target_file.display(),
                target_tok.get_vocab_size(true),
            )));
        }
    } else if tv != dv {
        return Err(Error::invalid(format!(
            "drafters.{name}: the draft's vocabulary size {dv} ({}) differs from the target's {tv} ({}), and the draft has no tokenizer.json to show they share tokens",
            draft.dir.display(),
            target.dir.display(),
        )));
    }
    Ok(())
}

/// Why two tokenizers differ, or `None` when their vocabularies are identical.
fn tokenizer_difference(a: &Tokenizer, b: &Tokenizer) -> Option<String> {
    if a.get_vocab_size(true) != b.get_vocab_size(true) {
        return Some("different sizes".into());
    }
    let (va, vb) = (a.get_vocab(true), b.get_vocab(true));
    let mut diffs: Vec<(&String, &u32)> =
        va.iter().filter(|(t, id)| vb.get(*t) != Some(id)).collect();
    diffs.sort_by_key(|(_, id)| **id);
    diffs.first().map(|(token, id)| {
        let other = b.id_to_token(**id).unwrap_or_default();
        format!("token id {id} is {token:?} for the target but {other:?} for the draft")
    })
}

/// The shared output width of `models` (the smallest), applied to every model whose width is
/// larger; returns it. Only call after [`check_vocabulary`] accepted every draft.
pub fn align_vocabularies(models: &mut [&mut LoadedModel]) -> Option<usize> {
    let widths: Vec<usize> = models.iter().map(|m| m.model.info().vocab_size).collect();
    let min = *widths.iter().min()?;
    if widths.iter().all(|&w| w == min) {
        return None;
    }
    for m in models.iter_mut() {
        m.limit_vocab(min);
    }
    Some(min)
}
