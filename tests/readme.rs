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

/// Relative link targets of `[text](target)` in markdown: `(file, anchor)`, the file empty
/// for a link into the same document.
fn links(markdown: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for part in markdown.split("](").skip(1) {
        let Some(end) = part.find(')') else { continue };
        let target = &part[..end];
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor.to_string())),
            None => (target, None),
        };
        let external = file.contains("://") || file.starts_with("mailto:");
        let nothing = file.is_empty() && anchor.is_none();
        if !(nothing || external || target.contains(' ')) {
            out.push((file.to_string(), anchor));
        }
    }
    out
}

/// The anchors GitHub gives a markdown file's headings: the heading's text lowercased, every
/// character but letters, digits, `_`, `-` and spaces dropped, spaces made `-`; a repeated
/// anchor takes `-1`, `-2`, … Headings inside code fences do not count.
fn anchors(markdown: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if fenced || level == 0 || level > 6 || !line[level..].starts_with(' ') {
            continue;
        }
        let slug: String = line[level..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|&c| c.is_alphanumeric() || c == '_' || c == '-' || c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let seen = out
            .iter()
            .filter(|a| {
                *a == &slug
                    || a.strip_prefix(slug.as_str())
                        .is_some_and(|r| r.starts_with('-') && r[1..].parse::<usize>().is_ok())
            })
            .count();
        out.push(if seen == 0 {
            slug
        } else {
            format!("{slug}-{seen}")
        });
    }
    out
}

#[test]
fn anchors_are_githubs() {
    let doc = "# A title\n## Prefills – and attention (06:10–07:30 UTC)\n```\n# not a heading\n```\n## A title\n### `γ` = 2, ×1.5\n";
    assert_eq!(
        anchors(doc),
        [
            "a-title",
            "prefills--and-attention-06100730-utc",
            "a-title-1",
            "γ--2-15"
        ]
    );
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
        let text = read(file);
        for (target, anchor) in links(&text) {
            let path = if target.is_empty() {
                file.clone()
            } else {
                dir.join(&target)
            };
            if !path.exists() {
                broken.push(format!("{}: {target}", file.display()));
                continue;
            }
            let markdown = path.extension().is_some_and(|e| e == "md");
            if let (Some(anchor), true) = (anchor, markdown) {
                if !anchors(&read(&path)).contains(&anchor) {
                    broken.push(format!("{}: {target}#{anchor}", file.display()));
                }
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
