//! The house rules of src/, checked on every test run: no two modules import each other
//! (scripts/import_cycles.py: a module's `use` and inline paths, the crate error type
//! included), no source file over 700 lines, and no `SPECDEC_*` environment variable read
//! outside the one override module (src/engine/env.rs).
use std::path::{Path, PathBuf};
use std::process::Command;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(PathBuf, String)> {
    let mut paths = Vec::new();
    files(&src(), &mut paths);
    paths
        .into_iter()
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "rs" || e == "cu" || e == "cuh")
        })
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a readable source file");
            (p, text)
        })
        .collect()
}

#[test]
fn no_two_modules_import_each_other() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/import_cycles.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(src())
        .output()
        .expect("python3 runs scripts/import_cycles.py");
    // The pairs on stdout, one a line; the count on stderr.
    let pairs = String::from_utf8_lossy(&out.stdout);
    let count = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "import circles ({count}):\n{pairs}");
    assert!(
        pairs.trim().is_empty() && count.contains("0 pair(s)"),
        "{count}\n{pairs}"
    );
}

#[test]
fn no_source_file_is_over_700_lines() {
    let long: Vec<String> = sources()
        .iter()
        .filter(|(_, text)| text.lines().count() > 700)
        .map(|(p, text)| format!("{}: {} lines", p.display(), text.lines().count()))
        .collect();
    assert!(long.is_empty(), "{long:?}");
}

#[test]
fn specdec_variables_are_read_in_the_override_module_only() {
    let env_module = src().join("engine").join("env.rs");
    let readers: Vec<String> = sources()
        .iter()
        .filter(|(p, _)| *p != env_module)
        .filter(|(_, text)| {
            text.lines().any(|l| {
                let code = l.split("//").next().unwrap_or("");
                code.contains("SPECDEC_") && (code.contains("var(") || code.contains("env!("))
            })
        })
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(
        readers.is_empty(),
        "SPECDEC_* read outside src/engine/env.rs: {readers:?}"
    );
}
