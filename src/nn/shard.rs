//! Tensor parallelism (Megatron-style): a decoder's layers split over `world` ranks, one
//! device each. q/k/v and gate/up are split by output rows (whole heads, MLP columns), the
//! output and down projections by input columns; each rank's attention and MLP outputs are
//! partial sums, added over the ranks by one all-reduce after attention and one after the MLP
//! of every layer. Embeddings and norms are replicated (every rank holds the whole residual
//! stream); the LM head runs on rank 0 only. KV and rotating caches are split by KV head: each
//! rank caches its own heads.
use std::sync::{Condvar, Mutex};

use candle_core::Tensor;

use super::attention::HeadShape;
use super::spec::DecoderSpec;
use crate::error::{Error, Result};

/// One rank's part of a tensor-parallel decoder: rank `rank` of `world`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Ranks in the group.
    pub world: usize,
}

/// A part of a checkpoint matrix (or vector) one rank loads: `len` entries of dimension `dim`
/// from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// 0: rows (a matrix's outputs, a vector's entries), 1: columns (a matrix's inputs).
    pub dim: usize,
    /// First entry kept.
    pub start: usize,
    /// Entries kept.
    pub len: usize,
}

impl Shard {
    /// The whole model on one device.
    pub const WHOLE: Shard = Shard { rank: 0, world: 1 };

    /// Refuses a split of `spec` over `world` ranks that would cut a head or leave ranks
    /// uneven: `world` must divide the query heads and the MLP width, and divide the KV heads
    /// or be a multiple of them (then each KV head is replicated on `world / kv` ranks, whose
    /// query heads all read it, as vLLM does).
    pub fn check(spec: &DecoderSpec, world: usize) -> Result<()> {
        if world == 0 {
            return Err(Error::invalid(
                "tensor_parallel = 0: at least one rank is needed",
            ));
        }
        let HeadShape {
            num_heads,
            num_kv_heads,
            ..
        } = spec.heads;
        for (what, n) in [
            ("attention heads (num_attention_heads)", num_heads),
            ("key/value heads (num_key_value_heads)", num_kv_heads),
            ("MLP width (intermediate_size)", spec.intermediate_size),
        ] {
            let replicated = n == num_kv_heads && n > 0 && world.is_multiple_of(n);
            if !n.is_multiple_of(world) && !replicated {
                return Err(Error::invalid(format!(
                    "tensor_parallel = {world} does not divide the model's {n} {what}; \
                     choose a rank count that divides {num_heads} query heads and an MLP \
                     width of {}, and divides {num_kv_heads} KV heads or is a multiple of them",
                    spec.intermediate_size
                )));
            }
        }
        Ok(())
    }

    /// True for a model split over more than one rank.
    pub fn is_split(&self) -> bool {
        self.world > 1
    }

    /// The rank's equal part of `total` entries: `(start, len)`. `world` divides `total`
    /// ([`Shard::check`]).
    pub fn part(&self, total: usize) -> (usize, usize) {
        let len = total / self.world;
        (self.rank * len, len)
    }

    /// This rank's heads: its share of the query and KV heads (one replicated KV head when
    /// there are fewer KV heads than ranks), the same width.
    pub fn heads(&self, heads: HeadShape) -> HeadShape {
        HeadShape {
            num_heads: heads.num_heads / self.world,
            num_kv_heads: (heads.num_kv_heads / self.world).max(1),
            head_dim: heads.head_dim,
        }
    }

    /// The rank's rows of a K or V projection of `kv` heads `head_dim` wide: its share of the
    /// heads, or, with fewer heads than ranks, the one head its query heads read.
    pub fn kv_cut(&self, kv: usize, head_dim: usize) -> Option<Cut> {
        if !self.is_split() {
            return None;
        }
        let (first, heads) = if kv >= self.world {
            (self.rank * kv / self.world, kv / self.world)
        } else {
            (self.rank * kv / self.world, 1)
        };
        Some(Cut {
            dim: 0,
            start: first * head_dim,
            len: heads * head_dim,
        })
    }

    /// The rank's rows of a matrix (or entries of a vector) with `total` of them in `dim`:
    /// `None` for a whole model (load the tensor whole).
    pub fn cut(&self, dim: usize, total: usize) -> Option<Cut> {
        self.is_split().then(|| {
            let (start, len) = self.part(total);
            Cut { dim, start, len }
        })
    }
}

/// The sum over every rank of each rank's partial output, which every rank calls with its own
/// part, in the same order, once per reduction point of a forward. Implementations: the
/// host group below (ranks as threads on the CPU) and NCCL on CUDA.
pub trait AllReduce: Send + Sync + std::fmt::Debug {
    /// `Σ_ranks x`, the same tensor (bitwise) on every rank, on this rank's device.
    fn sum(&self, x: &Tensor) -> Result<Tensor>;

    /// Marks the group broken (a rank failed part-way through a forward): every rank waiting
    /// in [`AllReduce::sum`], and every later call, returns an error instead of waiting for
    /// the failed rank forever.
    fn abort(&self);
}

/// An all-reduce between ranks that are threads of this process on the CPU: each rank leaves
/// its part, the last to arrive adds them in rank order (so every rank gets the same bits),
/// and all take the sum. One per group, shared by its ranks ([`HostReduce`]).
#[derive(Debug)]
pub struct HostGroup {
    world: usize,
    state: Mutex<HostState>,
    turn: Condvar,
}

#[derive(Debug, Default)]
struct HostState {
    parts: Vec<Option<Tensor>>,
    arrived: usize,
    /// Completed reductions: a waiting rank leaves when this moves past its own.
    round: u64,
    sum: Option<Tensor>,
    aborted: bool,
}

