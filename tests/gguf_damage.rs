//! Damaged real GGUF files — cut anywhere, or bytes flipped in the header, metadata or tensor
//! table — give an error naming the file, never a panic, an abort on a huge allocation or an
//! out-of-bounds read. Each case writes the damaged copy to a temporary file and loads it as
//! a model and as a tokenizer.
mod common;

use std::path::Path;

use proptest::prelude::*;
use specdec::gguf::GgufFile;
use specdec::models::{load_tokenizer, LoadOptions, Model};

/// Where tensor data begins: everything before it is header, metadata and tensor table.
fn data_start(path: &Path) -> usize {
    let file = GgufFile::open(path).expect("the undamaged file opens");
    file.tensors().map(|(_, t)| t.start).min().expect("tensors")
}

/// Loads `bytes` as a GGUF model and tokenizer; returns the model's error, if any. Every
/// error must name the damaged file.
fn load_damaged(bytes: &[u8], dir: &Path) -> Option<String> {
    let path = dir.join("damaged.gguf");
    std::fs::write(&path, bytes).expect("write the damaged copy");
    let shown = path.display().to_string();
    if let Err(e) = load_tokenizer(&path) {
        assert!(
            e.to_string().contains(&shown),
            "tokenizer error without the file: {e}"
        );
    }
    match Model::load(&path, &LoadOptions::default()) {
        Ok(_) => None,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(&shown), "model error without the file: {msg}");
            Some(msg)
        }
    }
}

/// `cases` cuts and `cases` flips of the real file `name`.
fn damage(test: &str, name: &str, cases: u32) {
    let Some(path) = common::real::real_model(test, name) else {
        return;
    };
    let bytes = std::fs::read(&path).expect("read the real file");
    let header = data_start(&path);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    // Cut anywhere: the tensor table then points past the end, so loading always fails.
    proptest!(config.clone(), |(cut in 0..bytes.len())| {
        let err = load_damaged(&bytes[..cut], dir.path());
        prop_assert!(err.is_some(), "a file cut at byte {cut} of {} loaded", bytes.len());
    });
    // Flip 1 to 8 bytes before the data: loading may succeed (a changed letter in a token, a
    // changed norm epsilon) but must never panic.
    proptest!(config, |(flips in prop::collection::vec((0..header, 1u8..=255), 1..=8))| {
        let mut damaged = bytes.clone();
        for &(at, mask) in &flips {
            damaged[at] ^= mask;
        }
        load_damaged(&damaged, dir.path());
    });
}

#[test]
fn damaged_smollm2_files_are_refused_cleanly() {
    damage(
        "damaged_smollm2_files_are_refused_cleanly",
        common::real::SMOLLM2,
        24,
    );
}

#[test]
fn damaged_gemma3_files_are_refused_cleanly() {
    damage(
        "damaged_gemma3_files_are_refused_cleanly",
        common::real::GEMMA3,
        12,
    );
}
