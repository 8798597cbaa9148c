//! The time-accounting cost model of a speculative point: what one verification step costs,
//! in target decode forwards, and the speedup those costs predict.
//!
//! Per paired (repeat, prompt) generation, with `t` = seconds per decode forward of the
//! autoregressive generation of the same prompt and repeat: a speculative step costs `γc·t`
//! drafting, `v·t` verifying (one target forward over γ + 1 tokens, the acceptance test and
//! the commit) and `o·t` engine work outside both, and yields τ tokens; an autoregressive
//! token costs `t`. So the decode phase runs `τ / (γc + v + o)` times as fast as
//! autoregressive decoding: prediction (b). Every term is the median over pairs, like the
//! measured speedup. (b) leaves out prefill (time to first token), which speculation does not
//! speed up. A verification forward over γ + 1 ≥ 2 tokens reads the same weights as a decode
//! forward and more activations, so `v < 1` means the baseline's decode step was slower than
//! it should be (a slower kernel for one row, or the machine's speed drifting between them).
use serde::Serialize;

use crate::experiment::stats::median;
use crate::speculative::GenerationRecord;
use crate::stats::ratio;

/// Relative distance between the measured speedup and (b) above which a row is flagged.
pub const TOLERANCE: f64 = 0.10;

/// The measured terms of one speculative point and what they predict (medians over pairs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostModel {
    /// Seconds per decode forward of the paired autoregressive generations.
    pub t_s: f64,
    /// γc: drafting seconds per step / t (γ as actually drafted; c per draft forward is
    /// `PointSummary::cost_ratio`).
    pub draft_per_step: f64,
    /// v: verification seconds per step / t.
    pub v: f64,
    /// o: seconds per step outside drafting, verification and prefill / t.
    pub overhead: f64,
    /// Share of the point's wall time outside drafting, verification and prefill.
    pub overhead_share: f64,
    /// Share of the point's wall time in prefill (target and draft model).
    pub prefill_share: f64,
    /// Share of the autoregressive point's wall time in prefill.
    pub base_prefill_share: f64,
    /// (b) = τ / (γc + v + o).
    pub predicted: f64,
    /// τ / v: the decode-phase speedup if drafting and overhead were free.
    pub bound: f64,
    /// Why the measured speedup disagrees with (b) or exceeds τ / v, or why v < 1; `None`
    /// when everything agrees.
    pub flag: Option<String>,
}

/// What was measured of a speculative point against its baseline, for the cost model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Median paired speedup (end to end).
    pub speedup: f64,
    /// Its 95% interval.
    pub interval: (f64, f64),
    /// Median paired speedup of the decode phase (wall − prefill).
    pub decode_speedup: Option<f64>,
}

/// The terms of one pair: (t, γc, v, o, τ); `None` when a term cannot be measured (no
/// decode forward, no step).
fn pair_terms(spec: &GenerationRecord, base: &GenerationRecord) -> Option<[f64; 5]> {
    let t = ratio(base.verify_s, base.target_forwards.saturating_sub(1) as f64)?;
    let steps = spec.proposed.len() as f64;
    let unit = |secs: f64| ratio(secs / steps, t);
    let tau = ratio(
        spec.new_tokens().saturating_sub(1) as f64,
        spec.target_forwards.saturating_sub(1) as f64,
    )?;
    Some([
        t,
        unit(spec.draft_s)?,
        unit(spec.verify_s)?,
        unit(spec.other_s())?,
        tau,
    ])
}

/// Where a point's wall seconds went, summed over its generations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeSplit {
    /// Wall seconds.
    pub wall_s: f64,
    /// Prefill seconds.
    pub prefill_s: f64,
    /// Seconds outside prefill, drafting and verification.
    pub other_s: f64,
}

