//! A tiny one-layer attention language model over the real cache layer, for engine tests
//! that need many fast forwards (thousands of seeds) and exact control of the vocabulary.
use candle_core::Tensor;
use rand::{rngs::StdRng, Rng, SeedableRng};
use specdec::cache::{KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy};
use specdec::speculative::LanguageModel;

use super::device;

/// One attention layer (q = k = v = embedding) plus an output projection.
/// `logits = scale · (x + attn(x)) W + bias · onehot((token + 1) mod V)`.
pub struct Toy {
    emb: Tensor,
    out: Tensor,
    /// Sliding window of the attention (rotating cache) or `None` (KV cache).
    pub window: Option<usize>,
    pub eos: Vec<u32>,
    vocab: usize,
    /// Logit bonus for the successor of the current token: large values make the greedy
    /// output count upward cyclically (repetitive text).
    successor_bias: f32,
}

impl Toy {
    pub fn new(vocab: usize, dim: usize, seed: u64, scale: f32, window: Option<usize>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut rand =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
        let dev = device();
        let emb = Tensor::from_vec(rand(vocab * dim), (vocab, dim), &dev).unwrap();
        let out = (Tensor::from_vec(rand(dim * vocab), (dim, vocab), &dev).unwrap() * scale as f64)
            .unwrap();
        Self {
            emb,
            out,
            window,
            eos: Vec::new(),
            vocab,
            successor_bias: 0.0,
        }
    }

    pub fn with_successor_bias(mut self, bias: f32) -> Self {
        self.successor_bias = bias;
        self
    }

    pub fn with_eos(mut self, eos: Vec<u32>) -> Self {
        self.eos = eos;
        self
    }

    /// The embedding table `[vocab, dim]`.
    pub fn embedding(&self) -> &Tensor {
        &self.emb
    }

    /// Logits of the last position of a fresh full forward over `tokens`.
    pub fn last_logits(&self, tokens: &[u32]) -> Vec<f32> {
        let mut cache = self.new_cache(RotatingStrategy::Staged).unwrap();
        let logits = self.forward(tokens, &mut cache).unwrap();
        logits.get(tokens.len() - 1).unwrap().to_vec1().unwrap()
    }
}

impl LanguageModel for Toy {
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> specdec::Result<Tensor> {
        let n = tokens.len();
        let dim = self.emb.dim(1)?;
        let ids = Tensor::new(tokens, self.emb.device())?;
        let x = self.emb.index_select(&ids, 0)?;
        let kv = x.reshape((1, 1, n, dim))?;
        let att = cache.layer_mut(0)?.append(&kv, &kv)?;
        let (att_k, att_v) = att.joined()?;
        let mut scores = kv.matmul(&att_k.contiguous()?.t()?)?;
        scores = (scores / (dim as f64).sqrt())?;
        if let Some(mask) = &att.mask_tensor()? {
            scores = scores.broadcast_add(mask)?;
        }
        let p = candle_nn::ops::softmax_last_dim(&scores)?;
        let h = p.matmul(&att_v.contiguous()?)?.reshape((n, dim))?;
        let y = (&x + h)?;
        // Hidden states for a drafter that reads them: layer 0 = the embeddings, 1 = the
        // layer's output.
        if let Some(layers) = cache.hidden_layers().map(<[usize]>::to_vec) {
            let rows = layers
                .iter()
                .map(|&l| if l == 0 { x.clone() } else { y.clone() })
                .collect::<Vec<_>>();
            cache.record_hidden(Tensor::cat(&rows, 1)?);
        }
        let mut logits = y.matmul(&self.out)?;
        if self.successor_bias != 0.0 {
            let mut bias = vec![0f32; n * self.vocab];
            for (i, &t) in tokens.iter().enumerate() {
                bias[i * self.vocab + (t as usize + 1) % self.vocab] = self.successor_bias;
            }
            logits = (logits + Tensor::from_vec(bias, (n, self.vocab), self.emb.device())?)?;
        }
        Ok(logits)
    }

    fn new_cache(&self, strategy: RotatingStrategy) -> specdec::Result<ModelCache> {
        let layer = match self.window {
            None => LayerCache::Kv(KvCache::new(16)),
            Some(w) => LayerCache::Rotating(RotatingKvCache::new(w, strategy)?),
        };
        Ok(ModelCache::new(vec![layer]))
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }
}
