//! Experiments: a strict TOML config names models, drafters, prompts, a sweep and engine
//! options; the runner generates every prompt at every sweep point and writes records,
//! summaries and plots.
//!
//! ```text
//! ExperimentConfig::load(file, --set overrides)  ─► validate() (structure) ─► check_paths()
//!   ─► [engine] with the SPECDEC_* override layer applied (what config.toml records)
//!   ─► tokenizer, prompts (chat template), models (vocabulary check)
//!   ─► check_context(): prompt + max_new_tokens within every model's context
//!   ─► sweep_points(): autoregressive first (the baselines), then speculative
//!   ─► Session::run in schedule() order (repeats; interleaved or grouped) ─► results.jsonl
//!   ─► summarize (paired speedups, cost model) ─► summary.md / summary.csv / plots/*.svg
//! ```
//!
//! Modules: `config/` (the TOML, validation, loading), `sweep` and `schedule` (the points
//! and their order), `runner/` (generating), `summary/` (per-point figures), `report/`
//! (Markdown, CSV and the terminal's answer), `plot`, `run` (one experiment end to end).
//! No two of them import each other.

mod chat;
pub mod config;
mod context;
mod dataset;
mod host;
mod load;
mod output;
mod plot;
pub mod report;
mod run;
pub mod runner;
mod schedule;
mod stats;
pub mod summary;
mod sweep;

pub use chat::{encode_conversation, encode_prompt, ChatTemplate};
pub use config::engine::{exp_defaults, EngineConfig};
pub use config::load::apply_override;
pub use config::{
    AdaptiveGamma, CacheChoice, DatasetConfig, DeviceChoice, DrafterConfig, DrafterKind,
    DtypeChoice, ExperimentConfig, GammaChoice, List, Method, PrefixCacheConfig, RunOrder,
    SweepConfig, TargetConfig, TurnsChoice,
};
pub use context::{check_context, context_limit};
pub use dataset::{load_prompts, selection, Prompt};
pub use load::{check_vocabulary, select_device, LoadedModel};
pub use output::{default_result_path, ResultDir};
pub use plot::write_plots;
pub use report::{
    csv, markdown, markdown_table, prefill_section, prompt_markdown, prompt_rows,
    recordings_section, store_section, tree_markdown, turns_section, PromptRow, StrategyCheck,
};
pub use run::{run_experiment, ProcessRank, RunOptions, RunOutcome};
pub use runner::{Conversations, DraftSource, EncodedPrompt, ResultRecord, Session, SweepObserver};
pub use schedule::{pairing_groups, schedule, Slot};
pub use stats::{median, median_interval, paired_ratios, MedianInterval};
pub use summary::{summarize, CostModel, Measured, PointSummary, TOLERANCE};
pub use sweep::{max_block, rotating_strategy, sweep_points, SweepPoint};
