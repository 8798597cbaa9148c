//! The experiment runner end to end: records, summaries and plots from a sweep over a toy
//! model, then the `exp` binary on the shipped models (when present) and on bad input.
mod common;

use common::exp::{exp, exp_default};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::Toy;
use specdec::experiment::{
    csv, summarize, sweep_points, write_plots, DraftSource, EncodedPrompt, ExperimentConfig,
    Method, PointSummary, ResultRecord, Session, StrategyCheck, SweepObserver,
};

struct Quiet;
impl SweepObserver for Quiet {}

const TOY_CONFIG: &str = r#"
    seed = 7
    max_new_tokens = 40
    warmup = false
    [drafters.toy]
    kind = "model"
    path = "unused"
    [drafters.lookup]
    kind = "ngram"
    [sweep]
    gamma = [1, 3, "adaptive"]
    temperature = [0.0, 1.0]
    cache = ["staged", "slack"]
"#;

fn toy_session(decode: &dyn Fn(&[u32]) -> specdec::Result<String>) -> Session<'_, Toy> {
    // A window of 8 makes the rotating caches wrap many times in 40 tokens.
    let target = Toy::new(48, 16, 1, 3.0, Some(8)).with_successor_bias(2.0);
    let draft = Toy::new(48, 16, 1, 2.0, Some(8)).with_successor_bias(3.0);
    let mut drafters = BTreeMap::new();
    drafters.insert(
        "toy".to_string(),
        DraftSource::Model {
            model: Arc::new(draft),
            confidence: None,
        },
    );
    drafters.insert(
        "lookup".to_string(),
        DraftSource::Ngram {
            min_ngram: 1,
            max_ngram: 3,
        },
    );
    let prompts = [vec![1, 2, 3, 4, 1, 2], vec![5, 9, 30, 31, 7], vec![40; 12]]
        .into_iter()
        .enumerate()
        .map(|(i, tokens)| EncodedPrompt {
            id: format!("p{i}"),
            category: None,
            tokens,
        })
        .collect();
    Session {
        target: Arc::new(target),
        target_device: common::device::device(),
        drafters,
        prompts,
        decode,
    }
}

fn by_key(records: &[ResultRecord]) -> BTreeMap<(String, String), &ResultRecord> {
    records
        .iter()
        .map(|r| ((r.label.clone(), r.prompt_id.clone()), r))
        .collect()
}

#[test]
fn toy_sweep_records_summaries_and_plots() {
    let config = ExperimentConfig::from_toml(TOY_CONFIG).unwrap();
    config.validate().unwrap();
    let decode = |ids: &[u32]| Ok(format!("{ids:?}"));
    let session = toy_session(&decode);
    let points = sweep_points(&config);
    // 2 temperatures × 2 caches autoregressive; × 2 drafters × 3 γ speculative.
    assert_eq!(points.len(), 4 + 4 * 6);
    let records = session.run(&config, &points, &mut Quiet).unwrap();
    assert_eq!(records.len(), points.len() * 3);
    check_toy_records(&records);
    let rows = summarize(&points, &records);
    assert_eq!(rows.len(), points.len());
    check_toy_rows(&rows);
    let table = csv(&rows);
    assert_eq!(table.lines().count(), 1 + rows.len());
    assert!(table.lines().next().unwrap().contains(",alpha,tau,"));
    assert!(table.lines().next().unwrap().contains(",accept_pos_3"));
    check_plots(&rows);
}

