//! One experiment end to end: check, load, run the sweep, write the result folder.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tokenizers::Tokenizer;

use super::chat::{encode_conversation, encode_prompt, ChatTemplate};
use super::config::{DrafterKind, ExperimentConfig, TurnsChoice};
use super::context::check_context;
use super::dataset::load_prompts;
use super::load::{
    align_vocabularies, check_vocabulary, load_options, select_device, LoadedModel, Placement,
};
use super::output::{default_result_path, ResultDir};
use super::plot::write_plots;
use super::report::{
    answer, csv, engine_section, markdown, markdown_table, prefill_section, prompt_markdown,
    prompt_rows, recordings_section, store_section, store_verdict, tree_markdown, turns_section,
    Agreement, StrategyCheck, ENGINE_VERDICT, SPECULATIVE_VERDICT,
};
use super::runner::{
    Conversations, DraftSource, EncodedPrompt, ResultRecord, Session, SweepObserver,
};
use super::summary::{summarize, PointSummary};
use super::sweep::{sweep_points, SweepPoint};
use crate::error::{Error, Result};
use crate::models::{is_eagle3, load_eagle3, load_tokenizer, LoadOptions, RankGroup};
use crate::nn::Eagle3Head;
use crate::speculative::ReferenceStore;

/// How to run an experiment.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The result folder (default `experiments/<name>/<run-id>`).
    pub out: Option<PathBuf>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// This process runs one rank of the target, the others run in other processes (other
    /// hosts), each running the same config (see [`ProcessRank`]); `None`: every rank here.
    pub process: Option<ProcessRank>,
}

/// `exp --rank R --rendezvous FILE`: this process runs rank `rank` of the target's
/// `tensor_parallel` ranks on its CUDA device (GPU 0 of those it sees: give each process its
/// GPU with `CUDA_VISIBLE_DEVICES`), its drafters beside it. Every process runs the whole
/// experiment and takes the same decisions (every rank computes the logits); each writes its
/// own results (ranks past 0 to `<name>-rank<R>` by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRank {
    /// This process's rank.
    pub rank: usize,
    /// The file through which rank 0 hands the others the group's NCCL id (a path every
    /// process reads, fresh per launch).
    pub rendezvous: PathBuf,
}

/// What a finished run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The result folder.
    pub dir: PathBuf,
    /// One summary per sweep point.
    pub summaries: Vec<PointSummary>,
    /// The summary table (Markdown).
    pub table: String,
    /// The sections of summary.md after the table (cache strategies, engine options, prefix
    /// store, …, those with nothing to say left out) and the peak resident memory line
    /// (Markdown).
    pub checks: String,
    /// What `exp` prints: the fastest point per drafter and sampling setting, the one-line
    /// checks and where the full tables are (at most about 40 lines).
    pub answer: String,
}

/// The process's peak resident memory in bytes (`VmHWM` of `/proc/self/status`); `None` where
/// the system does not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn peak_rss_line() -> String {
    match peak_rss_bytes() {
        Some(b) => format!(
            "Peak resident memory of the run (models, caches, everything): {:.1} MiB.\n",
            b as f64 / (1024.0 * 1024.0)
        ),
        None => "Peak resident memory: not reported by this system.\n".to_string(),
    }
}

