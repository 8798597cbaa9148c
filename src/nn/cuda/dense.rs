//! Row-wise products and elementwise steps of a decode or verification step: GEMV,
//! SiLU·up, residual add + RMSNorm (the row argmax: `argmax.rs`).
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::launch::Launch;
use crate::engine::EngineOptions;
use crate::nn::fused::Gate;

/// Most rows [`Gemv`] takes (a decode step and verification blocks up to γ = 15); longer
/// inputs take cuBLAS.
pub const GEMV_MAX_ROWS: usize = 16;
/// Warps per block of `gemv` (`GEMV_WARPS` in gemv.cu).
const GEMV_WARPS: usize = 4;
/// Outputs per warp of `gemv` for `rows` rows (the `GEMV` macro in gemv.cu); `out` must
/// be a multiple of it (the caller asks for a multiple of 4).
fn gemv_outs(rows: usize) -> usize {
    if rows <= 2 {
        1
    } else {
        2
    }
}

/// Whether bf16 / f16 GEMVs run on the tensor-core kernel (the option `tc_gemv`; off: the
/// CUDA-core kernel, as f32 always does).
fn tensor_core_gemv(o: &EngineOptions) -> bool {
    o.tc_gemv
}

/// `y = x wᵀ` for `x: [rows, in]` (rows ≤ [`GEMV_MAX_ROWS`]) and `w: [out, in]`, both
/// contiguous, reading `w` once: `gemv_tc` in gemv.cu (tensor cores) for bf16 / f16 with
/// `in` a multiple of 32, else `gemv`. Inputs of [`candle_core::CustomOp2`]:
/// `x`, `w`. Output `[rows, out]`.
///
/// With a `gate`, `w` is a gated MLP's fused `[2 inter, in]` gate/up weight and the output
/// `[rows, inter]` is `act(x gᵀ) * (x uᵀ)`, in the arithmetic [`GateMul`] applies to the
/// plain product (products rounded to the dtype, the activation in f32; tensor-core path
/// only: [`silu_gate_applies`]; GELU only with a folded norm, [`FoldedGemv`]).
pub struct Gemv {
    pub gate: Option<Gate>,
}

/// Most bytes of a folded norm's weight (staged in shared memory beside the reduction
/// buffers of a block of at most 16 warps): hidden sizes up to 12,288 in half precision.
const NORM_WEIGHT_SMEM: usize = 24 << 10;

/// What a tensor-core GEMV folds in from its third input (`GEMV_NORM` / `GEMV_RESID` in
/// gemv.cu), so that decode and verification steps run no norm or add kernel between
/// their products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fold {
    /// The third input is an RMSNorm's weight `[in]` and `x` the residual stream before that
    /// norm: `y = r · (x ⊙ g) wᵀ` with `r = rsqrt(mean(x²) + eps)` per row (also with a
    /// gate, where both products take `r` before the activation).
    Norm { eps: f32 },
    /// The third input is the residual stream `[rows, out]`: `y = resid + x wᵀ`, each
    /// rounded to the dtype as `add_rmsnorm` rounds its sum.
    Resid,
}

/// [`Gemv`] with a [`Fold`]: inputs `x`, `w` and the fold's tensor (a
/// [`candle_core::CustomOp3`]); tensor-core path only ([`fold_applies`]).
pub struct FoldedGemv {
    pub gate: Option<Gate>,
    pub fold: Fold,
    /// `[out]` added to each rounded output as a separate add would add it (Qwen2's q/k/v
    /// biases; without a gate only: [`bias_fits`]).
    pub bias: Option<Tensor>,
}