/// Rank `rank`'s handle on a [`HostGroup`].
#[derive(Debug, Clone)]
pub struct HostReduce {
    group: std::sync::Arc<HostGroup>,
    rank: usize,
}

impl HostGroup {
    /// One handle per rank of a group of `world` ranks.
    pub fn handles(world: usize) -> Vec<HostReduce> {
        let group = std::sync::Arc::new(HostGroup {
            world,
            state: Mutex::new(HostState {
                parts: vec![None; world],
                ..HostState::default()
            }),
            turn: Condvar::new(),
        });
        (0..world)
            .map(|rank| HostReduce {
                group: group.clone(),
                rank,
            })
            .collect()
    }
}

fn broken() -> Error {
    Error::invalid("tensor-parallel group broken: a rank failed part-way through a forward")
}

impl AllReduce for HostReduce {
    fn sum(&self, x: &Tensor) -> Result<Tensor> {
        let g = &self.group;
        let mut s = g.state.lock().map_err(|_| broken())?;
        if s.aborted {
            return Err(broken());
        }
        s.parts[self.rank] = Some(x.clone());
        s.arrived += 1;
        if s.arrived == g.world {
            let mut parts = s.parts.iter_mut().map(|p| p.take());
            let first = parts.next().flatten().ok_or_else(broken)?;
            let sum = parts.try_fold(first, |acc, p| -> Result<Tensor> {
                Ok((acc + p.ok_or_else(broken)?)?)
            });
            let sum = match sum {
                Ok(sum) => sum,
                Err(e) => {
                    s.aborted = true;
                    g.turn.notify_all();
                    return Err(e);
                }
            };
            s.sum = Some(sum.clone());
            s.arrived = 0;
            s.round += 1;
            g.turn.notify_all();
            return Ok(sum);
        }
        let round = s.round;
        let s = g
            .turn
            .wait_while(s, |s| s.round == round && !s.aborted)
            .map_err(|_| broken())?;
        if s.round == round {
            return Err(broken());
        }
        s.sum.clone().ok_or_else(broken)
    }

    fn abort(&self) {
        if let Ok(mut s) = self.group.state.lock() {
            s.aborted = true;
        }
        self.group.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Every rank gets the rank-ordered sum, over many rounds (no rank overtakes a round),
    /// and an aborted group releases its waiting ranks with an error.
    #[test]
    fn host_group_sums_in_rank_order_and_aborts() {
        for world in [1, 2, 3, 4] {
            let handles = HostGroup::handles(world);
            let sums: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
                let threads: Vec<_> = handles
                    .iter()
                    .map(|h| {
                        s.spawn(move || {
                            (0..50)
                                .map(|round| {
                                    let v = (h.rank * 100 + round) as f32;
                                    let x = Tensor::new(&[v, 1.0], &Device::Cpu).unwrap();
                                    h.sum(&x).unwrap().to_vec1::<f32>().unwrap()
                                })
                                .collect()
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            for rank_sums in &sums {
                for (round, sum) in rank_sums.iter().enumerate() {
                    let want: f32 = (0..world).map(|r| (r * 100 + round) as f32).sum();
                    assert_eq!(
                        sum,
                        &vec![want, world as f32],
                        "world {world} round {round}"
                    );
                }
            }
        }
        let handles = HostGroup::handles(2);
        std::thread::scope(|s| {
            let waiting = s.spawn(|| handles[0].sum(&Tensor::new(&[1f32], &Device::Cpu).unwrap()));
            std::thread::sleep(std::time::Duration::from_millis(20));
            handles[1].abort();
            assert!(waiting.join().unwrap().is_err());
        });
        assert!(handles[1]
            .sum(&Tensor::new(&[1f32], &Device::Cpu).unwrap())
            .is_err());
    }

    /// Splits that cut a head or the MLP are refused with the counts named.
    #[test]
    fn check_refuses_uneven_splits() {
        let json = r#"{"model_type": "llama", "vocab_size": 32, "hidden_size": 64,
            "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5}"#;
        let obj = serde_json::from_str(json).unwrap();
        let cfg = crate::models::HfConfig::from_object(std::path::Path::new("config.json"), obj);
        let spec = crate::models::decoder_spec(&cfg).unwrap();
        for ok in [1, 2, 4] {
            Shard::check(&spec, ok).unwrap();
        }
        for bad in [0, 3, 5, 8, 16] {
            let e = Shard::check(&spec, bad).unwrap_err().to_string();
            assert!(e.contains(&format!("tensor_parallel = {bad}")), "{e}");
        }
        let e = Shard::check(&spec, 8).unwrap_err().to_string();
        assert!(e.contains("100 MLP width"), "{e}");
        // Four ranks over two KV heads: ranks 0 and 1 read head 0, ranks 2 and 3 head 1.
        let kv_start = |rank| Shard { rank, world: 4 }.kv_cut(2, 8).unwrap().start;
        assert_eq!((0..4).map(kv_start).collect::<Vec<_>>(), [0, 0, 8, 8]);
        let four = Shard { rank: 3, world: 4 }.heads(spec.heads);
        assert_eq!((four.num_heads, four.num_kv_heads), (2, 1));
        let s = Shard { rank: 1, world: 2 };
        assert_eq!(s.part(100), (50, 50));
        assert_eq!(
            s.heads(spec.heads),
            HeadShape {
                num_heads: 4,
                num_kv_heads: 1,
                head_dim: 8
            }
        );
        assert_eq!(Shard::WHOLE.cut(0, 100), None);
    }
}