fn check_toy_records(records: &[ResultRecord]) {
    // Greedy speculative output equals the greedy autoregressive output of the same prompt,
    // for every drafter, γ and cache strategy.
    let ar: Vec<&ResultRecord> = records
        .iter()
        .filter(|r| r.settings.method == Method::Autoregressive && r.settings.temperature == 0.0)
        .collect();
    for r in records.iter().filter(|r| r.settings.temperature == 0.0) {
        let base = ar.iter().find(|a| a.prompt_id == r.prompt_id).unwrap();
        assert_eq!(
            r.generation.output_ids, base.generation.output_ids,
            "{} {}",
            r.label, r.prompt_id
        );
    }
    for r in records {
        assert_eq!(r.new_tokens, r.generation.output_ids.len());
        assert_eq!(
            r.new_tokens, 40,
            "no EOS in the toy: max_new_tokens ends it"
        );
        assert_eq!(r.output_text, format!("{:?}", r.generation.output_ids));
        assert_eq!(r.generation.accepted.len(), r.generation.proposed.len());
        assert!(r
            .generation
            .accepted
            .iter()
            .zip(&r.generation.proposed)
            .all(|(a, p)| a <= p));
        assert!(
            r.generation.wall_s
                >= r.generation.prefill_s + r.generation.draft_s + r.generation.verify_s - 1e-6
        );
        if r.settings.method == Method::Autoregressive {
            assert_eq!(r.generation.target_forwards, r.new_tokens);
            assert!(r.generation.proposed.is_empty());
        } else {
            assert_eq!(
                r.generation.target_forwards,
                1 + r.generation.proposed.len()
            );
        }
    }
}

fn check_toy_rows(rows: &[PointSummary]) {
    for row in rows {
        assert!(
            row.speedup.is_some(),
            "{}: every point has a baseline",
            row.label
        );
        if row.settings.method == Method::Autoregressive {
            assert_eq!(row.tau, Some(1.0));
            assert_eq!(row.alpha, None);
        } else {
            let alpha = row.alpha.unwrap();
            assert!((0.0..=1.0).contains(&alpha), "{}: α = {alpha}", row.label);
            assert!(row.tau.unwrap() >= 1.0);
            assert!(row.acceptance_at.iter().all(|a| (0.0..=1.0).contains(a)));
            assert!(row.predicted_speedup.is_some(), "{}", row.label);
        }
    }
    // A model draft that agrees sometimes: greedy acceptance strictly between 0 and 1.
    let toy_greedy = rows
        .iter()
        .find(|r| r.label == "toy γ=3 T=0 staged")
        .unwrap();
    let alpha = toy_greedy.alpha.unwrap();
    assert!(alpha > 0.0 && alpha < 1.0, "α = {alpha}");
    assert_eq!(toy_greedy.acceptance_at.len(), 3);
}

fn check_plots(rows: &[PointSummary]) {
    let dir = tempfile::tempdir().unwrap();
    let plots = write_plots(dir.path(), rows).unwrap();
    assert_eq!(plots.len(), 3);
    for plot in plots {
        let svg = std::fs::read_to_string(&plot).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<text"),
            "{}",
            plot.display()
        );
        assert!(
            svg.contains("toy · T=0") && svg.contains("cache = staged"),
            "{}: panel titles and legend",
            plot.display()
        );
    }
}

#[test]
fn same_config_and_seed_give_the_same_tokens() {
    let config = ExperimentConfig::from_toml(TOY_CONFIG).unwrap();
    let decode = |ids: &[u32]| Ok(format!("{ids:?}"));
    let points: Vec<_> = sweep_points(&config)
        .into_iter()
        .filter(|p| p.temperature > 0.0 && p.cache == specdec::experiment::CacheChoice::Slack)
        .collect();
    let first = toy_session(&decode)
        .run(&config, &points, &mut Quiet)
        .unwrap();
    let second = toy_session(&decode)
        .run(&config, &points, &mut Quiet)
        .unwrap();
    let (a, b) = (by_key(&first), by_key(&second));
    assert_eq!(a.len(), b.len());
    for (key, r) in &a {
        assert_eq!(
            r.generation.output_ids, b[key].generation.output_ids,
            "{key:?}"
        );
        assert_eq!(r.generation.accepted, b[key].generation.accepted, "{key:?}");
        assert_eq!(r.seed, b[key].seed);
    }
    // Different prompts and points draw from different seeds.
    let seeds: std::collections::BTreeSet<u64> = first.iter().map(|r| r.seed).collect();
    assert_eq!(seeds.len(), first.len());
}

