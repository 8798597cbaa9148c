//! Checkpoint tensors: memory-mapped safetensors (one file or shards listed in an index), or
//! a GGUF file's tensors dequantized on load.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::shard::Cut;
use crate::error::{Error, Result};
use crate::gguf::GgufTensors;

/// The single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint (`{"weight_map": {tensor: shard file}}`).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The tensors of a checkpoint, looked up by Hugging Face name (across shards) and converted
/// on load to one compute `dtype` on one `device`.
pub struct Weights {
    /// Each shard's path and mapping (empty for a GGUF file).
    files: Vec<(PathBuf, MmapedSafetensors)>,
    /// Tensor name -> index into `files`.
    index: HashMap<String, usize>,
    /// The GGUF file the tensors come from instead of `files`.
    gguf: Option<GgufTensors>,
    /// Keep a GGUF file's block-quantized matrices quantized ([`Weights::quantized_part`]).
    keep_quantized: bool,
    /// Random weights of every shape asked, no file behind them ([`Weights::random`]).
    random: bool,
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
            gguf: None,
            keep_quantized: false,
            random: false,
            device: device.clone(),
            dtype,
        })
    }

    /// Random weights for speed measurements at a published shape without its checkpoint
    /// (a config alone): every matrix drawn from N(0, 0.02²) on the device, seeded by its name
    /// (and part), so every load draws the same weights and every rank the same copy of a
    /// replicated tensor; every vector (norm weights, biases) ones. Only the parts a rank asks
    /// for are drawn, so a model larger than one device's memory can be built shard by shard.
    pub fn random(device: &Device, dtype: DType) -> Self {
        Self {
            files: Vec::new(),
            index: HashMap::new(),
            gguf: None,
            keep_quantized: false,
            random: true,
            device: device.clone(),
            dtype,
        }
    }

    /// The tensors of a GGUF file, dequantized to f32 on load and then converted to `dtype`.
    pub fn from_gguf(tensors: GgufTensors, device: &Device, dtype: DType) -> Self {
        Self {
            files: Vec::new(),
            index: HashMap::new(),
            gguf: Some(tensors),
            keep_quantized: false,
            random: false,
            device: device.clone(),
            dtype,
        }
    }

    /// The same tensors with a GGUF file's block-quantized matrices kept quantized.
    pub fn keeping_quantized(self, keep: bool) -> Self {
        Self {
            keep_quantized: keep,
            ..self
        }
    }

    /// Matrix `name` (`[out, in]`, checked) as a quantized row block whose outputs take
    /// `scale`, when quantized weights are kept and the file stores it in a block-quantized
    /// type; `None` sends the caller to the dense path.
    pub fn quantized_part(
        &self,
        name: &str,
        shape: &[usize],
        scale: f64,
    ) -> Result<Option<super::linear::QuantizedPart>> {
        let Some(gguf) = self.gguf.as_ref().filter(|_| self.keep_quantized) else {
            return Ok(None);
        };
        use candle_core::quantized::GgmlDType;
        match gguf.stored_type(name) {
            None | Some(GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) => Ok(None),
            Some(_) => {
                let q = gguf.qtensor(name, shape, &self.device)?;
                Ok(Some(super::linear::QuantizedPart {
                    matrix: candle_core::quantized::QMatMul::from_qtensor(q)?,
                    rows: shape[0],
                    scale,
                }))
            }
        }
    }

    /// The GGUF file the tensors come from, if they do.
    pub fn gguf(&self) -> Option<&GgufTensors> {
        self.gguf.as_ref()
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
        if self.random {
            return true;
        }
        match &self.gguf {
            Some(g) => g.contains(name),
            None => self.index.contains_key(name),
        }
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
        self.get_part(name, shape, 1.0, None)
    }

    /// [`Weights::get_scaled`] of the part `cut` of tensor `name` (its whole `shape` checked):
    /// what one rank of a tensor-parallel model loads. `None` loads it whole.
    pub fn get_part(
        &self,
        name: &str,
        shape: &[usize],
        scale: f64,
        cut: Option<Cut>,
    ) -> Result<Tensor> {
        if scale != 1.0 {
            return self.get_mapped_part(name, shape, cut, |t| t * scale);
        }
        let tensor = self.load(name, shape, self.dtype, cut)?;
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
        self.get_mapped_part(name, shape, None, map)
    }

    /// [`Weights::get_mapped`] of the part `cut` (see [`Weights::get_part`]).
    pub fn get_mapped_part(
        &self,
        name: &str,
        shape: &[usize],
        cut: Option<Cut>,
        map: impl FnOnce(Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<Tensor> {
        let tensor = self
            .load(name, shape, DType::F32, cut)?
            .to_dtype(DType::F32)?;
        Ok(map(tensor)?.to_dtype(self.dtype)?)
    }

    /// [`Weights::get`] times `scale` (applied in f32 when it is not 1).
    pub fn get_scaled(&self, name: &str, shape: &[usize], scale: f64) -> Result<Tensor> {
        self.get_part(name, shape, scale, None)
    }

    /// Tensors `parts` (`(name, shape, scale, rows)`, all with the same trailing dimensions),
    /// each cut to its `rows` (a tensor-parallel rank's part; `None`: whole), stacked
    /// along dim 0, each multiplied by its scale, in the compute dtype: how fused projections
    /// (q/k/v, gate/up) are loaded. For f32 on the CPU every part is converted straight from
    /// the mapping into one buffer (one pass, no per-part tensor, no concatenation copy);
    /// otherwise the parts are loaded and concatenated.
    pub fn get_stacked(&self, parts: &[(&str, &[usize], f64, Option<Cut>)]) -> Result<Tensor> {
        let Some(&(_, first, _, _)) = parts.first() else {
            return Err(Error::invalid("no tensors to stack"));
        };
        for &(name, part_shape, _, _) in parts {
            if part_shape[1..] != first[1..] {
                return Err(Error::invalid(format!(
                    "tensor `{name}`: shape {part_shape:?} cannot be stacked with {first:?}"
                )));
            }
        }
        if !(self.device.is_cpu() && self.dtype == DType::F32 && self.gguf.is_none()) || self.random
        {
            let loaded = parts
                .iter()
                .map(|&(name, shape, scale, rows)| self.get_part(name, shape, scale, rows))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Tensor::cat(&loaded, 0)?);
        }
        let mut shape = first.to_vec();
        shape[0] = parts
            .iter()
            .map(|(_, s, _, rows)| rows.map_or(s[0], |c| c.len))
            .sum();
        let mut values: Vec<f32> = Vec::with_capacity(shape.iter().product());
        for &(name, part_shape, scale, rows) in parts {
            check_cut(name, part_shape, rows)?;
            self.with_bytes(name, part_shape, |_, data, stored| {
                let data = cut_bytes(data, part_shape, stored.size_in_bytes(), rows);
                extend_f32(&mut values, &data.0, stored, scale as f32);
                Ok(())
            })?;
        }
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
    }

    /// Calls `f` with the file, the mapped bytes and the stored dtype of tensor `name`, checked
    /// to have `shape` and a supported dtype.
    fn with_bytes<R>(
        &self,
        name: &str,
        shape: &[usize],
        f: impl FnOnce(&Path, &[u8], DType) -> Result<R>,
    ) -> Result<R> {
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
        f(path, view.data(), stored)
    }

    /// Tensor `name` (checked to have `shape`), or its part `cut`, on the device: widened
    /// straight to f32 on the CPU when `want` is f32, else in its stored dtype.
    fn load(&self, name: &str, shape: &[usize], want: DType, cut: Option<Cut>) -> Result<Tensor> {
        check_cut(name, shape, cut)?;
        if self.random {
            let (kept, _) = cut_shape(shape, cut);
            if kept.len() == 1 {
                return Ok(Tensor::ones(kept, DType::F32, &self.device)?);
            }
            return random_normal(&kept, seed_of(name, cut), &self.device);
        }
        if let Some(gguf) = &self.gguf {
            let mut t = gguf.dequantize(name, shape)?;
            if let Some(c) = cut {
                t = t.narrow(c.dim, c.start, c.len)?.contiguous()?;
            }
            return Ok(t.to_device(&self.device)?);
        }
        self.with_bytes(name, shape, |path, data, stored| {
            let bad = |e: candle_core::Error| {
                Error::invalid(format!("{}: tensor `{name}`: {e}", path.display()))
            };
            let (data, shape) = cut_bytes(data, shape, stored.size_in_bytes(), cut);
            if self.device.is_cpu() && want == DType::F32 && stored != DType::F32 {
                return widen_to_f32(&data, stored, &shape).map_err(bad);
            }
            Tensor::from_raw_buffer(&data, stored, &shape, &self.device).map_err(bad)
        })
    }
}

