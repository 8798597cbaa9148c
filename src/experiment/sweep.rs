//! The sweep's points: the cartesian product of the `[sweep]` lists, autoregressive first.
use serde::{Deserialize, Serialize};

use super::config::engine::option_value;
use super::config::{AdaptiveGamma, CacheChoice, ExperimentConfig, GammaChoice, Method};
use crate::cache::RotatingStrategy;
use crate::engine::EngineOptions;
use crate::speculative::{GammaPolicy, SamplingParams};

/// One combination of settings; every prompt is generated once per point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Decoding method.
    pub method: Method,
    /// Drafter name (speculative only).
    pub drafter: Option<String>,
    /// Draft length (speculative only).
    pub gamma: Option<GammaChoice>,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Top-k filter (0 = off).
    pub top_k: usize,
    /// Nucleus filter (1 = off).
    pub top_p: f64,
    /// Rotating-cache strategy.
    pub cache: CacheChoice,
    /// Draft tree width (1 = chain).
    #[serde(default = "one")]
    pub tree_width: usize,
    /// Most drafted nodes per step (speculative points; γ for chains, `None` for adaptive
    /// chains and autoregressive points).
    #[serde(default)]
    pub tree_budget: Option<usize>,
    /// Whether prefills use a prefix store (`[prefix_cache] enabled`).
    #[serde(default)]
    pub prefix_cache: bool,
    /// The engine options in effect for this point's generations (`[engine]`, with the
    /// environment's overrides where the run applied them); a record's `engine` object.
    #[serde(default)]
    pub engine: EngineOptions,
    /// The `[engine]` keys the sweep varies (named with their values in labels); a record's
    /// `engine_swept`, left out when the sweep varies none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_swept: Vec<String>,
}

fn one() -> usize {
    1
}

impl SweepPoint {
    /// The sampling settings shared by target and draft.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }

    /// The sampling settings as a short text: `T=0`, `T=1 k=50 p=0.9`.
    pub fn sampling_label(&self) -> String {
        let mut s = format!("T={}", self.temperature);
        if self.top_k > 0 {
            s += &format!(" k={}", self.top_k);
        }
        if self.top_p < 1.0 {
            s += &format!(" p={}", self.top_p);
        }
        s
    }

    /// The swept engine options with their values (`queued_verify=false gemv_max_warps=32`);
    /// empty when the sweep varies none.
    pub fn engine_label(&self) -> String {
        let parts: Vec<String> = self
            .engine_swept
            .iter()
            .filter_map(|key| Some(format!("{key}={}", option_value(&self.engine, key)?)))
            .collect();
        parts.join(" ")
    }

    /// The sampling settings, cache and swept engine options as a short text: `T=0 staged`,
    /// `T=1 k=50 p=0.9 slack`, `T=0 staged prefix-cache`, `T=0 staged queued_verify=false`.
    pub fn setting_label(&self) -> String {
        let mut s = format!("{} {}", self.sampling_label(), self.cache);
        if self.prefix_cache {
            s += " prefix-cache";
        }
        let engine = self.engine_label();
        if !engine.is_empty() {
            s += &format!(" {engine}");
        }
        s
    }

    /// A unique, readable name: `autoregressive T=0 staged`, `small γ=4 T=0 staged`.
    pub fn label(&self) -> String {
        match (&self.drafter, self.gamma) {
            (Some(d), Some(g)) if self.is_tree() => format!(
                "{d} γ={g} w={} b={} {}",
                self.tree_width,
                self.tree_budget.unwrap_or(0),
                self.setting_label()
            ),
            (Some(d), Some(g)) => format!("{d} γ={g} {}", self.setting_label()),
            _ => format!("{} {}", self.method, self.setting_label()),
        }
    }

    /// γ for tables: `4`, `4 w=2 b=16` for a tree, `—` for autoregressive points.
    pub fn gamma_label(&self) -> String {
        match self.gamma {
            None => "—".into(),
            Some(g) if self.is_tree() => format!(
                "{g} w={} b={}",
                self.tree_width,
                self.tree_budget.unwrap_or(0)
            ),
            Some(g) => g.to_string(),
        }
    }

    /// True for tree drafting (width > 1); chains keep the chain engine.
    pub fn is_tree(&self) -> bool {
        self.tree_width > 1
    }

    /// True when this point is the autoregressive baseline of `other`: same sampling, cache,
    /// prefix store and engine options.
    pub fn is_baseline_for(&self, other: &SweepPoint) -> bool {
        self.method == Method::Autoregressive
            && self.temperature == other.temperature
            && self.top_k == other.top_k
            && self.top_p == other.top_p
            && self.cache == other.cache
            && self.prefix_cache == other.prefix_cache
            && self.engine == other.engine
    }

    /// The engine's γ policy (fixed 1 for autoregressive points, where it is unused).
    pub fn gamma_policy(&self, adaptive: AdaptiveGamma) -> GammaPolicy {
        match self.gamma {
            Some(GammaChoice::Fixed(g)) => GammaPolicy::Fixed(g),
            Some(GammaChoice::Adaptive) => GammaPolicy::Adaptive {
                min: adaptive.min,
                max: adaptive.max,
                start: adaptive.start,
            },
            None => GammaPolicy::Fixed(1),
        }
    }

