//! [`BenchConfig`]: what the cache-strategy benchmark measures, from TOML (defaults built in).
use std::path::Path;

use serde::Deserialize;

use super::strategy::RollbackStrategy;
use crate::error::{Error, Result};

/// How many of the γ drafts each step accepts. A step appends γ+1 tokens (the current token
/// and the drafts) and keeps the current token plus the accepted drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Every draft accepted: keep γ+1, nothing to roll back.
    All,
    /// No draft accepted: keep 1, roll back γ.
    None,
    /// A uniformly random number of drafts (seeded): keep 1..=γ+1.
    Random,
    /// The γ+1 tokens form a token tree (binary, node `i`'s parent is `(i − 1) / 2`) and the
    /// path to a uniformly random node (seeded) is committed: node moves instead of a
    /// prefix. Speculation strategies only (the baselines have no tree commit).
    Path,
}

impl Pattern {
    /// The name used in configs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::All => "all",
            Pattern::None => "none",
            Pattern::Random => "random",
            Pattern::Path => "path",
        }
    }
}

/// The benchmark grid and timing settings. Every key is optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BenchConfig {
    /// Strategy names (see [`RollbackStrategy::name`]); default: all of them.
    pub strategies: Vec<String>,
    /// Cache lengths in tokens (rotating layouts: the window, filled past wrapping).
    pub lengths: Vec<usize>,
    /// Draft lengths γ.
    pub gammas: Vec<usize>,
    /// Acceptance patterns.
    pub patterns: Vec<Pattern>,
    /// KV heads of the layer.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Layers per cache.
    pub layers: usize,
    /// Fewest timed steps per cell.
    pub min_runs: usize,
    /// Most timed steps per cell.
    pub max_runs: usize,
    /// Time per cell after which no more than `min_runs` steps are taken, in milliseconds.
    pub target_ms: u64,
    /// Seed of the random acceptance pattern.
    pub seed: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            strategies: RollbackStrategy::ALL
                .iter()
                .map(|s| s.name().to_string())
                .collect(),
            lengths: vec![256, 1024, 4096, 32768],
            gammas: vec![1, 4, 8, 16],
            patterns: vec![Pattern::All, Pattern::None, Pattern::Random, Pattern::Path],
            kv_heads: 8,
            head_dim: 128,
            layers: 1,
            min_runs: 2,
            max_runs: 2000,
            target_ms: 15,
            seed: 0,
        }
    }
}

impl BenchConfig {
    /// Reads and validates a TOML config.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let config: Self = toml::from_str(&text)
            .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the grid: non-empty lists without repeats, known strategies, positive sizes.
    pub fn validate(&self) -> Result<()> {
        self.strategy_list()?;
        non_empty_unique("lengths", &self.lengths)?;
        non_empty_unique("gammas", &self.gammas)?;
        non_empty_unique("patterns", &self.patterns)?;
        let positive = [
            ("lengths", self.lengths.iter().copied().min().unwrap_or(0)),
            ("gammas", self.gammas.iter().copied().min().unwrap_or(0)),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("layers", self.layers),
            ("min_runs", self.min_runs),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid(format!("{key}: must be at least 1")));
        }
        if self.max_runs < self.min_runs {
            return Err(Error::invalid(format!(
                "max_runs: {} is below min_runs {}",
                self.max_runs, self.min_runs
            )));
        }
        Ok(())
    }

    /// The strategies named in `strategies`.
    pub fn strategy_list(&self) -> Result<Vec<RollbackStrategy>> {
        non_empty_unique("strategies", &self.strategies)?;
        self.strategies
            .iter()
            .map(|name| {
                RollbackStrategy::from_name(name).ok_or_else(|| {
                    let known: Vec<&str> = RollbackStrategy::ALL.iter().map(|s| s.name()).collect();
                    Error::invalid(format!(
                        "strategies: unknown {name:?}; allowed: {}",
                        known.join(", ")
                    ))
                })
            })
            .collect()
    }
}

fn non_empty_unique<T: PartialEq + std::fmt::Debug>(key: &str, values: &[T]) -> Result<()> {
    if values.is_empty() {
        return Err(Error::invalid(format!("{key}: needs at least one value")));
    }
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            return Err(Error::invalid(format!("{key}: {v:?} is repeated")));
        }
    }
    Ok(())
}