/// The cost model of a speculative point from its generations paired with the autoregressive
/// ones of the same (repeat, prompt) (`pairs`: (speculative, autoregressive)), its time
/// `row` and the baseline's time `base`, with `measured` deciding the flag; `None` without a
/// pair whose terms can be measured.
pub fn cost_model(
    row: TimeSplit,
    base: TimeSplit,
    pairs: &[(&GenerationRecord, &GenerationRecord)],
    measured: Option<Measured>,
) -> Option<CostModel> {
    let terms: Vec<[f64; 5]> = pairs.iter().filter_map(|(s, b)| pair_terms(s, b)).collect();
    let med = |f: &dyn Fn(&[f64; 5]) -> Option<f64>| -> Option<f64> {
        median(&terms.iter().filter_map(f).collect::<Vec<_>>())
    };
    let mut model = CostModel {
        t_s: med(&|x| Some(x[0]))?,
        draft_per_step: med(&|x| Some(x[1]))?,
        v: med(&|x| Some(x[2]))?,
        overhead: med(&|x| Some(x[3]))?,
        overhead_share: ratio(row.other_s, row.wall_s)?,
        prefill_share: ratio(row.prefill_s, row.wall_s)?,
        base_prefill_share: ratio(base.prefill_s, base.wall_s)?,
        predicted: med(&|x| ratio(x[4], x[1] + x[2] + x[3]))?,
        bound: med(&|x| ratio(x[4], x[2]))?,
        flag: None,
    };
    model.flag = measured.and_then(|m| flag(&model, &m));
    Some(model)
}