impl FoldedGemv {
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        dev: &CudaDevice,
        name: &str,
        x: (&CudaSlice<T>, &Layout),
        w: (&CudaSlice<T>, &Layout),
        (aux, al): (&CudaSlice<T>, &Layout),
    ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
        let Some((a0, a1)) = al.contiguous_offsets() else {
            candle_core::bail!("gemv: the folded input must be contiguous");
        };
        let gemv = Gemv { gate: self.gate };
        let guard = self.bias.as_ref().map(|b| b.storage_and_layout());
        let bias = match &guard {
            Some(g)
                if self.gate.is_none() && g.1.is_contiguous() && g.1.dims() == [w.1.dims()[0]] =>
            {
                Some(super::op::view::<T>(g, "bias")?)
            }
            Some(g) => candle_core::bail!(
                "gemv: a bias {:?} does not fit w {:?} (contiguous [out], no gate)",
                g.1.dims(),
                w.1.dims()
            ),
            None => None,
        };
        gemv.launch(
            dev,
            name,
            x,
            w,
            Some((&aux.slice(a0..a1), al.dims(), self.fold)),
            bias.as_ref(),
        )
    }
}

float_op3!(FoldedGemv, "folded-gemv");

impl Gemv {
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        dev: &CudaDevice,
        name: &str,
        (x, xl): (&CudaSlice<T>, &Layout),
        (w, wl): (&CudaSlice<T>, &Layout),
        fold: Option<(&CudaView<'_, T>, &[usize], Fold)>,
        bias: Option<&CudaView<'_, T>>,
    ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
        let (Some((x0, x1)), Some((w0, w1))) = (xl.contiguous_offsets(), wl.contiguous_offsets())
        else {
            candle_core::bail!("gemv: x and w must be contiguous");
        };
        let (xd, wd) = (xl.dims(), wl.dims());
        if xd.len() != 2 || wd.len() != 2 || xd[1] != wd[1] || xd[0] == 0 || xd[0] > GEMV_MAX_ROWS {
            candle_core::bail!("gemv: x {xd:?} and w {wd:?} do not fit");
        }
        let (rows, inp) = (xd[0], xd[1]);
        // The engine options, read once for the launch.
        let o = crate::engine::get();
        let tensor_cores = name != "f32" && inp.is_multiple_of(32) && tensor_core_gemv(&o);
        if self.gate.is_some() && (!tensor_cores || !wd[0].is_multiple_of(16)) {
            candle_core::bail!("gemv: a gated product needs the tensor-core path");
        }
        if self.gate == Some(Gate::Gelu) && !matches!(fold, Some((_, _, Fold::Norm { .. }))) {
            candle_core::bail!("gemv: the GELU-gated product is built with a folded norm only");
        }
        let out = if self.gate.is_some() {
            wd[0] / 2
        } else {
            wd[0]
        };
        // The kernel's name part, the folded input and epsilon (checked against the kernel's
        // reads: the norm weight in whole 16-byte vectors beside each chunk of `x`, the
        // residual one element per output).
        let (mode, aux, eps) = match fold {
            None => ("", None, 0.0),
            Some((aux, dims, fold)) => match fold {
                _ if !tensor_cores => {
                    candle_core::bail!("gemv: a folded product needs the tensor-core path")
                }
                Fold::Norm { eps }
                    if dims == [inp]
                        && aux.len() == inp
                        && inp * std::mem::size_of::<T>() <= NORM_WEIGHT_SMEM =>
                {
                    ("norm_", Some(aux), eps)
                }
                Fold::Resid if self.gate.is_none() && dims == [rows, out] => {
                    ("resid_", Some(aux), 0.0)
                }
                _ => candle_core::bail!(
                    "gemv: folded input {dims:?} does not fit {fold:?} for x {xd:?}, w {wd:?}"
                ),
            },
        };
        // SAFETY: written in full by either kernel.
        let y = unsafe { super::op::out_alloc::<T>(dev, rows * out)? };
        let (x, w) = (x.slice(x0..x1), w.slice(w0..w1));
        if tensor_cores {
            let nt = rows.div_ceil(8);
            // 16 weight rows per block: 16 outputs, or 8 gated ones.
            let blocks = wd[0].div_ceil(16);
            // Enough warps in flight where there are few outputs (few blocks), at most the
            // option `gemv_max_warps` (16 by default: a 32-warp block, 64 registers a thread,
            // takes a whole SM and cannot start beside the kernel ahead of it; 8 was slower).
            let warps = match blocks {
                0..200 => 32,
                200..600 => 16,
                _ => 8,
            }
            .min(o.gemv_max_warps);
            // A folded norm's weight sits in shared memory beside the block's reduction
            // buffers: at most 16 warps keep both within the default 48 KB.
            let warps = if mode == "norm_" {
                warps.min(16)
            } else {
                warps
            };
            let gate = match self.gate {
                None => "",
                Some(Gate::Silu) => "silu_",
                Some(Gate::Gelu) => "gelu_",
            };
            // 16-byte loads per lane and weight row per chunk: the option `gemv_loads`, 0
            // choosing 2 where `in` is a multiple of 64. The chunk width depends on `in` only,
            // never on the row count: every row count sums in the same order.
            let v = match o.gemv_loads {
                0 => 1 + usize::from(inp.is_multiple_of(64)),
                v if inp.is_multiple_of(32 * v) => v,
                _ => 1,
            };
            let kernel = format!("gemv_tc_{gate}{mode}{name}_n{nt}_w{warps}_v{v}");
            let mut l = Launch::new(dev, &kernel)?;
            l.ptr(&x).ptr(&w).ptr(&y);
            l.val(rows as i32).val(inp as i32).val(out as i32);
            match aux {
                Some(aux) => l.ptr(aux),
                None => l.null(),
            };
            l.val(eps);
            match bias {
                Some(b) => l.ptr(b),
                None => l.null(),
            };
            // GEMV_NORM stages the norm weight (`in` elements) in shared memory.
            let shared_mem_bytes = if mode == "norm_" {
                (inp * std::mem::size_of::<T>()) as u32
            } else {
                0
            };
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: ((warps * 32) as u32, 1, 1),
                shared_mem_bytes,
            };
            // SAFETY: matches `gemv_tc`; `in` is a multiple of the 32-input chunk, rows and
            // outputs past the ends are clamped on load and never written; a folded input
            // has the length its mode reads (checked above), a bias `out` elements.
            unsafe { l.run(cfg) }?;
            return Ok((y, Shape::from((rows, out))));
        }
        if fold.is_some() || bias.is_some() {
            candle_core::bail!("gemv: a folded product needs the tensor-core path");
        }
        let mut l = Launch::new(dev, &format!("gemv_{name}_r{rows}"))?;
        l.ptr(&x).ptr(&w).ptr(&y).val(inp as i32).val(out as i32);
        let cfg = LaunchConfig {
            grid_dim: (out.div_ceil(GEMV_WARPS * gemv_outs(rows)) as u32, 1, 1),
            block_dim: ((GEMV_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `gemv`; `in` is a multiple of the 16-byte vector (checked by
        // `gemv_applies`), so every load stays inside its row.
        unsafe { l.run(cfg) }?;
        Ok((y, Shape::from((rows, out))))
    }
}

impl candle_core::CustomOp2 for Gemv {
    fn name(&self) -> &'static str {
        "gemv"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("gemv runs on CUDA only; the CPU takes its own kernels")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = x.device();
        let (slice, shape) = match (&x.slice, &w.slice) {
            (CudaStorageSlice::BF16(x), CudaStorageSlice::BF16(w)) => {
                let (y, s) = self.launch(dev, "bf16", (x, xl), (w, wl), None, None)?;
                (CudaStorageSlice::BF16(y), s)
            }
            (CudaStorageSlice::F16(x), CudaStorageSlice::F16(w)) => {
                let (y, s) = self.launch(dev, "f16", (x, xl), (w, wl), None, None)?;
                (CudaStorageSlice::F16(y), s)
            }
            (CudaStorageSlice::F32(x), CudaStorageSlice::F32(w)) => {
                let (y, s) = self.launch(dev, "f32", (x, xl), (w, wl), None, None)?;
                (CudaStorageSlice::F32(y), s)
            }
            _ => candle_core::bail!("gemv: x and w must share a float dtype"),
        };
        Ok((
            CudaStorage {
                slice,
                device: dev.clone(),
            },
            shape,
        ))
    }
}

/// True when [`Gemv`] takes `x: [rows, in]` times `w: [out, in]ᵀ`.
pub fn gemv_applies(x: &Tensor, w: &Tensor) -> bool {
    let vector = 16 / w.dtype().size_in_bytes().max(1);
    x.device().is_cuda()
        && x.rank() == 2
        && w.rank() == 2
        && (1..=GEMV_MAX_ROWS).contains(&x.dims()[0])
        && x.dims()[1] == w.dims()[1]
        && x.dims()[1].is_multiple_of(vector)
        && w.dims()[0].is_multiple_of(4)
        && x.dtype() == w.dtype()
        && matches!(
            w.dtype(),
            candle_core::DType::BF16 | candle_core::DType::F16 | candle_core::DType::F32
        )
        && w.is_contiguous()
        && w.layout().start_offset().is_multiple_of(vector)
}

/// True when [`Gemv`] with `silu_gate` takes `x: [rows, in]` and the fused gate/up weight
/// `w: [2 inter, in]`: [`gemv_applies`], on the tensor-core path (bf16 / f16, `in` a
/// multiple of 32) with `inter` a multiple of 8, unless the option `silu_gate` keeps the
/// SiLU in its own kernel.
pub fn silu_gate_applies(x: &Tensor, w: &Tensor) -> bool {
    silu_gate_fits(&crate::engine::get(), x, w)
}

/// [`silu_gate_applies`] under the options `o`.
fn silu_gate_fits(o: &EngineOptions, x: &Tensor, w: &Tensor) -> bool {
    tensor_core_applies(o, x, w) && w.dims()[0].is_multiple_of(16) && o.silu_gate
}

/// [`gemv_applies`] on the tensor-core path: bf16 / f16, `in` a multiple of 32, not switched
/// off by the option `tc_gemv` (`Gemv::launch` picks the same path).
fn tensor_core_applies(o: &EngineOptions, x: &Tensor, w: &Tensor) -> bool {
    gemv_applies(x, w)
        && matches!(
            w.dtype(),
            candle_core::DType::BF16 | candle_core::DType::F16
        )
        && w.dims()[1].is_multiple_of(32)
        && tensor_core_gemv(o)
}

/// Whether a step over the residual stream `x: [rows, hidden]` takes the folded products
/// (see `fused::folds`): the tensor-core GEMV's rows and dtypes, and the options `tc_gemv`
/// and `gemv_fold` on.
pub fn folds(x: &Tensor) -> bool {
    let o = crate::engine::get();
    x.device().is_cuda()
        && x.rank() == 2
        && (1..=GEMV_MAX_ROWS).contains(&x.dims()[0])
        && x.dims()[1].is_multiple_of(32)
        && matches!(
            x.dtype(),
            candle_core::DType::BF16 | candle_core::DType::F16
        )
        && tensor_core_gemv(&o)
        && o.gemv_fold
}

/// True when [`FoldedGemv`] takes `x: [rows, in]`, `w` (with a gate: [`silu_gate_applies`]'s
/// shapes, the SiLU under the option `silu_gate`, the GELU under `gelu_gate` and with a norm
/// only; else [`gemv_applies`]) and the fold's input `aux`: the tensor-core path (bf16 / f16,
/// `in` a multiple of 32), folding not switched off (`gemv_fold`), and `aux` contiguous, of
/// `x`'s dtype, either the norm weight `[in]` starting 16-byte aligned or the residual
/// `[rows, out]`.
pub fn fold_applies(x: &Tensor, w: &Tensor, aux: &Tensor, gate: Option<Gate>, norm: bool) -> bool {
    let o = crate::engine::get();
    let products = match gate {
        None => tensor_core_applies(&o, x, w),
        Some(Gate::Silu) => silu_gate_fits(&o, x, w),
        Some(Gate::Gelu) => {
            norm && tensor_core_applies(&o, x, w) && w.dims()[0].is_multiple_of(16) && o.gelu_gate
        }
    };
    let vector = 16 / aux.dtype().size_in_bytes().max(1);
    let fits = if norm {
        aux.dims() == [x.dims()[1]]
            && aux.layout().start_offset().is_multiple_of(vector)
            && aux.elem_count() * aux.dtype().size_in_bytes() <= NORM_WEIGHT_SMEM
    } else {
        gate.is_none() && aux.dims() == [x.dims()[0], w.dims()[0]]
    };
    products && o.gemv_fold && fits && aux.dtype() == x.dtype() && aux.is_contiguous()
}

/// True when [`FoldedGemv`] adds `bias` in its epilogue for the product with `w` under
/// `gate`: the engine option `bias_fold`, no gate, and `bias` a contiguous `[out]` of `w`'s
/// dtype.
pub fn bias_fits(bias: &Tensor, w: &Tensor, gate: Option<Gate>) -> bool {
    crate::engine::get().bias_fold
        && gate.is_none()
        && bias.dims() == [w.dims()[0]]
        && bias.dtype() == w.dtype()
        && bias.is_contiguous()
}

/// `act(g) * u` of a fused gate/up product `[t, 2 * inter]` (gate columns first), as
/// `[t, inter]`, `act` SiLU or (with `gelu`) GELU with the tanh approximation (`silu_mul` and
/// `gelu_mul` in elementwise.cu). Input of [`candle_core::CustomOp1`], contiguous.
pub struct GateMul {
    /// GELU (tanh approximation) instead of SiLU.
    pub gelu: bool,
}

impl candle_core::CustomOp1 for GateMul {
    fn name(&self) -> &'static str {
        "gate-mul"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("gate-mul runs on CUDA only")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let act = if self.gelu { "gelu" } else { "silu" };
        fn go<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
            dev: &CudaDevice,
            kernel: &str,
            gu: &CudaSlice<T>,
            l: &Layout,
        ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
            let (Some((a, b)), [t, two]) = (l.contiguous_offsets(), l.dims()) else {
                candle_core::bail!("gate-mul: input must be a contiguous [t, 2 * inter]");
            };
            let (t, inter) = (*t, *two / 2);
            let n = t * inter;
            // SAFETY: written in full by the kernel.
            let y = unsafe { super::op::out_alloc::<T>(dev, n)? };
            let mut l = Launch::new(dev, kernel)?;
            let gu = gu.slice(a..b);
            l.ptr(&gu).ptr(&y).val(inter as i32).val(n as i64);
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(256).min(65_535) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches `gate_mul`; a grid-stride loop over n = t * inter elements.
            unsafe { l.run(cfg) }?;
            Ok((y, Shape::from((t, inter))))
        }
        let dev = s.device();
        let (slice, shape) = match &s.slice {
            CudaStorageSlice::BF16(x) => {
                let (y, sh) = go(dev, &format!("{act}_mul_bf16"), x, l)?;
                (CudaStorageSlice::BF16(y), sh)
            }
            CudaStorageSlice::F16(x) => {
                let (y, sh) = go(dev, &format!("{act}_mul_f16"), x, l)?;
                (CudaStorageSlice::F16(y), sh)
            }
            CudaStorageSlice::F32(x) => {
                let (y, sh) = go(dev, &format!("{act}_mul_f32"), x, l)?;
                (CudaStorageSlice::F32(y), sh)
            }
            _ => candle_core::bail!("gate-mul: float input expected"),
        };
        Ok((
            CudaStorage {
                slice,
                device: dev.clone(),
            },
            shape,
        ))
    }
}

