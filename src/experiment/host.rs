//! What a run measured on: the machine and the code, for the head of `summary.md`. Figures
//! from two machines (or two commits) are not comparable, so every result folder names both.

/// `"<CPU model>, <n> CPU threads; specdec <commit>"`: the CPU's model name (Linux's
/// `/proc/cpuinfo`, elsewhere the architecture), the threads the CPU forwards run on, and the
/// commit this binary was built from (recorded by `build.rs` at build time, followed by
/// " with uncommitted changes" where the compiled files differed from it), or "commit
/// unknown" for a build outside a git checkout.
pub fn description() -> String {
    let commit = match env!("BUILT_FROM_COMMIT") {
        "" => "commit unknown (built outside a git checkout)",
        commit => commit,
    };
    format!(
        "{}, {} CPU threads; specdec {commit}",
        cpu_model(),
        rayon::current_num_threads(),
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