/// The reason a row is flagged: measured above τ / v, or more than [`TOLERANCE`] away from
/// (b), with the likeliest cause among those the run measured.
pub fn flag(model: &CostModel, m: &Measured) -> Option<String> {
    let mut reasons = Vec::new();
    if model.v < 1.0 {
        reasons.push(format!(
            "v = {:.2} < 1: a verification forward of γ + 1 tokens measured cheaper than the \
             baseline's one-token decode forward (a slower kernel for one row, or speed drift)",
            model.v
        ));
    }
    // τ / v bounds the decode phase; end to end, the same prefill in both runs pulls a
    // slowdown towards 1 and can lift it above τ / v without anything being wrong.
    let decode = m.decode_speedup.unwrap_or(m.speedup);
    if decode > model.bound {
        reasons.push(format!(
            "decode-phase speedup {decode:.2} > τ/v = {:.2}: the baseline ran slower per \
             forward than verification (a kernel or speed drift between the runs)",
            model.bound
        ));
    }
    let off = m.speedup / model.predicted - 1.0;
    if off.abs() > TOLERANCE {
        reasons.push(format!(
            "measured {:.2} is {:+.0}% from (b) = {:.2}: {}",
            m.speedup,
            100.0 * off,
            model.predicted,
            cause(model, m)
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// The likeliest cause of a gap between the measured speedup and (b).
fn cause(model: &CostModel, m: &Measured) -> String {
    let decode_off = m.decode_speedup.map(|d| d / model.predicted - 1.0);
    match decode_off {
        Some(d) if d.abs() <= TOLERANCE => format!(
            "prefill, which (b) leaves out and speculation does not speed up, is {:.0}% of this \
             point's wall time against {:.0}% of the baseline's; the decode phase alone ran \
             {:.2}×, {:+.0}% from (b)",
            100.0 * model.prefill_share,
            100.0 * model.base_prefill_share,
            m.decode_speedup.unwrap_or(f64::NAN),
            100.0 * d
        ),
        _ if m.interval.0 <= model.predicted && model.predicted <= m.interval.1 => format!(
            "prompts differ (the per-prompt ratios' 95% interval [{:.2}, {:.2}] contains (b), \
             which is computed from sums over prompts)",
            m.interval.0, m.interval.1
        ),
        Some(d) => format!(
            "not explained by prefill (decode phase {:+.0}% from (b)) nor by the spread over \
             prompts: per-prompt costs vary more than the sums show, or the machine's speed \
             drifted within pairs",
            100.0 * d
        ),
        None => "no decode-phase measurement to compare".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(predicted: f64, bound: f64) -> CostModel {
        CostModel {
            t_s: 1e-3,
            draft_per_step: 0.5,
            v: 1.1,
            overhead: 0.05,
            overhead_share: 0.02,
            prefill_share: 0.2,
            base_prefill_share: 0.1,
            predicted,
            bound,
            flag: None,
        }
    }

    fn measured(speedup: f64, interval: (f64, f64), decode: f64) -> Measured {
        Measured {
            speedup,
            interval,
            decode_speedup: Some(decode),
        }
    }

    #[test]
    fn a_row_within_tolerance_is_not_flagged() {
        assert_eq!(
            flag(&model(2.0, 3.0), &measured(2.15, (2.0, 2.3), 2.2)),
            None
        );
        assert_eq!(
            flag(&model(2.0, 3.0), &measured(1.85, (1.7, 2.0), 1.9)),
            None
        );
    }

    #[test]
    fn a_row_above_tau_over_v_is_flagged_even_when_it_matches_b() {
        let f = flag(&model(2.0, 1.9), &measured(2.0, (1.9, 2.1), 2.0)).unwrap();
        assert!(f.contains("speedup 2.00 > τ/v = 1.90"), "{f}");
        assert!(!f.contains("from (b)"), "{f}");
    }

    #[test]
    fn a_gap_explained_by_prefill_names_prefill() {
        let f = flag(&model(2.0, 3.0), &measured(1.6, (1.5, 1.7), 1.95)).unwrap();
        assert!(f.contains("-20% from (b) = 2.00"), "{f}");
        assert!(
            f.contains("prefill") && f.contains("20% of this point"),
            "{f}"
        );
    }

    #[test]
    fn a_gap_inside_the_interval_names_the_spread_over_prompts() {
        let f = flag(&model(2.0, 3.0), &measured(1.6, (1.2, 2.1), 1.5)).unwrap();
        assert!(f.contains("prompts differ"), "{f}");
    }

    #[test]
    fn an_unexplained_gap_says_so() {
        let f = flag(&model(2.0, 3.0), &measured(2.6, (2.5, 2.7), 2.7)).unwrap();
        assert!(
            f.contains("+30% from (b)") && f.contains("not explained"),
            "{f}"
        );
    }

    #[test]
    fn a_verification_cheaper_than_a_decode_step_is_flagged() {
        let mut m = model(2.0, 3.0);
        m.v = 0.8;
        let f = flag(&m, &measured(2.0, (1.9, 2.1), 2.0)).unwrap();
        assert!(f.starts_with("v = 0.80 < 1"), "{f}");
    }

    fn generation(new: usize, forwards: usize, steps: usize, times: [f64; 4]) -> GenerationRecord {
        let [prefill_s, draft_s, verify_s, other_s] = times;
        GenerationRecord {
            output_ids: vec![1; new],
            proposed: vec![4; steps],
            accepted: vec![2; steps],
            target_forwards: forwards,
            prefill_s,
            draft_s,
            verify_s,
            wall_s: prefill_s + draft_s + verify_s + other_s,
            ..GenerationRecord::default()
        }
    }

    #[test]
    fn the_model_adds_up_from_the_paired_times() {
        // AR: 30 decode forwards in 30 ms (t = 1 ms). Speculative: 10 steps of τ = 3 tokens,
        // 0.8 ms drafting, 1.2 ms verifying and 0.1 ms else per step.
        let base = generation(31, 31, 0, [0.002, 0.0, 0.030, 0.0]);
        let spec = generation(31, 11, 10, [0.002, 0.008, 0.012, 0.001]);
        assert_eq!((base.new_tokens(), spec.new_tokens()), (31, 31));
        let time = |g: &GenerationRecord| TimeSplit {
            wall_s: g.wall_s,
            prefill_s: g.prefill_s,
            other_s: g.other_s(),
        };
        let m = cost_model(time(&spec), time(&base), &[(&spec, &base)], None).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(m.t_s, 1e-3) && close(m.draft_per_step, 0.8), "{m:?}");
        assert!(close(m.v, 1.2) && close(m.overhead, 0.1), "{m:?}");
        assert!(
            close(m.predicted, 3.0 / 2.1) && close(m.bound, 2.5),
            "{m:?}"
        );
        assert_eq!(m.flag, None);
    }
}
