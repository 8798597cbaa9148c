//! Validation of an [`ExperimentConfig`]: the structure (no file system) and, separately, the
//! paths it names, so configs for checkpoints that are not on this machine still validate.
use std::path::Path;

use super::{
    DeviceChoice, DrafterConfig, DrafterKind, ExperimentConfig, GammaChoice, Method, SweepConfig,
};
use crate::error::{Error, Result};

impl ExperimentConfig {
    /// Checks every value against its allowed range; the error lists every problem, each
    /// naming its key and the allowed values. Touches no files (see [`Self::check_paths`]).
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.') {
            problems.push(format!(
                "name = {:?}: must be a non-empty folder name without '/' and not starting with '.'",
                self.name
            ));
        }
        if self.max_new_tokens == 0 {
            problems.push("max_new_tokens = 0: must be >= 1".into());
        }
        if self.repeats == 0 {
            problems.push("repeats = 0: must be >= 1 (1 runs every generation once)".into());
        }
        if self.target.tensor_parallel == 0 {
            problems.push(
                "target.tensor_parallel = 0: must be >= 1 (1 keeps the target on one device)"
                    .into(),
            );
        }
        if self.target.tensor_parallel > 1 && self.target.quantized {
            problems.push(format!(
                "target.tensor_parallel = {}: splits dense weights; target.quantized = true is not supported with it",
                self.target.tensor_parallel
            ));
        }
        self.check_gpus(&mut problems);
        for (name, drafter) in &self.drafters {
            check_drafter(name, drafter, &mut problems);
        }
        self.check_dataset(&mut problems);
        self.check_sweep(&mut problems);
        problems.extend(self.prefix_cache.problems());
        problems.extend(self.engine.problems());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(problems.join("\n")))
        }
    }

    /// Checks that the files the run needs exist: the target's and the used draft models'
    /// directories (with a config.json) and the dataset. Run before any long work.
    pub fn check_paths(&self) -> Result<()> {
        let mut problems = Vec::new();
        check_model_dir("target.path", &self.target.path, &mut problems);
        if self.target.quantized && self.target.path.is_dir() {
            problems.push(format!(
                "target.quantized = true: {} is a model directory; only a GGUF file's matrices can stay quantized",
                self.target.path.display()
            ));
        }
        for name in self.used_drafters() {
            if let Some(DrafterConfig {
                kind: DrafterKind::Model | DrafterKind::Oracle | DrafterKind::Eagle3,
                path: Some(path),
                ..
            }) = self.drafters.get(name)
            {
                check_model_dir(&format!("drafters.{name}.path"), path, &mut problems);
            }
        }
        if !self.dataset.path.is_file() {
            problems.push(format!(
                "dataset.path = {:?}: no such file",
                self.dataset.path.display().to_string()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(problems.join("\n")))
        }
    }

    /// Names of the drafters the sweep runs (none without a speculative method).
    pub fn used_drafters(&self) -> Vec<&str> {
        if !self.sweep.methods().contains(&Method::Speculative) {
            return Vec::new();
        }
        match &self.sweep.drafter {
            Some(names) => names.iter().map(String::as_str).collect(),
            None => self.drafters.keys().map(String::as_str).collect(),
        }
    }

    /// The largest draft length any point can use (slack rings are sized for it).
    pub fn max_gamma(&self) -> usize {
        self.sweep
            .gamma
            .iter()
            .map(|g| match g {
                GammaChoice::Fixed(g) => *g,
                GammaChoice::Adaptive => self.sweep.adaptive.max,
            })
            .max()
            .unwrap_or(1)
    }

    fn check_dataset(&self, problems: &mut Vec<String>) {
        if self.dataset.limit == Some(0) {
            problems
                .push("dataset.limit = 0: must be >= 1 (leave it out to use every prompt)".into());
        }
        if self.dataset.per_category == Some(0) {
            problems.push(
                "dataset.per_category = 0: must be >= 1 (leave it out to use every prompt)".into(),
            );
        }
        if let Some(categories) = &self.dataset.categories {
            if categories.is_empty() {
                problems.push(
                    "dataset.categories = []: name at least one category or leave it out".into(),
                );
            }
        }
    }

    fn check_sweep(&self, problems: &mut Vec<String>) {
        let sweep = &self.sweep;
        let allowed = "allowed values: \"autoregressive\", \"speculative\"";
        if sweep.methods().is_empty() {
            problems.push(format!(
                "sweep.method = []: name at least one method; {allowed}"
            ));
        }
        let speculative = sweep.methods().contains(&Method::Speculative);
        if speculative {
            self.check_sweep_drafters(problems);
            self.check_oracle_sampling(problems);
        }
        self.check_sweep_repeats(problems);
        let gammas = sweep.gamma.iter();
        for g in gammas.filter(|g| **g == GammaChoice::Fixed(0)) {
            problems.push(format!(
                "sweep.gamma = {g}: draft lengths must be >= 1 (or \"adaptive\")"
            ));
        }
        if speculative && sweep.gamma.is_empty() {
            problems.push(
                "sweep.gamma = []: name at least one draft length (>= 1) or \"adaptive\"".into(),
            );
        }
        let a = sweep.adaptive;
        if a.min == 0 || a.min > a.max || a.start < a.min || a.start > a.max {
            problems.push(format!(
                "sweep.adaptive = {{ min = {}, max = {}, start = {} }}: need 1 <= min <= start <= max",
                a.min, a.max, a.start
            ));
        }
        check_sampling(sweep, problems);
        check_tree(sweep, problems);
        if sweep.cache.is_empty() {
            problems.push("sweep.cache = []: allowed values: \"staged\", \"slack\"".into());
        }
    }

    /// An oracle's acceptance is defined against the target's argmax: greedy only.
    fn check_oracle_sampling(&self, problems: &mut Vec<String>) {
        let sampled: Vec<f64> = self
            .sweep
            .temperature
            .iter()
            .copied()
            .filter(|t| *t != 0.0)
            .collect();
        if sampled.is_empty() {
            return;
        }
        for name in self.used_drafters() {
            if self.drafters.get(name).map(|d| d.kind) == Some(DrafterKind::Oracle) {
                problems.push(format!(
                    "drafters.{name}: kind = \"oracle\" needs greedy decoding, but sweep.temperature includes {sampled:?}; set sweep.temperature = [0] or sweep.drafter to exclude {name:?}"
                ));
            }
        }
    }

    fn check_sweep_repeats(&self, problems: &mut Vec<String>) {
        let sweep = &self.sweep;
        no_repeats("sweep.method", sweep.methods(), problems);
        if let Some(names) = &sweep.drafter {
            no_repeats("sweep.drafter", names, problems);
        }
        no_repeats("sweep.gamma", &sweep.gamma, problems);
        no_repeats("sweep.temperature", &sweep.temperature, problems);
        no_repeats("sweep.top_k", &sweep.top_k, problems);
        no_repeats("sweep.top_p", &sweep.top_p, problems);
        no_repeats("sweep.cache", &sweep.cache, problems);
    }

    fn check_sweep_drafters(&self, problems: &mut Vec<String>) {
        let defined: Vec<&str> = self.drafters.keys().map(String::as_str).collect();
        if defined.is_empty() {
            problems.push(
                "sweep.method includes \"speculative\" but no drafter is defined: add a [drafters.<name>] table".into(),
            );
            return;
        }
        if let Some(names) = &self.sweep.drafter {
            if names.is_empty() {
                problems.push(format!(
                    "sweep.drafter = []: name at least one of the defined drafters: {}",
                    defined.join(", ")
                ));
            }
            for name in names.iter().filter(|n| !self.drafters.contains_key(*n)) {
                problems.push(format!(
                    "sweep.drafter = {name:?}: no [drafters.{name}] table; defined drafters: {}",
                    defined.join(", ")
                ));
            }
        }
    }
}

