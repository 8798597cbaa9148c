//! Every shipped config parses and validates, and each kind of bad input is rejected with a
//! message naming the key, file or line at fault.
//!
//! Structure and paths are checked separately: the configs for real checkpoints name model
//! directories that exist only on the machines that downloaded them, so only
//! `configs/default.toml` (whose models ship in `models/`) must pass `check_paths`; the others
//! are checked for structure and for their (shipped) datasets.
use std::path::{Path, PathBuf};

use specdec::engine::EngineOptions;
use specdec::experiment::{
    apply_override, load_prompts, selection, sweep_points, DatasetConfig, ExperimentConfig,
    GammaChoice, Method, Prompt,
};

fn shipped_configs() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir("configs")
        .expect("configs/ exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    paths.sort();
    paths
}

/// Writes `text` as a config file in a fresh temp dir; returns both (the dir must live).
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exp.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn load_err(text: &str) -> String {
    let (_dir, path) = config_file(text);
    let err = ExperimentConfig::load(&path, &[]).expect_err("config must be rejected");
    err.to_string()
}

#[test]
fn every_shipped_config_parses_and_validates() {
    let paths = shipped_configs();
    assert!(
        paths.len() >= 4,
        "expected the default and three checkpoint configs: {paths:?}"
    );
    for path in paths {
        let config = ExperimentConfig::load(&path, &[])
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            !sweep_points(&config).is_empty(),
            "{}: empty sweep",
            path.display()
        );
        // The resolved config written to a result folder reads back to the same config.
        let again = ExperimentConfig::from_toml(&config.to_toml().unwrap()).unwrap();
        assert_eq!(again, config, "{}", path.display());
        // Their datasets ship with the repository and parse.
        let prompts = load_prompts(&config.dataset);
        assert!(prompts.is_ok(), "{}: {:?}", path.display(), prompts.err());
    }
}

#[test]
fn default_config_names_existing_models() {
    let config = ExperimentConfig::load(Path::new("configs/default.toml"), &[]).unwrap();
    config.check_paths().unwrap();
}

#[test]
fn every_key_has_a_default() {
    let config = ExperimentConfig::from_toml("").unwrap();
    config.validate().unwrap();
    assert_eq!(
        config.sweep.methods(),
        [Method::Autoregressive],
        "no drafter, no speculation"
    );
    let config = ExperimentConfig::from_toml("[drafters.a]\nkind = \"ngram\"").unwrap();
    assert_eq!(
        config.sweep.methods(),
        [Method::Autoregressive, Method::Speculative]
    );
    assert_eq!(config.max_new_tokens, 128);
    assert_eq!(config.target.path, Path::new("models/target"));
    // No drafter defined: the default sweep is autoregressive only where nothing else applies.
    let (_dir, path) = config_file("[sweep]\nmethod = \"autoregressive\"\n");
    let config = ExperimentConfig::load(&path, &[]).unwrap();
    assert_eq!(config.name, "exp", "the name defaults to the file stem");
    let points = sweep_points(&config);
    assert_eq!(points.len(), 1);
    assert_eq!(points[0].method, Method::Autoregressive);
}

#[test]
fn scalars_are_accepted_where_lists_are_and_autoregressive_points_are_not_multiplied() {
    let text = r#"
        [drafters.a]
        kind = "ngram"
        [drafters.b]
        kind = "ngram"
        max_ngram = 4
        [sweep]
        gamma = [1, 2, "adaptive"]
        temperature = 1
        top_k = [0, 20]
        cache = ["staged", "slack"]
    "#;
    let config = ExperimentConfig::from_toml(text).unwrap();
    config.validate().unwrap();
    assert_eq!(*config.sweep.temperature, [1.0]);
    assert_eq!(config.sweep.gamma[2], GammaChoice::Adaptive);
    let points = sweep_points(&config);
    let ar = points
        .iter()
        .filter(|p| p.method == Method::Autoregressive)
        .count();
    assert_eq!(ar, 2 * 2, "one autoregressive point per top_k × cache");
    assert_eq!(
        points.len() - ar,
        2 * 2 * 2 * 3,
        "drafters × γ per top_k × cache"
    );
    assert!(
        points[..ar]
            .iter()
            .all(|p| p.method == Method::Autoregressive),
        "baselines first"
    );
    assert_eq!(config.max_gamma(), config.sweep.adaptive.max);
}

