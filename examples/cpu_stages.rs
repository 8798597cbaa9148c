//! Where a decode step and a five-token verification of one model spend their time, stage by
//! stage (`specdec::nn::profile`): the products, attention, RoPE, norms, the SiLU gate, the LM
//! head. Each kind runs 2,000 times after a prompt (inside a speculation that rolls back, so
//! every forward sees the same cache), once plain and once with the stage marks, twice over.
//!
//! `cargo run --release --example cpu_stages -- [MODEL (models/target)] [CONTEXT (128)] [forwards (2000)] [ROWS (1,5)]`
use std::path::PathBuf;
use std::time::Instant;

use specdec::cache::RotatingStrategy;
use specdec::models::{LoadOptions, Model};
use specdec::nn::profile;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "models/target".into()));
    let context: usize = match args.next() {
        Some(s) => s.parse().map_err(|e| format!("CONTEXT {s:?}: {e}"))?,
        None => 128,
    };
    let forwards: usize = match args.next() {
        Some(s) => s.parse().map_err(|e| format!("forwards {s:?}: {e}"))?,
        None => 2000,
    };
    let rows: Vec<usize> = match args.next() {
        Some(s) => s
            .split(',')
            .map(|r| r.parse().map_err(|e| format!("ROWS {s:?}: {e}")))
            .collect::<Result<_, _>>()?,
        None => vec![1, 5],
    };
    specdec::nn::on_cpu_pool(|| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let model = Model::load(&dir, &LoadOptions::default())?;
        let vocab = model.info().vocab_size;
        let prompt: Vec<u32> = (0..context)
            .map(|i| ((i * 37 + 11) % vocab) as u32)
            .collect();
        let mut seeded = model.new_cache(RotatingStrategy::Slack { max_draft: 8 })?;
        model.forward_last(&prompt, &mut seeded)?;
        println!(
            "{} after {context} tokens, {forwards} forwards a row",
            dir.display()
        );
        for len in rows.iter().chain(&rows).copied() {
            for marked in [false, true] {
                profile::enable(marked);
                let start = Instant::now();
                for _ in 0..forwards {
                    let mut spec = seeded.speculate()?;
                    if len == 1 {
                        std::hint::black_box(model.forward_last(&prompt[..1], spec.cache())?);
                    } else {
                        std::hint::black_box(model.forward(&prompt[..len], spec.cache())?);
                    }
                }
                let ms = start.elapsed().as_secs_f64() * 1e3 / forwards as f64;
                println!("{len} token(s), stage marks {marked}: {ms:.4} ms a forward");
                for (stage, spent, _) in profile::take() {
                    let ms = spent.as_secs_f64() * 1e3 / forwards as f64;
                    println!("    {stage:28} {ms:.4} ms");
                }
            }
        }
        profile::enable(false);
        Ok(())
    })
}