#[test]
fn cache_strategies_give_identical_sampled_outputs() {
    // Points differing only in the cache strategy share their seeds, and both strategies
    // are exact: every record of a slack point equals its staged twin, sampled ones included.
    let config = ExperimentConfig::from_toml(TOY_CONFIG).unwrap();
    let decode = |ids: &[u32]| Ok(format!("{ids:?}"));
    let points = sweep_points(&config);
    let records = toy_session(&decode)
        .run(&config, &points, &mut Quiet)
        .unwrap();
    let staged = by_key(&records);
    let mut compared = 0;
    for r in records.iter().filter(|r| r.label.ends_with(" slack")) {
        let twin = r.label.replace(" slack", " staged");
        let s = staged[&(twin, r.prompt_id.clone())];
        assert_eq!(
            (r.seed, &r.generation.output_ids, &r.generation.accepted),
            (s.seed, &s.generation.output_ids, &s.generation.accepted),
            "{}",
            r.label
        );
        compared += 1;
    }
    assert_eq!(compared, records.len() / 2);

    // The report's check agrees, and catches a tampered output.
    let greedy = records
        .iter()
        .filter(|r| r.settings.temperature == 0.0)
        .count();
    let check = StrategyCheck::new(&points, &records);
    assert_eq!((check.compared, check.mismatches.len()), (greedy / 2, 0));
    assert!(check.markdown().contains("**identical**"));
    let mut tampered = records.clone();
    let victim = tampered
        .iter_mut()
        .find(|r| r.settings.temperature == 0.0 && r.label.ends_with(" slack"))
        .unwrap();
    victim.generation.output_ids[0] ^= 1;
    let check = StrategyCheck::new(&points, &tampered);
    assert_eq!(check.mismatches.len(), 1);
    assert!(check.markdown().contains("differ"));
}

// ---- the `exp` binary ----

#[test]
fn help_explains_every_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_exp"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for needle in [
        "CONFIG",
        "--out",
        "--set",
        "KEY=VALUE",
        "run",
        "configs/default.toml",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
}

#[test]
fn bad_input_fails_with_a_message_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[sweep]\ngama = 2\n").unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![bad.to_str().unwrap()], "gama"),
        (
            vec!["configs/default.toml", "--set", "sweep.gamma=0"],
            "sweep.gamma",
        ),
        (
            vec![
                "run",
                "configs/default.toml",
                "--set",
                "target.path=no/such/model",
            ],
            "no/such/model",
        ),
        (vec!["no/such/config.toml"], "no/such/config.toml"),
    ];
    for (args, needle) in cases {
        let mut args = args;
        args.extend(["--out", out]);
        let (ok, _, stderr) = exp(&args);
        assert!(!ok, "{args:?} must fail");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!Path::new(out).exists(), "{args:?} left a result folder");
    }
}