#[test]
fn unknown_key_is_named() {
    let err = load_err("[sweep]\ngama = [2]\n");
    assert!(err.contains("gama"), "{err}");
    let err = load_err("[drafters.small]\nkind = \"model\"\npath = \"x\"\nconfidense = 0.5\n");
    assert!(err.contains("confidense"), "{err}");
    let err = load_err("nmae = \"x\"\n");
    assert!(err.contains("nmae"), "{err}");
}

#[test]
fn bad_values_name_the_key_and_the_allowed_values() {
    for (text, key, allowed) in [
        ("[sweep]\ngamma = 0\n", "sweep.gamma", ">= 1"),
        ("[sweep]\ngamma = [2, 0]\n", "sweep.gamma", ">= 1"),
        ("[sweep]\ngamma = -1\n", "gamma", ">= 1"),
        ("[sweep]\ngamma = \"auto\"\n", "gamma", "adaptive"),
        ("[sweep]\ntemperature = -0.5\n", "sweep.temperature", ">= 0"),
        ("[sweep]\ntop_p = 0.0\n", "sweep.top_p", "(0, 1]"),
        ("[sweep]\ntop_p = 1.5\n", "sweep.top_p", "(0, 1]"),
        ("[sweep]\nmethod = \"beam\"\n", "beam", "speculative"),
        ("[sweep]\ncache = \"ring\"\n", "ring", "slack"),
        ("device = \"tpu\"\n", "tpu", "metal"),
        ("dtype = \"f8\"\n", "f8", "bf16"),
        ("max_new_tokens = 0\n", "max_new_tokens", ">= 1"),
        ("[dataset]\nlimit = 0\n", "dataset.limit", ">= 1"),
        (
            "[dataset]\nper_category = 0\n",
            "dataset.per_category",
            ">= 1",
        ),
        (
            "[drafters.a]\nkind = \"ngram\"\n[sweep]\ndrafter = \"b\"\n",
            "sweep.drafter",
            "defined drafters: a",
        ),
        (
            "[sweep]\nmethod = \"speculative\"\n",
            "speculative",
            "[drafters.<name>]",
        ),
        (
            "[drafters.a]\nkind = \"model\"\n",
            "drafters.a.path",
            "required",
        ),
        (
            "[drafters.a]\nkind = \"ngram\"\npath = \"x\"\n",
            "drafters.a.path",
            "does not apply",
        ),
        (
            "[drafters.a]\nkind = \"ngram\"\nmin_ngram = 4\n",
            "drafters.a",
            "min_ngram <= max_ngram",
        ),
        ("[drafters.a]\nkind = \"lookup\"\n", "lookup", "ngram"),
        (
            "[drafters.a]\nkind = \"model\"\npath = \"x\"\nconfidence = 1.5\n",
            "drafters.a.confidence",
            "(0, 1)",
        ),
        (
            "[drafters.a]\nkind = \"eagle3\"\npath = \"x\"\nconfidence = 0.0\n",
            "drafters.a.confidence",
            "(0, 1)",
        ),
        (
            "[drafters.a]\nkind = \"ngram\"\nconfidence = 0.5\n",
            "drafters.a.confidence",
            "does not apply",
        ),
        (
            "[sweep.adaptive]\nmin = 4\nmax = 2\n",
            "sweep.adaptive",
            "min <= start <= max",
        ),
        (
            "[sweep]\ngamma = [2, 4, 2]\n",
            "sweep.gamma",
            "listed twice",
        ),
    ] {
        let err = load_err(text);
        assert!(
            err.contains(key) && err.contains(allowed),
            "{text:?} gave: {err}"
        );
    }
}