/// Refuses a part `cut` that does not lie inside a `shape` tensor of at most two dimensions.
fn check_cut(name: &str, shape: &[usize], cut: Option<Cut>) -> Result<()> {
    match cut {
        Some(c) if shape.len() > 2 || c.dim >= shape.len() || c.start + c.len > shape[c.dim] => {
            Err(Error::invalid(format!(
                "tensor `{name}` of shape {shape:?}: cannot take {c:?}"
            )))
        }
        _ => Ok(()),
    }
}

/// A seed for tensor `name` (its part `cut`): the same on every rank and in every run, so the
/// ranks' copies of a replicated tensor agree and runs on random weights repeat (FNV-1a).
fn seed_of(name: &str, cut: Option<Cut>) -> u64 {
    let start = cut.map_or(0, |c| c.start as u64 * 2 + c.dim as u64 + 1);
    name.bytes()
        .chain(start.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// `[shape]` f32 drawn from N(0, 0.02²) by a generator seeded with `seed`: on a GPU its own
/// generator, on the CPU a seeded Box-Muller (candle's CPU generator takes no seed).
fn random_normal(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
    if device.is_cpu() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let values = (0..n)
            .map(|_| {
                let (u, v): (f32, f32) = (1.0 - rng.random::<f32>(), rng.random());
                0.02 * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
            })
            .collect::<Vec<f32>>();
        return Ok(Tensor::from_vec(values, shape, device)?);
    }
    device.set_seed(seed)?;
    Ok(Tensor::randn(0f32, 0.02, shape, device)?)
}

/// The shape of the part `cut` of a `shape` tensor, and the elements in one row of `shape`
/// (its trailing dimension for a matrix, 1 for a vector).
fn cut_shape(shape: &[usize], cut: Option<Cut>) -> (Vec<usize>, usize) {
    let mut kept = shape.to_vec();
    if let Some(c) = cut {
        kept[c.dim] = c.len;
    }
    (kept, shape.get(1).copied().unwrap_or(1))
}

/// The bytes of the part `cut` of a row-major `shape` tensor (`esize`-byte elements, at
/// most two dimensions) and its shape: a row range is a sub-slice of the mapping, a column
/// range gathers each row's part.
fn cut_bytes<'a>(
    data: &'a [u8],
    shape: &[usize],
    esize: usize,
    cut: Option<Cut>,
) -> (std::borrow::Cow<'a, [u8]>, Vec<usize>) {
    let (kept, cols) = cut_shape(shape, cut);
    let row = cols * esize;
    match cut {
        None => (data.into(), kept),
        Some(Cut { dim: 0, start, len }) => (data[start * row..(start + len) * row].into(), kept),
        Some(Cut { start, len, .. }) => {
            let gathered = data
                .chunks_exact(row)
                .flat_map(|r| &r[start * esize..(start + len) * esize])
                .copied()
                .collect::<Vec<u8>>();
            (gathered.into(), kept)
        }
    }
}

