//! `by_prompt.md`: per speculative point and prompt, what one step costs against the
//! autoregressive decode step of the same prompt, so a study over prompt length (context)
//! shows how verification, drafting and time to first token grow with it.
use crate::experiment::runner::ResultRecord;
use crate::experiment::stats::median;
use crate::experiment::sweep::SweepPoint;

/// Medians over repeats of one (speculative point, prompt) against its baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    /// The point's label.
    pub label: String,
    /// The prompt's id.
    pub prompt_id: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Autoregressive seconds per decode forward (t).
    pub decode_s: f64,
    /// Verification seconds per step.
    pub verify_s: f64,
    /// Drafting seconds per step.
    pub draft_s: f64,
    /// Time to first token, autoregressive (target prefill).
    pub base_prefill_s: f64,
    /// Time to first token, speculative (target and draft prefill).
    pub prefill_s: f64,
    /// Decode-phase speedup: (tokens after the first / (wall − prefill)) over the baseline's.
    pub decode_speedup: f64,
}

fn per_step(secs: f64, r: &ResultRecord) -> Option<f64> {
    let steps = r.generation.proposed.len();
    (steps > 0).then(|| secs / steps as f64)
}

fn decode_rate(r: &ResultRecord) -> Option<f64> {
    let g = &r.generation;
    let secs = g.wall_s - g.prefill_s;
    (secs > 0.0).then(|| r.new_tokens.saturating_sub(1) as f64 / secs)
}

/// One row per (speculative point with a baseline, prompt), in point then prompt-length order.
pub fn prompt_rows(points: &[SweepPoint], records: &[ResultRecord]) -> Vec<PromptRow> {
    let mut rows = Vec::new();
    for (i, p) in points.iter().enumerate().filter(|(_, p)| p.gamma.is_some()) {
        let Some(base) = points.iter().position(|b| b.is_baseline_for(p)) else {
            continue;
        };
        let mut prompts: Vec<(usize, &str)> = records
            .iter()
            .filter(|r| r.point == i)
            .map(|r| (r.prompt_tokens, r.prompt_id.as_str()))
            .collect();
        prompts.sort();
        prompts.dedup();
        for (tokens, id) in prompts {
            let pairs: Vec<(&ResultRecord, &ResultRecord)> = records
                .iter()
                .filter(|r| r.point == i && r.prompt_id == id)
                .filter_map(|r| {
                    let b = records
                        .iter()
                        .find(|b| b.point == base && b.prompt_id == id && b.repeat == r.repeat)?;
                    Some((r, b))
                })
                .collect();
            let med = |f: &dyn Fn(&ResultRecord, &ResultRecord) -> Option<f64>| {
                median(
                    &pairs
                        .iter()
                        .filter_map(|(r, b)| f(r, b))
                        .collect::<Vec<_>>(),
                )
            };
            let row = (|| {
                Some(PromptRow {
                    label: p.label(),
                    prompt_id: id.to_string(),
                    prompt_tokens: tokens,
                    decode_s: med(&|_, b| {
                        let forwards = b.generation.target_forwards.saturating_sub(1);
                        (forwards > 0).then(|| b.generation.verify_s / forwards as f64)
                    })?,
                    verify_s: med(&|r, _| per_step(r.generation.verify_s, r))?,
                    draft_s: med(&|r, _| per_step(r.generation.draft_s, r))?,
                    base_prefill_s: med(&|_, b| Some(b.generation.prefill_s))?,
                    prefill_s: med(&|r, _| Some(r.generation.prefill_s))?,
                    decode_speedup: med(&|r, b| Some(decode_rate(r)? / decode_rate(b)?))?,
                })
            })();
            rows.extend(row);
        }
    }
    rows
}

/// The rows as a Markdown document.
pub fn prompt_markdown(rows: &[PromptRow]) -> String {
    let mut out = String::from(
        "# Per prompt\n\nMedians over repeats, each speculative generation against the \
         autoregressive generation of the same prompt and repeat. t = autoregressive seconds per \
         decode forward; verify and draft are seconds per speculative step; v = verify / t. Time \
         to first token (TTFT) is the prefill: the target's, plus the draft model's pass over the \
         prompt for speculation. Decode speedup: tokens after the first per second after \
         prefill, over the baseline's.\n\n\
         | point | prompt | prompt tokens | t ms | verify ms | v | draft ms/step | TTFT AR ms | TTFT spec ms | decode speedup |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.3} | {:.1} | {:.1} | {:.2} |\n",
            r.label,
            r.prompt_id,
            r.prompt_tokens,
            1e3 * r.decode_s,
            1e3 * r.verify_s,
            r.verify_s / r.decode_s,
            1e3 * r.draft_s,
            1e3 * r.base_prefill_s,
            1e3 * r.prefill_s,
            r.decode_speedup,
        );
    }
    out
}