#[test]
fn missing_paths_are_named_before_any_work() {
    let text = r#"
        [target]
        path = "no/such/target"
        [drafters.small]
        kind = "model"
        path = "no/such/draft"
        [dataset]
        path = "no/such/prompts.jsonl"
    "#;
    let config = ExperimentConfig::from_toml(text).unwrap();
    config.validate().expect("the structure is fine");
    let err = config.check_paths().unwrap_err().to_string();
    for needle in [
        "target.path",
        "no/such/target",
        "drafters.small.path",
        "no/such/draft",
        "dataset.path",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    // A directory without config.json is not a model directory.
    let dir = tempfile::tempdir().unwrap();
    let mut config = config;
    config.target.path = dir.path().to_path_buf();
    let err = config.check_paths().unwrap_err().to_string();
    assert!(err.contains("no config.json"), "{err}");
}

#[test]
fn unreadable_dataset_line_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prompts.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"prompt\": \"x\"}\n\n{\"id\": \"b\", \"prompt\": \n",
    )
    .unwrap();
    let config = DatasetConfig {
        path: path.clone(),
        ..DatasetConfig::default()
    };
    let err = load_prompts(&config).unwrap_err().to_string();
    assert!(
        err.contains("prompts.jsonl") && err.contains("line 3"),
        "{err}"
    );
    std::fs::write(&path, "{\"id\": \"a\", \"text\": \"x\"}\n").unwrap();
    let err = load_prompts(&config).unwrap_err().to_string();
    assert!(
        err.contains("line 1") && err.contains("\"prompt\""),
        "{err}"
    );
}

#[test]
fn spec_bench_is_read_as_it_is() {
    let mut config = DatasetConfig {
        path: "configs/prompts/spec_bench_question.jsonl".into(),
        ..DatasetConfig::default()
    };
    assert_eq!(load_prompts(&config).unwrap().len(), 480);
    config.categories = Some(specdec::experiment::List(vec![
        "coding".into(),
        "math".into(),
    ]));
    let prompts = load_prompts(&config).unwrap();
    assert_eq!(prompts.len(), 20);
    assert!(prompts
        .iter()
        .all(|p| matches!(p.category.as_deref(), Some("coding" | "math"))));
    config.limit = Some(3);
    assert_eq!(load_prompts(&config).unwrap().len(), 3);
    config.categories = Some(specdec::experiment::List(vec!["codng".into()]));
    let err = load_prompts(&config).unwrap_err().to_string();
    assert!(err.contains("codng") && err.contains("coding"), "{err}");
}

/// `per_category` keeps the first N of every category in file order, against the file read
/// without it; it applies after `categories` and before `limit`.
#[test]
fn per_category_samples_every_category_in_file_order() {
    let mut config = DatasetConfig {
        path: "configs/prompts/spec_bench_question.jsonl".into(),
        ..DatasetConfig::default()
    };
    let all = load_prompts(&config).unwrap();
    let mut categories: Vec<&str> = all.iter().filter_map(|p| p.category.as_deref()).collect();
    categories.sort_unstable();
    categories.dedup();
    for per in [1, 2, 15] {
        config.per_category = Some(per);
        let got = load_prompts(&config).unwrap();
        let mut expected = Vec::new();
        for p in &all {
            let c = p.category.as_deref();
            if expected
                .iter()
                .filter(|q: &&Prompt| q.category.as_deref() == c)
                .count()
                < per
            {
                expected.push(p.clone());
            }
        }
        assert_eq!(got, expected, "per_category = {per}");
        for c in &categories {
            let n = got
                .iter()
                .filter(|p| p.category.as_deref() == Some(*c))
                .count();
            let available = all
                .iter()
                .filter(|p| p.category.as_deref() == Some(*c))
                .count();
            assert_eq!(n, per.min(available), "{c}, per_category = {per}");
        }
    }
    config.per_category = Some(2);
    config.categories = Some(specdec::experiment::List(vec!["qa".into(), "rag".into()]));
    config.limit = Some(3);
    let got = load_prompts(&config).unwrap();
    let ids: Vec<&str> = got.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["321", "322", "481"]);
}

