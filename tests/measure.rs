//! Measurement: the run order (`order`, `repeats`) as recorded in results.jsonl, paired
//! speedups and their intervals, the cost model's flags, and refusing runs past a model's
//! context.
mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::exp::{exp, exp_default};
use specdec::experiment::{
    markdown_table, pairing_groups, summarize, sweep_points, CacheChoice, ExperimentConfig,
    GammaChoice, Method, ResultRecord, SweepPoint,
};
use specdec::speculative::GenerationRecord;

/// Runs the shipped pair on a tiny sweep and returns its records in file order.
fn run_small(dir: &Path, order: &str) -> (ExperimentConfig, Vec<ResultRecord>) {
    let out = dir.join(order);
    let order = format!("order=\"{order}\"");
    let sets = [
        "dataset.limit=2",
        "max_new_tokens=8",
        "repeats=2",
        order.as_str(),
        "sweep.gamma=[1, 2]",
        "sweep.drafter=\"small\"",
        "sweep.temperature=[0.0, 1.0]",
        "sweep.cache=\"staged\"",
    ];
    let (ok, _, stderr) = exp_default(&out, &sets);
    assert!(ok, "exp failed: {stderr}");
    let config = ExperimentConfig::load(&out.join("config.toml"), &[]).unwrap();
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let records = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (config, records)
}

#[test]
fn interleaved_order_runs_each_prompt_of_a_pairing_group_back_to_back_rotating() {
    let dir = tempfile::tempdir().unwrap();
    let (config, records) = run_small(dir.path(), "interleaved");
    let points = sweep_points(&config);
    let groups = pairing_groups(&points);
    assert_eq!(groups.len(), 2, "one group per temperature");
    assert_eq!(records.len(), points.len() * 2 * 2);
    // results.jsonl lists the generations in the order they ran.
    let sequences: Vec<usize> = records.iter().map(|r| r.sequence).collect();
    assert_eq!(sequences, (0..records.len()).collect::<Vec<_>>());
    // Each (group, repeat, prompt) is one contiguous run holding every point of the group.
    let mut runs: BTreeMap<(usize, usize, String), Vec<(usize, usize)>> = BTreeMap::new();
    for r in &records {
        let g = groups.iter().position(|g| g.contains(&r.point)).unwrap();
        runs.entry((g, r.repeat, r.prompt_id.clone()))
            .or_default()
            .push((r.sequence, r.point));
    }
    let mut firsts = Vec::new();
    for ((g, _, _), run) in &runs {
        let seqs: Vec<usize> = run.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            seqs.last().unwrap() - seqs[0] + 1,
            seqs.len(),
            "{run:?} not contiguous"
        );
        let mut members: Vec<usize> = run.iter().map(|(_, p)| *p).collect();
        members.sort();
        assert_eq!(members, groups[*g]);
        firsts.push((*g, run[0].1));
    }
    // The order rotates: within a group, more than one point runs first.
    for g in 0..groups.len() {
        let mut first: Vec<usize> = firsts.iter().filter(|f| f.0 == g).map(|f| f.1).collect();
        first.sort();
        first.dedup();
        assert!(
            first.len() > 1,
            "group {g} always starts with the same point"
        );
    }
}

#[test]
fn grouped_order_runs_every_prompt_of_a_point_before_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (config, records) = run_small(dir.path(), "grouped");
    let points = sweep_points(&config);
    let order: Vec<(usize, usize)> = records.iter().map(|r| (r.repeat, r.point)).collect();
    let mut want = Vec::new();
    for repeat in 0..2 {
        for point in 0..points.len() {
            want.extend([(repeat, point); 2]);
        }
    }
    assert_eq!(order, want);
}

fn point(gamma: Option<usize>) -> SweepPoint {
    SweepPoint {
        method: if gamma.is_some() {
            Method::Speculative
        } else {
            Method::Autoregressive
        },
        drafter: gamma.map(|_| "d".to_string()),
        gamma: gamma.map(GammaChoice::Fixed),
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        cache: CacheChoice::Staged,
        prefix_cache: false,
        tree_width: 1,
        tree_budget: None,
        engine: specdec::engine::EngineOptions::default(),
        engine_swept: Vec::new(),
    }
}

/// A generation of `new` tokens in `steps` verification steps (autoregressive: `steps` = 0,
/// one forward per token) with the given (prefill, draft, verify) seconds.
fn record(p: (usize, &SweepPoint), prompt: &str, steps: usize, secs: [f64; 3]) -> ResultRecord {
    let new = 97;
    let [prefill_s, draft_s, verify_s] = secs;
    let generation = GenerationRecord {
        output_ids: vec![5; new],
        proposed: vec![4; steps],
        accepted: vec![2; steps],
        target_forwards: if steps == 0 { new } else { steps + 1 },
        prefill_s,
        draft_s,
        verify_s,
        wall_s: prefill_s + draft_s + verify_s,
        ..GenerationRecord::default()
    };
    ResultRecord {
        point: p.0,
        label: p.1.label(),
        settings: p.1.clone(),
        prompt_id: prompt.into(),
        category: None,
        seed: 0,
        prompt_tokens: 10,
        tokens_per_s: generation.tokens_per_s(),
        new_tokens: new,
        output_text: String::new(),
        generation,
        repeat: 0,
        sequence: 0,
        turn: 1,
    }
}

