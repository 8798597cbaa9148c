//! `[engine]`: the engine options ([`EngineOptions`]) of a run as configuration. Every option
//! is a key that takes a value or a list of values; a list is swept like a `[sweep]` list
//! (points that differ only in engine options are distinct points, each compared with the
//! autoregressive point of the same options). Keys left out take exp's defaults
//! ([`exp_defaults`]): the library's, except `cuda_graphs = true`.
//!
//! The `SPECDEC_*` variables of [`crate::engine::env`] are the override layer on top of this
//! table: [`EngineConfig::with_overrides`] applies them to every combination, and the run's
//! `config.toml` holds the result, so that the file alone reproduces the run.
use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::list::List;
use crate::engine::{env, EngineOptions};
use crate::error::Result;

/// exp's engine options where `[engine]` leaves a key out: the library's defaults, except
/// `cuda_graphs = true` (exp decodes one sequence at a time on one thread, which is what
/// graph recording needs; the library's default is off).
pub fn exp_defaults() -> EngineOptions {
    EngineOptions {
        cuda_graphs: true,
        ..EngineOptions::default()
    }
}

/// `[engine]`: every option key with its values (each of the option's type), sorted by key.
/// Holds every key (defaults filled in), so that a written config states every option.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    values: BTreeMap<String, Vec<toml::Value>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self::spanning(&[exp_defaults()])
    }
}

/// `options` as a TOML table keyed by option.
fn table_of(options: &EngineOptions) -> toml::Table {
    match toml::Value::try_from(options) {
        Ok(toml::Value::Table(t)) => t,
        // Unreachable: the options are a struct of numbers and booleans.
        _ => toml::Table::new(),
    }
}

/// Option `key` of `options` as TOML text (`16`, `true`, `8.0`); `None` for an unknown key.
pub fn option_value(options: &EngineOptions, key: &str) -> Option<String> {
    table_of(options).get(key).map(|v| v.to_string())
}

/// `value` as a value of option `key`'s type (`8` for a megabyte count becomes `8.0`); the
/// error names the key and the value.
fn typed(key: &str, value: &toml::Value) -> std::result::Result<toml::Value, String> {
    let mut table = table_of(&EngineOptions::default());
    table.insert(key.to_string(), value.clone());
    let options: EngineOptions = toml::Value::Table(table)
        .try_into()
        .map_err(|e| format!("engine.{key} = {value}: {e}"))?;
    table_of(&options)
        .remove(key)
        .ok_or_else(|| format!("engine.{key}: not an engine option"))
}

impl EngineConfig {
    /// The table of `given` values (each key a value or a list), exp's defaults for the rest.
    /// Unknown keys and values of the wrong type are errors naming the key.
    pub fn from_lists(
        given: BTreeMap<String, List<toml::Value>>,
    ) -> std::result::Result<Self, String> {
        let mut config = Self::default();
        for (key, list) in given {
            if !config.values.contains_key(&key) {
                return Err(format!(
                    "engine.{key}: unknown engine option; the options are {}",
                    EngineOptions::keys().join(", ")
                ));
            }
            let values = list
                .iter()
                .map(|v| typed(&key, v))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            config.values.insert(key, values);
        }
        Ok(config)
    }

    /// The table whose combinations are `options`: every key's distinct values in order of
    /// appearance (exact when `options` are a cartesian product, as combinations with
    /// overrides applied are).
    fn spanning(options: &[EngineOptions]) -> Self {
        let mut values: BTreeMap<String, Vec<toml::Value>> = BTreeMap::new();
        for o in options {
            for (key, value) in table_of(o) {
                let seen = values.entry(key).or_default();
                if !seen.contains(&value) {
                    seen.push(value);
                }
            }
        }
        Self { values }
    }

    /// Every combination of the values, the first key (alphabetically) outermost.
    pub fn combinations(&self) -> Vec<EngineOptions> {
        let mut tables = vec![toml::Table::new()];
        for (key, values) in &self.values {
            tables = tables
                .iter()
                .flat_map(|t| {
                    values.iter().map(move |v| {
                        let mut t = t.clone();
                        t.insert(key.clone(), v.clone());
                        t
                    })
                })
                .collect();
        }
        // Every value was checked against its option's type when the table was built.
        tables
            .into_iter()
            .filter_map(|t| toml::Value::Table(t).try_into().ok())
            .collect()
    }

