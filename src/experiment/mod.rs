//! Experiments: a strict TOML config names models, drafters, prompts and a sweep; the runner
//! generates every prompt at every sweep point and writes records, summaries and plots.
//!
//! ```text
//! ExperimentConfig::load(file, --set overrides)  ─► validate() (structure) ─► check_paths()
//!   ─► tokenizer, prompts (chat template), models (vocabulary check)
//!   ─► sweep_points(): autoregressive first (the baselines), then speculative
//!   ─► Session::run ─► results.jsonl ─► summarize ─► summary.md / summary.csv / plots/*.svg
//! ```

mod chat;
mod config;
mod config_prefix;
mod conversation;
mod dataset;
mod load;
mod load_config;
mod output;
mod plot;
mod report;
mod report_prefix;
mod run;
mod runner;
mod sweep;
mod tree_report;
mod validate;

pub use chat::{encode_conversation, encode_prompt, ChatTemplate};
pub use config::{
    AdaptiveGamma, CacheChoice, DatasetConfig, DeviceChoice, DrafterConfig, DrafterKind,
    DtypeChoice, ExperimentConfig, GammaChoice, List, Method, PrefixCacheConfig, SweepConfig,
    TargetConfig, TurnsChoice,
};
pub use conversation::Conversations;
pub use dataset::{load_prompts, Prompt};
pub use load::{check_vocabulary, select_device, LoadedModel};
pub use load_config::apply_override;
pub use output::{default_result_path, ResultDir};
pub use plot::write_plots;
pub use report::{csv, markdown, markdown_table, summarize, PointSummary, StrategyCheck};
pub use report_prefix::{prefill_section, store_section, turns_section};
pub use run::{run_experiment, RunOptions, RunOutcome};
pub use runner::{DraftSource, EncodedPrompt, ResultRecord, Session, SweepObserver};
pub use sweep::{max_block, rotating_strategy, sweep_points, SweepPoint};
pub use tree_report::tree_markdown;
