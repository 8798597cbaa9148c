//! What a run measured on: the machine and the code, for the head of `summary.md`. Figures
//! from two machines (or two commits) are not comparable, so every result folder names both.
use std::process::Command;

/// `"<CPU model>, <n> CPU threads; specdec <commit>"`: the CPU's model name (Linux's
/// `/proc/cpuinfo`, elsewhere the architecture), the threads the CPU forwards run on, and the
/// commit of the checkout this binary was built from (`git rev-parse --short=12 HEAD` in
/// it), followed by " with uncommitted changes" where `git status` lists modified tracked
/// files, or "commit unknown" where that checkout is not here (a binary carried to another
/// machine) or git is missing.
pub fn description() -> String {
    format!(
        "{}, {} CPU threads; specdec {}",
        cpu_model(),
        rayon::current_num_threads(),
        commit().unwrap_or_else(|| "commit unknown (its checkout is not here)".to_string())
    )
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(key, _)| key.trim() == "model name")
                .map(|(_, name)| name.trim().to_string())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("{} CPU (model name not read)", std::env::consts::ARCH))
}

/// The commit of the checkout the binary was built from, marked where tracked files differ
/// from it.
fn commit() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty())?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])?;
    Some(match dirty.is_empty() {
        true => head,
        false => format!("{head} with uncommitted changes"),
    })
}
