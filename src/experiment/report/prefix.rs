//! The summary sections of prefix reuse and conversations: prefill tokens computed and
//! reused with time to first token per point, the prefix store's effect (store on against
//! the same point with it off: identical greedy outputs, time-to-first-token ratio), and
//! acceptance per turn.
use crate::experiment::runner::ResultRecord;
use crate::experiment::sweep::SweepPoint;
use crate::stats::median;

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |s| format!("{:.2}", s * 1e3))
}

/// Prefill tokens and time to first token per point (Markdown); empty when no point uses
/// the prefix store and no generation continues a conversation (nothing is reused then).
pub fn prefill_section(points: &[SweepPoint], records: &[ResultRecord]) -> String {
    if !points.iter().any(|p| p.prefix_cache) && records.iter().all(|r| r.turn < 2) {
        return String::new();
    }
    let mut out = String::from(
        "## Prefill and time to first token\n\n\
         Target prompt tokens run through the model (computed) or kept from the previous turn \
         / restored from the prefix store (reused), summed over the point's generations; \
         time to first token (TTFT): the target's prefill and the first sampling.\n\n\
         | point | generations | prefill computed | prefill reused | median TTFT ms | mean TTFT ms |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for (i, p) in points.iter().enumerate() {
        let rs: Vec<&ResultRecord> = records.iter().filter(|r| r.point == i).collect();
        if rs.is_empty() {
            continue;
        }
        let ttft: Vec<f64> = rs.iter().map(|r| r.generation.ttft_s).collect();
        let mean = ttft.iter().sum::<f64>() / ttft.len() as f64;
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            p.label(),
            rs.len(),
            rs.iter()
                .map(|r| r.generation.prefill_tokens_computed)
                .sum::<usize>(),
            rs.iter()
                .map(|r| r.generation.prefill_tokens_reused)
                .sum::<usize>(),
            ms(median(&ttft)),
            ms(Some(mean)),
        );
    }
    out + "\n"
}

/// Store on against off, per pair of points that differ only in `prefix_cache` (Markdown;
/// empty when no point uses the store).
pub fn store_section(points: &[SweepPoint], records: &[ResultRecord]) -> String {
    match store_comparison(points, records) {
        Some((verdict, rows)) => format!(
            "## Prefix store\n\n{verdict}\n\n\
             | point (store off) | median TTFT ms, off | median TTFT ms, on | on / off |\n\
             |---|---:|---:|---:|\n{rows}\n"
        ),
        None => String::new(),
    }
}

/// The prefix store's greedy-output verdict as one line; `None` when no point uses it.
pub fn store_verdict(points: &[SweepPoint], records: &[ResultRecord]) -> Option<String> {
    store_comparison(points, records).map(|(verdict, _)| verdict)
}

/// (verdict, table rows) of the store on against off; `None` when no point uses the store.
fn store_comparison(points: &[SweepPoint], records: &[ResultRecord]) -> Option<(String, String)> {
    let twin = |on: &SweepPoint| {
        points.iter().position(|p| {
            !p.prefix_cache
                && *p
                    == SweepPoint {
                        prefix_cache: false,
                        ..on.clone()
                    }
        })
    };
    let mut rows = String::new();
    let (mut compared, mut differ) = (0, Vec::new());
    for (i, p) in points.iter().enumerate().filter(|(_, p)| p.prefix_cache) {
        let Some(off) = twin(p) else { continue };
        let on_rs: Vec<&ResultRecord> = records.iter().filter(|r| r.point == i).collect();
        let off_rs: Vec<&ResultRecord> = records.iter().filter(|r| r.point == off).collect();
        if p.temperature == 0.0 {
            for r in &on_rs {
                let o = off_rs
                    .iter()
                    .find(|o| o.prompt_id == r.prompt_id && o.turn == r.turn);
                if let Some(o) = o {
                    compared += 1;
                    if o.generation.output_ids != r.generation.output_ids {
                        differ.push(format!(
                            "{} prompt {} turn {}",
                            p.label(),
                            r.prompt_id,
                            r.turn
                        ));
                    }
                }
            }
        }
        let ttft = |rs: &[&ResultRecord]| {
            median(&rs.iter().map(|r| r.generation.ttft_s).collect::<Vec<_>>())
        };
        let (t_on, t_off) = (ttft(&on_rs), ttft(&off_rs));
        let ratio = match (t_on, t_off) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
            _ => "–".into(),
        };
        rows += &format!(
            "| {} | {} | {} | {ratio} |\n",
            points[off].label(),
            ms(t_off),
            ms(t_on)
        );
    }
    if rows.is_empty() {
        return None;
    }
    let verdict = if differ.is_empty() {
        format!(
            "Greedy outputs with the prefix store on are identical to outputs with it off: \
             {compared} of {compared} generations compared (per prompt and turn)."
        )
    } else {
        format!(
            "**Greedy outputs differ with the prefix store on** in {} of {compared} \
             generations: {}.",
            differ.len(),
            differ.join("; ")
        )
    };
    Some((verdict, rows))
}

/// Acceptance per turn of each speculative point (Markdown; empty for single-turn runs).
pub fn turns_section(points: &[SweepPoint], records: &[ResultRecord]) -> String {
    let last_turn = records.iter().map(|r| r.turn).max().unwrap_or(1);
    if last_turn < 2 {
        return String::new();
    }
    let mut out = String::from(
        "## Acceptance per turn\n\n\
         α = drafts accepted / proposed; accepted per step = drafts accepted per \
         verification.\n\n\
         | point | turn | generations | new tokens | α | accepted per step | tokens/s |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (i, p) in points.iter().enumerate() {
        for turn in 1..=last_turn {
            let rs: Vec<&ResultRecord> = records
                .iter()
                .filter(|r| r.point == i && r.turn == turn)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let sum = |f: fn(&ResultRecord) -> usize| rs.iter().map(|r| f(r)).sum::<usize>();
            let accepted = sum(|r| r.generation.accepted.iter().sum());
            let proposed = sum(|r| r.generation.proposed.iter().sum());
            let steps = sum(|r| r.generation.accepted.len());
            let tokens = sum(|r| r.new_tokens);
            let wall: f64 = rs.iter().map(|r| r.generation.wall_s).sum();
            let frac = |a: usize, b: usize| match b {
                0 => "–".to_string(),
                _ => format!("{:.3}", a as f64 / b as f64),
            };
            out += &format!(
                "| {} | {turn} | {} | {tokens} | {} | {} | {:.1} |\n",
                p.label(),
                rs.len(),
                frac(accepted, proposed),
                frac(accepted, steps),
                tokens as f64 / wall.max(1e-12),
            );
        }
    }
    out + "\n"
}
