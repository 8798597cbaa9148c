//! Per-point summaries of a run: α, τ, per-position acceptance, tokens/s, the measured
//! speedup against the autoregressive point of the same settings (paired by repeat, prompt
//! and turn), the time-accounting cost model and the Leviathan et al. prediction.
//!
//! `point.rs` holds [`PointSummary`]; `paired.rs` what a point measured against its
//! baseline; `cost.rs` the cost model. How summaries are written lives in `report/`.
mod cost;
mod paired;
mod point;

pub use cost::{CostModel, Measured, TimeSplit, TOLERANCE};
pub use point::PointSummary;

use crate::experiment::config::GammaChoice;
use crate::experiment::runner::ResultRecord;
use crate::experiment::stats::median;
use crate::experiment::sweep::SweepPoint;
use paired::against_baseline;
pub(crate) use point::ratio;

/// Sums the records of each point (in `points` order), then derives the ratios; speedups,
/// costs and predictions refer to the autoregressive point with the same sampling, cache
/// and engine options, paired by (repeat, prompt).
pub fn summarize(points: &[SweepPoint], records: &[ResultRecord]) -> Vec<PointSummary> {
    let mut rows: Vec<PointSummary> = points
        .iter()
        .enumerate()
        .map(|(i, p)| sum_point(i, p, records.iter().filter(|r| r.point == i)))
        .collect();
    let bases: Vec<Option<usize>> = rows
        .iter()
        .map(|row| {
            rows.iter()
                .position(|b| b.settings.is_baseline_for(&row.settings))
        })
        .collect();
    for (i, base) in bases.into_iter().enumerate() {
        let Some(base) = base else { continue };
        let base_row = rows[base].clone();
        against_baseline(&mut rows[i], &base_row, records);
        if rows[i].settings.gamma.is_some() {
            rows[i].predicted_speedup = predicted(&rows[i]);
        }
    }
    rows
}

fn sum_point<'a>(
    index: usize,
    point: &SweepPoint,
    records: impl Iterator<Item = &'a ResultRecord>,
) -> PointSummary {
    let mut s = PointSummary::empty(index, point);
    let (mut acc_at, mut prop_at) = (Vec::<usize>::new(), Vec::<usize>::new());
    // Per repeat: (new tokens, wall seconds).
    let mut per_repeat: Vec<(usize, f64)> = Vec::new();
    for r in records {
        let g = &r.generation;
        s.prompts += 1;
        s.new_tokens += r.new_tokens;
        s.target_forwards += g.target_forwards;
        s.draft_forwards += g.draft_forwards;
        s.proposed += g.proposed.iter().sum::<usize>();
        s.accepted += g.accepted.iter().sum::<usize>();
        s.steps += g.proposed.len();
        s.wall_s += g.wall_s;
        s.draft_s += g.draft_s;
        s.verify_s += g.verify_s;
        s.prefill_s += g.prefill_s;
        s.other_s += g.other_s();
        add_into(&mut acc_at, &g.accepted_at);
        add_into(&mut prop_at, &g.proposed_at);
        if per_repeat.len() <= r.repeat {
            per_repeat.resize(r.repeat + 1, (0, 0.0));
        }
        per_repeat[r.repeat].0 += r.new_tokens;
        per_repeat[r.repeat].1 += g.wall_s;
    }
    s.repeats = per_repeat.iter().filter(|(_, w)| *w > 0.0).count();
    s.alpha = ratio(s.accepted as f64, s.proposed as f64);
    s.tau = ratio(
        s.new_tokens.saturating_sub(s.prompts) as f64,
        s.target_forwards.saturating_sub(s.prompts) as f64,
    );
    s.acceptance_at = acc_at
        .iter()
        .zip(&prop_at)
        .map(|(&a, &p)| ratio(a as f64, p as f64).unwrap_or(0.0))
        .collect();
    s.mean_proposed = ratio(s.proposed as f64, s.steps as f64);
    let rates: Vec<f64> = per_repeat
        .iter()
        .filter_map(|&(n, w)| ratio(n as f64, w))
        .collect();
    s.tokens_per_s = median(&rates).unwrap_or(0.0);
    s
}

fn add_into(total: &mut Vec<usize>, add: &[usize]) {
    if total.len() < add.len() {
        total.resize(add.len(), 0);
    }
    for (t, a) in total.iter_mut().zip(add) {
        *t += a;
    }
}

/// `(1 − α^(γ+1)) / ((1 − α)(γc + 1))` with the nominal γ (adaptive: the mean proposed).
fn predicted(row: &PointSummary) -> Option<f64> {
    let alpha = row.alpha?;
    let c = row.cost_ratio?;
    let gamma = match row.settings.gamma? {
        GammaChoice::Fixed(g) => g as f64,
        GammaChoice::Adaptive => row.mean_proposed?,
    };
    let expected_tokens = if (1.0 - alpha).abs() < 1e-12 {
        gamma + 1.0
    } else {
        (1.0 - alpha.powf(gamma + 1.0)) / (1.0 - alpha)
    };
    Some(expected_tokens / (gamma * c + 1.0))
}
