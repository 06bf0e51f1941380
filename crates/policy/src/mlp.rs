//! `build_mlp`'s Sequential: Linear, (LayerNorm on the first layer only),
//! activation, ..., final Linear, with weights from the checkpoint.
//!
//! Weights are stored transposed (`[in, out]`, contiguous) once at load,
//! so every forward is one row-major GEMM per layer (candle's gemm crate
//! on CPU, cuBLAS on CUDA) plus a broadcast bias add.

use std::cell::RefCell;

use candle_core::{DType, Device, Tensor, D};
use pmstate_ckpt::Checkpoint;

use crate::activation::Activation;
use crate::config::MlpConfig;
use crate::error::{PolicyError, Result};
use crate::kernels::{Epilogue, PackedLinear};
use crate::problem::GraphProblem;

/// LayerNorm's epsilon (`nn.LayerNorm` default).
pub const LAYER_NORM_EPS: f64 = 1e-5;

/// One `nn.Linear`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `weight`, `[out, in]`, as saved.
    pub weight: Tensor,
    /// `weight.T`, contiguous.
    pub weight_t: Tensor,
    /// `bias`, `[out]`.
    pub bias: Tensor,
    /// State-dict prefix (`_actor.mu.mlp.0`).
    pub key: String,
    /// The weights packed for the CPU kernel (CPU only).
    pub packed: Option<PackedLinear>,
}

impl Linear {
    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `x @ W.T + b` over the last dim of a 2-D `x`: the packed kernels for
    /// float32 on the CPU (candle's matmul there trails them 2-7x from 2 to
    /// 11 rows, and torch's sgemm on Intel Xeons at every size: the
    /// transformers' Linears take this path), candle's matmul elsewhere.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.packed {
            Some(p) if x.device().is_cpu() && x.dtype() == DType::F32 => {
                let (m, _) = x.dims2()?;
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                let y = p.forward(&xs, m, Epilogue::Identity);
                Ok(Tensor::from_vec(y, (m, self.out_features()), &Device::Cpu)?)
            }
            _ => Ok(x.matmul(&self.weight_t)?.broadcast_add(&self.bias)?),
        }
    }
}

/// `nn.LayerNorm(units)` with affine weights.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale.
    pub weight: Tensor,
    /// Shift.
    pub bias: Tensor,
    /// State-dict prefix.
    pub key: String,
}

impl LayerNorm {
    /// Normalizes the last dim (population variance, eps 1e-5), then scales
    /// and shifts. Two passes (mean, then the mean of squared deviations),
    /// as torch does; candle-nn's fused `layer_norm` is not used because it
    /// takes the variance as `E[x^2] - E[x]^2` in float32, which cancels
    /// when the mean is large against the spread.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() && x.dtype() == DType::F32 {
            return self.forward_rows(x);
        }
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let denom = (var + LAYER_NORM_EPS)?.sqrt()?;
        Ok(xc.broadcast_div(&denom)?.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)?)
    }
}

impl LayerNorm {
    /// [`LayerNorm::forward`] for float32 on the CPU, one row at a time (rows
    /// in parallel on the current rayon pool): the same operations in the
    /// same order per element, `((x - mean) / sqrt(var + eps)) * g + b`, the
    /// two means summed in 16 lanes ([`lane_sum`]), in one buffer instead of nine
    /// tensors (at MaskedMimic's batch 256 those were 5.8 MB each, fresh
    /// pages on every call). Any summation order is inside the derived
    /// bound (`gamma(2n + 8)`, `crate::bound`), and a row's bits do not
    /// depend on the other rows or the thread count.
    fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        use rayon::prelude::*;
        let n = x.dims().last().copied().unwrap_or(0);
        if n == 0 || x.elem_count() == 0 {
            return Ok(x.clone());
        }
        let g = self.weight.to_vec1::<f32>()?;
        let b = self.bias.to_vec1::<f32>()?;
        let mut v = x.flatten_all()?.to_vec1::<f32>()?;
        v.par_chunks_mut(n).for_each(|row| layer_norm_row(row, &g, &b));
        Ok(Tensor::from_vec(v, x.dims(), &Device::Cpu)?)
    }
}