/// A copy of the draft whose tokenizer has one token more than the target's.
fn draft_with_other_vocabulary(dir: &Path) -> PathBuf {
    let copy = dir.join("draft");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir("models/draft").unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let path = copy.join("tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    let next = vocab.len();
    vocab.insert("<extra-token>".into(), serde_json::json!(next));
    std::fs::write(&path, tok.to_string()).unwrap();
    copy
}

#[test]
fn a_draft_with_another_vocabulary_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let draft = draft_with_other_vocabulary(dir.path());
    let set = format!("drafters.small.path={}", draft.display());
    let out = dir.path().join("out");
    let (ok, _, stderr) = exp(&["--set", &set, "--out", out.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("drafters.small") && stderr.contains("vocabulary"),
        "{stderr}"
    );
    let sizes = ["1025", "1024"];
    assert!(
        sizes.iter().all(|s| stderr.contains(s)),
        "names both sizes: {stderr}"
    );
    assert!(
        stderr.contains(&draft.join("tokenizer.json").display().to_string()),
        "{stderr}"
    );
    assert!(!out.exists());
}

#[test]
fn exp_runs_a_small_config_on_the_shipped_models() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let sets = [
        "dataset.limit=2",
        "max_new_tokens=24",
        "repeats=1",
        "sweep.gamma=[2, 4]",
        "sweep.temperature=[0.0, 1.0]",
        "sweep.cache=[\"staged\", \"slack\"]",
    ];
    let (ok, stdout, stderr) = exp_default(&out, &sets);
    assert!(ok, "exp failed: {stderr}");
    // The terminal leads with the fastest points; the full table is in summary.md.
    assert!(
        stdout.contains("| drafter | sampling | γ | speedup [95%]"),
        "{stdout}"
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| # | method"), "{summary}");
    check_result_folder(&out);
    // The head names the machine and the code (the commit exp was built from) as the
    // system reports them.
    let host = summary
        .lines()
        .find(|l| l.starts_with("* host: "))
        .unwrap_or_else(|| panic!("no host line: {summary}"));
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        let model = info
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string());
        if let Some(model) = model {
            assert!(host.starts_with(&format!("* host: {model}, ")), "{host}");
        }
    }
    // Binaries unpacked from a build made elsewhere (scripts/gpu-unpack.sh puts them under
    // .cuda/run/) name the commit of that build, which this checkout need not have: there the
    // host line must name the commit this test binary was built from (one build made both).
    let carried =
        std::env::current_exe().is_ok_and(|exe| exe.components().any(|c| c.as_os_str() == ".cuda"));
    if carried {
        let want = match env!("BUILT_FROM_COMMIT") {
            "" => "; specdec commit unknown".to_string(),
            built => format!("; specdec {built}"),
        };
        assert!(host.contains(&want), "{host} (want {want})");
        return;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(head) => {
            // The files compiled in, as build.rs checks them when the binary is built (just
            // before this test runs).
            let dirty = !git(&[
                "status",
                "--porcelain",
                "--",
                "src",
                "build.rs",
                "Cargo.toml",
                "Cargo.lock",
            ])
            .unwrap_or_default()
            .is_empty();
            let want = match dirty {
                true => format!("; specdec {head} with uncommitted changes"),
                false => format!("; specdec {head}"),
            };
            assert!(host.ends_with(&want), "{host} (want {want})");
        }
        None => assert!(host.contains("specdec commit unknown"), "{host}"),
    }
}

