//! Per-point summaries of a run: α, τ, per-position acceptance, tokens/s, measured speedup
//! and the Leviathan et al. prediction; written as Markdown and CSV.
use serde::Serialize;

use super::config::GammaChoice;
use super::cost::CostModel;
use super::paired::against_baseline;
use super::runner::ResultRecord;
use super::stats::median;
use super::sweep::SweepPoint;
use crate::stats::ratio;

/// The measurements of one sweep point over all prompts (sums, then ratios of sums).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointSummary {
    /// Index of the point.
    pub point: usize,
    /// The point's label.
    pub label: String,
    /// The point's settings.
    pub settings: SweepPoint,
    /// Generations run (prompts × repeats).
    pub prompts: usize,
    /// Repeats of every prompt.
    pub repeats: usize,
    /// New tokens, all prompts.
    pub new_tokens: usize,
    /// Target forwards, prefills included.
    pub target_forwards: usize,
    /// Draft-model forwards.
    pub draft_forwards: usize,
    /// Drafts proposed.
    pub proposed: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Verification steps.
    pub steps: usize,
    /// Wall seconds of all generations.
    pub wall_s: f64,
    /// Drafting seconds.
    pub draft_s: f64,
    /// Target seconds after prefill.
    pub verify_s: f64,
    /// Prefill seconds (target, and draft model where there is one): time to first token.
    pub prefill_s: f64,
    /// Seconds outside prefill, drafting and verification.
    pub other_s: f64,
    /// α = accepted / proposed (None when nothing was proposed).
    pub alpha: Option<f64>,
    /// τ = (new tokens − prompts) / (target forwards − prompts): tokens per decode-phase
    /// target forward, the prefill forward and the token it yields left out (1 for
    /// autoregressive decoding).
    pub tau: Option<f64>,
    /// `[i]`: accepted_at[i] / proposed_at[i], P(draft i+1 accepted | it was proposed).
    pub acceptance_at: Vec<f64>,
    /// Mean drafts proposed per step.
    pub mean_proposed: Option<f64>,
    /// Median over repeats of (new tokens / wall seconds) of each repeat's prompts.
    pub tokens_per_s: f64,
    /// Median over (repeat, prompt) pairs of tokens/s / tokens/s of the same prompt and
    /// repeat at the autoregressive point with the same sampling and cache.
    pub speedup: Option<f64>,
    /// 95% bootstrap interval of `speedup`: (low, high).
    pub speedup_interval: Option<(f64, f64)>,
    /// Paired (repeat, prompt) ratios behind `speedup`.
    pub pairs: usize,
    /// Like `speedup`, for the decode phase only (tokens after the first / (wall − prefill)).
    pub decode_speedup: Option<f64>,
    /// The time-accounting cost model (speculative points with a baseline).
    pub cost: Option<CostModel>,
    /// c = seconds per draft forward / seconds per autoregressive target forward.
    pub cost_ratio: Option<f64>,
    /// Leviathan et al.: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); assumes v = 1.
    pub predicted_speedup: Option<f64>,
}

impl PointSummary {
    /// A summary of `point` with nothing measured yet.
    pub fn empty(index: usize, point: &SweepPoint) -> Self {
        Self {
            point: index,
            label: point.label(),
            settings: point.clone(),
            prompts: 0,
            repeats: 0,
            new_tokens: 0,
            target_forwards: 0,
            draft_forwards: 0,
            proposed: 0,
            accepted: 0,
            steps: 0,
            wall_s: 0.0,
            draft_s: 0.0,
            verify_s: 0.0,
            prefill_s: 0.0,
            other_s: 0.0,
            alpha: None,
            tau: None,
            acceptance_at: Vec::new(),
            mean_proposed: None,
            tokens_per_s: 0.0,
            speedup: None,
            speedup_interval: None,
            pairs: 0,
            decode_speedup: None,
            cost: None,
            cost_ratio: None,
            predicted_speedup: None,
        }
    }
}

/// Sums the records of each point (in `points` order), then derives the ratios; speedups,
/// costs and predictions refer to the autoregressive point with the same sampling and cache,
/// paired by (repeat, prompt).
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

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

fn positions(row: &PointSummary) -> String {
    let shown: Vec<String> = row
        .acceptance_at
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    if shown.is_empty() {
        "—".into()
    } else {
        shown.join(" ")
    }
}

