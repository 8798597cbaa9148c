//! The front door stays true: README.md's library example is `examples/speculate.rs`
//! (which the build compiles), the README stays short, and every relative link in README.md
//! and docs/ names a file that exists.
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_library_example_is_the_compiled_example() {
    let readme = read(&root().join("README.md"));
    let section = readme
        .split("## As a library")
        .nth(1)
        .expect("README.md has an 'As a library' section");
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a rust block in that section");
    let example = read(&root().join("examples/speculate.rs"));
    let code: Vec<&str> = example
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .collect();
    assert_eq!(block.trim(), code.join("\n").trim());
}

#[test]
fn the_readme_is_a_front_door() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(lines <= 250, "README.md has {lines} lines");
}

/// Relative link targets of `[text](target)` in markdown, without anchors.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in markdown.split("](").skip(1) {
        let Some(end) = part.find(')') else { continue };
        let target = part[..end].split('#').next().unwrap_or("");
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external && !target.contains(' ') {
            out.push(target.to_string());
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut files = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.expect("docs entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut broken = Vec::new();
    for file in &files {
        let dir = file.parent().expect("a parent folder");
        for target in links(&read(file)) {
            if !dir.join(&target).exists() {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_docs_index_lists_every_doc() {
    let index = read(&root().join("docs/README.md"));
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = entry.expect("docs entry").file_name();
        let name = name.to_string_lossy();
        if name != "README.md" && !name.ends_with(".svg") {
            assert!(
                index.contains(name.as_ref()),
                "docs/README.md does not list {name}"
            );
        }
    }
}
