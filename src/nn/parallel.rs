//! A tensor-parallel decoder (see [`super::shard`] for the split): rank 0's [`Decoder`] holds
//! the other ranks and runs every forward on all of them at once, one thread per rank, each
//! on its own device with its own run of the [`ModelCache`]'s layers.
//!
//! The ranks share one [`ModelCache`] (rank after rank: [`Decoder::new_cache`]), so a
//! speculation's commit, rollback, snapshot or restore reaches every rank's caches in the same
//! transaction or poisons the whole cache; a forward refuses a cache whose ranks' layers
//! stand at different offsets. Every rank takes the same tokens, so their greedy decisions
//! agree by construction: rank 0 alone computes logits.
//!
//! The CPU runs ranks as threads (for tests and studies of the split, not for speed), each on
//! a rayon pool of its own: rank threads blocked in an all-reduce must not hold the threads
//! the other ranks' kernels need. CUDA ranks run on one GPU each with NCCL's all-reduce.
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::block::Input;
use super::shard::{AllReduce, HostGroup, Shard};
use super::spec::DecoderSpec;
use super::tokens::StepIds;
use super::transformer::{tap, Decoder, Parallel};
use super::weights::Weights;
use crate::cache::{LayerCache, ModelCache};
use crate::error::{Error, Result};

/// What one rank's forward hands back: rank 0's logits and tapped hidden states.
type RankOutput = (Option<Tensor>, Option<Tensor>);

/// What every rank is told of a step beyond its ids: where its caches stand and whether
/// only the last row's logits are wanted. Every rank sees the same, so that their recorded
/// steps are the same kinds of step (see [`Decoder::rank_graphed`]).
#[derive(Clone, Copy)]
struct RankStep {
    offset: usize,
    last: bool,
    graphs: bool,
}

