//! Config keys of conversations and the prefix store: `[dataset] turns` and `[prefix_cache]`.
use serde::{Deserialize, Serialize};

use super::list::List;

/// `[dataset] turns = "first" | "all"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnsChoice {
    /// Only each prompt's first user turn (one generation per prompt).
    #[default]
    First,
    /// Every user turn: turn k + 1 is the conversation so far, the model's own answers
    /// included, and the caches continue from the end of turn k.
    All,
}

/// `[prefix_cache]`: a store of cache snapshots keyed by token prefixes, one per model and
/// sweep point, shared by that point's generations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCacheConfig {
    /// Whether the store is used; a list (`[false, true]`) runs every point both ways, so
    /// the run compares them.
    #[serde(default = "off")]
    pub enabled: List<bool>,
    /// Most MiB of snapshots each model's store keeps (least recently used evicted first).
    #[serde(default = "default_budget_mb")]
    pub budget_mb: usize,
    /// Tokens between the sliding-window checkpoints a prefill leaves in the store (models
    /// with rotating layers can resume only at a checkpoint).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: usize,
}

fn off() -> List<bool> {
    List(vec![false])
}
fn default_budget_mb() -> usize {
    1024
}
fn default_checkpoint_every() -> usize {
    crate::speculative::DEFAULT_CHECKPOINT_EVERY
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        Self {
            enabled: off(),
            budget_mb: default_budget_mb(),
            checkpoint_every: default_checkpoint_every(),
        }
    }
}

impl PrefixCacheConfig {
    /// The store's budget in bytes.
    pub fn budget_bytes(&self) -> usize {
        self.budget_mb.saturating_mul(1 << 20)
    }

    /// Problems with the values, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.enabled.is_empty() {
            problems.push("prefix_cache.enabled = []: give true, false or both".into());
        }
        let mut seen = self.enabled.to_vec();
        seen.dedup();
        if seen.len() != self.enabled.len() {
            problems.push(format!(
                "prefix_cache.enabled = {:?}: each value at most once",
                self.enabled.0
            ));
        }
        if self.budget_mb == 0 {
            problems.push("prefix_cache.budget_mb = 0: must be >= 1".into());
        }
        if self.checkpoint_every == 0 {
            problems.push("prefix_cache.checkpoint_every = 0: must be >= 1".into());
        }
        problems
    }
}