    /// The keys given more than one value: the engine options the sweep varies.
    pub fn swept(&self) -> Vec<String> {
        self.values
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// This table with the `SPECDEC_*` environment variables' overrides applied to every
    /// combination (see [`crate::engine::env`]); an overridden key keeps one value.
    pub fn with_env_overrides(&self) -> Result<Self> {
        let effective = self
            .combinations()
            .into_iter()
            .map(env::overrides)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::spanning(&effective))
    }

    /// [`Self::with_env_overrides`] with the environment given as a lookup (tests).
    pub fn with_overrides(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let effective = self
            .combinations()
            .into_iter()
            .map(|o| env::apply(o, &lookup))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::spanning(&effective))
    }

    /// Problems with the values, each naming its key: empty or repeated lists, and every
    /// combination's [`EngineOptions::validate`] error (each message once).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, values) in &self.values {
            if values.is_empty() {
                problems.push(format!("engine.{key} = []: give at least one value"));
            }
            if let Some(v) = values
                .iter()
                .enumerate()
                .find_map(|(i, v)| values[..i].contains(v).then_some(v))
            {
                problems.push(format!("engine.{key}: {v} is listed twice"));
            }
        }
        for options in self.combinations() {
            if let Err(e) = options.validate() {
                let message = e.to_string();
                if !problems.contains(&message) {
                    problems.push(message);
                }
            }
        }
        problems
    }
}

impl Serialize for EngineConfig {
    /// A key with one value as that value, with several as a list.
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let table: BTreeMap<&String, toml::Value> = self
            .values
            .iter()
            .map(|(k, v)| match v.as_slice() {
                [one] => (k, one.clone()),
                many => (k, toml::Value::Array(many.to_vec())),
            })
            .collect();
        table.serialize(s)
    }
}

impl<'de> Deserialize<'de> for EngineConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let given = BTreeMap::<String, List<toml::Value>>::deserialize(d)?;
        Self::from_lists(given).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> std::result::Result<EngineConfig, String> {
        toml::from_str::<EngineConfig>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn left_out_keys_take_exp_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config.combinations(), vec![exp_defaults()]);
        assert!(exp_defaults().cuda_graphs);
        assert!(config.swept().is_empty());
    }

    #[test]
    fn lists_multiply_and_values_take_their_option_type() {
        let config =
            parse("queued_verify = [true, false]\ngemv_max_warps = [16, 32]\nl2_prefetch_mb = 4\n")
                .unwrap();
        let combos = config.combinations();
        assert_eq!(combos.len(), 4);
        assert!(combos.iter().all(|o| o.l2_prefetch_mb == 4.0));
        assert_eq!(config.swept(), ["gemv_max_warps", "queued_verify"]);
        let text = toml::to_string(&config).unwrap();
        assert!(text.contains("l2_prefetch_mb = 4.0"), "{text}");
        assert_eq!(parse(&text).unwrap(), config);
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        let err = parse("gemv_warps = 16\n").unwrap_err();
        assert!(
            err.contains("engine.gemv_warps: unknown engine option"),
            "{err}"
        );
        let err = parse("queued_verify = 3\n").unwrap_err();
        assert!(err.contains("engine.queued_verify = 3"), "{err}");
        let config = parse("gemv_max_warps = [16, 12]\nattn_rows_heads = [2, 2]\n").unwrap();
        let problems = config.problems().join("\n");
        assert!(
            problems.contains("engine.gemv_max_warps = 12: expected 8, 16 or 32"),
            "{problems}"
        );
        assert!(
            problems.contains("engine.attn_rows_heads: 2 is listed twice"),
            "{problems}"
        );
        assert_eq!(
            problems.matches("gemv_max_warps = 12").count(),
            1,
            "{problems}"
        );
    }

    #[test]
    fn overrides_replace_a_swept_key_by_their_value() {
        let config = parse("gemv_max_warps = [16, 32]\nqueued_verify = [true, false]\n").unwrap();
        let env = |name: &str| (name == "SPECDEC_GEMV_MAX_WARPS").then(|| "8".to_string());
        let over = config.with_overrides(env).unwrap();
        assert_eq!(over.swept(), ["queued_verify"]);
        assert!(over.combinations().iter().all(|o| o.gemv_max_warps == 8));
        assert_eq!(over.combinations().len(), 2);
        let bad = |name: &str| (name == "SPECDEC_PDL").then(|| "maybe".to_string());
        let err = config.with_overrides(bad).unwrap_err().to_string();
        assert!(err.contains("SPECDEC_PDL=maybe"), "{err}");
    }
}