#[test]
fn the_default_run_prints_at_most_40_lines_answer_first() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // The default sweep (36 points), on fewer prompts and tokens.
    let (ok, stdout, stderr) = exp(&[
        "--out",
        out.to_str().unwrap(),
        "--set",
        "dataset.limit=2",
        "--set",
        "max_new_tokens=16",
        "--set",
        "repeats=1",
    ]);
    assert!(ok, "exp failed: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() <= 40, "{} lines:\n{stdout}", lines.len());
    assert!(
        lines[0].starts_with("Fastest point per drafter"),
        "{stdout}"
    );
    // One row per drafter and temperature, with the cache strategy (swept) named.
    for row in [
        "| lookup | T=0 |",
        "| lookup | T=1 |",
        "| small | T=0 |",
        "| small | T=1 |",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    assert!(stdout.contains(" cache |"), "{stdout}");
    for check in [
        "Greedy speculative outputs against autoregressive: **identical**",
        "Greedy outputs across strategies: **identical**",
        "Peak resident memory",
    ] {
        assert!(stdout.contains(check), "{check}: {stdout}");
    }
    assert!(
        stdout.contains(&out.join("summary.md").display().to_string()),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary.csv") && stdout.contains("plots/"),
        "{stdout}"
    );
    // The prefix store is off: no prefill section anywhere.
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(!summary.contains("## Prefill"), "{summary}");
    assert!(!stdout.contains("Prefill"), "{stdout}");
    assert!(summary.contains("| # | method") && summary.contains("## Cache strategies"));
}

#[test]
fn engine_options_are_swept_recorded_and_change_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let sets = [
        "device=\"cpu\"",
        "dataset.limit=2",
        "max_new_tokens=16",
        "repeats=1",
        "sweep.gamma=2",
        "sweep.temperature=0.0",
        "sweep.cache=\"staged\"",
        "engine.queued_verify=[true, false]",
        "engine.gemv_max_warps=[16, 32]",
    ];
    let (ok, stdout, stderr) = exp_default(&out, &sets);
    assert!(ok, "exp failed: {stderr}");
    // config.toml holds the table as run; its points are the run's.
    let written = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        written.contains("queued_verify = [true, false]"),
        "{written}"
    );
    assert!(written.contains("gemv_max_warps = [16, 32]"), "{written}");
    assert!(written.contains("cuda_graphs = true"), "{written}");
    let config = ExperimentConfig::load(&out.join("config.toml"), &[]).unwrap();
    let points = sweep_points(&config);
    // (autoregressive + 3 drafters) × 4 engine combinations.
    assert_eq!(points.len(), 4 * 4);
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let mut outputs: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let engine = r["engine"]
            .as_object()
            .expect("every record has its engine options");
        assert_eq!(
            engine.len(),
            specdec::engine::EngineOptions::keys().len(),
            "{line}"
        );
        let point = &points[r["point"].as_u64().unwrap() as usize];
        assert_eq!(
            engine["queued_verify"], point.engine.queued_verify,
            "{line}"
        );
        assert_eq!(
            engine["gemv_max_warps"], point.engine.gemv_max_warps,
            "{line}"
        );
        assert_eq!(
            r["engine_swept"],
            serde_json::json!(["gemv_max_warps", "queued_verify"])
        );
        seen.insert((
            engine["queued_verify"].to_string(),
            engine["gemv_max_warps"].to_string(),
        ));
        let prompt = r["prompt_id"].as_str().unwrap().to_string();
        outputs
            .entry(prompt)
            .or_default()
            .push(r["output_ids"].clone());
    }
    assert_eq!(seen.len(), 4, "every combination ran: {seen:?}");
    for (prompt, outs) in &outputs {
        assert_eq!(outs.len(), points.len());
        assert!(
            outs.iter().all(|o| *o == outs[0]),
            "greedy outputs differ on {prompt}"
        );
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("| small | 2 | T=0 staged gemv_max_warps=32 queued_verify=false |"),
        "the table names the swept options: {summary}"
    );
    assert!(summary.contains("## Engine options"), "{summary}");
    assert!(
        summary.contains("Greedy outputs across engine options: **identical**"),
        "{summary}"
    );
    assert!(stdout.contains(" engine |"), "{stdout}");
    assert!(
        stdout.contains("Greedy outputs across engine options: **identical**"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert!(
        csv.contains("\"gemv_max_warps=16 queued_verify=true\""),
        "{csv}"
    );
}

#[test]
fn environment_overrides_are_recorded_as_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = Command::new(env!("CARGO_BIN_EXE_exp"))
        .args(["--out", out.to_str().unwrap(), "--no-progress"])
        .args([
            "--set",
            "dataset.limit=1",
            "--set",
            "max_new_tokens=8",
            "--set",
            "repeats=1",
        ])
        .args([
            "--set",
            "sweep.method=\"autoregressive\"",
            "--set",
            "sweep.temperature=0.0",
        ])
        .args([
            "--set",
            "sweep.cache=\"staged\"",
            "--set",
            "engine.gemv_max_warps=[16, 32]",
        ])
        .env("SPECDEC_GEMV_MAX_WARPS", "8")
        .env("SPECDEC_CUDA_GRAPHS", "0")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let written = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(written.contains("gemv_max_warps = 8\n"), "{written}");
    assert!(written.contains("cuda_graphs = false\n"), "{written}");
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    assert_eq!(
        text.lines().count(),
        1,
        "the override leaves one combination"
    );
    let r: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(r["engine"]["gemv_max_warps"], 8);
    assert_eq!(r["engine"]["cuda_graphs"], false);
    // A bad override names its variable and runs nothing.
    let bad = Command::new(env!("CARGO_BIN_EXE_exp"))
        .args([
            "--out",
            dir.path().join("bad").to_str().unwrap(),
            "--no-progress",
        ])
        .env("SPECDEC_ATTN_ROWS_HEADS", "3")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("attn_rows_heads"), "{stderr}");
    assert!(!dir.path().join("bad").exists());
}

