//! The GGUF container (versions 2 and 3): header, metadata, tensor table and data section,
//! read from a memory map with every length and offset checked against the file's size
//! before anything is allocated or sliced. A damaged file gives an [`Error`] naming the file,
//! the byte offset and what was wrong there; nothing in this reader panics on any input.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's limit on a tensor's rank.
const MAX_DIMS: u32 = 4;
/// Nesting of arrays in metadata deeper than this is refused (GGUF writers emit depth 1).
const MAX_ARRAY_DEPTH: u32 = 2;
/// `general.alignment` when the file does not set it.
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float when it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, when the value is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The type's name as GGUF spells it, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F32(_) => "float32",
            Value::F64(_) => "float64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One entry of the tensor table: where a tensor's bytes lie and how to read them.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Dimensions in PyTorch order (outermost first): GGUF stores them innermost first.
    pub shape: Vec<usize>,
    /// The storage type.
    pub dtype: GgmlDType,
    /// Byte range inside the file (data section offset already added).
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
}

/// A parsed GGUF file: metadata, tensor table and the mapping the tensors are read from.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    metadata: HashMap<String, Value>,
    tensors: HashMap<String, TensorInfo>,
    version: u32,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses `path`. The whole header, metadata and tensor table are validated
    /// here; tensor bytes are only sliced, never copied, until [`GgufFile::tensor_bytes`].
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only; a file modified on disk while it is mapped is
        // outside what this crate supports (as for every mmap loader, candle's included).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let parsed = parse(&map).map_err(|e| {
            Error::invalid(format!(
                "{}: not a readable GGUF file: {} at byte {}",
                path.display(),
                e.what,
                e.offset
            ))
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            version: parsed.version,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata value `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Every metadata key.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.metadata.keys().map(String::as_str)
    }

    /// The tensor table entry of `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// Every tensor's name and table entry.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &TensorInfo)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The stored bytes of tensor `info` (bounds checked when the table was read).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.start..info.start + info.len]
    }

    /// An error about `key` of this file.
    pub fn key_error(&self, key: &str, what: impl std::fmt::Display) -> Error {
        Error::invalid(format!("{}: metadata `{key}`: {what}", self.path.display()))
    }

    /// Metadata `key` as an unsigned integer; `None` when absent, an error when another type.
    pub fn u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, Value::as_u64, "a non-negative integer")
    }

    /// Metadata `key` as a float; `None` when absent, an error when another type.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, Value::as_f64, "a number")
    }

    /// Metadata `key` as a string; `None` when absent, an error when another type.
    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, Value::as_str, "a string")
    }

    /// Metadata `key` as an array; `None` when absent, an error when another type.
    pub fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        self.typed(key, Value::as_array, "an array")
    }

    /// Metadata `key` as a bool; `None` when absent, an error when another type.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(
            key,
            |v| match v {
                Value::Bool(b) => Some(*b),
                _ => None,
            },
            "a bool",
        )
    }

    /// Metadata `key`, required.
    pub fn require<T>(&self, key: &str, got: Result<Option<T>>) -> Result<T> {
        got?.ok_or_else(|| self.key_error(key, "missing"))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        cast: impl FnOnce(&'a Value) -> Option<T>,
        want: &str,
    ) -> Result<Option<T>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => cast(v).map(Some).ok_or_else(|| {
                self.key_error(key, format!("expected {want}, found {}", v.type_name()))
            }),
        }
    }
}

/// What went wrong where, before the file name is attached.
#[derive(Debug)]
struct ParseError {
    offset: usize,
    what: String,
}

