//! What `exp` prints when a run ends, answer first: per drafter and sampling setting the
//! fastest speculative point, then the one-line checks, then where the full tables are. Every
//! table stays in summary.md; the terminal gets a screenful.
use std::path::Path;

use crate::experiment::summary::PointSummary;

/// Most rows of the answer's table; further groups are counted, not shown.
const MAX_ROWS: usize = 24;

/// For each (drafter, sampling setting), the speculative row with the highest measured
/// speedup, ordered by drafter then sampling.
pub fn best_points(rows: &[PointSummary]) -> Vec<&PointSummary> {
    let mut best: Vec<&PointSummary> = Vec::new();
    for row in rows.iter().filter(|r| r.settings.gamma.is_some()) {
        let Some(speedup) = row.speedup else { continue };
        let key = |r: &PointSummary| (r.settings.drafter.clone(), r.settings.sampling_label());
        match best.iter().position(|b| key(b) == key(row)) {
            Some(i) if best[i].speedup.is_some_and(|s| s >= speedup) => {}
            Some(i) => best[i] = row,
            None => best.push(row),
        }
    }
    best.sort_by(|a, b| {
        let (a, b) = (&a.settings, &b.settings);
        (&a.drafter, a.temperature, a.top_k)
            .partial_cmp(&(&b.drafter, b.temperature, b.top_k))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.top_p.total_cmp(&b.top_p))
    });
    best
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

/// The answer's table: one row per [`best_points`] entry, with the cache strategy, prefix
/// store and engine options as columns only where the run varied them.
fn best_table(rows: &[PointSummary]) -> String {
    let best = best_points(rows);
    if best.is_empty() {
        return "No speculative point with an autoregressive baseline: every point's tok/s is in \
                summary.md.\n"
            .into();
    }
    let varies = |f: &dyn Fn(&PointSummary) -> String| {
        let first = f(&rows[0]);
        rows.iter().any(|r| f(r) != first)
    };
    let cache = varies(&|r| r.settings.cache.to_string());
    let store = varies(&|r| r.settings.prefix_cache.to_string());
    let engine = rows.iter().any(|r| !r.settings.engine_swept.is_empty());
    let mut out = String::from(
        "Fastest point per drafter and sampling setting. Speedup: the median over prompts and\n\
         repeats of tok/s / tok/s of autoregressive decoding at the same settings [95% interval].\n\n\
         | drafter | sampling | γ | speedup [95%] | α | τ |",
    );
    let extra = [
        (cache, " cache |"),
        (store, " prefix store |"),
        (engine, " engine |"),
    ];
    let mut rule = String::from("|---|---|---|---|---|---|");
    for (shown, head) in extra {
        if shown {
            out += head;
            rule += "---|";
        }
    }
    out += " point |\n";
    out += &(rule + "---|\n");
    for r in best.iter().take(MAX_ROWS) {
        let p = &r.settings;
        let interval = r
            .speedup_interval
            .map_or_else(String::new, |(lo, hi)| format!(" [{lo:.2}, {hi:.2}]"));
        out += &format!(
            "| {} | {} | {} | {}{interval} | {} | {} |",
            p.drafter.as_deref().unwrap_or("—"),
            p.sampling_label(),
            p.gamma_label(),
            num(r.speedup, 2),
            num(r.alpha, 3),
            num(r.tau, 2),
        );
        if cache {
            out += &format!(" {} |", p.cache);
        }
        if store {
            out += if p.prefix_cache { " on |" } else { " off |" };
        }
        if engine {
            out += &format!(" {} |", p.engine_label());
        }
        out += &format!(" #{} |\n", r.point);
    }
    if best.len() > MAX_ROWS {
        out += &format!("\n… and {} more in summary.md.\n", best.len() - MAX_ROWS);
    }
    out
}

/// The terminal's text: the fastest points, the `checks` (one line each), the flagged rows'
/// count, and where in `dir` the full tables and `plots` are.
pub fn answer(rows: &[PointSummary], checks: &[String], dir: &Path, plots: usize) -> String {
    let mut out = best_table(rows);
    let speculative = rows.iter().filter(|r| r.settings.gamma.is_some()).count();
    let flagged = rows
        .iter()
        .filter(|r| r.cost.as_ref().is_some_and(|c| c.flag.is_some()))
        .count();
    out += "\nChecks:\n";
    for check in checks {
        out += &format!("* {check}\n");
    }
    if flagged > 0 {
        out += &format!(
            "* {flagged} of {speculative} speculative points flagged: measured speedup off the \
             time-accounting model (reasons under the table in summary.md).\n"
        );
    }
    let summary = dir.join("summary.md");
    out += &format!(
        "\nEvery point, the definitions and every section: {}\n\
         Also: summary.csv, by_prompt.md, plots/ ({plots} SVG plots), results.jsonl, config.toml.\n",
        summary.display()
    );
    out
}