/// Threads per block of `add_rmsnorm` (at most), and the 16-byte vectors each holds
/// (`NORM_VECS` in elementwise.cu): rows of up to 32 KB.
const NORM_THREADS: usize = 256;
const NORM_VECS: usize = 8;

/// True when [`AddRmsNorm`] takes `x`, `y: [t, h]`: on CUDA, equal shapes, rows of whole
/// 16-byte vectors starting 16-byte aligned, at most 32 KB.
pub fn add_rmsnorm_applies(x: &Tensor, y: &Tensor) -> bool {
    let size = x.dtype().size_in_bytes();
    let vec = 16 / size.max(1);
    let aligned = |t: &Tensor| t.layout().start_offset().is_multiple_of(vec);
    x.device().is_cuda()
        && x.rank() == 2
        && x.dims() == y.dims()
        && x.dims()[1].is_multiple_of(vec)
        && x.dims()[1] * size <= NORM_THREADS * NORM_VECS * 16
        && aligned(x)
        && aligned(y)
}

/// Residual add and RMSNorm in one pass: inputs `x`, `y: [t, h]`, `w: [h]` (contiguous);
/// output `[2, t, h]`: the sum `x + y`, then its norm (`add_rmsnorm` in elementwise.cu). With
/// `post`, the norm is `y`'s and comes before the add (a sandwich block's post-norm): output
/// `[t, h]`, `x + norm(y)` (`add_normed`).
pub struct AddRmsNorm {
    /// The norm's epsilon.
    pub eps: f32,
    /// Normalise `y`, then add it to `x`.
    pub post: bool,
}