/// Runs `config` (already validated): applies the `SPECDEC_*` engine overrides
/// ([`crate::engine::env`]) to `[engine]`, checks paths and the result folder, loads tokenizer,
/// prompts and models (every error so far comes before any generation), runs the sweep and
/// writes `config.toml` (the config as run, overrides included), `results.jsonl`,
/// `summary.md`, `summary.csv` and `plots/*.svg`.
pub fn run_experiment(config: &ExperimentConfig, opts: &RunOptions) -> Result<RunOutcome> {
    // The SPECDEC_* override layer on top of `[engine]`: what runs, and what config.toml says.
    let config = &ExperimentConfig {
        engine: config.engine.with_env_overrides()?,
        ..config.clone()
    };
    config.validate()?;
    config.check_paths()?;
    let out = opts.out.clone().unwrap_or_else(|| match &opts.process {
        Some(p) if p.rank > 0 => default_result_path(&format!("{}-rank{}", config.name, p.rank)),
        _ => default_result_path(&config.name),
    });
    let dir = ResultDir::plan(out)?;
    let tokenizer = load_tokenizer(&config.target.path)?;
    let template = match config.dataset.chat_template {
        true => Some(ChatTemplate::load(&config.target.path)?),
        false => None,
    };
    let (prompts, turns) = encode_prompts(config, &tokenizer, template.as_ref())?;
    check_context(config, &prompts)?;
    let first_gpu = config.target.gpus.as_ref().and_then(|g| g.first().copied());
    let device = select_device(config.device, first_gpu.unwrap_or(0))?;
    let mut placement = Placement::new(device.clone());
    let group = process_rank(config, opts, &device)?;
    let ranks = match group {
        Some(_) => vec![device.clone()],
        None => placement.target(&config.target)?,
    };
    let load = LoadOptions {
        random_weights: config.random_weights,
        ..load_options(device.clone(), config.dtype)
    };
    let target_load = LoadOptions {
        device: ranks[0].clone(),
        quantized: config.target.quantized,
        tensor_parallel: config.target.tensor_parallel,
        rank_devices: if ranks.len() > 1 { ranks } else { Vec::new() },
        rank_group: group,
        ..load.clone()
    };
    let mut target = LoadedModel::load(&config.target.path, &target_load)?;
    let mut drafts = load_drafts(config, (&load, &mut placement), &target, &tokenizer)?;
    let mut all: Vec<&mut LoadedModel> = vec![&mut target];
    all.extend(drafts.values_mut());
    if let Some(width) = align_vocabularies(&mut all) {
        eprintln!("note: models pad their vocabularies differently; logits limited to the shared first {width} ids");
    }
    let heads = load_heads(config, &target)?;
    let context = describe(config, &target, (&drafts, &heads), &device, prompts.len());
    let decode = |ids: &[u32]| -> Result<String> {
        tokenizer
            .decode(ids, false)
            .map_err(|e| Error::invalid(format!("cannot decode output tokens: {e}")))
    };
    let session = Session {
        target_device: target.model.device().clone(),
        target: Arc::new(target),
        drafters: draft_sources(config, drafts, heads),
        prompts,
        decode: &decode,
    };
    let points = sweep_points(config);
    let partial = dir.create()?.to_path_buf();
    write(&partial.join("config.toml"), &config.to_toml()?)?;
    let encode_turns = |turns: &[String]| -> Result<Vec<u32>> {
        encode_conversation(&tokenizer, "", turns, template.as_ref())
    };
    let conversations = (config.dataset.turns == TurnsChoice::All).then_some(Conversations {
        turns,
        encode: &encode_turns,
    });
    let records = run_points(
        config,
        &session,
        &points,
        (&partial, conversations.as_ref()),
        opts.progress,
    )
    .map_err(|e| {
        Error::invalid(format!(
            "{e} (partial results kept in {})",
            partial.display()
        ))
    })?;
    let summaries = summarize(&points, &records);
    let (checks, check_lines) = check_sections(&points, &records, &summaries);
    let title = format!("Experiment `{}`", config.name);
    write(
        &partial.join("summary.md"),
        &format!("{}\n{checks}", markdown(&title, &context, &summaries)),
    )?;
    write(&partial.join("summary.csv"), &csv(&summaries))?;
    write(
        &partial.join("by_prompt.md"),
        &prompt_markdown(&prompt_rows(&points, &records)),
    )?;
    let plots = write_plots(&partial.join("plots"), &summaries)?;
    let dir = dir.finish()?;
    Ok(RunOutcome {
        answer: answer(&summaries, &check_lines, &dir, plots.len()),
        dir,
        table: markdown_table(&summaries),
        summaries,
        checks,
    })
}

