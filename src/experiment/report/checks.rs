//! Outputs that must agree, checked on the greedy generations of a run: speculative against
//! the autoregressive baseline of the same settings (speculation is lossless), and the same
//! point under other engine options (engine options change speed, never tokens); and the
//! summary's engine-options section.
use crate::experiment::runner::ResultRecord;
use crate::experiment::summary::ratio;
use crate::experiment::sweep::SweepPoint;

/// Mismatches named in a verdict line at most.
const NAMED: usize = 5;

/// Greedy generations compared with the generation of the same prompt, turn and repeat at
/// another point, and those whose outputs differed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Agreement {
    /// Generations compared.
    pub compared: usize,
    /// `(label, prompt id)` of each comparison whose outputs differed.
    pub mismatches: Vec<(String, String)>,
}

impl Agreement {
    /// Compares every greedy record of a point `i` with the record of point `other(i)` (when
    /// it is another point) of the same prompt, turn and repeat.
    fn new(records: &[ResultRecord], other: impl Fn(usize) -> Option<usize>) -> Self {
        let mut agreement = Self::default();
        for r in records.iter().filter(|r| r.settings.temperature == 0.0) {
            let Some(o) = other(r.point).filter(|&o| o != r.point) else {
                continue;
            };
            let twin = records.iter().find(|t| {
                t.point == o
                    && t.prompt_id == r.prompt_id
                    && t.turn == r.turn
                    && t.repeat == r.repeat
            });
            if let Some(twin) = twin {
                agreement.compared += 1;
                if twin.generation.output_ids != r.generation.output_ids {
                    agreement
                        .mismatches
                        .push((r.label.clone(), r.prompt_id.clone()));
                }
            }
        }
        agreement
    }

    /// Greedy speculative generations against the autoregressive point of the same settings.
    pub fn speculative_vs_autoregressive(points: &[SweepPoint], records: &[ResultRecord]) -> Self {
        Self::new(records, |i| {
            let p = points.get(i)?;
            p.gamma?;
            points.iter().position(|b| b.is_baseline_for(p))
        })
    }

    /// Greedy generations against the first point that differs from theirs only in engine
    /// options.
    pub fn across_engine_options(points: &[SweepPoint], records: &[ResultRecord]) -> Self {
        Self::new(records, |i| {
            let p = points.get(i)?;
            points.iter().position(|q| {
                SweepPoint {
                    engine: q.engine,
                    ..p.clone()
                } == *q
            })
        })
    }

    /// One line: `what` followed by the verdict; `None` when nothing was compared.
    pub fn verdict(&self, what: &str) -> Option<String> {
        if self.compared == 0 {
            return None;
        }
        if self.mismatches.is_empty() {
            return Some(format!(
                "{what}: **identical** ({} generations compared).",
                self.compared
            ));
        }
        let named: Vec<String> = self
            .mismatches
            .iter()
            .take(NAMED)
            .map(|(label, prompt)| format!("`{label}` on `{prompt}`"))
            .collect();
        let more = self.mismatches.len().saturating_sub(NAMED);
        Some(format!(
            "{what}: **{} of {} differ**: {}{}.",
            self.mismatches.len(),
            self.compared,
            named.join("; "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ))
    }
}

/// The verdict line of greedy speculative outputs against autoregressive ones.
pub const SPECULATIVE_VERDICT: &str = "Greedy speculative outputs against autoregressive";
/// The verdict line of greedy outputs across engine options.
pub const ENGINE_VERDICT: &str = "Greedy outputs across engine options";

/// Tokens per second per swept engine-option combination and the greedy-output verdict
/// across them (Markdown); empty when the sweep varies no engine option.
pub fn engine_section(points: &[SweepPoint], records: &[ResultRecord]) -> String {
    if points.iter().all(|p| p.engine_swept.is_empty()) {
        return String::new();
    }
    let mut throughput: Vec<(String, usize, f64)> = Vec::new();
    for r in records {
        let name = points
            .get(r.point)
            .map_or_else(String::new, |p| p.engine_label());
        match throughput.iter_mut().find(|(n, _, _)| *n == name) {
            Some(entry) => {
                entry.1 += r.new_tokens;
                entry.2 += r.generation.wall_s;
            }
            None => throughput.push((name, r.new_tokens, r.generation.wall_s)),
        }
    }
    let mut out = String::from(
        "## Engine options\n\nEvery point's options are in `config.toml` (`[engine]`) and in each \
         record's `engine`; the swept ones:\n\n\
         | engine options | new tokens | seconds | tok/s |\n|---|---:|---:|---:|\n",
    );
    for (name, tokens, secs) in &throughput {
        let rate = ratio(*tokens as f64, *secs).unwrap_or(0.0);
        out += &format!("| {name} | {tokens} | {secs:.3} | {rate:.1} |\n");
    }
    let verdict = Agreement::across_engine_options(points, records)
        .verdict(ENGINE_VERDICT)
        .unwrap_or_else(|| format!("{ENGINE_VERDICT}: nothing to compare (no greedy points)."));
    out + "\n" + &verdict + "\n\n"
}

/// How many CUDA graph steps were recorded inside timed generations (Markdown, one
/// paragraph); empty when none was. A recording runs its step eagerly, captures and
/// instantiates it, so the generations that record are slower than the steady state.
pub fn recordings_section(records: &[ResultRecord]) -> String {
    let recorded: usize = records.iter().map(|r| r.generation.graph_recordings).sum();
    if recorded == 0 {
        return String::new();
    }
    let recording = records
        .iter()
        .filter(|r| r.generation.graph_recordings > 0)
        .count();
    format!(
        "CUDA graph steps recorded inside timed generations: {recorded}, in {recording} of {} \
         generations (`graph_recordings` in `results.jsonl`): each point records a step the \
         first time it takes it on its caches' buffers, and again where a buffer grows or \
         more kinds of step are live than `engine.graphs_kept` keeps.\n",
        records.len()
    )
}