/// Temperature, top-k and top-p lists: non-empty, in range.
fn check_sampling(sweep: &SweepConfig, problems: &mut Vec<String>) {
    for t in sweep
        .temperature
        .iter()
        .filter(|t| !(**t >= 0.0 && t.is_finite()))
    {
        problems.push(format!(
            "sweep.temperature = {t}: must be a finite number >= 0 (0 = greedy)"
        ));
    }
    for p in sweep.top_p.iter().filter(|p| !(**p > 0.0 && **p <= 1.0)) {
        problems.push(format!(
            "sweep.top_p = {p}: must be in (0, 1] (1 = no nucleus filter)"
        ));
    }
    for (key, empty) in [
        ("temperature", sweep.temperature.is_empty()),
        ("top_k", sweep.top_k.is_empty()),
        ("top_p", sweep.top_p.is_empty()),
    ] {
        if empty {
            problems.push(format!("sweep.{key} = []: give at least one value"));
        }
    }
}

fn check_tree(sweep: &SweepConfig, problems: &mut Vec<String>) {
    if sweep.tree_width.is_empty() {
        problems.push("sweep.tree_width = []: name at least one width (1 = chain)".into());
    }
    for w in sweep.tree_width.iter().filter(|&&w| w == 0) {
        problems.push(format!(
            "sweep.tree_width = {w}: widths must be >= 1 (1 = chain)"
        ));
    }
    no_repeats("sweep.tree_width", &sweep.tree_width, problems);
    if let Some(budgets) = &sweep.tree_budget {
        if budgets.is_empty() {
            problems.push("sweep.tree_budget = []: name at least one node budget (>= 1), or leave it out for γ".into());
        }
        for b in budgets.iter().filter(|&&b| b == 0) {
            problems.push(format!(
                "sweep.tree_budget = {b}: budgets must be >= 1 drafted nodes"
            ));
        }
        no_repeats("sweep.tree_budget", budgets, problems);
    }
}