/// The summary table in Markdown (also printed to stdout), followed by the flagged rows
/// with their reasons.
pub fn markdown_table(rows: &[PointSummary]) -> String {
    let mut out = String::from(
        "| # | method | drafter | γ | sampling | α | τ | accept/position | tok/s | speedup [95%] | c | v | o | (a) Leviathan, v = 1 | (b) τ/(γc+v+o) | flag |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let p = &r.settings;
        let cost = r.cost.as_ref();
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.point,
            p.method,
            p.drafter.as_deref().unwrap_or("—"),
            p.gamma_label(),
            p.setting_label(),
            opt(r.alpha, 3),
            opt(r.tau, 2),
            positions(r),
            r.tokens_per_s,
            speedup_cell(r),
            opt(r.cost_ratio, 3),
            opt(cost.map(|c| c.v), 2),
            opt(cost.map(|c| c.overhead), 2),
            opt(r.predicted_speedup, 2),
            opt(cost.map(|c| c.predicted), 2),
            if cost.is_some_and(|c| c.flag.is_some()) { "**flagged**" } else { "" },
        );
    }
    let flagged: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            Some(format!(
                "* #{} `{}`: {}\n",
                r.point,
                r.label,
                r.cost.as_ref()?.flag.as_ref()?
            ))
        })
        .collect();
    if !flagged.is_empty() {
        out += "\nFlagged rows (measured speedup more than 10% from (b), or above τ / v):\n\n";
        out += &flagged.concat();
    }
    out
}

fn speedup_cell(r: &PointSummary) -> String {
    match (r.speedup, r.speedup_interval) {
        (Some(s), Some((lo, hi))) if r.settings.gamma.is_some() => {
            format!("{s:.2} [{lo:.2}, {hi:.2}]")
        }
        (s, _) => opt(s, 2),
    }
}

/// `summary.md`: a title, the definitions of every column, the table.
pub fn markdown(title: &str, context: &str, rows: &[PointSummary]) -> String {
    format!(
        "# {title}\n\n{context}\n\n{}\n## Definitions\n\n{DEFINITIONS}",
        markdown_table(rows)
    )
}

const DEFINITIONS: &str = "Counts and times sum over the generations of a point (every prompt, \
every repeat) first, then divide; tok/s and speedup are medians.

* **α** = drafts accepted / drafts proposed.
* **τ** = (new tokens − generations) / (target forwards − generations): new tokens per target \
forward in the decode phase. The prefill forward of each generation (which yields the first new \
token) is left out of both counts, so τ = 1 for autoregressive decoding and τ = mean accepted \
drafts + 1 for speculative decoding (less where EOS or `max_new_tokens` cut a step short).
* **accept/position** — entry i: steps in which draft i was accepted / steps in which draft i \
was proposed (acceptance of draft i implies acceptance of drafts 1..i−1).
* **tok/s** = new tokens / wall seconds of a repeat's generations (prefill included), the median \
over repeats.
* **speedup** = the median over (repeat, prompt) pairs of this point's tok/s / the tok/s of the \
same prompt in the same repeat at the autoregressive point with the same sampling and cache; in \
brackets its 95% percentile-bootstrap interval. With `order = \"interleaved\"` the two ran back \
to back.
* **c** = seconds per draft forward (`draft_s / (draft_forwards − generations)`: the draft's prompt \
prefill is booked as prefill) / seconds per decode-phase target forward of the matching \
autoregressive point, t = `verify_s / (target_forwards − generations)`. Model-free drafters run \
no forward: their c uses seconds per proposed draft token instead.
* **v** = seconds per verification step (one target forward over the γ + 1 tokens, acceptance \
test and commit) / t. **o** = seconds per step outside prefill, drafting and verification \
(engine overhead) / t.
* **(a)** = Leviathan et al. (2023), (1 − α^(γ+1)) / ((1 − α)(γc + 1)), from the measured α and \
c with the nominal γ (for adaptive γ, the mean drafts proposed per step). It assumes v = 1 and \
that every step proposes γ drafts.
* **(b)** = τ / (γc + v + o), with γc the drafting seconds per step / t (γ as actually drafted): \
the decode phase's time accounting. It leaves out prefill, which speculation does not speed up. \
A row is **flagged** when the measured speedup is more than 10% from (b) or above τ / v (the \
speedup if drafting were free), with the likeliest reason.
";

/// `summary.csv`: one row per point; `accept_pos_<i>` columns up to the longest draft.
pub fn csv(rows: &[PointSummary]) -> String {
    let width = rows
        .iter()
        .map(|r| r.acceptance_at.len())
        .max()
        .unwrap_or(0);
    let mut header = String::from(
        "point,label,method,drafter,gamma,temperature,top_k,top_p,cache,prompts,new_tokens,\
         target_forwards,draft_forwards,proposed,accepted,steps,wall_s,draft_s,verify_s,alpha,tau,\
         mean_proposed,tokens_per_s,speedup,cost_ratio,predicted_speedup,repeats,pairs,\
         speedup_low,speedup_high,decode_speedup,prefill_s,other_s,draft_per_step,v,overhead,\
         overhead_share,predicted_time_accounting,tau_over_v,flag",
    );
    for i in 1..=width {
        header += &format!(",accept_pos_{i}");
    }
    let mut out = header + "\n";
    let num = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.6}"));
    for r in rows {
        let p = &r.settings;
        out += &format!(
            "{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{},{},{},{:.4},{},{},{}",
            r.point,
            r.label.replace('"', "\"\""),
            p.method,
            p.drafter.as_deref().unwrap_or(""),
            p.gamma.map_or_else(String::new, |g| g.to_string()),
            p.temperature,
            p.top_k,
            p.top_p,
            p.cache,
            r.prompts,
            r.new_tokens,
            r.target_forwards,
            r.draft_forwards,
            r.proposed,
            r.accepted,
            r.steps,
            r.wall_s,
            r.draft_s,
            r.verify_s,
            num(r.alpha),
            num(r.tau),
            num(r.mean_proposed),
            r.tokens_per_s,
            num(r.speedup),
            num(r.cost_ratio),
            num(r.predicted_speedup),
        );
        out += &super::cost::csv_columns(r);
        for i in 0..width {
            out += ",";
            out += &r
                .acceptance_at
                .get(i)
                .map_or_else(String::new, |a| format!("{a:.6}"));
        }
        out += "\n";
    }
    out
}

