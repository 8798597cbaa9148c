//! Reading a config file, applying `--set KEY=VALUE` overrides, validating.
use std::path::Path;

use serde::Deserialize;

use super::ExperimentConfig;
use crate::error::{Error, Result};

impl ExperimentConfig {
    /// Parses a config from TOML text; unknown keys are errors naming the key. Defaults are
    /// resolved; not validated.
    pub fn from_toml(text: &str) -> Result<Self> {
        let mut config: Self = toml::from_str(text).map_err(|e| Error::invalid(e.to_string()))?;
        config.resolve_defaults();
        Ok(config)
    }

    /// Reads `path`, applies `overrides` (`"dataset.limit=2"`, see [`apply_override`]),
    /// fills `name` from the file stem when the file has none, then validates the structure.
    /// Paths are not checked here (see [`Self::check_paths`]).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut table: toml::Table = toml::from_str(&text)
            .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
        if !table.contains_key("name") {
            if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                table.insert("name".into(), toml::Value::String(stem.into()));
            }
        }
        let config = if overrides.is_empty() {
            // Parse the text itself so errors point at the line.
            Self::from_toml(&text).map(|mut c| {
                if let Some(name) = table.get("name").and_then(|v| v.as_str()) {
                    c.name = name.to_string();
                }
                c
            })
        } else {
            for set in overrides {
                apply_override(&mut table, set)?;
            }
            Self::deserialize(toml::Value::Table(table))
                .map(|mut c| {
                    c.resolve_defaults();
                    c
                })
                .map_err(|e| Error::invalid(format!("after --set overrides: {e}")))
        }
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
        config
            .validate()
            .map_err(|e| Error::invalid(format!("{}: invalid config:\n{e}", path.display())))?;
        Ok(config)
    }

    /// The config as TOML (defaults filled in), as written to a result folder.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::invalid(format!("cannot write the config: {e}")))
    }
}

/// Applies one `KEY=VALUE` override: `KEY` is a dotted path into the TOML tables
/// (`sweep.gamma`, `drafters.small.path`), created as needed; `VALUE` is parsed as a TOML
/// value (`2`, `[1, 2]`, `"x"`, `{ kind = "ngram" }`) and taken as a string if that fails.
pub fn apply_override(table: &mut toml::Table, set: &str) -> Result<()> {
    let bad = |why: &str| Error::invalid(format!("--set {set:?}: {why}"));
    let (key, value) = set
        .split_once('=')
        .ok_or_else(|| bad("expected KEY=VALUE, e.g. dataset.limit=2"))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').map(str::trim).collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad("the key must be a dotted path like sweep.gamma"));
    }
    let value = parse_value(value.trim());
    let (last, parents) = parts.split_last().ok_or_else(|| bad("empty key"))?;
    let mut current = table;
    for (i, part) in parents.iter().enumerate() {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry.as_table_mut().ok_or_else(|| {
            bad(&format!(
                "`{}` is a value, not a table",
                parts[..=i].join(".")
            ))
        })?;
    }
    current.insert(last.to_string(), value);
    Ok(())
}

/// `text` as a TOML value, or as a string when it is not one (`--set name=run2`).
fn parse_value(text: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct Holder {
        v: toml::Value,
    }
    match toml::from_str::<Holder>(&format!("v = {text}")) {
        Ok(h) => h.v,
        Err(_) => toml::Value::String(text.to_string()),
    }
}
