//! The timing loop: prefill once per length and layout, start every strategy from a snapshot
//! of that prefill, and take the median of repeated steps per cell.
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use super::config::{BenchConfig, Pattern};
use super::strategy::{Layout, RollbackStrategy, StepCost, StrategyCache, StrategySpec};
use crate::cache::{
    CacheSnapshot, KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy,
};
use crate::error::Result;
use crate::stats::median;

/// One cell of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The strategy.
    pub strategy: RollbackStrategy,
    /// Cache length (KV: tokens held; rotating: the window, filled past wrapping).
    pub length: usize,
    /// Draft length: a step appends γ+1 tokens.
    pub gamma: usize,
    /// Acceptance pattern.
    pub pattern: Pattern,
    /// Timed steps.
    pub runs: usize,
    /// Median µs of a whole step (append + commit/rollback).
    pub step_us: f64,
    /// Median µs of the commit/rollback alone.
    pub rollback_us: f64,
    /// Mean bytes copied per step beyond writing the new K/V once.
    pub bytes_copied: f64,
    /// Most extra bytes held during a step.
    pub bytes_held: usize,
}

/// A plain cache of `layout` holding `length` tokens (rotating: a window of `length` filled
/// with `length + length / 8` tokens, so the ring has wrapped), snapshotted from position 0,
/// and its offset.
pub fn prefilled(
    layout: Layout,
    length: usize,
    config: &BenchConfig,
) -> Result<(CacheSnapshot, usize)> {
    let layer = || -> Result<LayerCache> {
        Ok(match layout {
            Layout::Kv => LayerCache::Kv(KvCache::default()),
            Layout::Rotating => {
                LayerCache::Rotating(RotatingKvCache::new(length, RotatingStrategy::Staged)?)
            }
        })
    };
    let mut cache = ModelCache::new((0..config.layers).map(|_| layer()).collect::<Result<_>>()?);
    // KV: single tokens need no mask; rotating: chunks keep the number of window copies low.
    let (total, chunk) = match layout {
        Layout::Kv => (length, 1),
        Layout::Rotating => (length + length / 8, (length / 8).max(1)),
    };
    let data = random_kv(config, total)?;
    let mut at = 0;
    while at < total {
        let n = chunk.min(total - at);
        for i in 0..config.layers {
            let (k, v) = (data.0.narrow(2, at, n)?, data.1.narrow(2, at, n)?);
            cache.layer_mut(i)?.append(&k, &v)?;
        }
        at += n;
    }
    Ok((cache.snapshot(0)?, total))
}

fn random_kv(config: &BenchConfig, tokens: usize) -> Result<(Tensor, Tensor)> {
    let shape = (1, config.kv_heads, tokens, config.head_dim);
    let k = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
    let v = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
    Ok((k, v))
}

/// The K/V of one step of draft length `gamma`: one `[1, kv_heads, γ+1, head_dim]` pair per
/// layer.
pub fn step_kv(config: &BenchConfig, gamma: usize) -> Result<Vec<(Tensor, Tensor)>> {
    (0..config.layers)
        .map(|_| random_kv(config, gamma + 1))
        .collect()
}

/// Runs the whole grid, calling `progress` after each cell.
pub fn measure(config: &BenchConfig, mut progress: impl FnMut(&BenchRow)) -> Result<Vec<BenchRow>> {
    config.validate()?;
    let strategies = config.strategy_list()?;
    let max_draft = config.gammas.iter().copied().max().unwrap_or(1);
    let mut rows = Vec::new();
    for &length in &config.lengths {
        for layout in [Layout::Kv, Layout::Rotating] {
            let used: Vec<RollbackStrategy> = strategies
                .iter()
                .copied()
                .filter(|s| s.layout() == layout)
                .collect();
            if used.is_empty() {
                continue;
            }
            let (snapshot, offset) = prefilled(layout, length, config)?;
            for strategy in used {
                let spec = StrategySpec {
                    strategy,
                    layers: config.layers,
                    window: length,
                    max_draft,
                };
                let mut cache = StrategyCache::new(spec)?;
                cache.restore_from(&snapshot, offset)?;
                for &gamma in &config.gammas {
                    let kv = step_kv(config, gamma)?;
                    for &pattern in &config.patterns {
                        if pattern == Pattern::Path && !strategy.transactional() {
                            continue;
                        }
                        let cell = Cell {
                            length,
                            gamma,
                            pattern,
                        };
                        let row = measure_cell(&mut cache, &kv, cell, config)?;
                        progress(&row);
                        rows.push(row);
                    }
                }
            }
        }
    }
    Ok(rows)
}