/// What the `cache` sweep showed: tokens/s per rotating-cache strategy over the same points
/// and prompts, and whether greedy outputs were identical across strategies (strategies must
/// change cost, never results).
#[derive(Debug, Clone, PartialEq)]
pub struct StrategyCheck {
    /// `(strategy, new tokens, wall seconds)` summed over every point run with it.
    pub throughput: Vec<(String, usize, f64)>,
    /// Greedy (point, prompt) outputs compared against the same point with another strategy.
    pub compared: usize,
    /// `(label, prompt id)` of each comparison whose outputs differed.
    pub mismatches: Vec<(String, String)>,
}

impl StrategyCheck {
    /// Compares the records of points that differ only in `cache`.
    pub fn new(points: &[SweepPoint], records: &[ResultRecord]) -> Self {
        let mut throughput: Vec<(String, usize, f64)> = Vec::new();
        for r in records {
            let name = r.settings.cache.to_string();
            match throughput.iter_mut().find(|(n, _, _)| *n == name) {
                Some(entry) => {
                    entry.1 += r.new_tokens;
                    entry.2 += r.generation.wall_s;
                }
                None => throughput.push((name, r.new_tokens, r.generation.wall_s)),
            }
        }
        let same_but_cache = |a: &SweepPoint, b: &SweepPoint| {
            SweepPoint {
                cache: b.cache,
                ..a.clone()
            } == *b
        };
        let (mut compared, mut mismatches) = (0, Vec::new());
        for r in records.iter().filter(|r| r.settings.temperature == 0.0) {
            // Compare each record with the first point (lowest index) of its group.
            let Some(base) = points
                .iter()
                .position(|p| same_but_cache(&points[r.point], p))
            else {
                continue;
            };
            if base == r.point {
                continue;
            }
            let other = records
                .iter()
                .find(|o| o.point == base && o.prompt_id == r.prompt_id && o.turn == r.turn);
            if let Some(other) = other {
                compared += 1;
                if other.generation.output_ids != r.generation.output_ids {
                    mismatches.push((r.label.clone(), r.prompt_id.clone()));
                }
            }
        }
        Self {
            throughput,
            compared,
            mismatches,
        }
    }

    /// A Markdown section.
    pub fn markdown(&self) -> String {
        let mut out = String::from("## Cache strategies\n\n| cache | new tokens | seconds | tok/s |\n|---|---:|---:|---:|\n");
        for (name, tokens, secs) in &self.throughput {
            let rate = ratio(*tokens as f64, *secs).unwrap_or(0.0);
            out.push_str(&format!("| {name} | {tokens} | {secs:.3} | {rate:.1} |\n"));
        }
        out.push('\n');
        if self.compared == 0 {
            out.push_str("Greedy outputs across strategies: nothing to compare (the sweep has one `cache` value or no greedy points).\n");
        } else if self.mismatches.is_empty() {
            out.push_str(&format!(
                "Greedy outputs across strategies: **identical** ({} generations compared with the same point under another strategy).\n",
                self.compared
            ));
        } else {
            out.push_str(&format!(
                "Greedy outputs across strategies: **{} of {} differ**:",
                self.mismatches.len(),
                self.compared
            ));
            for (label, prompt) in &self.mismatches {
                out.push_str(&format!(" `{label}` on `{prompt}`;"));
            }
            out.push('\n');
        }
        out
    }
}
