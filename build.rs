//! With the `cuda` feature, compiles specdec's own kernels (`src/nn/cuda/kernels.cu`, one
//! translation unit that includes the family files beside it: `common.cuh`, `attn_split.cu`,
//! `attn_combine.cuh`, `prefill.cu`, `gemv.cu`, `elementwise.cu`) with `nvcc` (on `PATH`, as
//! `scripts/build-cuda.sh` sets up) into one fat binary for the compute capability in
//! `CUDA_COMPUTE_CAP` (default 80): machine code (SASS) for that architecture, which also
//! runs on later GPUs of the same major version, and its PTX, which the driver compiles for
//! any newer GPU. Shipping the machine code spares the first run on a machine the driver's
//! compilation of the PTX (about a minute for these kernels on an H100, ~20 MB of PTX). The
//! architecture built for reaches the crate as `BUILT_CUDA_COMPUTE_CAP`. Other builds do
//! nothing.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=SPECDEC_KERNEL_TRACE");
    build_commit();
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let src = "src/nn/cuda/kernels.cu";
    for file in kernel_files() {
        println!("cargo:rerun-if-changed=src/nn/cuda/{file}");
    }
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_digit()) {
        panic!("CUDA_COMPUTE_CAP = {cap:?}: expected digits such as 80 or 90");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("specdec_kernels.fatbin");
    // SPECDEC_KERNEL_TRACE=1: a diagnostics build whose kernels record when each block
    // passed its PDL wait (`nn::kernel_trace`); slower, never for measurements of speed.
    let trace = std::env::var("SPECDEC_KERNEL_TRACE").is_ok_and(|v| v == "1");
    // The architecture, for the loader's error on a GPU the build does not cover.
    println!("cargo:rustc-env=BUILT_CUDA_COMPUTE_CAP={cap}");
    // This script also re-runs whenever a Rust source changes (`build_commit`): the kernels
    // are compiled again only when a kernel file, the architecture or the trace flag did.
    let stamp = out.with_extension("stamp");
    let wanted = format!("cap {cap} trace {trace}");
    let newest_input = kernel_files()
        .map(|f| PathBuf::from("src/nn/cuda").join(f))
        .chain([PathBuf::from("build.rs")])
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    let built = std::fs::metadata(&out).and_then(|m| m.modified()).ok();
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted)
        && matches!((built, newest_input), (Some(b), Some(i)) if b >= i)
    {
        return;
    }
    let status = Command::new("nvcc")
        .args(trace.then_some("-DSPECDEC_KERNEL_TRACE"))
        .args([
            "--fatbin",
            "-O3",
            &format!("-gencode=arch=compute_{cap},code=[sm_{cap},compute_{cap}]"),
            src,
            "-o",
        ])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {
            std::fs::write(&stamp, wanted).expect("write the kernels' build stamp in OUT_DIR")
        }
        Ok(s) => panic!("nvcc failed ({s}) compiling {src}"),
        Err(e) => panic!("nvcc not found on PATH ({e}); build with scripts/build-cuda.sh"),
    }
}

/// The CUDA files of `src/nn/cuda/`: the unity file and every file it includes.
fn kernel_files() -> impl Iterator<Item = &'static str> {
    [
        "kernels.cu",
        "common.cuh",
        "attn_split.cu",
        "attn_combine.cuh",
        "prefill.cu",
        "gemv.cu",
        "elementwise.cu",
    ]
    .into_iter()
}

/// `BUILT_FROM_COMMIT` for result folders (`src/experiment/host.rs`): the commit this build
/// compiles (`git rev-parse --short=12 HEAD`), followed by " with uncommitted changes" where
/// the files compiled in (`src/`, `build.rs`, `Cargo.toml`, `Cargo.lock`) differ from it
/// (modified or untracked); empty outside a git checkout (a source archive) or without git.
/// Re-runs when one of those files or the checkout's HEAD changes.
fn build_commit() {
    let compiled = ["src", "build.rs", "Cargo.toml", "Cargo.lock"];
    for path in compiled {
        println!("cargo:rerun-if-changed={path}");
    }
    let git = |args: &[&str]| {
        // No optional locks: `status` must not rewrite the index it reads.
        let out = Command::new("git")
            .arg("--no-optional-locks")
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // HEAD and the branch it names (loose or packed) move with every commit.
    for file in ["HEAD", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    if let Some(path) = git(&["symbolic-ref", "-q", "HEAD"])
        .and_then(|branch| git(&["rev-parse", "--git-path", &branch]))
        .filter(|p| std::path::Path::new(p).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .filter(|h| !h.is_empty())
        .map(|head| {
            let mut status = vec!["status", "--porcelain", "--"];
            status.extend(compiled);
            match git(&status).is_some_and(|changes| changes.is_empty()) {
                true => head,
                false => format!("{head} with uncommitted changes"),
            }
        })
        .unwrap_or_default();
    println!("cargo:rustc-env=BUILT_FROM_COMMIT={commit}");
}