/// One row of [`LayerNorm::forward`] in place, float32: `((x - mean) /
/// sqrt(var + eps)) * g + b` with the two means as [`lane_sum`]s (the order
/// the row-wise path and the transformer's CPU path share).
#[inline(always)]
pub(crate) fn layer_norm_row(row: &mut [f32], g: &[f32], b: &[f32]) {
    let n = row.len() as f32;
    let eps = LAYER_NORM_EPS as f32;
    let mean = lane_sum(row, |e| e) / n;
    for e in row.iter_mut() {
        *e -= mean;
    }
    let var = lane_sum(row, |e| e * e) / n;
    let denom = (var + eps).sqrt();
    for ((e, &gi), &bi) in row.iter_mut().zip(g).zip(b) {
        *e = *e / denom * gi + bi;
    }
}

/// `sum f(v)` over `row` in 16 interleaved partial sums (element `i` into
/// sum `i % 16`, the tail into a 17th), added up at the end: a fixed order
/// that the compiler can vectorize, where a left-to-right float sum is one
/// chain of dependent adds.
#[inline(always)]
pub(crate) fn lane_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder().iter().map(|&v| f(v)).sum::<f32>();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// A hidden layer.
#[derive(Debug, Clone)]
pub struct Hidden {
    /// Its Linear.
    pub linear: Linear,
    /// LayerNorm after the Linear (first layer only).
    pub layer_norm: Option<LayerNorm>,
    /// Then this.
    pub activation: Activation,
}

/// The Sequential of an `MLPWithConcat`.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Hidden layers in order.
    pub hidden: Vec<Hidden>,
    /// The final Linear.
    pub out: Linear,
}

impl Mlp {
    /// Loads `{prefix}.mlp.{i}` weights for `cfg` from the state dict at `dict` of `ckpt`.
    pub fn load(
        ckpt: &Checkpoint,
        dict: &str,
        prefix: &str,
        cfg: &MlpConfig,
        path: &str,
        dev: &Device,
    ) -> Result<Self> {
        let mut idx = 0usize;
        let mut hidden = Vec::with_capacity(cfg.layers.len());
        let mut prev: Option<usize> = None;
        for (i, l) in cfg.layers.iter().enumerate() {
            let linear = load_linear(ckpt, dict, &format!("{prefix}.mlp.{idx}"), Some(l.units), prev, path, dev)?;
            idx += 1;
            let layer_norm = if l.use_layer_norm && i == 0 {
                let key = format!("{prefix}.mlp.{idx}");
                idx += 1;
                let weight = load_vec(ckpt, dict, &format!("{key}.weight"), l.units, path, dev)?;
                let bias = load_vec(ckpt, dict, &format!("{key}.bias"), l.units, path, dev)?;
                Some(LayerNorm { weight, bias, key })
            } else {
                None
            };
            idx += 1; // the activation
            prev = Some(l.units);
            hidden.push(Hidden { linear, layer_norm, activation: l.activation });
        }
        let out = load_linear(ckpt, dict, &format!("{prefix}.mlp.{idx}"), Some(cfg.num_out), prev, path, dev)?;
        Ok(Mlp { hidden, out })
    }

    /// Input width (the first Linear's).
    pub fn in_features(&self) -> usize {
        self.hidden.first().map_or(self.out.in_features(), |h| h.linear.in_features())
    }

