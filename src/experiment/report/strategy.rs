//! The cache-strategy check: throughput per rotating-cache strategy and whether greedy
//! outputs were identical across strategies.
use crate::experiment::runner::ResultRecord;
use crate::experiment::summary::ratio;
use crate::experiment::sweep::SweepPoint;

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

    /// The greedy-output verdict as one line; `None` when there was nothing to compare.
    pub fn verdict(&self) -> Option<String> {
        if self.compared == 0 {
            return None;
        }
        if self.mismatches.is_empty() {
            return Some(format!(
                "Greedy outputs across strategies: **identical** ({} generations compared with the same point under another strategy).",
                self.compared
            ));
        }
        let mut out = format!(
            "Greedy outputs across strategies: **{} of {} differ**:",
            self.mismatches.len(),
            self.compared
        );
        for (label, prompt) in &self.mismatches {
            out.push_str(&format!(" `{label}` on `{prompt}`;"));
        }
        Some(out)
    }

    /// A Markdown section; empty when the run used one strategy (nothing to compare).
    pub fn markdown(&self) -> String {
        if self.throughput.len() < 2 && self.compared == 0 {
            return String::new();
        }
        let mut out = String::from("## Cache strategies\n\n| cache | new tokens | seconds | tok/s |\n|---|---:|---:|---:|\n");
        for (name, tokens, secs) in &self.throughput {
            let rate = ratio(*tokens as f64, *secs).unwrap_or(0.0);
            out.push_str(&format!("| {name} | {tokens} | {secs:.3} | {rate:.1} |\n"));
        }
        out.push('\n');
        out.push_str(&self.verdict().unwrap_or_else(|| {
            "Greedy outputs across strategies: nothing to compare (no greedy points).".into()
        }));
        out.push('\n');
        out
    }
}
