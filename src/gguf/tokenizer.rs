//! placeholder until the tokenizer lands
use super::file::GgufFile;
use crate::error::{Error, Result};

/// The tokenizer a GGUF file's `tokenizer.*` metadata describes.
pub fn from_gguf(file: &GgufFile) -> Result<tokenizers::Tokenizer> {
    Err(Error::invalid(format!(
        "{}: tokenizer not yet",
        file.path().display()
    )))
}

/// `tokenizer.chat_template`, when the file has one.
pub fn chat_template(file: &GgufFile) -> Result<Option<String>> {
    Ok(file.str("tokenizer.chat_template")?.map(String::from))
}