/// The sections of summary.md after the table, those with nothing to say left out, and the
/// one-line checks the terminal repeats.
fn check_sections(
    points: &[SweepPoint],
    records: &[ResultRecord],
    summaries: &[PointSummary],
) -> (String, Vec<String>) {
    let strategy = StrategyCheck::new(points, records);
    let speculative =
        Agreement::speculative_vs_autoregressive(points, records).verdict(SPECULATIVE_VERDICT);
    let engine = Agreement::across_engine_options(points, records).verdict(ENGINE_VERDICT);
    let rss = peak_rss_line();
    let sections = [
        tree_markdown(summaries),
        strategy.markdown(),
        engine_section(points, records),
        prefill_section(points, records),
        store_section(points, records),
        turns_section(points, records),
        speculative
            .clone()
            .map_or_else(String::new, |v| format!("{v}\n")),
        recordings_section(records),
        rss.clone(),
    ];
    let markdown: Vec<String> = sections
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end().to_string() + "\n")
        .collect();
    let lines = [
        speculative,
        strategy.verdict(),
        engine,
        store_verdict(points, records),
        Some(rss.trim_end().to_string()),
    ];
    (markdown.join("\n"), lines.into_iter().flatten().collect())
}

/// The dataset's prompts (first turns) encoded with the target's tokenizer (and chat
/// template), and every prompt's user turns.
fn encode_prompts(
    config: &ExperimentConfig,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> Result<(Vec<EncodedPrompt>, Vec<Vec<String>>)> {
    let mut encoded = Vec::new();
    let mut turns = Vec::new();
    for p in load_prompts(&config.dataset)? {
        encoded.push(EncodedPrompt {
            tokens: encode_prompt(tokenizer, &p, template)?,
            id: p.id,
            category: p.category,
        });
        turns.push(p.turns);
    }
    Ok((encoded, turns))
}

/// The draft models the sweep uses, each checked against the target's vocabulary.
/// Each on its `gpu`, else beside the target's rank 0.
fn load_drafts(
    config: &ExperimentConfig,
    (load, placement): (&LoadOptions, &mut Placement),
    target: &LoadedModel,
    tokenizer: &Tokenizer,
) -> Result<BTreeMap<String, LoadedModel>> {
    let mut drafts = BTreeMap::new();
    for name in config.used_drafters() {
        let Some(d) = config.drafters.get(name) else {
            continue;
        };
        if let (DrafterKind::Model | DrafterKind::Oracle, Some(path)) = (d.kind, &d.path) {
            if d.kind == DrafterKind::Oracle && is_eagle3(path) {
                continue;
            }
            let opts = LoadOptions {
                device: placement.draft(name, d.gpu, target.model.device())?,
                quantized: d.quantized,
                ..load.clone()
            };
            let draft = LoadedModel::load(path, &opts)?;
            check_vocabulary(name, (target, tokenizer), &draft)?;
            drafts.insert(name.to_string(), draft);
        }
    }
    Ok(drafts)
}

/// The EAGLE-3 heads the sweep uses, loaded for the target (its layers and embedding).
fn load_heads(
    config: &ExperimentConfig,
    target: &LoadedModel,
) -> Result<BTreeMap<String, Arc<Eagle3Head>>> {
    let mut heads = BTreeMap::new();
    for name in config.used_drafters() {
        let Some(d) = config.drafters.get(name) else {
            continue;
        };
        let head_path = match (d.kind, &d.path) {
            (DrafterKind::Eagle3, Some(path)) => Some(path),
            (DrafterKind::Oracle, Some(path)) if is_eagle3(path) => Some(path),
            _ => None,
        };
        if let Some(path) = head_path {
            if let Some(gpu) = d.gpu {
                return Err(Error::invalid(format!(
                    "drafters.{name}.gpu = {gpu}: {} is an EAGLE-3 head, which reads the target's hidden states and runs beside its rank 0",
                    path.display()
                )));
            }
            let head = load_eagle3(path, target.model.num_layers(), target.model.embedding())
                .map_err(|e| Error::invalid(format!("drafters.{name}: {e}")))?;
            heads.insert(name.to_string(), Arc::new(head));
        }
    }
    Ok(heads)
}

fn draft_sources(
    config: &ExperimentConfig,
    mut models: BTreeMap<String, LoadedModel>,
    mut heads: BTreeMap<String, Arc<Eagle3Head>>,
) -> BTreeMap<String, DraftSource<LoadedModel>> {
    let mut sources = BTreeMap::new();
    // One store of greedy references for every oracle of the run.
    let references = ReferenceStore::default();
    for name in config.used_drafters() {
        let Some(d) = config.drafters.get(name) else {
            continue;
        };
        if let (Some(head), DrafterKind::Eagle3) = (heads.get(name), d.kind) {
            let head = Arc::clone(head);
            let confidence = d.confidence;
            sources.insert(name.to_string(), DraftSource::Eagle3 { head, confidence });
            continue;
        }
        let source = match (d.kind, models.remove(name)) {
            (DrafterKind::Model, Some(model)) => DraftSource::Model {
                model: Arc::new(model),
                confidence: d.confidence,
            },
            (DrafterKind::Oracle, cost) => DraftSource::Oracle {
                alpha: d.alpha.unwrap_or(1.0),
                cost: cost.map(Arc::new),
                cost_head: heads.remove(name),
                references: references.clone(),
            },
            _ => {
                let (min_ngram, max_ngram) = d.ngram_sizes();
                DraftSource::Ngram {
                    min_ngram,
                    max_ngram,
                }
            }
        };
        sources.insert(name.to_string(), source);
    }
    sources
}

/// Warms up, then runs the points, appending each record to `results.jsonl` as it comes.
fn run_points(
    config: &ExperimentConfig,
    session: &Session<'_, LoadedModel>,
    points: &[SweepPoint],
    (dir, conversations): (&Path, Option<&Conversations<'_>>),
    progress: bool,
) -> Result<Vec<ResultRecord>> {
    let per_point = conversations.map_or(session.prompts.len(), |c| {
        c.turns.iter().map(|t| t.len().max(1)).sum()
    });
    let bar = if progress {
        ProgressBar::new((points.len() * per_point) as u64)
    } else {
        ProgressBar::hidden()
    };
    let style = ProgressStyle::with_template(
        "[{elapsed_precise}] {bar:30} {pos}/{len} generations · {msg}",
    )
    .map_err(|e| Error::invalid(format!("progress bar: {e}")))?;
    bar.set_style(style);
    if config.warmup {
        bar.set_message("warming up");
        session.warm_up(config)?;
    }
    let path = dir.join("results.jsonl");
    let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
    let mut observer = Recorder {
        out: BufWriter::new(file),
        path,
        bar: bar.clone(),
        label: String::new(),
        tokens: 0,
        started: Instant::now(),
    };
    let records = session.run_with(config, points, &mut observer, conversations)?;
    bar.finish_and_clear();
    Ok(records)
}

/// Writes records as JSON lines and reports progress.
struct Recorder {
    out: BufWriter<File>,
    path: PathBuf,
    bar: ProgressBar,
    label: String,
    tokens: usize,
    started: Instant,
}

impl SweepObserver for Recorder {
    fn point_started(&mut self, index: usize, total: usize, point: &SweepPoint) {
        self.label = format!("point {}/{total}: {}", index + 1, point.label());
        self.tokens = 0;
        self.started = Instant::now();
        self.bar.set_message(self.label.clone());
    }

    fn record(&mut self, record: &ResultRecord) -> Result<()> {
        let line = serde_json::to_string(record)
            .map_err(|e| Error::invalid(format!("cannot serialise a result: {e}")))?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(|e| Error::io(&self.path, e))?;
        self.tokens += record.new_tokens;
        let rate = self.tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        self.bar
            .set_message(format!("{} · {rate:.1} tok/s", self.label));
        self.bar.inc(1);
        Ok(())
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// A device as the summary names it.
fn place(at: candle_core::DeviceLocation) -> String {
    match at {
        candle_core::DeviceLocation::Cpu => "the CPU".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("GPU {gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("Metal GPU {gpu_id}"),
    }
}

/// This process's rank of a target split over processes (`--rank`), joined to the others.
fn process_rank(
    config: &ExperimentConfig,
    opts: &RunOptions,
    device: &candle_core::Device,
) -> Result<Option<RankGroup>> {
    let Some(p) = &opts.process else {
        return Ok(None);
    };
    let world = config.target.tensor_parallel;
    if p.rank >= world {
        return Err(Error::invalid(format!(
            "--rank {}: target.tensor_parallel = {world} has ranks 0..{}",
            p.rank,
            world.saturating_sub(1)
        )));
    }
    if let Some(gpus) = &config.target.gpus {
        return Err(Error::invalid(format!(
            "target.gpus = {gpus:?}: with --rank each process runs one rank on its device (give it its GPU with CUDA_VISIBLE_DEVICES)"
        )));
    }
    let wait = std::time::Duration::from_secs(600);
    let reduce = crate::nn::process_group(device, p.rank, world, &p.rendezvous, wait)
        .map_err(|e| Error::invalid(format!("--rank {}: {e}", p.rank)))?;
    Ok(Some(RankGroup {
        rank: p.rank,
        reduce,
    }))
}

/// The run's setting, for the head of summary.md.
fn describe(
    config: &ExperimentConfig,
    target: &LoadedModel,
    (drafts, heads): (
        &BTreeMap<String, LoadedModel>,
        &BTreeMap<String, Arc<Eagle3Head>>,
    ),
    device: &candle_core::Device,
    prompts: usize,
) -> String {
    let model = |m: &LoadedModel| {
        let i = m.model.info();
        format!(
            "`{}` ({}, {:.1}M parameters, {} layers, {:?}{})",
            m.dir.display(),
            i.arch,
            i.param_count as f64 / 1e6,
            i.num_layers,
            i.dtype,
            i.sliding_window
                .map_or_else(String::new, |w| format!(", sliding window {w}")),
        )
    };
    let mut s = format!("* target: {}\n", model(target));
    if config.random_weights {
        s += "* random weights drawn from each model's config.json (random_weights = true): a speed study; the outputs mean nothing\n";
    }
    let ranks = target.model.rank_locations();
    let world = target.model.ranks();
    if ranks.len() > 1 {
        let on: Vec<String> = ranks.iter().map(|&l| place(l)).collect();
        s += &format!(
            "* target split over {} ranks (tensor parallelism) on {}\n",
            ranks.len(),
            on.join(", ")
        );
    } else if world > 1 {
        s += &format!(
            "* target split over {world} ranks in separate processes (tensor parallelism); this process ran rank {} on {}\n",
            target.model.rank(),
            place(ranks[0])
        );
    }
    for (name, d) in drafts {
        let at = d.model.device().location();
        let at = match at == ranks[0] {
            true => String::new(),
            false => format!(", on {}", place(at)),
        };
        s += &format!("* drafter `{name}`: {}{at}\n", model(d));
    }
    for (name, h) in heads {
        let path = config.drafters.get(name).and_then(|d| d.path.as_ref());
        s += &format!(
            "* drafter `{name}`: EAGLE-3 head `{}` ({:.1}M parameters, fusing target layers {:?}, draft vocabulary {})\n",
            path.map_or_else(String::new, |p| p.display().to_string()),
            h.param_count() as f64 / 1e6,
            h.target_layers(),
            h.draft_vocab_size()
        );
    }
    s + &format!(
        "* host: {}\n\
         * device: {:?}; prompts: {prompts} from `{}`{}; max_new_tokens: {}; seed: {}\n\
         * engine options: `[engine]` of `config.toml` (SPECDEC_* overrides applied); swept: {}\n\
         * resolved config: `config.toml`; per-generation records: `results.jsonl`",
        super::host::description(),
        device.location(),
        config.dataset.path.display(),
        super::dataset::selection(&config.dataset),
        config.max_new_tokens,
        config.seed,
        match config.engine.swept() {
            swept if swept.is_empty() => "none".to_string(),
            swept => swept.join(", "),
        }
    )
}