impl Decoder {
    /// `spec` split over one rank per device of `devices` (rank order; all CPU, or all
    /// CUDA): each rank's weights from `weights_on(its device)`, its part cut at load
    /// ([`Weights::get_part`]), the ranks loaded concurrently. Refused when the ranks do not
    /// divide the heads or the MLP, or the devices cannot form a group.
    pub fn load_parallel(
        spec: &DecoderSpec,
        devices: &[Device],
        weights_on: impl Fn(&Device) -> Result<Weights> + Sync,
    ) -> Result<Decoder> {
        let world = devices.len();
        Shard::check(spec, world)?;
        let reducers = all_reduce_group(devices)?;
        let loaded: Vec<Result<Decoder>> = std::thread::scope(|s| {
            let ranks: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, device)| {
                    let weights_on = &weights_on;
                    s.spawn(move || {
                        let weights = weights_on(device)?;
                        Decoder::load_shard(spec, &weights, Shard { rank, world }, rank == 0)
                    })
                })
                .collect();
            ranks.into_iter().map(join).collect()
        });
        let mut ranks = Vec::with_capacity(world);
        for (rank, (decoder, reduce)) in loaded.into_iter().zip(reducers).enumerate() {
            let mut decoder = decoder?;
            decoder.parallel = Some(Box::new(Parallel::new(Shard { rank, world }, reduce)));
            ranks.push(decoder);
        }
        let pools = match devices.first() {
            Some(Device::Cpu) => cpu_pools(world)?,
            _ => Vec::new(),
        };
        let mut ranks = ranks.into_iter();
        let mut first = ranks.next().ok_or_else(|| Error::invalid("no ranks"))?;
        if let Some(p) = first.parallel.as_mut() {
            p.lead(ranks.collect(), pools);
        }
        first.param_count = spec.param_count();
        Ok(first)
    }

    /// Rank `shard.rank` of a group whose other ranks run elsewhere (other processes or
    /// hosts, each running the same program; in tests, other threads): its part of `spec`
    /// from `weights`, summing with `reduce`, and its own LM head. Every rank then computes
    /// the logits from the same residual stream (an all-reduce leaves the same bits on every
    /// rank), so given the same inputs and seeds every rank takes the same decisions and the
    /// same cache operations: no rank sends another its tokens. Its caches
    /// ([`Decoder::new_cache`]) hold its own layers only.
    pub fn load_rank(
        spec: &DecoderSpec,
        weights: &Weights,
        shard: Shard,
        reduce: Arc<dyn AllReduce>,
    ) -> Result<Decoder> {
        if shard.rank >= shard.world {
            return Err(Error::invalid(format!(
                "rank {} of a group of {}",
                shard.rank, shard.world
            )));
        }
        let mut decoder = Decoder::load_shard(spec, weights, shard, true)?;
        decoder.parallel = Some(Box::new(Parallel::new(shard, reduce)));
        decoder.param_count = spec.param_count();
        Ok(decoder)
    }

    /// A forward on every rank at once (rank 0 here, the others on threads of their own),
    /// each over its run of the cache's layers; rank 0's logits. A rank that fails breaks
    /// the group ([`AllReduce::abort`]): the others stop at their next reduction.
    pub(super) fn forward_parallel(
        &self,
        parallel: &Parallel,
        ids: StepIds,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<Tensor> {
        let offset = cache.offset();
        let taps = cache.hidden_layers().map(<[usize]>::to_vec);
        let n = self.blocks.len();
        let layers = cache.layers_mut()?;
        if let Some((i, l)) = layers
            .iter()
            .enumerate()
            .find(|(_, l)| l.offset() != offset)
        {
            return Err(Error::invalid(format!(
                "tensor-parallel cache: rank {} layer {} holds {} positions where the others \
                 hold {offset}; a transaction reached only some ranks",
                i / n,
                i % n,
                l.offset()
            )));
        }
        let mut runs = layers.chunks_mut(n);
        let mine = runs
            .next()
            .ok_or_else(|| Error::invalid("cache without layers"))?;
        // Every rank's ids on its device before any rank starts: a peer copying them from
        // rank 0's stream once rank 0 has queued its first all-reduce would wait on that
        // all-reduce, which waits on the peer (a deadlock).
        let first = ids.tensor(self.embed.device())?;
        // Host ids go to each device straight from the host; device ids through it.
        let peer_ids = parallel
            .peers()
            .iter()
            .map(|p| match ids {
                StepIds::Host(_) => ids.tensor(p.embed.device()),
                StepIds::Device(_) => Ok(first.to_device(p.embed.device())?),
            })
            .collect::<Result<Vec<Tensor>>>()?;
        // Every rank records and replays its steps, or none does: NCCL hangs when an
        // all-reduce is captured or replayed on one rank and run eagerly on another. Steps
        // that tap hidden states, and every step once a rank's recording failed, take the
        // ordinary path on all ranks.
        #[cfg(feature = "cuda")]
        let graphs = taps.is_none() && self.graphs_on_every_rank(parallel);
        #[cfg(not(feature = "cuda"))]
        let graphs = false;
        let step = RankStep {
            offset,
            last,
            graphs,
        };
        let pool = |rank: usize| parallel.pool(rank);
        let (mine, peers) = std::thread::scope(|s| {
            let peers: Vec<_> = parallel
                .peers()
                .iter()
                .zip(runs)
                .zip(&peer_ids)
                .enumerate()
                .map(|(i, ((peer, run), ids))| {
                    s.spawn(move || on(pool(i + 1), || peer.rank_forward(ids, run, None, step)))
                })
                .collect();
            let mine = on(pool(0), || {
                self.rank_forward(&first, mine, Some(taps.as_deref()), step)
            });
            (mine, peers.into_iter().map(join).collect::<Vec<_>>())
        });
        let (logits, hidden) = mine?;
        for peer in peers {
            peer?;
        }
        if let Some(hidden) = hidden {
            cache.record_hidden(hidden);
        }
        logits.ok_or_else(|| Error::invalid("rank 0 computed no logits"))
    }

    /// This rank's layers over `ids` (`[t]` u32 on its device) and `run` (its caches); rank 0
    /// (`head`: `Some(the layers to tap)`) also taps hidden states and runs the final norm
    /// and LM head. `step.graphs`: every rank may record or replay this step (see
    /// [`Decoder::forward_parallel`]).
    fn rank_forward(
        &self,
        ids: &Tensor,
        run: &mut [LayerCache],
        head: Option<Option<&[usize]>>,
        step: RankStep,
    ) -> Result<RankOutput> {
        let RankStep {
            offset,
            last,
            graphs,
        } = step;
        let parallel = self
            .parallel
            .as_ref()
            .ok_or_else(|| Error::invalid("rank forward of a model that is not split"))?;
        let reduce = parallel.reduce();
        let out = (|| -> Result<RankOutput> {
            #[cfg(feature = "cuda")]
            if graphs {
                if let Some(out) = self.rank_graphed(ids, run, head.is_some(), step, reduce)? {
                    return Ok(out);
                }
            }
            #[cfg(not(feature = "cuda"))]
            let _ = graphs;
            let taps = head.flatten().map(<[usize]>::to_vec);
            let mut tapped = Vec::new();
            let mut input = Input::Embedded(self.embed_rows(ids, false)?);
            for (i, (block, layer)) in self.blocks.iter().zip(run).enumerate() {
                tap(&taps, i, &input, &mut tapped)?;
                input = block.forward_sharded(input, offset, layer, reduce)?;
            }
            tap(&taps, self.blocks.len(), &input, &mut tapped)?;
            let hidden = self.tapped_rows(&taps, tapped)?;
            match head {
                Some(_) => Ok((Some(self.head(input, last, true)?), hidden)),
                None => Ok((None, hidden)),
            }
        })();
        if out.is_err() {
            reduce.abort();
        }
        out
    }
}