#[derive(Debug, Clone, Copy)]
struct Cell {
    length: usize,
    gamma: usize,
    pattern: Pattern,
}

/// Median of repeated steps (at least `min_runs`, more until `target_ms` has passed, at
/// most `max_runs`). KV layouts rewind to the prefill after each step (untimed);
/// rotating layouts keep stepping (their window stays full).
fn measure_cell(
    cache: &mut StrategyCache,
    kv: &[(Tensor, Tensor)],
    cell: Cell,
    config: &BenchConfig,
) -> Result<BenchRow> {
    let base = cache.offset();
    let rewind = cache.strategy().layout() == Layout::Kv;
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let parents: Vec<Option<usize>> = (0..=cell.gamma)
        .map(|i| i.checked_sub(1).map(|p| p / 2))
        .collect();
    let mut step = |cache: &mut StrategyCache| -> Result<StepCost> {
        let keep = match cell.pattern {
            Pattern::All | Pattern::Path => cell.gamma + 1,
            Pattern::None => 1,
            Pattern::Random => rng.random_range(1..=cell.gamma + 1),
        };
        let cost = if cell.pattern == Pattern::Path {
            let path = heap_path(rng.random_range(0..=cell.gamma));
            cache.step_path(kv, &parents, &path)?
        } else {
            cache.step(kv, keep)?
        };
        if rewind {
            cache.rewind(base)?;
        }
        Ok(cost)
    };
    let target = Duration::from_millis(config.target_ms);
    // A warm-up step, discarded unless it alone took `target_ms` or longer: slow cells are
    // dominated by bulk copies, which need no warming, and keep the default grid short.
    let first = step(cache)?;
    let mut costs = Vec::new();
    if first.append + first.finish >= target {
        costs.push(first);
    }
    let start = Instant::now();
    while costs.len() < config.max_runs
        && (costs.len() < config.min_runs || start.elapsed() < target)
    {
        costs.push(step(cache)?);
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let steps: Vec<f64> = costs.iter().map(|c| us(c.append + c.finish)).collect();
    let rollbacks: Vec<f64> = costs.iter().map(|c| us(c.finish)).collect();
    let n = costs.len();
    Ok(BenchRow {
        strategy: cache.strategy(),
        length: cell.length,
        gamma: cell.gamma,
        pattern: cell.pattern,
        runs: n,
        // No timed step (a grid with `max_runs = 0`) reports 0 µs.
        step_us: median(&steps).unwrap_or(0.0),
        rollback_us: median(&rollbacks).unwrap_or(0.0),
        bytes_copied: costs.iter().map(|c| c.bytes_copied as f64).sum::<f64>() / n as f64,
        bytes_held: costs.iter().map(|c| c.bytes_held).max().unwrap_or(0),
    })
}

/// The root-to-`node` path of the binary heap tree (node `i`'s parent is `(i − 1) / 2`).
fn heap_path(node: usize) -> Vec<usize> {
    let mut path = vec![node];
    let mut n = node;
    while n > 0 {
        n = (n - 1) / 2;
        path.push(n);
    }
    path.reverse();
    path
}

/// Median µs of an empty timed region (`Instant::now()` then `elapsed()`): the smallest time
/// the benchmark can report.
pub fn timer_floor_us() -> f64 {
    let samples: Vec<f64> = (0..10_000)
        .map(|_| {
            let start = Instant::now();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    median(&samples).unwrap_or(0.0)
}
