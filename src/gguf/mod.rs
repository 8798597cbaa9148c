//! GGUF files, the format llama.cpp keeps models in: the container ([`GgufFile`]), its
//! tensors read under Hugging Face names and dequantized ([`GgufTensors`]), and the tokenizer
//! its metadata describes ([`tokenizer`]).
mod file;
mod tensors;
pub mod tokenizer;

pub use file::{GgufFile, TensorInfo, Value};
pub use tensors::GgufTensors;

use std::io::Read;
use std::path::Path;

/// True when `path` is a file that starts with the GGUF magic number.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == b"GGUF"
}
