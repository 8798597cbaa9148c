//! Running the `exp` binary from tests.
use std::path::Path;
use std::process::Command;

/// Runs `exp` with `args` (progress bars off): (success, stdout, stderr).
pub fn exp(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_exp"))
        .args(args)
        .arg("--no-progress")
        .output()
        .expect("exp runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the default experiment into `out` with each of `sets` as a `--set` override.
pub fn exp_default(out: &Path, sets: &[&str]) -> (bool, String, String) {
    let mut args = vec![
        "run",
        "configs/default.toml",
        "--out",
        out.to_str().expect("a UTF-8 path"),
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    exp(&args)
}