#[cfg(feature = "cuda")]
impl Decoder {
    /// Whether no rank's recordings failed (see [`super::cuda::graph::Graphs::enabled`]).
    fn graphs_on_every_rank(&self, parallel: &Parallel) -> bool {
        self.graphs.enabled() && parallel.peers().iter().all(|p| p.graphs.enabled())
    }

    /// This rank's step as a replayed CUDA graph with its all-reduces inside (NCCL
    /// collectives are captured like kernels), under the conditions of the one-device
    /// recorded step (`Decoder::forward_graphed`): a step of at most `GRAPH_MAX_ROWS` rows
    /// after the first, graphs on, every layer's cache taking the step in place, no hidden
    /// states tapped. `None` sends the rank down the ordinary path. `lead`: rank 0, which
    /// also runs the LM head.
    ///
    /// NCCL's contract: a collective is captured on every rank or on none, and a graph
    /// holding one is replayed on every rank together. So ranks must decide alike, and do:
    /// the same rows, positions, options and `step` (a peer files its recording under rank
    /// 0's slot, `last` included, though its own work does not depend on it), caches grown
    /// alike, recordings dropped in the same order.
    fn rank_graphed(
        &self,
        ids: &Tensor,
        run: &mut [LayerCache],
        lead: bool,
        step: RankStep,
        reduce: &dyn AllReduce,
    ) -> Result<Option<RankOutput>> {
        let RankStep { offset, last, .. } = step;
        let candle_core::Device::Cuda(dev) = self.embed.device() else {
            return Ok(None);
        };
        let t = ids.dim(0)?;
        if t > super::transformer::GRAPH_MAX_ROWS || offset == 0 || !super::graphs::graphs_enabled()
        {
            return Ok(None);
        }
        let Some(gate_ups) = self.graph_weights() else {
            return Ok(None);
        };
        let Some(bufs) = crate::cache::reserve_layers(run, t, false)? else {
            return Ok(None);
        };
        let len = (offset + t) as u32;
        let mut key = super::transformer::in_place_key(&bufs);
        let layers = self.graph_layers(&bufs, len, &mut key)?;
        let last = last && t > 1;
        let slot = 4 * t + usize::from(last);
        let step_ids = super::tokens::DeviceTokens::from_argmax(ids.clone(), self.vocab_size);
        let out = self.graphs.run(
            dev,
            (slot, false),
            key,
            StepIds::Device(&step_ids),
            &[len],
            None,
            |ids, len, _| {
                let mut input = Input::Embedded(self.embed_rows(ids, true)?);
                let per_layer = self.blocks.iter().zip(&bufs).zip(&gate_ups).zip(&layers);
                for (((block, buf), gate_up), (reach, ring)) in per_layer {
                    let (gate_up, ring) = (*gate_up, super::transformer::ring_step(*ring, buf));
                    input = block.forward_sharded_with(input, reduce, |attn, input| {
                        let kv = (&buf.k, &buf.v);
                        attn.forward_in_place(input, kv, (len, *reach), ring, Some(gate_up), None)
                    })?;
                }
                // Ranks past 0 hand out their last stream (the recording's output).
                match lead {
                    true => Ok((self.head(input, last, true)?, None)),
                    false => Ok((input.into_stream()?, None)),
                }
            },
        )?;
        let Some((out, _)) = out else {
            return Ok(None);
        };
        crate::cache::advance_layers(run, t)?;
        Ok(Some((lead.then_some(out), None)))
    }
}