    /// Runs the Sequential on the last dim of `x` (any rank >= 2).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let x2 = if dims.len() > 2 { x.reshape(((), dims[dims.len() - 1]))? } else { x.clone() };
        let y = if self.out.packed.is_some() && x2.device().is_cpu() && x2.dtype() == DType::F32 {
            self.forward_packed(&x2)?
        } else {
            let mut h = x2.contiguous()?;
            for layer in &self.hidden {
                h = layer.linear.forward(&h)?;
                if let Some(ln) = &layer.layer_norm {
                    h = ln.forward(&h)?;
                }
                h = layer.activation.apply(&h)?;
            }
            self.out.forward(&h)?
        };
        if dims.len() > 2 {
            let mut out_dims = dims[..dims.len() - 1].to_vec();
            out_dims.push(self.out.out_features());
            Ok(y.reshape(out_dims)?)
        } else {
            Ok(y)
        }
    }

    /// The CPU path: packed kernels, ReLU fused; LayerNorm and other activations through candle.
    fn forward_packed(&self, x: &Tensor) -> Result<Tensor> {
        // Two activation buffers kept per thread and reused call after call
        // (a 4096 x 1024 layer is 16 MiB: fresh pages would fault on every
        // call); fresh ones if this thread is already inside a forward.
        thread_local! {
            static BUFFERS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
        }
        BUFFERS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut bufs) => {
                let (a, b) = &mut *bufs;
                self.forward_packed_in(x, a, b)
            }
            Err(_) => self.forward_packed_in(x, &mut Vec::new(), &mut Vec::new()),
        })
    }

    fn packed(l: &Linear) -> Result<&PackedLinear> {
        l.packed
            .as_ref()
            .ok_or_else(|| PolicyError::Graph { path: l.key.clone(), problem: GraphProblem::WeightsNotPacked })
    }

    fn forward_packed_in(&self, x: &Tensor, h: &mut Vec<f32>, y: &mut Vec<f32>) -> Result<Tensor> {
        let m = x.dims()[0];
        let cpu = Device::Cpu;
        let xs = x.flatten_all()?;
        h.clear();
        h.extend_from_slice(&xs.to_vec1::<f32>()?);
        for layer in &self.hidden {
            let fused =
                layer.layer_norm.is_none() && matches!(layer.activation, Activation::Relu | Activation::Identity);
            if fused {
                let ep = if layer.activation == Activation::Relu { Epilogue::Relu } else { Epilogue::Identity };
                Self::packed(&layer.linear)?.forward_into(h, m, ep, y);
                std::mem::swap(h, y);
            } else {
                let out = Self::packed(&layer.linear)?.forward(h, m, Epilogue::Identity);
                let mut t = Tensor::from_vec(out, (m, layer.linear.out_features()), &cpu)?;
                if let Some(ln) = &layer.layer_norm {
                    t = ln.forward(&t)?;
                }
                *h = layer.activation.apply(&t)?.flatten_all()?.to_vec1::<f32>()?;
            }
        }
        let out = Self::packed(&self.out)?.forward(h, m, Epilogue::Identity);
        Ok(Tensor::from_vec(out, (m, self.out.out_features()), &cpu)?)
    }

    /// Chooses the CPU matrix product (see [`CpuKernels`]).
    pub fn set_cpu_kernels(&mut self, kernels: CpuKernels) -> Result<()> {
        for l in self.hidden.iter_mut().map(|h| &mut h.linear).chain(std::iter::once(&mut self.out)) {
            l.packed = match kernels {
                CpuKernels::Candle => None,
                CpuKernels::Packed if l.weight.device().is_cpu() => Some(pack(&l.weight, &l.bias)?),
                CpuKernels::Packed => None,
            };
        }
        Ok(())
    }

    /// Every Linear (hidden then output), for reports and bounds.
    pub fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.hidden.iter().map(|h| &h.linear).chain(std::iter::once(&self.out))
    }
}

/// Which matrix product a CPU forward uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuKernels {
    /// This crate's packed kernels ([`crate::kernels`]): the default.
    #[default]
    Packed,
    /// candle's matmul (the gemm crate), as on other devices.
    Candle,
}

fn pack(weight: &Tensor, bias: &Tensor) -> Result<PackedLinear> {
    let (n, k) = weight.dims2()?;
    let w = weight.flatten_all()?.to_vec1::<f32>()?;
    let b = bias.to_vec1::<f32>()?;
    Ok(PackedLinear::new(&w, &b, n, k)?)
}

fn full_key(dict: &str, key: &str) -> String {
    if dict.is_empty() {
        key.to_owned()
    } else {
        format!("{dict}.{key}")
    }
}

/// A float tensor of the state dict as f32 on `dev`, or an error naming the key.
pub(crate) fn load_f32(ckpt: &Checkpoint, dict: &str, key: &str, path: &str, dev: &Device) -> Result<Tensor> {
    let full = full_key(dict, key);
    let t = ckpt.tensor(&full).map_err(|_| PolicyError::MissingWeight {
        file: ckpt.path_str().to_owned(),
        key: full.clone(),
        path: path.to_owned(),
    })?;
    let x = ckpt.to_candle(t, dev)?;
    if !x.dtype().is_float() {
        return Err(PolicyError::WeightShape {
            file: ckpt.path_str().to_owned(),
            key: full,
            got: t.shape.clone(),
            expected: format!("a float tensor, not {}", t.dtype),
        });
    }
    Ok(x.to_dtype(DType::F32)?)
}

pub(crate) fn load_vec(ckpt: &Checkpoint, dict: &str, key: &str, n: usize, path: &str, dev: &Device) -> Result<Tensor> {
    let t = load_f32(ckpt, dict, key, path, dev)?;
    if t.dims() != [n] {
        return Err(PolicyError::WeightShape {
            file: ckpt.path_str().to_owned(),
            key: full_key(dict, key),
            got: t.dims().to_vec(),
            expected: format!("[{n}]"),
        });
    }
    Ok(t)
}

