//! How a run's summaries are written: the summary table (`table.rs`: summary.md and
//! summary.csv), the cache-strategy check (`strategy.rs`), the greedy-output checks and the
//! engine-options section (`checks.rs`), the prefix store, prefill and conversation sections
//! (`prefix.rs`), trees against chains (`tree.rs`), the per-prompt costs (`by_prompt.rs`:
//! by_prompt.md) and what the terminal prints (`answer.rs`).
mod answer;
mod by_prompt;
mod checks;
mod prefix;
mod strategy;
mod table;
mod tree;

pub use answer::{answer, best_points};
pub use by_prompt::{prompt_markdown, prompt_rows, PromptRow};
pub use checks::{
    engine_section, recordings_section, Agreement, ENGINE_VERDICT, SPECULATIVE_VERDICT,
};
pub use prefix::{prefill_section, store_section, store_verdict, turns_section};
pub use strategy::StrategyCheck;
pub use table::{csv, markdown, markdown_table};
pub use tree::tree_markdown;
