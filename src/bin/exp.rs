//! `exp`: run speculative decoding experiments from TOML configs.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use specdec::bench_cache::{self, BenchConfig};
use specdec::experiment::{run_experiment, ExperimentConfig, ProcessRank, RunOptions};

/// Run speculative decoding experiments: compare acceptance rates and speedups of draft
/// models and n-gram drafting against autoregressive decoding.
#[derive(Parser, Debug)]
#[command(name = "exp", version, args_conflicts_with_subcommands = true)]
#[command(after_help = "Examples:\n  \
    exp                                   run configs/default.toml\n  \
    exp configs/qwen2.5-0.5b-7b.toml --set dataset.limit=8\n  \
    exp run my.toml --out /tmp/r1 --set sweep.gamma=[1,2,4] --set sweep.temperature=0")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an experiment config (the default when no subcommand is given).
    Run(RunArgs),
    /// Benchmark the cache rollback strategies on CPU and write results.csv, summary.md and
    /// plots (a small TOML config may narrow the grid; defaults are built in).
    BenchCache(BenchCacheArgs),
}

#[derive(Args, Debug)]
struct BenchCacheArgs {
    /// Grid config (TOML: strategies, lengths, gammas, patterns, kv_heads, head_dim, layers,
    /// min_runs, max_runs, target_ms, seed). Default: the built-in grid.
    #[arg(value_name = "CONFIG")]
    config: Option<PathBuf>,
    /// Result folder. Default: experiments/bench-cache/<run-id>/. It must not exist.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

fn bench_cache(args: BenchCacheArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => BenchConfig::load(path).context("invalid bench-cache config")?,
        None => BenchConfig::default(),
    };
    let rows = bench_cache::measure(&config, |r| {
        eprint!(
            "\r{:<14} length {:>6} γ {:>2} {:<6} {:>10.1} µs",
            r.strategy.name(),
            r.length,
            r.gamma,
            r.pattern.name(),
            r.step_us
        )
    })
    .context("cache benchmark failed")?;
    eprintln!();
    let outcome = bench_cache::write_results(&config, &rows, args.out)?;
    println!("{}", outcome.table);
    println!("{}", bench_cache::target_checks(&rows));
    println!("results: {}", outcome.dir.display());
    Ok(())
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The experiment config (TOML). Default: configs/default.toml.
    #[arg(value_name = "CONFIG")]
    config: Option<PathBuf>,
    /// Result folder. Default: experiments/<name>/<run-id>/ (run-id: a local timestamp).
    /// It must not exist; results appear there only when the run succeeds.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Override a config key before validation: a dotted path and a TOML value, e.g.
    /// `dataset.limit=2`, `sweep.gamma=[1,2]`, `drafters.small.path=/models/x`
    /// (a value that is not valid TOML is taken as a string). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Do not draw the progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Run only this rank of the target's `tensor_parallel` ranks, the others in processes of
    /// their own (on this host or others, each running the same config with its own --rank):
    /// CUDA with NCCL; each process on GPU 0 of those it sees (set CUDA_VISIBLE_DEVICES).
    #[arg(long, value_name = "R", requires = "rendezvous")]
    rank: Option<usize>,
    /// With --rank: a file every process can read, fresh per launch, through which rank 0
    /// hands the others the group's NCCL id.
    #[arg(long, value_name = "FILE", requires = "rank")]
    rendezvous: Option<PathBuf>,
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let path = args
        .config
        .unwrap_or_else(|| PathBuf::from("configs/default.toml"));
    let config = ExperimentConfig::load(&path, &args.set).context("invalid experiment config")?;
    let opts = RunOptions {
        out: args.out,
        progress: !args.no_progress,
        process: args
            .rank
            .zip(args.rendezvous)
            .map(|(rank, rendezvous)| ProcessRank { rank, rendezvous }),
    };
    let outcome = run_experiment(&config, &opts)
        .with_context(|| format!("experiment {} ({}) failed", config.name, path.display()))?;
    print!("{}", outcome.answer);
    println!("results: {}", outcome.dir.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Engine options (CUDA graphs among them) come from the config's `[engine]` table, with
    // the SPECDEC_* variables as an override layer; the runner puts each point's in effect.
    // The whole run on rayon's pool: candle's parallel CPU ops then start in place instead of
    // handing off to the pool from outside it (see `on_cpu_pool`).
    let result = specdec::nn::on_cpu_pool(|| match cli.command {
        Some(Command::Run(args)) => run(args),
        Some(Command::BenchCache(args)) => bench_cache(args),
        None => run(cli.run),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", context_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message
/// already holds (errors that print their source, such as an I/O error naming its file).
fn context_chain(e: &anyhow::Error) -> String {
    let mut message = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !message.contains(&cause) {
            message += ": ";
            message += &cause;
        }
    }
    message
}