pub(crate) fn load_linear(
    ckpt: &Checkpoint,
    dict: &str,
    key: &str,
    out: Option<usize>,
    inp: Option<usize>,
    path: &str,
    dev: &Device,
) -> Result<Linear> {
    let mut l = load_linear_keys(ckpt, dict, &format!("{key}.weight"), &format!("{key}.bias"), out, inp, path, dev)?;
    l.key = key.to_owned();
    Ok(l)
}

/// A Linear whose weight and bias have their own names (`in_proj_weight`,
/// `in_proj_bias`); its `key` is the weight's name.
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_linear_keys(
    ckpt: &Checkpoint,
    dict: &str,
    weight_key: &str,
    bias_key: &str,
    out: Option<usize>,
    inp: Option<usize>,
    path: &str,
    dev: &Device,
) -> Result<Linear> {
    let weight = load_f32(ckpt, dict, weight_key, path, dev)?;
    let dims = weight.dims().to_vec();
    let ok = dims.len() == 2 && out.is_none_or(|o| dims[0] == o) && inp.is_none_or(|i| dims[1] == i) && dims[1] > 0;
    if !ok {
        let o = out.map_or("?".into(), |o| o.to_string());
        let i = inp.map_or("in".into(), |i| i.to_string());
        return Err(PolicyError::WeightShape {
            file: ckpt.path_str().to_owned(),
            key: full_key(dict, weight_key),
            got: dims,
            expected: format!("[{o}, {i}] (from the config's layer widths)"),
        });
    }
    let bias = load_vec(ckpt, dict, bias_key, dims[0], path, dev)?;
    let weight_t = weight.t()?.contiguous()?;
    let packed = if dev.is_cpu() { Some(pack(&weight, &bias)?) } else { None };
    Ok(Linear { weight, weight_t, bias, key: weight_key.to_owned(), packed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::values;

    fn layer_norm(n: usize) -> LayerNorm {
        let weight = Tensor::from_vec(values(n, 7, 3.0), n, &Device::Cpu).expect("weight");
        let bias = Tensor::from_vec(values(n, 11, 3.0), n, &Device::Cpu).expect("bias");
        LayerNorm { weight, bias, key: "ln".into() }
    }

    /// The row-wise float32 path against the same formula in float64: within
    /// a few float32 roundings of the output scale (37 = not a multiple of
    /// the 16 lanes, so the tail is summed too), and a row's bits the same
    /// alone as in a batch.
    #[test]
    fn layer_norm_rows_match_float64_and_do_not_depend_on_the_batch() {
        for n in [1usize, 16, 37, 512] {
            let ln = layer_norm(n);
            let rows = 5;
            let x = values(rows * n, 3, 3.0);
            let t = Tensor::from_vec(x.clone(), (rows, n), &Device::Cpu).expect("x");
            let got = ln.forward(&t).expect("forward").to_vec2::<f32>().expect("out");
            let (g, b) = (values(n, 7, 3.0), values(n, 11, 3.0));
            for (r, row) in x.chunks(n).enumerate() {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                let s = (var + LAYER_NORM_EPS).sqrt();
                for i in 0..n {
                    let want = (row[i] as f64 - mean) / s * g[i] as f64 + b[i] as f64;
                    let tol = 1e-5 * (1.0 + ((row[i] as f64 - mean) / s).abs()) * (1.0 + g[i].abs() as f64);
                    assert!((got[r][i] as f64 - want).abs() <= tol, "n {n} row {r} col {i}: {} vs {want}", got[r][i]);
                }
                let alone = Tensor::from_vec(row.to_vec(), (1, n), &Device::Cpu).expect("row");
                let alone = ln.forward(&alone).expect("forward").to_vec2::<f32>().expect("out");
                let same = alone[0].iter().zip(&got[r]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "n {n} row {r}: alone differs from in the batch");
            }
        }
    }

    /// No columns: nothing to normalize, the input comes back (no division by zero, no panic).
    #[test]
    fn layer_norm_of_zero_columns_is_the_input() {
        let ln = layer_norm(0);
        let x = Tensor::zeros((3, 0), DType::F32, &Device::Cpu).expect("x");
        assert_eq!(ln.forward(&x).expect("forward").dims(), &[3, 0]);
    }
}