/// A value listed twice would run the same point twice under the same label.
fn no_repeats<T: PartialEq + std::fmt::Debug>(key: &str, values: &[T], problems: &mut Vec<String>) {
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            problems.push(format!("{key}: {v:?} is listed twice"));
            return;
        }
    }
}

impl ExperimentConfig {
    /// `target.gpus` gives one GPU per rank, each once; GPUs are named only where CUDA may
    /// run the models; `drafters.<name>.gpu` only where a draft model runs.
    fn check_gpus(&self, problems: &mut Vec<String>) {
        let cuda_possible = matches!(self.device, DeviceChoice::Cuda | DeviceChoice::Auto);
        if let Some(gpus) = &self.target.gpus {
            let n = self.target.tensor_parallel;
            if gpus.len() != n {
                problems.push(format!(
                    "target.gpus = {gpus:?}: names {} GPUs; target.tensor_parallel = {n} needs one per rank",
                    gpus.len()
                ));
            }
            if let Some(g) = gpus
                .iter()
                .find(|g| gpus.iter().filter(|h| h == g).count() > 1)
            {
                problems.push(format!(
                    "target.gpus = {gpus:?}: names GPU {g} twice; each rank needs a GPU of its own"
                ));
            }
            if !cuda_possible {
                problems.push(format!(
                    "target.gpus = {gpus:?}: names CUDA GPUs; device = \"{}\" runs none",
                    self.device.name()
                ));
            }
        }
        for (name, d) in &self.drafters {
            let Some(gpu) = d.gpu else { continue };
            let key = format!("drafters.{name}.gpu = {gpu}");
            match (d.kind, &d.path) {
                (DrafterKind::Model, _) | (DrafterKind::Oracle, Some(_)) => {}
                (DrafterKind::Eagle3, _) => problems.push(format!(
                    "{key}: an EAGLE-3 head reads the target's hidden states and runs beside its rank 0"
                )),
                _ => problems.push(format!(
                    "{key}: places a draft model (kind = \"model\", or \"oracle\" with a path)"
                )),
            }
            if !cuda_possible {
                problems.push(format!(
                    "{key}: names a CUDA GPU; device = \"{}\" runs none",
                    self.device.name()
                ));
            }
        }
    }
}

