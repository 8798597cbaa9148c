//! No import circles in `src/experiment`: for every two of its modules, at most one uses the
//! other. A module is a file (`config/mod.rs` is `config`, `config/engine.rs` is
//! `config::engine`); it uses another when a path in its code (a `use`, or an inline
//! `super::…` / `crate::experiment::…` path) names that module or an item of it. Comments are
//! skipped; the `tests` module of a file counts as the file.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every module of `src/experiment` by path, with its source.
fn modules(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if path.is_dir() {
            let mut m = prefix.clone();
            m.push(name);
            modules(&path, &m, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut m = prefix.clone();
            if name != "mod" {
                m.push(name);
            }
            out.insert(m, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The module a path starting at module `from` lands in: the longest run of its segments
/// that are modules.
fn resolve(from: &Module, segments: &[&str], known: &BTreeSet<Module>) -> Module {
    let mut at = from.clone();
    for s in segments {
        let mut next = at.clone();
        next.push(s.to_string());
        if known.contains(&next) {
            at = next;
        } else {
            break;
        }
    }
    at
}

/// The paths of one `use` statement's tree (one level of braces): `a::{b, c::d}` gives
/// `a::b` and `a::c::d`.
fn use_paths(tree: &str) -> Vec<String> {
    match tree.split_once('{') {
        Some((head, rest)) => rest
            .trim_end_matches('}')
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| format!("{head}{item}"))
            .collect(),
        None => vec![tree.to_string()],
    }
}

/// The modules `module` (with source `text`) uses.
fn uses(module: &Module, text: &str, known: &BTreeSet<Module>) -> BTreeSet<Module> {
    let parent: Module = module[..module.len().saturating_sub(1)].to_vec();
    let mut found = BTreeSet::new();
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut target = |path: &str| {
        let segments: Vec<&str> = path.split("::").map(str::trim).collect();
        let landed = match segments.as_slice() {
            ["crate", "experiment", rest @ ..] => resolve(&Vec::new(), rest, known),
            ["super", rest @ ..] => resolve(&parent, rest, known),
            ["self", rest @ ..] => resolve(module, rest, known),
            [first, ..] if known.contains(&[module.clone(), vec![first.to_string()]].concat()) => {
                resolve(module, &segments, known)
            }
            _ => return,
        };
        if landed != *module {
            found.insert(landed);
        }
    };
    // `use` statements (relative paths included): from the line that opens one to its `;`.
    for statement in code.split(';') {
        let lines: Vec<&str> = statement.lines().collect();
        let opens = lines.iter().rposition(|l| {
            let l = l.trim_start();
            ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .any(|p| l.starts_with(p))
        });
        let Some(opens) = opens else { continue };
        let text = lines[opens..].join(" ");
        let Some((_, tree)) = text.split_once("use ") else {
            continue;
        };
        let tree: String = tree.split_whitespace().collect();
        for path in use_paths(&tree) {
            if path != "super::*" {
                target(&path);
            }
        }
    }
    // Inline paths: `super::x::f(…)`, `crate::experiment::x::T`.
    for start in ["super::", "crate::experiment::"] {
        for (i, _) in code.match_indices(start) {
            let path: String = code[i..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path = path.trim_end_matches(':');
            // `super::*` (a glob, as the `tests` module of a file writes it) names no module.
            if path != "super" {
                target(path);
            }
        }
    }
    found
}

#[test]
fn no_two_experiment_modules_import_each_other() {
    let mut all = BTreeMap::new();
    modules(Path::new("src/experiment"), &Vec::new(), &mut all);
    let known: BTreeSet<Module> = all.keys().cloned().collect();
    let graph: BTreeMap<&Module, BTreeSet<Module>> = all
        .iter()
        .map(|(m, text)| (m, uses(m, text, &known)))
        .collect();
    let name = |m: &Module| {
        if m.is_empty() {
            "experiment".to_string()
        } else {
            m.join("::")
        }
    };
    let mut circles = Vec::new();
    for (a, used) in &graph {
        for b in used {
            if name(a) < name(b) && graph.get(b).is_some_and(|u| u.contains(*a)) {
                circles.push(format!("{} <-> {}", name(a), name(b)));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules importing each other: {circles:?}"
    );
    // The check sees imports: the runner uses the sweep, the summary its points.
    let runner_points = vec!["runner".to_string(), "points".to_string()];
    assert!(graph[&runner_points].contains(&vec!["sweep".to_string()]));
}