#[test]
fn speedup_is_the_median_of_paired_per_prompt_ratios() {
    let points = vec![point(None), point(Some(4))];
    // Autoregressive: 1 s per prompt except `b` (2 s); speculative: 0.5, 0.4, 0.25 s.
    let mut records = Vec::new();
    for (prompt, ar, spec) in [("a", 1.0, 0.5), ("b", 2.0, 0.4), ("c", 1.0, 0.25)] {
        records.push(record((0, &points[0]), prompt, 0, [0.0, 0.0, ar]));
        records.push(record(
            (1, &points[1]),
            prompt,
            24,
            [0.0, spec / 2.0, spec / 2.0],
        ));
    }
    let rows = summarize(&points, &records);
    // Paired ratios 2, 5, 4: median 4 (the ratio of pooled tok/s would be 4 / 1.15 = 3.48).
    assert_eq!(rows[1].speedup, Some(4.0));
    assert_eq!(rows[1].pairs, 3);
    let (lo, hi) = rows[1].speedup_interval.unwrap();
    assert!(
        (2.0..=4.0).contains(&lo) && (4.0..=5.0).contains(&hi),
        "{lo} {hi}"
    );
    assert_eq!(rows[0].speedup, Some(1.0));
}

#[test]
fn a_row_that_disagrees_with_the_cost_model_is_flagged_with_its_reason() {
    let points = vec![point(None), point(Some(4)), point(Some(2))];
    let mut records = Vec::new();
    for prompt in ["a", "b", "c"] {
        // Autoregressive: 96 decode forwards in 0.96 s (t = 10 ms), no prefill.
        records.push(record((0, &points[0]), prompt, 0, [0.0, 0.0, 0.96]));
        // 24 steps of τ = 4, 10 ms drafting + 12 ms verifying per step: (b) = 4 / 2.2.
        // Prefill 0: the measured speedup is exactly (b); not flagged.
        records.push(record((1, &points[1]), prompt, 24, [0.0, 0.24, 0.288]));
        // The same steps after a 0.5 s prefill: measured 0.96 / 1.028 ≈ 0.93 against
        // (b) ≈ 1.82: flagged, and the decode phase alone agrees with (b): prefill.
        records.push(record((2, &points[2]), prompt, 24, [0.5, 0.24, 0.288]));
    }
    let rows = summarize(&points, &records);
    let agree = rows[1].cost.as_ref().unwrap();
    assert!((agree.predicted - 4.0 / 2.2).abs() < 1e-9, "{agree:?}");
    assert!((rows[1].speedup.unwrap() - agree.predicted).abs() < 1e-9);
    assert_eq!(agree.flag, None);
    let flagged = rows[2].cost.as_ref().unwrap();
    let reason = flagged.flag.as_deref().expect("flagged");
    assert!(
        reason.contains("from (b)") && reason.contains("prefill"),
        "{reason}"
    );
    let table = markdown_table(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert!(!lines[3].contains("**flagged**"), "{}", lines[3]);
    assert!(lines[4].contains("**flagged**"), "{}", lines[4]);
    assert!(
        table.contains(&format!("* #2 `{}`: {reason}", rows[2].label)),
        "{table}"
    );
    let csv = specdec::experiment::csv(&rows);
    assert!(csv.lines().nth(3).unwrap().contains("prefill"));
}

#[test]
fn a_run_past_a_models_context_is_refused_naming_prompt_numbers_and_model() {
    let (ok, _, stderr) = exp(&["configs/default.toml", "--set", "max_new_tokens=9000"]);
    assert!(!ok);
    for needle in [
        "max_new_tokens 9000",
        "max_position_embeddings = 4096",
        "of the target (models/target/config.json)",
        "of draft model `small` (models/draft/config.json)",
        "prompt \"",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing: {stderr}");
    }
}

#[test]
fn graph_recordings_inside_timed_generations_are_reported() {
    let p = point(None);
    let mut records: Vec<ResultRecord> = (0..4)
        .map(|i| record((0, &p), &format!("p{i}"), 0, [0.1, 0.0, 1.0]))
        .collect();
    // None recorded (a CPU run, or every step kept): nothing to say.
    assert_eq!(specdec::experiment::recordings_section(&records), "");
    records[1].generation.graph_recordings = 3;
    records[3].generation.graph_recordings = 2;
    let line = specdec::experiment::recordings_section(&records);
    assert!(line.contains(": 5, in 2 of 4 generations"), "{line}");
    assert!(line.contains("graphs_kept"), "{line}");
}
