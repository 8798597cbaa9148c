//! Lenient reading of Hugging Face `config.json` in both the transformers 4.x spelling
//! (`rope_theta`, `rope_scaling`, `sliding_window_pattern`, `torch_dtype`) and the 5.x one
//! (`rope_parameters`, `layer_types`, `dtype`). Unknown keys are ignored; a key that is present
//! but malformed is an error naming the file and the key.
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::nn::{LayerKind, RopeScaling, RopeSpec};

/// One JSON object of a config file (the file itself or a nested `text_config`).
#[derive(Debug, Clone)]
pub struct HfConfig {
    path: PathBuf,
    /// Key path of this object inside the file (`""` or `"text_config."`).
    context: String,
    obj: Map<String, Value>,
}

/// Where a layer kind's RoPE comes from in the 4.x spelling.
#[derive(Debug, Clone, Copy)]
pub struct RopeKeys<'a> {
    /// `layer_types` value whose entry of a per-layer-type `rope_parameters` applies.
    pub layer_type: &'a str,
    /// 4.x key of the base (`rope_theta`, Gemma's `rope_local_base_freq`).
    pub theta_key: &'a str,
    /// Base when the key is absent.
    pub default_theta: f64,
    /// 4.x key of the scaling dict, when this layer kind reads one.
    pub scaling_key: Option<&'a str>,
}

