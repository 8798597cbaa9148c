//! The sweep's points: the cartesian product of the `[sweep]` lists, autoregressive first.
use serde::{Deserialize, Serialize};

use super::config::{AdaptiveGamma, CacheChoice, ExperimentConfig, GammaChoice, Method};
use crate::cache::RotatingStrategy;
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
    /// Whether prefills use a prefix store (`[prefix_cache] enabled`).
    #[serde(default)]
    pub prefix_cache: bool,
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

    /// The sampling settings and cache as a short text: `T=0 staged`, `T=1 k=50 p=0.9 slack`,
    /// `T=0 staged prefix-cache`.
    pub fn setting_label(&self) -> String {
        let mut s = format!("T={}", self.temperature);
        if self.top_k > 0 {
            s += &format!(" k={}", self.top_k);
        }
        if self.top_p < 1.0 {
            s += &format!(" p={}", self.top_p);
        }
        s += &format!(" {}", self.cache);
        if self.prefix_cache {
            s += " prefix-cache";
        }
        s
    }

    /// A unique, readable name: `autoregressive T=0 staged`, `small γ=4 T=0 staged`.
    pub fn label(&self) -> String {
        match (&self.drafter, self.gamma) {
            (Some(d), Some(g)) => format!("{d} γ={g} {}", self.setting_label()),
            _ => format!("{} {}", self.method, self.setting_label()),
        }
    }

    /// True when `other` is the autoregressive baseline of this point: same sampling and cache.
    pub fn is_baseline_for(&self, other: &SweepPoint) -> bool {
        self.method == Method::Autoregressive
            && self.temperature == other.temperature
            && self.top_k == other.top_k
            && self.top_p == other.top_p
            && self.cache == other.cache
            && self.prefix_cache == other.prefix_cache
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
    /// seeds of the other points. The cache strategy and the prefix store are left out:
    /// points that differ only in them draw the same random numbers, so their outputs must be
    /// identical (caches are exact) and their timings are a paired comparison.
    pub fn generation_seed(&self, seed: u64, prompt_id: &str) -> u64 {
        let key = format!(
            "{} {:?} {:?} {} {} {}",
            self.method, self.drafter, self.gamma, self.temperature, self.top_k, self.top_p
        );
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
                        prefix_cache: false,
                    });
                }
            }
        }
    }
    // The prefix store, off and/or on, innermost: compared points run back to back.
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
        .collect();
    let mut points = Vec::new();
    if sweep.methods().contains(&Method::Autoregressive) {
        points.extend(settings.iter().cloned());
    }
    if sweep.methods().contains(&Method::Speculative) {
        for setting in &settings {
            for drafter in config.used_drafters() {
                for &gamma in sweep.gamma.iter() {
                    points.push(SweepPoint {
                        method: Method::Speculative,
                        drafter: Some(drafter.to_string()),
                        gamma: Some(gamma),
                        ..setting.clone()
                    });
                }
            }
        }
    }
    points
}
