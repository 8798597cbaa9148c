//! Per-point summaries of a run: α, τ, per-position acceptance, tokens/s, measured speedup
//! and the Leviathan et al. prediction; written as Markdown and CSV.
use serde::Serialize;

use super::config::GammaChoice;
use super::runner::ResultRecord;
use super::sweep::SweepPoint;

/// The measurements of one sweep point over all prompts (sums, then ratios of sums).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointSummary {
    /// Index of the point.
    pub point: usize,
    /// The point's label.
    pub label: String,
    /// The point's settings.
    pub settings: SweepPoint,
    /// Prompts generated.
    pub prompts: usize,
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
    /// new tokens / wall seconds.
    pub tokens_per_s: f64,
    /// tokens/s over the autoregressive point with the same sampling and cache.
    pub speedup: Option<f64>,
    /// c = seconds per draft forward / seconds per autoregressive target forward.
    pub cost_ratio: Option<f64>,
    /// Leviathan et al.: (1 − α^(γ+1)) / ((1 − α)(γc + 1)).
    pub predicted_speedup: Option<f64>,
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| num / den)
}

/// Sums the records of each point (in `points` order), then derives the ratios; speedups
/// and predictions refer to the autoregressive point with the same sampling and cache.
pub fn summarize(points: &[SweepPoint], records: &[ResultRecord]) -> Vec<PointSummary> {
    let mut rows: Vec<PointSummary> = points
        .iter()
        .enumerate()
        .map(|(i, p)| sum_point(i, p, records.iter().filter(|r| r.point == i)))
        .collect();
    let baselines: Vec<Option<(f64, f64)>> = rows
        .iter()
        .map(|row| {
            let base = rows
                .iter()
                .find(|b| b.settings.is_baseline_for(&row.settings))?;
            // Seconds per decode-phase target forward (prefills excluded).
            let per_forward = ratio(base.verify_s, (base.target_forwards - base.prompts) as f64);
            Some((base.tokens_per_s, per_forward.unwrap_or(0.0)))
        })
        .collect();
    for (row, base) in rows.iter_mut().zip(baselines) {
        let Some((base_tps, target_forward_s)) = base else {
            continue;
        };
        row.speedup = ratio(row.tokens_per_s, base_tps);
        if row.settings.gamma.is_none() {
            continue;
        }
        // Model drafters: seconds per draft forward. Model-free drafters run no forward:
        // seconds per proposed token instead.
        let draft_unit = if row.draft_forwards > 0 {
            ratio(row.draft_s, row.draft_forwards as f64)
        } else {
            ratio(row.draft_s, row.proposed as f64)
        };
        row.cost_ratio = draft_unit.and_then(|d| ratio(d, target_forward_s));
        row.predicted_speedup = predicted(row);
    }
    rows
}

fn sum_point<'a>(
    index: usize,
    point: &SweepPoint,
    records: impl Iterator<Item = &'a ResultRecord>,
) -> PointSummary {
    let mut s = PointSummary {
        point: index,
        label: point.label(),
        settings: point.clone(),
        prompts: 0,
        new_tokens: 0,
        target_forwards: 0,
        draft_forwards: 0,
        proposed: 0,
        accepted: 0,
        steps: 0,
        wall_s: 0.0,
        draft_s: 0.0,
        verify_s: 0.0,
        alpha: None,
        tau: None,
        acceptance_at: Vec::new(),
        mean_proposed: None,
        tokens_per_s: 0.0,
        speedup: None,
        cost_ratio: None,
        predicted_speedup: None,
    };
    let (mut acc_at, mut prop_at) = (Vec::<usize>::new(), Vec::<usize>::new());
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
        add_into(&mut acc_at, &g.accepted_at);
        add_into(&mut prop_at, &g.proposed_at);
    }
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
    s.tokens_per_s = ratio(s.new_tokens as f64, s.wall_s).unwrap_or(0.0);
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

/// The summary table in Markdown (also printed to stdout).
pub fn markdown_table(rows: &[PointSummary]) -> String {
    let mut out = String::from(
        "| # | method | drafter | γ | sampling | α | τ | accept/position | tok/s | speedup | c | predicted |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let p = &r.settings;
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} |\n",
            r.point,
            p.method,
            p.drafter.as_deref().unwrap_or("—"),
            p.gamma_label(),
            p.setting_label(),
            opt(r.alpha, 3),
            opt(r.tau, 2),
            positions(r),
            r.tokens_per_s,
            opt(r.speedup, 2),
            opt(r.cost_ratio, 3),
            opt(r.predicted_speedup, 2),
        );
    }
    out
}

/// `summary.md`: a title, the definitions of every column, the table.
pub fn markdown(title: &str, context: &str, rows: &[PointSummary]) -> String {
    format!(
        "# {title}\n\n{context}\n\n{}\n## Definitions\n\n{DEFINITIONS}",
        markdown_table(rows)
    )
}

const DEFINITIONS: &str = "All quantities sum over the prompts of a point first, then divide.

* **α** = drafts accepted / drafts proposed.
* **τ** = (new tokens − prompts) / (target forwards − prompts): new tokens per target forward in \
the decode phase. The prefill forward of each prompt (which yields the first new token) is left \
out of both counts, so τ = 1 for autoregressive decoding and τ = mean accepted drafts + 1 for \
speculative decoding (less where EOS or `max_new_tokens` cut a step short).
* **accept/position** — entry i: steps in which draft i was accepted / steps in which draft i \
was proposed (acceptance of draft i implies acceptance of drafts 1..i−1).
* **tok/s** = new tokens / wall seconds of the generations (prefill included).
* **speedup** = tok/s / tok/s of the autoregressive point with the same sampling and cache, \
measured in this run.
* **c** = seconds per draft forward (`draft_s / draft_forwards`) / seconds per decode-phase \
target forward of the matching autoregressive point (`verify_s / (target_forwards − prompts)`). \
Model-free drafters run no forward: their c uses seconds per proposed draft token instead.
* **predicted** = Leviathan et al. (2023), (1 − α^(γ+1)) / ((1 − α)(γc + 1)), from the measured α \
and c, with the nominal γ (for adaptive γ, the mean number of drafts proposed per step). It \
assumes every step proposes γ drafts; drafters that propose fewer (n-gram misses, a confidence \
cut-off) fall short of it.
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
         mean_proposed,tokens_per_s,speedup,cost_ratio,predicted_speedup",
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