impl AddRmsNorm {
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        dev: &CudaDevice,
        name: &str,
        (x, xl): (&CudaSlice<T>, &Layout),
        (y, yl): (&CudaSlice<T>, &Layout),
        (w, wl): (&CudaSlice<T>, &Layout),
    ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
        let (Some((x0, x1)), Some((y0, y1)), Some((w0, w1))) = (
            xl.contiguous_offsets(),
            yl.contiguous_offsets(),
            wl.contiguous_offsets(),
        ) else {
            candle_core::bail!("add-rmsnorm: inputs must be contiguous");
        };
        let [t, h] = xl.dims() else {
            candle_core::bail!("add-rmsnorm: x must be [t, h]");
        };
        let (t, h) = (*t, *h);
        let vec = 16 / std::mem::size_of::<T>();
        if h % vec != 0
            || h / vec > NORM_THREADS * NORM_VECS
            || [x0, y0, w0].iter().any(|o| o % vec != 0)
        {
            candle_core::bail!(
                "add-rmsnorm: rows of {h} must be whole 16-byte vectors, 16-byte aligned, at most {}",
                NORM_THREADS * NORM_VECS * vec
            );
        }
        if yl.dims() != xl.dims() || wl.dims() != [h] {
            candle_core::bail!(
                "add-rmsnorm: y {:?} and w {:?} do not fit x {:?}",
                yl.dims(),
                wl.dims(),
                xl.dims()
            );
        }
        let outputs = if self.post { 1 } else { 2 };
        // SAFETY: written in full by the kernel.
        let out = unsafe { super::op::out_alloc::<T>(dev, outputs * t * h)? };
        let kernel = if self.post {
            "add_normed"
        } else {
            "add_rmsnorm"
        };
        let mut l = Launch::new(dev, &format!("{kernel}_{name}"))?;
        let (x, y, w) = (x.slice(x0..x1), y.slice(y0..y1), w.slice(w0..w1));
        l.ptr(&x).ptr(&y).ptr(&w).ptr(&out);
        if !self.post {
            l.val(t as i32);
        }
        l.val(h as i32).val(self.eps);
        let cfg = LaunchConfig {
            grid_dim: (t as u32, 1, 1),
            block_dim: (
                NORM_THREADS.min((h / vec).next_multiple_of(32)) as u32,
                1,
                1,
            ),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `add_rmsnorm` (`add_normed`); block i touches row i of x, y and of
        // each output, in whole aligned vectors (checked above; `out` is a fresh allocation).
        unsafe { l.run(cfg) }?;
        let shape = if self.post {
            Shape::from((t, h))
        } else {
            Shape::from((2, t, h))
        };
        Ok((out, shape))
    }
}

float_op3!(AddRmsNorm, "add-rmsnorm");
