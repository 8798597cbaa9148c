//! The cache-strategy benchmark behind `exp bench-cache`: for every rollback strategy, cache
//! length, draft length γ and acceptance pattern, time one speculative step (append γ+1
//! K/V, then commit or roll back) on one layer of realistic shape, and report µs per step,
//! bytes copied per step and extra memory held.
//!
//! The strategies compared ([`RollbackStrategy`], each driving a [`StrategyCache`]) live in
//! `strategy`: the transactional caches of [`crate::cache`] and baselines that exist only for
//! this comparison.
//!
//! ```text
//! BenchConfig (TOML, defaults built in) ─► validate()
//!   ─► per length: one prefilled cache per layout, snapshotted ─► per strategy: restore it
//!   ─► per γ × pattern: median of repeated steps ─► results.csv, summary.md, plots/*.svg
//! ```

mod config;
mod report;
mod run;
mod strategy;

pub use config::{BenchConfig, Pattern};
pub use report::{csv, markdown, target_checks, write_plots, write_results, BenchOutcome};
pub use run::{measure, prefilled, step_kv, BenchRow};
pub use strategy::{Layout, RollbackStrategy, StepCost, StrategyCache, StrategySpec};