    /// A seed for one generation, from the config seed, this point and the prompt id: the same
    /// config and seed give the same tokens, and adding sweep values does not change the
    /// seeds of the other points. The cache strategy, the prefix store and the engine options
    /// are left out: points that differ only in them draw the same random numbers, so their
    /// outputs must be identical (caches are exact; engine options change no token) and
    /// their timings are a paired comparison.
    pub fn generation_seed(&self, seed: u64, prompt_id: &str) -> u64 {
        let mut key = format!(
            "{} {:?} {:?} {} {} {}",
            self.method, self.drafter, self.gamma, self.temperature, self.top_k, self.top_p
        );
        // Only trees extend the key, so the seeds of chain points stay as they were.
        if self.is_tree() {
            key += &format!(" tree {} {:?}", self.tree_width, self.tree_budget);
        }
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
        for b in key.bytes().chain([0]).chain(prompt_id.bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        splitmix64(h ^ seed.rotate_left(32))
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The rotating-cache strategy of `cache`; slack rings hold the sweep's largest draft.
pub fn rotating_strategy(cache: CacheChoice, max_gamma: usize) -> RotatingStrategy {
    match cache {
        CacheChoice::Staged => RotatingStrategy::Staged,
        CacheChoice::Slack => RotatingStrategy::Slack {
            max_draft: max_gamma,
        },
    }
}

/// Every point of the sweep: the autoregressive points first (they are the baselines of the
/// speculative ones), then the speculative points by cache, sampling, drafter and γ.
pub fn sweep_points(config: &ExperimentConfig) -> Vec<SweepPoint> {
    let sweep = &config.sweep;
    let mut settings = Vec::new();
    for &cache in sweep.cache.iter() {
        for &temperature in sweep.temperature.iter() {
            for &top_k in sweep.top_k.iter() {
                for &top_p in sweep.top_p.iter() {
                    settings.push(SweepPoint {
                        method: Method::Autoregressive,
                        drafter: None,
                        gamma: None,
                        temperature,
                        top_k,
                        top_p,
                        cache,
                        tree_width: 1,
                        tree_budget: None,
                        prefix_cache: false,
                        engine: EngineOptions::default(),
                        engine_swept: Vec::new(),
                    });
                }
            }
        }
    }
    // The prefix store, off and/or on, then the engine options innermost: compared points
    // run back to back.
    let engines = &config.engine.combinations();
    let swept = &config.engine.swept();
    let settings: Vec<SweepPoint> = settings
        .into_iter()
        .flat_map(|s| {
            config
                .prefix_cache
                .enabled
                .iter()
                .map(move |&on| SweepPoint {
                    prefix_cache: on,
                    ..s.clone()
                })
        })
        .flat_map(|s| {
            engines.iter().map(move |&engine| SweepPoint {
                engine,
                engine_swept: swept.clone(),
                ..s.clone()
            })
        })
        .collect();
    let mut points = Vec::new();
    if sweep.methods().contains(&Method::Autoregressive) {
        points.extend(settings.iter().cloned());
    }
    if sweep.methods().contains(&Method::Speculative) {
        for setting in &settings {
            for drafter in config.used_drafters() {
                for &gamma in sweep.gamma.iter() {
                    for (tree_width, tree_budget) in tree_shapes(config, gamma) {
                        points.push(SweepPoint {
                            method: Method::Speculative,
                            drafter: Some(drafter.to_string()),
                            gamma: Some(gamma),
                            tree_width,
                            tree_budget,
                            ..setting.clone()
                        });
                    }
                }
            }
        }
    }
    points
}

/// `(width, budget)` of the speculative points of one γ: each `tree_width`, and for widths
/// above 1 each `tree_budget` (default γ, or the adaptive maximum). A chain's budget is its γ.
fn tree_shapes(config: &ExperimentConfig, gamma: GammaChoice) -> Vec<(usize, Option<usize>)> {
    let sweep = &config.sweep;
    let depth = match gamma {
        GammaChoice::Fixed(g) => g,
        GammaChoice::Adaptive => sweep.adaptive.max,
    };
    let budgets = sweep
        .tree_budget
        .as_ref()
        .map_or(vec![depth], |b| b.to_vec());
    let mut shapes = Vec::new();
    for &width in sweep.tree_width.iter() {
        if width <= 1 {
            let budget = matches!(gamma, GammaChoice::Fixed(_)).then_some(depth);
            shapes.push((width, budget));
        } else {
            shapes.extend(budgets.iter().map(|&b| (width, Some(b))));
        }
    }
    shapes
}

/// The largest block a speculation appends: drafts of a chain or nodes of a tree.
pub fn max_block(config: &ExperimentConfig) -> usize {
    let trees = config.sweep.tree_width.iter().any(|&w| w > 1);
    let budget = match &config.sweep.tree_budget {
        Some(b) if trees => b.iter().copied().max().unwrap_or(0),
        _ => 0,
    };
    config.max_gamma().max(budget)
}