impl HfConfig {
    /// Reads and parses `path` (a JSON object).
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(format!("{}: bad JSON: {e}", path.display())))?;
        match value {
            Value::Object(obj) => Ok(Self {
                path: path.to_path_buf(),
                context: String::new(),
                obj,
            }),
            _ => Err(Error::invalid(format!(
                "{}: not a JSON object",
                path.display()
            ))),
        }
    }

    /// A config made from `obj` (a file's equivalent JSON object), errors naming `path`.
    pub fn from_object(path: &Path, obj: Map<String, Value>) -> Self {
        Self {
            path: path.to_path_buf(),
            context: String::new(),
            obj,
        }
    }

    /// The file this config came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An error naming the file and `key`.
    pub fn error(&self, key: &str, what: impl std::fmt::Display) -> Error {
        Error::invalid(format!(
            "{}: key `{}{key}`: {what}",
            self.path.display(),
            self.context
        ))
    }

    /// The value of `key`, `None` when absent or `null`.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// The nested object `key` (e.g. `text_config`), when present.
    pub fn nested(&self, key: &str) -> Result<Option<HfConfig>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(HfConfig {
                path: self.path.clone(),
                context: format!("{}{key}.", self.context),
                obj: obj.clone(),
            })),
            Some(other) => Err(self.error(key, format!("expected an object, found {other}"))),
        }
    }

    /// An optional string.
    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.error(key, format!("expected a string, found {other}"))),
        }
    }

    /// An optional non-negative integer.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.error(key, format!("expected a non-negative integer, found {v}"))
                }),
        }
    }

    /// A required positive integer.
    pub fn positive(&self, key: &str) -> Result<usize> {
        match self.usize(key)? {
            Some(0) => Err(self.error(key, "must be positive")),
            Some(n) => Ok(n),
            None => Err(self.error(key, "missing")),
        }
    }

    /// A positive integer, `default` when absent.
    pub fn positive_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.usize(key)? {
            Some(0) => Err(self.error(key, "must be positive")),
            Some(n) => Ok(n),
            None => Ok(default),
        }
    }

    /// An optional number.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(key, format!("expected a number, found {v}"))),
        }
    }

    /// An optional number that must be finite and positive.
    pub fn positive_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.f64(key)? {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                Err(self.error(key, format!("must be a positive number, found {x}")))
            }
            other => Ok(other),
        }
    }

    /// An optional boolean.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.error(key, format!("expected true or false, found {other}"))),
        }
    }

    /// A list of non-negative integers (absent or `null`: `None`).
    pub fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            self.error(key, format!("expected a non-negative integer, found {v}"))
                        })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.error(key, format!("expected a list of integers, found {v}"))),
        }
    }

    /// Token ids given as one integer or a list of integers (absent or `null`: none).
    pub fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        let bad = |v: &Value| {
            self.error(
                key,
                format!("expected a token id or a list of them, found {v}"),
            )
        };
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| as_id(v).ok_or_else(|| bad(v)))
                .collect(),
            Some(v) => as_id(v).map(|id| vec![id]).ok_or_else(|| bad(v)),
        }
    }

    /// The RoPE of one layer kind: from `rope_parameters` (5.x; flat, or per layer type as
    /// Gemma 3 writes it) when present, else from the 4.x keys named in `keys`.
    pub fn rope(&self, keys: RopeKeys<'_>) -> Result<RopeSpec> {
        let Some(params) = self.nested("rope_parameters")? else {
            let theta = self
                .positive_f64(keys.theta_key)?
                .unwrap_or(keys.default_theta);
            let scaling = match keys.scaling_key {
                Some(key) => match self.nested(key)? {
                    Some(dict) => dict.rope_scaling()?,
                    None => RopeScaling::None,
                },
                None => RopeScaling::None,
            };
            return Ok(RopeSpec { theta, scaling });
        };
        let per_type = ["full_attention", "sliding_attention"]
            .iter()
            .any(|t| params.obj.contains_key(*t));
        let params = if per_type {
            params
                .nested(keys.layer_type)?
                .ok_or_else(|| params.error(keys.layer_type, "missing"))?
        } else {
            params
        };
        let theta = params
            .positive_f64("rope_theta")?
            .unwrap_or(keys.default_theta);
        Ok(RopeSpec {
            theta,
            scaling: params.rope_scaling()?,
        })
    }

    /// Parses a scaling dict (`rope_scaling` of 4.x or `rope_parameters` of 5.x).
    fn rope_scaling(&self) -> Result<RopeScaling> {
        let kind = match self.str("rope_type")? {
            Some(kind) => kind,
            None => self.str("type")?.unwrap_or("default"),
        };
        let factor = || -> Result<f64> {
            self.positive_f64("factor")?.ok_or_else(|| {
                self.error("factor", format!("missing (needed by rope_type {kind})"))
            })
        };
        let need = |key: &str| -> Result<f64> {
            self.f64(key)?
                .ok_or_else(|| self.error(key, "missing (needed by rope_type llama3)"))
        };
        match kind {
            "default" => Ok(RopeScaling::None),
            "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
            "llama3" => Ok(RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: self
                    .usize("original_max_position_embeddings")?
                    .ok_or_else(|| {
                    self.error(
                        "original_max_position_embeddings",
                        "missing (needed by rope_type llama3)",
                    )
                })?,
            }),
            other => Err(self.error(
                "rope_type",
                format!("unsupported RoPE type `{other}` (supported: default, linear, llama3)"),
            )),
        }
    }

    /// The 5.x `layer_types` list as layer kinds (sliding layers get `window`), checked to have
    /// `num_layers` entries; `None` when absent.
    pub fn layer_types(
        &self,
        num_layers: usize,
        window: Option<usize>,
    ) -> Result<Option<Vec<LayerKind>>> {
        let Some(value) = self.get("layer_types") else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.error("layer_types", format!("expected a list, found {value}")))?;
        if items.len() != num_layers {
            return Err(self.error(
                "layer_types",
                format!(
                    "has {} entries but num_hidden_layers is {num_layers}",
                    items.len()
                ),
            ));
        }
        let kinds = items
            .iter()
            .map(|item| match item.as_str() {
                Some("full_attention") => Ok(LayerKind::Full),
                Some("sliding_attention") => match window {
                    Some(window) => Ok(LayerKind::Sliding { window }),
                    None => Err(self.error(
                        "sliding_window",
                        "missing, but layer_types has sliding layers",
                    )),
                },
                _ => Err(self.error(
                    "layer_types",
                    format!(
                        "unsupported entry {item} (supported: full_attention, sliding_attention)"
                    ),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(kinds))
    }
}
