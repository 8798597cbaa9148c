//! The README's library example: load the shipped target and draft, run one greedy
//! speculative generation, print its metrics (`cargo run --release --example speculate`).
use std::{path::Path, sync::Arc};

use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::models::{load_tokenizer, LoadOptions, Model};
use specdec::speculative::{generate, CachedSequence, Drafting, GammaPolicy, GenParams};
use specdec::speculative::{ModelDrafter, SamplingParams};

fn main() -> anyhow::Result<()> {
    let opts = LoadOptions::default(); // the CPU, f32
    let target = Model::load(Path::new("models/target"), &opts)?;
    let draft = Arc::new(Model::load(Path::new("models/draft"), &opts)?);
    let tokenizer = load_tokenizer(Path::new("models/target"))?;
    let prompt = tokenizer
        .encode("def fib(n):", false)
        .map_err(anyhow::Error::msg)?;
    let params = GenParams {
        max_new_tokens: 64,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(4),
        stop_at_eos: true,
    };
    let strategy = RotatingStrategy::Staged;
    let mut seq = CachedSequence::new(target.new_cache(strategy)?);
    let mut drafter = ModelDrafter::new("small", draft, strategy, None)?;
    let mut rng = StdRng::seed_from_u64(0);
    let drafting = Drafting::chain(&mut drafter); // a chain of γ drafts a step
    let record = generate(
        &target,
        &mut seq,
        prompt.get_ids(),
        &params,
        drafting,
        &mut rng,
    )?;
    println!(
        "{}",
        tokenizer
            .decode(&record.output_ids, true)
            .map_err(anyhow::Error::msg)?
    );
    println!(
        "{} tokens, {} target forwards, accepted per step {:?}, {:.0} tok/s",
        record.new_tokens(),
        record.target_forwards,
        record.accepted,
        record.tokens_per_s()
    );
    Ok(())
}