/// Converts a half-precision buffer straight from the mapping to an f32 CPU tensor (one pass,
/// no intermediate half tensor).
fn widen_to_f32(data: &[u8], stored: DType, shape: &[usize]) -> candle_core::Result<Tensor> {
    let mut values = Vec::with_capacity(data.len() / stored.size_in_bytes());
    extend_f32(&mut values, data, stored, 1.0);
    Tensor::from_vec(values, shape, &Device::Cpu)
}

/// Appends the little-endian f32, bf16 or f16 values in `data`, times `scale`, as f32.
fn extend_f32(out: &mut Vec<f32>, data: &[u8], stored: DType, scale: f32) {
    match stored {
        DType::BF16 => out.extend(
            data.chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32() * scale),
        ),
        DType::F16 => out.extend(
            data.chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32() * scale),
        ),
        _ => out.extend(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * scale),
        ),
    }
}

/// The distinct shard files named by an index file, resolved next to it.
pub(crate) fn shard_paths(index: &Path) -> Result<Vec<PathBuf>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn max_diff(x: &Tensor, y: &Tensor) -> f32 {
        (x - y)
            .and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>())
            .unwrap()
    }

    /// Random weights repeat per name and part, differ between names and parts, have the
    /// asked standard deviation; vectors are ones.
    #[test]
    fn random_weights_are_seeded_by_name_and_part() {
        let w = Weights::random(&Device::Cpu, DType::F32);
        let a = w.get("a.weight", &[64, 32]).unwrap();
        assert_eq!(max_diff(&a, &w.get("a.weight", &[64, 32]).unwrap()), 0.0);
        assert!(max_diff(&a, &w.get("b.weight", &[64, 32]).unwrap()) > 0.0);
        let std = a.sqr().unwrap().mean_all().unwrap();
        let std = std.to_scalar::<f32>().unwrap().sqrt();
        assert!((std - 0.02).abs() < 0.002, "standard deviation {std}");
        let part = |start| {
            let cut = Cut {
                dim: 1,
                start,
                len: 16,
            };
            w.get_part("a.weight", &[64, 32], 1.0, Some(cut)).unwrap()
        };
        assert_eq!(part(16).dims(), &[64, 16]);
        assert_eq!(max_diff(&part(16), &part(16)), 0.0);
        assert!(max_diff(&part(0), &part(16)) > 0.0);
        let norm = w.get("n.weight", &[8]).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(norm, vec![1.0; 8]);
    }

    /// A rank's part of a stored tensor is the narrow of the whole tensor: row and column
    /// parts of a matrix and a vector's part, stored in bf16 and in f32, loaded as f32 on the
    /// CPU (widened from the cut bytes) and as stored (raw bytes), and stacked.
    #[test]
    fn parts_of_stored_tensors_are_narrows_of_the_whole() {
        let dir = tempfile::tempdir().unwrap();
        let m = Tensor::arange(0f32, 48.0, &Device::Cpu)
            .unwrap()
            .reshape((6, 8))
            .unwrap();
        let v = Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap();
        let tensors = std::collections::HashMap::from([
            ("m16".to_string(), m.to_dtype(DType::BF16).unwrap()),
            ("m32".to_string(), m.clone()),
            ("v16".to_string(), v.to_dtype(DType::BF16).unwrap()),
        ]);
        candle_core::safetensors::save(&tensors, dir.path().join(SINGLE_FILE)).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let w = Weights::open(dir.path(), &Device::Cpu, dtype).unwrap();
            for (name, shape) in [("m16", &[6, 8][..]), ("m32", &[6, 8]), ("v16", &[6])] {
                let whole = w.get(name, shape).unwrap();
                let dims: &[usize] = if shape.len() == 2 { &[0, 1] } else { &[0] };
                for &dim in dims {
                    let cut = Cut {
                        dim,
                        start: 2,
                        len: 2,
                    };
                    let part = w.get_part(name, shape, 1.0, Some(cut)).unwrap();
                    let want = whole.narrow(dim, 2, 2).unwrap();
                    let (part, want) = (
                        part.to_dtype(DType::F32).unwrap(),
                        want.to_dtype(DType::F32).unwrap(),
                    );
                    assert_eq!(max_diff(&part, &want), 0.0, "{name} {dtype:?} {cut:?}");
                }
            }
            let rows = Some(Cut {
                dim: 0,
                start: 4,
                len: 2,
            });
            let stacked = w
                .get_stacked(&[("m32", &[6, 8], 1.0, rows), ("m16", &[6, 8], 2.0, None)])
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let want = Tensor::cat(&[m.narrow(0, 4, 2).unwrap(), (&m * 2.0).unwrap()], 0).unwrap();
            assert_eq!(max_diff(&stacked, &want), 0.0, "stacked {dtype:?}");
        }
    }
}
