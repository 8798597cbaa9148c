//! The one place specdec reads `SPECDEC_*` environment variables: an override layer on top
//! of configured [`EngineOptions`], for A/B comparisons in one build without editing a
//! config. Every option `key` has the variable `SPECDEC_<KEY>` (upper case), whose value is
//! written as in TOML: `SPECDEC_CUDA_GRAPHS=false`, `SPECDEC_GEMV_MAX_WARPS=32`. For the
//! switches, `0` and `1` also mean off and on. An unknown value is an error naming the
//! variable; what the layer changed is recorded with the results like any configured value.
use super::EngineOptions;
use crate::error::{Error, Result};

/// The variable that overrides option `key`.
pub fn variable(key: &str) -> String {
    format!("SPECDEC_{}", key.to_uppercase())
}

/// `base` with every option whose variable is set in the environment replaced by its value.
pub fn overrides(base: EngineOptions) -> Result<EngineOptions> {
    apply(base, |name| std::env::var(name).ok())
}

/// [`overrides`] with the environment given as a lookup (tests).
pub fn apply(
    base: EngineOptions,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<EngineOptions> {
    let mut table = match toml::Value::try_from(base) {
        Ok(toml::Value::Table(t)) => t,
        _ => return Err(Error::invalid("engine options do not serialise to a table")),
    };
    let mut changed = false;
    for (key, value) in table.iter_mut() {
        let name = variable(key);
        let Some(text) = lookup(&name) else { continue };
        *value = parse(&name, &text, value)?;
        changed = true;
    }
    if !changed {
        return Ok(base);
    }
    let options: EngineOptions = toml::Value::Table(table)
        .try_into()
        .map_err(|e| Error::invalid(format!("engine options from the environment: {e}")))?;
    options
        .validate()
        .map_err(|e| Error::invalid(format!("from the environment: {e}")))?;
    Ok(options)
}

/// `text` as a value of the kind `like` is.
fn parse(name: &str, text: &str, like: &toml::Value) -> Result<toml::Value> {
    let text = text.trim();
    let bad = |expected: &str| Error::invalid(format!("{name}={text}: expected {expected}"));
    Ok(match like {
        toml::Value::Boolean(_) => toml::Value::Boolean(match text {
            "1" | "true" | "on" => true,
            "0" | "false" | "off" => false,
            _ => return Err(bad("true or false (or 1 / 0)")),
        }),
        toml::Value::Integer(_) => {
            toml::Value::Integer(text.parse().map_err(|_| bad("a whole number >= 0"))?)
        }
        toml::Value::Float(_) => toml::Value::Float(text.parse().map_err(|_| bad("a number"))?),
        _ => return Err(bad("a value of a supported kind")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn variables_override_their_options_only() {
        let base = EngineOptions::default();
        let got = apply(
            base,
            env(&[
                ("SPECDEC_CUDA_GRAPHS", "1"),
                ("SPECDEC_GEMV_MAX_WARPS", "32"),
                ("SPECDEC_L2_PREFETCH_MB", "4"),
                ("SPECDEC_QUEUED_VERIFY", "false"),
            ]),
        )
        .unwrap();
        let want = EngineOptions {
            cuda_graphs: true,
            gemv_max_warps: 32,
            l2_prefetch_mb: 4.0,
            queued_verify: false,
            ..base
        };
        assert_eq!(got, want);
        assert_eq!(apply(base, env(&[])).unwrap(), base);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let base = EngineOptions::default();
        let msg = apply(base, env(&[("SPECDEC_PDL", "maybe")]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("SPECDEC_PDL=maybe"), "{msg}");
        let msg = apply(base, env(&[("SPECDEC_ATTN_ROWS_HEADS", "3")]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("attn_rows_heads"), "{msg}");
    }
}
