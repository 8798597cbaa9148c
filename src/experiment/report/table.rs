//! The summary table of a run in Markdown (`summary.md`, with the definitions of its
//! columns) and CSV (`summary.csv`).
use crate::experiment::summary::PointSummary;

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
same prompt in the same repeat at the autoregressive point with the same sampling, cache and \
engine options; in brackets its 95% percentile-bootstrap interval. With `order = \"interleaved\"` the two ran back \
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

/// `summary.csv`: one row per point; `engine` names the swept engine options with their
/// values; `accept_pos_<i>` columns up to the longest draft.
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
         overhead_share,predicted_time_accounting,tau_over_v,flag,engine",
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
        out += &csv_columns(r);
        out += &format!(",\"{}\"", p.engine_label());
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

/// The CSV columns from `repeats` to `flag` (see [`csv`]'s header).
fn csv_columns(r: &PointSummary) -> String {
    let num = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.6}"));
    let c = r.cost.as_ref();
    let flag = c
        .and_then(|c| c.flag.as_deref())
        .map_or_else(String::new, |f| format!("\"{}\"", f.replace('"', "\"\"")));
    format!(
        ",{},{},{},{},{},{:.6},{:.6},{},{},{},{},{},{},{flag}",
        r.repeats,
        r.pairs,
        num(r.speedup_interval.map(|i| i.0)),
        num(r.speedup_interval.map(|i| i.1)),
        num(r.decode_speedup),
        r.prefill_s,
        r.other_s,
        num(c.map(|c| c.draft_per_step)),
        num(c.map(|c| c.v)),
        num(c.map(|c| c.overhead)),
        num(c.map(|c| c.overhead_share)),
        num(c.map(|c| c.predicted)),
        num(c.map(|c| c.bound)),
    )
}