/// Every field a record must carry.
const FIELDS: [&str; 24] = [
    "method",
    "drafter",
    "gamma",
    "temperature",
    "top_k",
    "top_p",
    "cache",
    "prompt_id",
    "prompt_tokens",
    "output_ids",
    "output_text",
    "new_tokens",
    "accepted",
    "proposed",
    "accepted_at",
    "proposed_at",
    "target_forwards",
    "draft_forwards",
    "wall_s",
    "prefill_s",
    "draft_s",
    "verify_s",
    "tokens_per_s",
    "stop_reason",
];

fn check_result_folder(out: &Path) {
    for file in ["config.toml", "results.jsonl", "summary.md", "summary.csv"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let config = ExperimentConfig::load(&out.join("config.toml"), &[]).unwrap();
    assert_eq!(
        config.dataset.limit,
        Some(2),
        "the resolved config holds the overrides"
    );
    let points = sweep_points(&config);
    let records = check_results_jsonl(&out.join("results.jsonl"));
    assert_eq!(records.len(), points.len() * 2);
    let rows = summarize(&points, &records);
    for row in rows
        .iter()
        .filter(|r| r.settings.method == Method::Speculative)
    {
        let alpha = row.alpha.unwrap_or(0.0);
        assert!((0.0..=1.0).contains(&alpha), "{}", row.label);
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for i in 0..points.len() {
        assert!(
            summary.contains(&format!("\n| {i} | ")),
            "row {i} missing in summary.md"
        );
    }
    assert!(
        summary.contains("τ") && summary.contains("prefill"),
        "definitions"
    );
    assert!(
        summary.contains("Greedy outputs across strategies: **identical**"),
        "the staged and slack points agree: {summary}"
    );
    assert!(summary.contains("Peak resident memory"), "{summary}");
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), points.len() + 1);
    let plots = std::fs::read_dir(out.join("plots")).unwrap().count();
    assert_eq!(plots, 3);
}

/// Reads results.jsonl, checks every record has every field and that greedy speculative
/// outputs equal the greedy autoregressive output of their prompt.
fn check_results_jsonl(path: &Path) -> Vec<ResultRecord> {
    let text = std::fs::read_to_string(path).unwrap();
    for line in text.lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        for key in FIELDS {
            assert!(record.get(key).is_some(), "field {key} missing in {line}");
        }
    }
    let records: Vec<ResultRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for r in records.iter().filter(|r| r.settings.temperature == 0.0) {
        let base = records
            .iter()
            .find(|a| {
                a.settings.method == Method::Autoregressive
                    && a.settings.temperature == 0.0
                    && a.prompt_id == r.prompt_id
            })
            .unwrap();
        assert_eq!(
            r.generation.output_ids, base.generation.output_ids,
            "{} on {}",
            r.label, r.prompt_id
        );
    }
    records
}

#[test]
fn chat_template_wraps_the_first_turn_and_adds_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["tokenizer.json", "config.json"] {
        std::fs::copy(Path::new("models/target").join(file), dir.path().join(file)).unwrap();
    }
    let template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
    let config = serde_json::json!({ "chat_template": template, "bos_token": { "content": "<|endoftext|>" } });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let tokenizer = specdec::models::load_tokenizer(dir.path()).unwrap();
    let chat = specdec::experiment::ChatTemplate::load(dir.path()).unwrap();
    let prompt = specdec::experiment::Prompt {
        id: "q".into(),
        category: None,
        turns: vec!["  def f(x):  ".into(), "second turn, unused".into()],
    };
    let ids = specdec::experiment::encode_prompt(&tokenizer, &prompt, Some(&chat)).unwrap();
    let text = "<|endoftext|>[user] def f(x):\n[assistant] ";
    let expected = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(ids, expected);
    assert_eq!(
        ids[0], 0,
        "the template's BOS text is the special token id 0"
    );
    let plain = specdec::experiment::encode_prompt(&tokenizer, &prompt, None).unwrap();
    let raw = tokenizer.encode("  def f(x):  ", false).unwrap();
    assert_eq!(plain, raw.get_ids());
}
