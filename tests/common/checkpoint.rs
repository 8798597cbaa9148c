//! Loading checkpoints: the shipped models (`models/<name>`) and the transformers fixtures
//! (`tests/fixtures/hf/<case>`), on the test device or on the CPU. Every loader panics with
//! the directory and the error when a checkpoint does not load.
use std::path::{Path, PathBuf};

use specdec::models::{LoadOptions, Model};

/// `rel` under the crate root (`models/target`, `tests/fixtures/hf/qwen3`).
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The checkpoint in `dir`, loaded with `options`.
pub fn load_with(dir: &Path, options: &LoadOptions) -> Model {
    Model::load(dir, options).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// The checkpoint in `dir` on the test device, in the test dtype.
pub fn load(dir: &Path) -> Model {
    load_with(dir, &super::device::load_options())
}

/// The checkpoint in `dir` on the CPU, whatever the test device, in its own dtype widened to
/// f32 ([`LoadOptions::default`]): for tests whose expectations were taken there.
pub fn load_on_cpu(dir: &Path) -> Model {
    load_with(dir, &LoadOptions::default())
}

/// The shipped model `name` (`target` or `draft`) on the test device, in the test dtype.
pub fn shipped(name: &str) -> Model {
    load(&repo_path("models").join(name))
}

/// The shipped model `name` (`target` or `draft`) on the CPU (see [`load_on_cpu`]).
pub fn shipped_on_cpu(name: &str) -> Model {
    load_on_cpu(&repo_path("models").join(name))
}