/// A summary names how its prompts were selected, in the order the filters apply.
#[test]
fn a_selection_is_described_in_filter_order() {
    let mut config = DatasetConfig::default();
    assert_eq!(selection(&config), "");
    config.limit = Some(3);
    assert_eq!(selection(&config), " (the first 3)");
    config.per_category = Some(2);
    config.categories = Some(specdec::experiment::List(vec![
        "coding".into(),
        "math".into(),
    ]));
    assert_eq!(
        selection(&config),
        " (categories coding, math; 2 per category; the first 3)"
    );
}

#[test]
fn per_category_needs_categories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.jsonl");
    std::fs::write(&path, "{\"id\": \"a\", \"prompt\": \"x\"}\n").unwrap();
    let config = DatasetConfig {
        path,
        per_category: Some(1),
        ..DatasetConfig::default()
    };
    let err = load_prompts(&config).unwrap_err().to_string();
    assert!(
        err.contains("per_category") && err.contains("plain.jsonl") && err.contains("\"a\""),
        "{err}"
    );
}

#[test]
fn overrides_are_dotted_paths_with_toml_values() {
    let (_dir, path) = config_file("[dataset]\nlimit = 8\n[drafters.a]\nkind = \"ngram\"\n");
    let sets = [
        "dataset.limit=2",
        "sweep.gamma=[1, 3]",
        "name=my run",
        "drafters.a.max_ngram = 5",
        "sweep.temperature=0.7",
    ]
    .map(String::from);
    let config = ExperimentConfig::load(&path, &sets).unwrap();
    assert_eq!(config.dataset.limit, Some(2));
    assert_eq!(
        *config.sweep.gamma,
        [GammaChoice::Fixed(1), GammaChoice::Fixed(3)]
    );
    assert_eq!(config.name, "my run");
    assert_eq!(config.drafters["a"].max_ngram, Some(5));
    assert_eq!(*config.sweep.temperature, [0.7]);
    // Overrides are validated like the file.
    let err = ExperimentConfig::load(&path, &["sweep.gamma=0".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("sweep.gamma"), "{err}");
    let err = ExperimentConfig::load(&path, &["sweep.gama=2".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("gama"), "{err}");
    let mut table = toml::Table::new();
    assert!(apply_override(&mut table, "no-equals-sign").is_err());
    assert!(apply_override(&mut table, "a..b=1").is_err());
    apply_override(&mut table, "seed=3").unwrap();
    let err = apply_override(&mut table, "seed.x=1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`seed` is a value"), "{err}");
}

#[test]
fn oracle_drafters_are_validated() {
    let base = "[drafters.o]\nkind = \"oracle\"\n";
    let missing = load_err(&format!("{base}[sweep]\ntemperature = [0]\n"));
    assert!(missing.contains("drafters.o.alpha: required"), "{missing}");
    let range = load_err(&format!("{base}alpha = 1.5\n[sweep]\ntemperature = [0]\n"));
    assert!(
        range.contains("drafters.o.alpha = 1.5: must be in [0, 1]"),
        "{range}"
    );
    let sampled = load_err(&format!(
        "{base}alpha = 0.8\n[sweep]\ntemperature = [0, 1]\n"
    ));
    assert!(
        sampled.contains("needs greedy decoding") && sampled.contains("sweep.temperature"),
        "{sampled}"
    );
    let foreign = load_err("[drafters.d]\nkind = \"ngram\"\nalpha = 0.5\n");
    assert!(
        foreign.contains("drafters.d.alpha: applies to kind = \"oracle\" only"),
        "{foreign}"
    );
    let (_dir, path) = config_file(&format!("{base}alpha = 0.8\n[sweep]\ntemperature = [0]\n"));
    ExperimentConfig::load(&path, &[]).expect("a greedy oracle config validates");
}

#[test]
fn engine_options_default_to_exps_and_lists_are_swept() {
    // Left out: the library's defaults, except CUDA graphs on (exp runs one sequence on one
    // thread).
    let config = ExperimentConfig::from_toml("[drafters.a]\nkind = \"ngram\"\n").unwrap();
    let points = sweep_points(&config);
    let want = EngineOptions {
        cuda_graphs: true,
        ..EngineOptions::default()
    };
    assert!(points.iter().all(|p| p.engine == want));
    assert!(points.iter().all(|p| p.engine_swept.is_empty()));
    assert_eq!(points[0].label(), "autoregressive T=0 staged");
    // Every option is a key; the written config states every one and reads back the same.
    let written = config.to_toml().unwrap();
    for key in EngineOptions::keys() {
        assert!(written.contains(&format!("\n{key} = ")), "{key}: {written}");
    }
    assert_eq!(ExperimentConfig::from_toml(&written).unwrap(), config);

    let text = "[drafters.a]\nkind = \"ngram\"\n[sweep]\ngamma = [1, 2]\n\
                [engine]\nqueued_verify = [true, false]\ngemv_max_warps = [16, 32]\npdl = false\n";
    let config = ExperimentConfig::from_toml(text).unwrap();
    config.validate().unwrap();
    let points = sweep_points(&config);
    // (1 autoregressive + 2 γ) × 4 engine combinations.
    assert_eq!(points.len(), 3 * 4);
    assert!(points.iter().all(|p| !p.engine.pdl && p.engine.cuda_graphs));
    let labels: std::collections::BTreeSet<String> = points.iter().map(|p| p.label()).collect();
    assert_eq!(labels.len(), points.len(), "labels stay unique: {labels:?}");
    assert!(
        labels.contains("a γ=2 T=0 staged gemv_max_warps=32 queued_verify=false"),
        "{labels:?}"
    );
    // Each speculative point's baseline has its engine options.
    for p in points.iter().filter(|p| p.gamma.is_some()) {
        let base: Vec<_> = points.iter().filter(|b| b.is_baseline_for(p)).collect();
        assert_eq!(base.len(), 1, "{}", p.label());
        assert_eq!(base[0].engine, p.engine);
    }
    let again = ExperimentConfig::from_toml(&config.to_toml().unwrap()).unwrap();
    assert_eq!(again, config);
    // `--set` reaches the table like any other.
    let (_dir, path) = config_file("[sweep]\nmethod = \"autoregressive\"\n");
    let config = ExperimentConfig::load(&path, &["engine.attn_rows_heads=[2, 4]".into()]).unwrap();
    assert_eq!(sweep_points(&config).len(), 2);
}

#[test]
fn bad_engine_keys_and_values_name_the_key() {
    let cases = [
        (
            "gemv_warps = 16\n",
            "engine.gemv_warps: unknown engine option",
        ),
        (
            "queued_verify = \"yes\"\n",
            "engine.queued_verify = \"yes\"",
        ),
        (
            "gemv_max_warps = [16, 12]\n",
            "engine.gemv_max_warps = 12: expected 8, 16 or 32",
        ),
        ("gemv_loads = 3\n", "engine.gemv_loads = 3"),
        ("l2_prefetch_mb = -1\n", "engine.l2_prefetch_mb = -1"),
        (
            "attn_rows_heads = [2, 2]\n",
            "engine.attn_rows_heads: 2 is listed twice",
        ),
        ("pdl = []\n", "engine.pdl = []"),
    ];
    for (table, needle) in cases {
        let err = load_err(&format!("[engine]\n{table}"));
        assert!(err.contains(needle), "{table:?} gave: {err}");
    }
    let (_dir, path) = config_file("");
    let err = ExperimentConfig::load(&path, &["engine.tc_gemv=2".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("engine.tc_gemv = 2"), "{err}");
}