struct Parsed {
    version: u32,
    metadata: HashMap<String, Value>,
    tensors: HashMap<String, TensorInfo>,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn fail<T>(&self, what: impl Into<String>) -> std::result::Result<T, ParseError> {
        Err(ParseError {
            offset: self.pos,
            what: what.into(),
        })
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], ParseError> {
        if n > self.remaining() {
            return self.fail(format!(
                "file ends inside {what} ({n} bytes wanted, {} left)",
                self.remaining()
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], ParseError> {
        let b = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count or length, checked to fit `usize` and to be at most `remaining / min_size`
    /// (each counted item takes at least `min_size` bytes), so no allocation can exceed
    /// the file's own size.
    fn count(&mut self, what: &str, min_size: usize) -> std::result::Result<usize, ParseError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let limit = (self.remaining() / min_size.max(1)) as u64;
        if n > limit {
            self.pos = at;
            return self.fail(format!(
                "{what} {n} exceeds what the rest of the file can hold ({limit})"
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> std::result::Result<String, ParseError> {
        let len = self.count(&format!("length of {what}"), 1)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(ParseError {
                offset: at,
                what: format!("{what} is not UTF-8"),
            }),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> std::result::Result<Value, ParseError> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(key)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(key)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    self.pos -= 1;
                    return self.fail(format!(
                        "metadata `{key}`: bool byte {b} is neither 0 nor 1"
                    ));
                }
            },
            8 => Value::String(self.string(&format!("metadata `{key}`"))?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return self.fail(format!("metadata `{key}`: arrays nested too deeply"));
                }
                let elem = self.u32(&format!("element type of `{key}`"))?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    t => return self.fail(format!("metadata `{key}`: unknown element type {t}")),
                };
                let n = self.count(&format!("element count of `{key}`"), min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            t => return self.fail(format!("metadata `{key}`: unknown value type {t}")),
        })
    }
}

/// The storage type with GGML id `id`, or an error naming what the id is.
fn dtype_of(id: u32) -> std::result::Result<GgmlDType, String> {
    Ok(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        other => return Err(ggml_type_name(other)),
    })
}

/// ggml's name for a type id candle cannot read (ggml.h's `ggml_type`).
fn ggml_type_name(id: u32) -> String {
    let name = match id {
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        31..=33 => "Q4_0_4_4/Q4_0_4_8/Q4_0_8_8 (removed from ggml)",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("unknown ggml type {id}"),
    };
    format!("ggml type {name} (id {id})")
}

fn parse(bytes: &[u8]) -> std::result::Result<Parsed, ParseError> {
    let mut c = Cursor { bytes, pos: 0 };
    if c.take(4, "the magic number")? != MAGIC {
        c.pos = 0;
        return c.fail("no `GGUF` magic number (not a GGUF file)");
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        c.pos -= 4;
        return c.fail(format!(
            "unsupported GGUF version {version} (2 and 3 are read)"
        ));
    }
    // A tensor entry takes at least 8 (name length) + 4 (rank) + 4 (type) + 8 (offset) bytes,
    // a metadata entry 8 (key length) + 4 (type) + 1 (smallest value).
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata count", 13)?;
    let mut metadata = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = c.string("a metadata key")?;
        let ty = c.u32(&format!("type of `{key}`"))?;
        let value = c.value(ty, &key, 0)?;
        metadata.insert(key, value);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return c.fail(format!("`general.alignment` {v:?} is not a power of two")),
        },
    };
    let mut table = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let at = c.pos;
        let name = c.string("a tensor name")?;
        let rank = c.u32(&format!("rank of `{name}`"))?;
        if rank == 0 || rank > MAX_DIMS {
            c.pos -= 4;
            return c.fail(format!(
                "tensor `{name}`: rank {rank} outside 1..={MAX_DIMS}"
            ));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let d = c.u64(&format!("a dimension of `{name}`"))?;
            let Ok(d) = usize::try_from(d) else {
                return c.fail(format!("tensor `{name}`: dimension {d} too large"));
            };
            dims.push(d);
        }
        let type_id = c.u32(&format!("type of `{name}`"))?;
        let offset = c.u64(&format!("offset of `{name}`"))?;
        table.push((at, name, dims, type_id, offset));
    }
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let data_len = (bytes.len() as u64).saturating_sub(data_start);
    let mut tensors = HashMap::with_capacity(table.len());
    for (at, name, mut dims, type_id, offset) in table {
        let fail = |what: String| ParseError {
            offset: at,
            what: format!("tensor `{name}`: {what}"),
        };
        let dtype = dtype_of(type_id)
            .map_err(|t| fail(format!("{t} is not a type this build can read")))?;
        let elems = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| fail(format!("dimensions {dims:?} overflow")))?;
        let block = dtype.block_size();
        if dims[0] % block != 0 {
            return Err(fail(format!(
                "innermost dimension {} is not a multiple of {dtype:?}'s block of {block}",
                dims[0]
            )));
        }
        let len = (elems / block)
            .checked_mul(dtype.type_size())
            .ok_or_else(|| fail("byte size overflows".into()))?;
        if offset % alignment != 0 {
            return Err(fail(format!(
                "offset {offset} is not aligned to {alignment}"
            )));
        }
        if offset > data_len || len as u64 > data_len - offset {
            return Err(fail(format!(
                "its {len} bytes at data offset {offset} run past the end of the file ({data_len} data bytes)"
            )));
        }
        dims.reverse();
        let info = TensorInfo {
            shape: dims,
            dtype,
            start: (data_start + offset) as usize,
            len,
        };
        if tensors.insert(name.clone(), info).is_some() {
            return Err(ParseError {
                offset: at,
                what: format!("tensor `{name}` listed twice"),
            });
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal valid file: one u32 key, one string array, one f32 tensor of 2x3.
    fn tiny() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(MAGIC);
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        let key = |b: &mut Vec<u8>, k: &str| {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
        };
        key(&mut b, "a.n");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        key(&mut b, "a.list");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        key(&mut b, "x");
        key(&mut b, "yz");
        key(&mut b, "t");
        b.extend(2u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for i in 0..6 {
            b.extend((i as f32).to_le_bytes());
        }
        b
    }

    #[test]
    fn reads_a_valid_file() {
        let p = parse(&tiny()).unwrap();
        assert_eq!(p.metadata["a.n"], Value::U32(7));
        assert_eq!(
            p.metadata["a.list"],
            Value::Array(vec![Value::String("x".into()), Value::String("yz".into())])
        );
        let t = &p.tensors["t"];
        assert_eq!(t.shape, vec![2, 3]);
        assert_eq!(t.len, 24);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = tiny();
        for cut in 0..b.len() - 24 {
            assert!(parse(&b[..cut]).is_err(), "cut at {cut} parsed");
        }
        // Cutting inside the data section is caught by the tensor's bounds.
        assert!(parse(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut b = tiny();
        // The element count of the string array (after magic, version, counts, first kv, key,
        // type and element type).
        let at = 4 + 4 + 8 + 8 + (8 + 3 + 4 + 4) + (8 + 6) + 4 + 4;
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = parse(&b).err().unwrap();
        assert!(e.what.contains("exceeds"), "{}", e.what);
    }
}
