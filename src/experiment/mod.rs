//! Experiments: a strict TOML config names models, drafters, prompts and a sweep; the runner
//! generates every prompt at every sweep point and writes records, summaries and plots.
//!
//! ```text
//! ExperimentConfig::load(file, --set overrides)  ─► validate() (structure) ─► check_paths()
//!   ─► tokenizer, prompts (chat template), models (vocabulary check)
//!   ─► check_context(): prompt + max_new_tokens within every model's context
//!   ─► sweep_points(): autoregressive first (the baselines), then speculative
//!   ─► Session::run in schedule() order (repeats; interleaved or grouped) ─► results.jsonl
//!   ─► summarize (paired speedups, cost model) ─► summary.md / summary.csv / plots/*.svg
//! ```

mod by_prompt;
mod chat;
mod config;
mod config_prefix;
mod context;
mod conversation;
mod cost;
mod dataset;
mod load;
mod load_config;
mod output;
mod paired;
mod plot;
mod report;
mod report_prefix;
mod run;
mod runner;
mod schedule;
mod stats;
mod sweep;
mod tree_report;
mod validate;

pub use by_prompt::{prompt_markdown, prompt_rows, PromptRow};
pub use chat::{encode_conversation, encode_prompt, ChatTemplate};
pub use config::{
    AdaptiveGamma, CacheChoice, DatasetConfig, DeviceChoice, DrafterConfig, DrafterKind,
    DtypeChoice, ExperimentConfig, GammaChoice, List, Method, PrefixCacheConfig, RunOrder,
    SweepConfig, TargetConfig, TurnsChoice,
};
pub use context::{check_context, context_limit};
pub use conversation::Conversations;
pub use cost::{CostModel, Measured, TOLERANCE};
pub use dataset::{load_prompts, Prompt};
pub use load::{check_vocabulary, select_device, LoadedModel};
pub use load_config::apply_override;
pub use output::{default_result_path, ResultDir};
pub use plot::write_plots;
pub use report::{csv, markdown, markdown_table, summarize, PointSummary, StrategyCheck};
pub use report_prefix::{prefill_section, store_section, turns_section};
pub use run::{run_experiment, RunOptions, RunOutcome};
pub use runner::{DraftSource, EncodedPrompt, ResultRecord, Session, SweepObserver};
pub use schedule::{pairing_groups, schedule, Slot};
pub use stats::{median, median_interval, paired_ratios, MedianInterval};
pub use sweep::{max_block, rotating_strategy, sweep_points, SweepPoint};
pub use tree_report::tree_markdown;
