//! `exp`: run speculative decoding experiments from TOML configs.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use specdec::experiment::{run_experiment, ExperimentConfig, RunOptions};

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
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let path = args
        .config
        .unwrap_or_else(|| PathBuf::from("configs/default.toml"));
    let config = ExperimentConfig::load(&path, &args.set).context("invalid experiment config")?;
    let opts = RunOptions {
        out: args.out,
        progress: !args.no_progress,
    };
    let outcome = run_experiment(&config, &opts)
        .with_context(|| format!("experiment {} ({}) failed", config.name, path.display()))?;
    println!("{}", outcome.table);
    println!("results: {}", outcome.dir.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Run(args)) => args,
        None => cli.run,
    };
    match run(args) {
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