/// `f` on `pool` (a CPU rank's own) or on this thread.
fn on<R: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// A scoped thread's result, a panic made an error.
fn join<R>(handle: std::thread::ScopedJoinHandle<'_, Result<R>>) -> Result<R> {
    handle
        .join()
        .unwrap_or_else(|_| Err(Error::invalid("a tensor-parallel rank panicked")))
}

/// One rayon pool per CPU rank, the machine's threads shared between them.
fn cpu_pools(world: usize) -> Result<Vec<rayon::ThreadPool>> {
    let threads = (candle_core::utils::get_num_threads() / world).max(1);
    (0..world)
        .map(|rank| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("rank{rank}-{i}"))
                .build()
                .map_err(|e| Error::invalid(format!("tensor-parallel rank {rank}: {e}")))
        })
        .collect()
}

/// This process's end of a tensor-parallel group whose ranks are processes (on one host or
/// several): NCCL, joined through the file `rendezvous` (rank 0 writes the group's id there,
/// the others wait up to `wait` for it). CUDA builds with the `nccl` feature only.
pub fn process_group(
    device: &Device,
    rank: usize,
    world: usize,
    rendezvous: &std::path::Path,
    wait: std::time::Duration,
) -> Result<Arc<dyn AllReduce>> {
    #[cfg(feature = "nccl")]
    return super::cuda::nccl::process_group(device, rank, world, rendezvous, wait);
    #[cfg(not(feature = "nccl"))]
    {
        let _ = (rank, world, rendezvous, wait);
        Err(Error::invalid(format!(
            "ranks in separate processes join by NCCL: a CUDA build with --features nccl (scripts/build-cuda.sh with SPECDEC_NCCL=1); this run's device is {:?}",
            device.location()
        )))
    }
}

/// The all-reduce of a group with one rank per device of `devices` (rank order): threads of
/// this process on the CPU, NCCL on CUDA (each GPU once). A split model makes its own; this
/// is for measuring one alone.
pub fn all_reduce_group(devices: &[Device]) -> Result<Vec<Arc<dyn AllReduce>>> {
    match devices.first() {
        Some(Device::Cpu) if devices.iter().all(Device::is_cpu) => {
            Ok(HostGroup::handles(devices.len())
                .into_iter()
                .map(|h| Arc::new(h) as Arc<dyn AllReduce>)
                .collect())
        }
        #[cfg(feature = "nccl")]
        Some(Device::Cuda(_)) => super::cuda::nccl::group(devices),
        #[cfg(not(feature = "nccl"))]
        Some(Device::Cuda(_)) => Err(Error::invalid(
            "tensor_parallel on CUDA needs a build with --features nccl (scripts/build-cuda.sh with SPECDEC_NCCL=1)",
        )),
        _ => Err(Error::invalid(format!(
            "tensor_parallel runs ranks on the CPU or on CUDA GPUs (NCCL), not on {:?}",
            devices.first().map(Device::location)
        ))),
    }
}