fn check_drafter(name: &str, d: &DrafterConfig, problems: &mut Vec<String>) {
    let key = format!("drafters.{name}");
    if d.kind != DrafterKind::Oracle && d.alpha.is_some() {
        problems.push(format!("{key}.alpha: applies to kind = \"oracle\" only"));
    }
    if d.quantized {
        match &d.path {
            Some(p) if d.kind == DrafterKind::Model && !crate::gguf::is_gguf(p) && p.exists() => problems
                .push(format!(
                    "{key}.quantized = true: {} is not a GGUF file (only a GGUF file's matrices can stay quantized)",
                    p.display()
                )),
            _ if d.kind != DrafterKind::Model => problems.push(format!(
                "{key}.quantized: applies to kind = \"model\" only"
            )),
            _ => {}
        }
    }
    match d.kind {
        DrafterKind::Oracle => {
            for (field, set) in [
                ("confidence", d.confidence.is_some()),
                ("min_ngram", d.min_ngram.is_some()),
                ("max_ngram", d.max_ngram.is_some()),
            ] {
                if set {
                    problems.push(format!(
                        "{key}.{field}: does not apply to kind = \"oracle\""
                    ));
                }
            }
            match d.alpha {
                None => problems.push(format!(
                    "{key}.alpha: required for kind = \"oracle\" (per-token acceptance in [0, 1])"
                )),
                Some(a) if !(0.0..=1.0).contains(&a) => {
                    problems.push(format!("{key}.alpha = {a}: must be in [0, 1]"))
                }
                Some(_) => {}
            }
        }
        DrafterKind::Model => {
            if d.path.is_none() {
                problems.push(format!(
                    "{key}.path: required for kind = \"model\" (the draft's model directory)"
                ));
            }
            for (field, set) in [
                ("min_ngram", d.min_ngram.is_some()),
                ("max_ngram", d.max_ngram.is_some()),
            ] {
                if set {
                    problems.push(format!("{key}.{field}: does not apply to kind = \"model\""));
                }
            }
            check_confidence(&key, d.confidence, problems);
        }
        DrafterKind::Eagle3 => {
            if d.path.is_none() {
                problems.push(format!(
                    "{key}.path: required for kind = \"eagle3\" (the head's directory)"
                ));
            }
            for (field, set) in [
                ("min_ngram", d.min_ngram.is_some()),
                ("max_ngram", d.max_ngram.is_some()),
            ] {
                if set {
                    problems.push(format!(
                        "{key}.{field}: does not apply to kind = \"eagle3\""
                    ));
                }
            }
            check_confidence(&key, d.confidence, problems);
        }
        DrafterKind::Ngram => {
            for (field, set) in [
                ("path", d.path.is_some()),
                ("confidence", d.confidence.is_some()),
            ] {
                if set {
                    problems.push(format!("{key}.{field}: does not apply to kind = \"ngram\""));
                }
            }
            let (min, max) = d.ngram_sizes();
            if min == 0 || min > max {
                problems.push(format!(
                    "{key}: n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got min_ngram = {min}, max_ngram = {max}"
                ));
            }
        }
    }
}

impl DrafterConfig {
    /// `(min_ngram, max_ngram)` with defaults filled in.
    pub fn ngram_sizes(&self) -> (usize, usize) {
        (
            self.min_ngram.unwrap_or(super::DEFAULT_MIN_NGRAM),
            self.max_ngram.unwrap_or(super::DEFAULT_MAX_NGRAM),
        )
    }
}

/// A drafting confidence threshold is a probability strictly between 0 and 1.
fn check_confidence(key: &str, confidence: Option<f32>, problems: &mut Vec<String>) {
    if let Some(c) = confidence {
        if !(c > 0.0 && c < 1.0) {
            problems.push(format!("{key}.confidence = {c}: must be in (0, 1)"));
        }
    }
}

fn check_model_dir(key: &str, path: &Path, problems: &mut Vec<String>) {
    let shown = path.display();
    if path.is_file() {
        if !crate::gguf::is_gguf(path) {
            problems.push(format!(
                "{key} = \"{shown}\": not a GGUF file (no GGUF magic number); expected a Hugging Face model directory or a .gguf file"
            ));
        }
    } else if !path.is_dir() {
        let hint = if path.starts_with("models/real") {
            "; the real checkpoints are fetched by scripts/fetch-models.sh"
        } else {
            ""
        };
        problems.push(format!(
            "{key} = \"{shown}\": no such directory or file (expected a Hugging Face model directory or a .gguf file){hint}"
        ));
    } else if !path.join("config.json").is_file() {
        problems.push(format!(
            "{key} = \"{shown}\": no config.json in it (expected a Hugging Face model directory)"
        ));
    }
}
