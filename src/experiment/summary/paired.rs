//! What a point measured against its autoregressive baseline, paired by (repeat, prompt,
//! turn):
//! the speedup with its interval, the decode-phase speedup, c and the cost model.
use super::cost::{cost_model, Measured};
use super::point::PointSummary;
use crate::experiment::runner::ResultRecord;
use crate::experiment::stats::{median, median_interval, paired_ratios};
use crate::stats::ratio;

/// Fills `row`'s speedups (every point) and, for speculative points, `cost_ratio` and `cost`
/// from the records of `row.point` and of its baseline `base`.
pub(crate) fn against_baseline(
    row: &mut PointSummary,
    base: &PointSummary,
    records: &[ResultRecord],
) {
    let (i, b) = (row.point, base.point);
    let ends = paired(records, i, b, ResultRecord::tokens_per_s_of);
    let decode = paired(records, i, b, ResultRecord::decode_tokens_per_s);
    let interval = median_interval(&ends);
    row.pairs = ends.len();
    row.speedup = interval.map(|m| m.median);
    row.speedup_interval = interval.map(|m| (m.low, m.high));
    row.decode_speedup = median(&decode);
    if row.settings.gamma.is_none() {
        return;
    }
    // Model drafters: seconds per draft forward, the draft's prefill forward (booked as
    // prefill) left out. Model-free drafters run no forward: seconds per proposed token.
    let draft_unit = if row.draft_forwards > 0 {
        ratio(
            row.draft_s,
            row.draft_forwards.saturating_sub(row.prompts) as f64,
        )
    } else {
        ratio(row.draft_s, row.proposed as f64)
    };
    let target_forward_s = ratio(
        base.verify_s,
        base.target_forwards.saturating_sub(base.prompts) as f64,
    );
    row.cost_ratio = draft_unit
        .zip(target_forward_s)
        .and_then(|(d, t)| ratio(d, t));
    let measured = interval.map(|m| Measured {
        speedup: m.median,
        interval: (m.low, m.high),
        decode_speedup: row.decode_speedup,
    });
    let pairs: Vec<_> = records
        .iter()
        .filter(|r| r.point == i)
        .filter_map(|r| {
            let other = records.iter().find(|o| {
                o.point == b
                    && o.repeat == r.repeat
                    && o.prompt_id == r.prompt_id
                    && o.turn == r.turn
            })?;
            Some((&r.generation, &other.generation))
        })
        .collect();
    row.cost = cost_model(row.time(), base.time(), &pairs, measured);
}

/// Ratios `metric(record of point) / metric(record of base)` paired by (repeat, prompt,
/// turn).
fn paired(
    records: &[ResultRecord],
    point: usize,
    base: usize,
    metric: fn(&ResultRecord) -> Option<f64>,
) -> Vec<f64> {
    let of = |p: usize| -> Vec<((usize, &str, usize), f64)> {
        records
            .iter()
            .filter(|r| r.point == p)
            .filter_map(|r| Some(((r.repeat, r.prompt_id.as_str(), r.turn), metric(r)?)))
            .collect()
    };
    paired_ratios(&of(point), &of(base))
}

impl ResultRecord {
    /// New tokens per wall second.
    fn tokens_per_s_of(&self) -> Option<f64> {
        ratio(self.new_tokens as f64, self.generation.wall_s)
    }

    /// Tokens after the first per second after prefill.
    fn decode_tokens_per_s(&self) -> Option<f64> {
        let g = &self.generation;
        ratio(
            self.new_tokens.saturating_sub(1) as f64,
            g.wall_s - g.prefill_s,
        )
    }
}
