//! Memory-mapped safetensors checkpoints: one file or shards listed in an index.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// The single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint (`{"weight_map": {tensor: shard file}}`).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The tensors of a checkpoint, memory-mapped, looked up by name across shards and converted
/// on load to one compute `dtype` on one `device`.
pub struct Weights {
    /// Each shard's path and mapping.
    files: Vec<(PathBuf, MmapedSafetensors)>,
    /// Tensor name -> index into `files`.
    index: HashMap<String, usize>,
    device: Device,
    dtype: DType,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field(
                "files",
                &self.files.iter().map(|f| &f.0).collect::<Vec<_>>(),
            )
            .field("tensors", &self.index.len())
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl Weights {
    /// Maps `dir/model.safetensors`, or else every shard named in
    /// `dir/model.safetensors.index.json`. Tensors load as `dtype` on `device`.
    pub fn open(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let single = dir.join(SINGLE_FILE);
        let paths = if single.is_file() {
            vec![single]
        } else {
            let index = dir.join(INDEX_FILE);
            if !index.is_file() {
                return Err(Error::invalid(format!(
                    "{}: no {SINGLE_FILE} and no {INDEX_FILE}",
                    dir.display()
                )));
            }
            shard_paths(&index)?
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for path in paths {
            if !path.is_file() {
                let e = std::io::Error::new(std::io::ErrorKind::NotFound, "shard not found");
                return Err(Error::io(path, e));
            }
            // SAFETY: the mapping is read-only; a checkpoint modified on disk while a model
            // is loaded is outside what this crate supports (as for every mmap loader).
            let st = unsafe { MmapedSafetensors::new(&path) }
                .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
            for (name, _) in st.tensors() {
                index.insert(name, files.len());
            }
            files.push((path, st));
        }
        Ok(Self {
            files,
            index,
            device: device.clone(),
            dtype,
        })
    }

    /// The same checkpoint with tensors converted to `dtype`.
    pub fn with_dtype(self, dtype: DType) -> Self {
        Self { dtype, ..self }
    }

    /// The compute dtype tensors are converted to.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device tensors are loaded onto.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// True when the checkpoint holds tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The stored dtype of tensor `name`, when present and of a type candle knows.
    pub fn stored_dtype(&self, name: &str) -> Option<DType> {
        let (_, st) = self.locate(name).ok()?;
        DType::try_from(st.get(name).ok()?.dtype()).ok()
    }

    /// The file holding tensor `name` and its mapping.
    fn locate(&self, name: &str) -> Result<(&Path, &MmapedSafetensors)> {
        let &i = self.index.get(name).ok_or_else(|| self.missing(name))?;
        let (path, st) = &self.files[i];
        Ok((path, st))
    }

    fn missing(&self, name: &str) -> Error {
        let files: Vec<String> = self
            .files
            .iter()
            .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let dir = self.files.first().and_then(|(p, _)| p.parent());
        Error::invalid(format!(
            "{}: tensor `{name}` not found in {}",
            dir.map_or_else(String::new, |d| d.display().to_string()),
            files.join(", ")
        ))
    }

    /// Loads tensor `name`, checking that its shape is `shape`, converted to the compute
    /// dtype on the device. Errors name the file, the tensor and both shapes.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let tensor = self.load(name, shape, self.dtype)?;
        Ok(tensor.to_dtype(self.dtype)?)
    }

    /// Like [`Weights::get`], with `map` applied in f32 before the cast to the compute dtype
    /// (folding a scale into a weight loses no precision that way).
    pub fn get_mapped(
        &self,
        name: &str,
        shape: &[usize],
        map: impl FnOnce(Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<Tensor> {
        let tensor = self.load(name, shape, DType::F32)?.to_dtype(DType::F32)?;
        Ok(map(tensor)?.to_dtype(self.dtype)?)
    }

    /// Tensor `name` on the device: widened straight to f32 on the CPU when `want` is f32,
    /// else in its stored dtype.
    fn load(&self, name: &str, shape: &[usize], want: DType) -> Result<Tensor> {
        let (path, st) = self.locate(name)?;
        let bad = |e: candle_core::Error| {
            Error::invalid(format!("{}: tensor `{name}`: {e}", path.display()))
        };
        let view = st.get(name).map_err(bad)?;
        if view.shape() != shape {
            return Err(Error::invalid(format!(
                "{}: tensor `{name}` has shape {:?}, expected {shape:?}",
                path.display(),
                view.shape()
            )));
        }
        let stored = DType::try_from(view.dtype()).map_err(bad)?;
        if !matches!(stored, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::invalid(format!(
                "{}: tensor `{name}` is stored as {stored:?}; only f32, bf16 and f16 are supported",
                path.display()
            )));
        }
        if self.device.is_cpu() && want == DType::F32 && stored != DType::F32 {
            return widen_to_f32(view.data(), stored, shape).map_err(bad);
        }
        view.load(&self.device).map_err(bad)
    }
}

/// Converts a half-precision buffer straight from the mapping to an f32 CPU tensor (one pass,
/// no intermediate half tensor).
fn widen_to_f32(data: &[u8], stored: DType, shape: &[usize]) -> candle_core::Result<Tensor> {
    let halves = data
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]));
    let values: Vec<f32> = match stored {
        DType::BF16 => halves.map(|h| half::bf16::from_bits(h).to_f32()).collect(),
        _ => halves.map(|h| half::f16::from_bits(h).to_f32()).collect(),
    };
    Tensor::from_vec(values, shape, &Device::Cpu)
}

/// The distinct shard files named by an index file, resolved next to it.
fn shard_paths(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::invalid(format!("{}: bad JSON: {e}", index.display())))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| {
            Error::invalid(format!(
                "{}: key `weight_map` missing or not an object",
                index.display()
            ))
        })?;
    let mut shards = BTreeSet::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::invalid(format!(
                "{}: `weight_map.{tensor}` is not a file name",
                index.display()
            ))
        })?;
        shards.insert(file.to_string());
    }
    let dir = index.parent().unwrap_or(Path::new("."));
    Ok(shards.into_iter().map(|f| dir.join(f)).collect())
}
