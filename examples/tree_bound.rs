//! The most τ that greedy tree speculation of each width can reach on an experiment config's
//! prompts, whatever the budget: the τ of the full tree of the draft's top-`width` children
//! at depth γ (see `specdec::speculative::full_tree_steps`), from the target's greedy output
//! and one teacher-forced draft pass per prompt. Width 1 is the chain's τ exactly.
//!
//!   cargo run --release --example tree_bound -- configs/tree.toml [GAMMA] [DRAFTER]
//!
//! GAMMA defaults to 4 and DRAFTER to `small` (a `kind = "model"` drafter of the config).
//! Prompts are encoded like `exp` encodes them (chat template included); the models must
//! share one vocabulary size.
use std::path::Path;

use anyhow::{bail, Context};
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::experiment::{encode_prompt, load_prompts, ChatTemplate, ExperimentConfig};
use specdec::models::{load_tokenizer, LoadOptions, Model};
use specdec::speculative::{
    draft_ranks, full_tree_steps, generate, CachedSequence, Drafting, GammaPolicy, GenParams,
    LanguageModel, SamplingParams,
};

const WIDTHS: [usize; 6] = [1, 2, 3, 4, 6, 8];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        bail!("usage: tree_bound CONFIG [GAMMA] [DRAFTER]");
    };
    let gamma: usize = args.get(1).map_or(Ok(4), |g| g.parse())?;
    let drafter = args.get(2).map_or("small", String::as_str);
    let config = ExperimentConfig::load(Path::new(path), &[])?;
    let draft_dir = config
        .drafters
        .get(drafter)
        .and_then(|d| d.path.clone())
        .with_context(|| format!("no drafter {drafter} with a model path"))?;
    let tokenizer = load_tokenizer(&config.target.path)?;
    let template = match config.dataset.chat_template {
        true => Some(ChatTemplate::load(&config.target.path)?),
        false => None,
    };
    let target = Model::load(&config.target.path, &LoadOptions::default())?;
    let draft = Model::load(&draft_dir, &LoadOptions::default())?;
    if target.vocab_size() != draft.vocab_size() {
        bail!("target and draft vocabularies differ in size");
    }
    let params = GenParams {
        max_new_tokens: config.max_new_tokens,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(1),
        stop_at_eos: config.stop_at_eos,
    };
    // Per width: tokens after the prefill's first, and verification steps (τ's terms);
    // those tokens that are among the draft's top `width`.
    let (mut tokens, mut steps) = (0usize, [0usize; WIDTHS.len()]);
    let mut within = [0usize; WIDTHS.len()];
    for p in load_prompts(&config.dataset)? {
        let prompt = encode_prompt(&tokenizer, &p, template.as_ref())?;
        let mut seq = CachedSequence::new(target.new_cache(RotatingStrategy::Staged)?);
        let mut rng = StdRng::seed_from_u64(config.seed);
        let output = generate(
            &target,
            &mut seq,
            &prompt,
            &params,
            Drafting::None,
            &mut rng,
        )?
        .output_ids;
        let ranks = draft_ranks(&draft, &prompt, &output)?;
        tokens += output.len().saturating_sub(1);
        for (i, &w) in WIDTHS.iter().enumerate() {
            steps[i] += full_tree_steps(&ranks, w, gamma, config.max_new_tokens);
            within[i] += ranks.iter().skip(1).filter(|&&r| r < w).count();
        }
    }
    let chain = tokens as f64 / steps[0] as f64;
    println!("{path}, γ = {gamma}, drafter {drafter}: full tree of the draft's top-width children");
    println!(
        "| width | target token in the draft's top width | nodes | τ bound | / chain τ |\n\
         |---:|---:|---:|---:|---:|"
    );
    for (i, &w) in WIDTHS.iter().enumerate() {
        let tau = tokens as f64 / steps[i] as f64;
        let share = 100.0 * within[i] as f64 / tokens as f64;
        let nodes: usize = (1..=gamma as u32).map(|d| w.pow(d)).sum();
        println!(
            "| {w} | {share:.1}% | {nodes} | {tau:.3} | {:.3} |",
            tau / chain
        );
    }
    Ok(())
}
