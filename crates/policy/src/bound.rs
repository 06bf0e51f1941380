//! A float64 reference forward that carries, per element, a bound on how
//! far a float32 forward (this crate's or torch's) can be from it.
//!
//! The model (first order in the unit roundoff u = 2^-24, `gamma(n) = n u / (1 - n u)`):
//!
//! - **normalizer** `z = clamp((x - m) / s)`: a subtraction and a division
//!   (u each), and a std that may differ by 1 ulp (torch's float32 sqrt is
//!   not always correctly rounded; one ulp of s is at most 2^-23 s = 2u s):
//!   `e_z = e_x / s + gamma(4) |z|`; an element whose
//!   unclamped value exceeds the clamp by more than that is exactly `±c` on
//!   both sides (`e_z = 0`).
//! - **Linear** `y = W x + b` over n inputs, any summation order:
//!   `e_y = |W| e_x + gamma(n + 1) (|W| (|x| + e_x) + |b|)`.
//! - **activation** f: `e = L_f e_x + r_f(x)` with `L_f` its largest slope
//!   and `r_f` the rounding of one float32 evaluation
//!   ([`crate::Activation::rounding`]).
//! - **LayerNorm** over n: `e_i = |g_i| / s (2 + |x~_i|) max_j e_j` (its
//!   Jacobian's row sums) plus its own rounding,
//!   `|g_i| gamma(2n + 8) (1 + |x~_i|) (1 + mean|x| / s)`.
//! - **sphere projection** `x / ||x||`: `e_i = (1 + |y_i| sqrt(n)) / ||x|| max_j e_j + gamma(n + 3) |y_i|`.
//! - shape operations move errors with their elements.
//! - **FSQ** `codes = round(tanh(e) * h)` (h = `half_L`): the bounded latent
//!   `b = tanh(e) h` gets `e_b = h (s e_e + r_tanh(e)) + u |b|`, with `s` the
//!   largest slope of tanh within `e_e` of `e` and `r_tanh` its rounding.
//!   Rounding is not continuous, so the codes' bound is not `e_b`: where `b`
//!   lies farther than `e_b` from every rounding boundary `k + 1/2`, both
//!   float32 forwards round to the same integer and the code is exact
//!   (`bound 0`); where it lies within `e_b` of one, either neighbour may be
//!   picked, and the code's bound is the distance to the farthest integer
//!   rounding can reach (`round(b ± e_b)`, at least 1). The decoder then
//!   propagates that bound like any input error, so the mean action's bound
//!   stays valid, only loose, when a code may flip. [`FsqStage`] keeps each
//!   element's distance to its nearest boundary for reports.
//!
//! Inside an MLP that layer-by-layer bound grows with the product of the
//! `|W|` row sums (signs that cancel are counted as adding up), so for each
//! row a tighter first-order bound is also computed, through the signed
//! Jacobian `J` of the rest of the Sequential at the reference point:
//! `e_out = sum over stages |J_after(stage)| r(stage) + |J_all| e_in`, with
//! `r` the stage's own rounding from the rules above, times 1.01 for the
//! neglected second-order terms; the smaller of the two bounds is used. A
//! row where a ReLU input lies within its error of 0 (rounding could pick
//! the other side of the kink) keeps the layer-by-layer bound.
//!
//! Two float32 forwards that both obey the model differ by at most twice the
//! bound: [`within`] checks `|a - b| <= 2 bound` (torch vs this crate) and
//! the proptest checks `|ours - reference| <= bound`.
//!
//! Attention, softmax and the transformer (ProtoMotions' `Transformer`,
//! MaskedMimic's prior) have their rules in [`attention`].

pub mod attention;
mod masked_mimic;
mod tape;

pub(crate) use attention::ScoreBias;
pub(crate) use tape::Seeds;

use candle_core::{Device, Tensor};

use crate::activation::Activation;
use crate::error::{PolicyError, Result};
use crate::mlp::{Linear, Mlp, LAYER_NORM_EPS};
use crate::model::Policy;
use crate::module_ops::ModuleOp;
use crate::network::{FsqNetwork, Leaf, Network, ObsNormalizer, TensorMap};
use crate::problem::{FieldProblem, GraphProblem, OpProblem};

pub use crate::activation::U;

/// `gamma(n) = n u / (1 - n u)`.
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// A float64 array with a per-element error bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounded {
    /// Shape.
    pub shape: Vec<usize>,
    /// Reference values (row-major).
    pub value: Vec<f64>,
    /// Bound on a float32 forward's distance from `value`.
    pub bound: Vec<f64>,
}

impl Bounded {
    pub(crate) fn exact(shape: Vec<usize>, value: Vec<f64>) -> Self {
        let n = value.len();
        Bounded { shape, value, bound: vec![0.0; n] }
    }

    fn last(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    fn rows(&self) -> usize {
        self.value.len() / self.last().max(1)
    }

    fn map_rows(&self, out_w: usize, mut f: impl FnMut(&[f64], &[f64], &mut [f64], &mut [f64])) -> Bounded {
        let w = self.last();
        let rows = self.rows();
        let mut value = vec![0.0; rows * out_w];
        let mut bound = vec![0.0; rows * out_w];
        for r in 0..rows {
            f(
                &self.value[r * w..(r + 1) * w],
                &self.bound[r * w..(r + 1) * w],
                &mut value[r * out_w..(r + 1) * out_w],
                &mut bound[r * out_w..(r + 1) * out_w],
            );
        }
        let mut shape = self.shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = out_w;
        }
        Bounded { shape, value, bound }
    }

    /// Applies a pure shape operation to values and bounds alike.
    fn reshape_like(&self, op: &ModuleOp, batch: usize) -> std::result::Result<Bounded, OpProblem> {
        let out_shape = op.out_shape(&self.shape, batch)?;
        match op {
            ModuleOp::Permute(order) => {
                let rank = self.shape.len();
                let dims: Vec<usize> =
                    order.iter().map(|&d| if d < 0 { (d + rank as i64) as usize } else { d as usize }).collect();
                let strides = strides(&self.shape);
                let idx = gather_index(&out_shape, |coord| dims.iter().zip(coord).map(|(&d, &c)| c * strides[d]).sum());
                Ok(self.gather(out_shape, &idx))
            }
            ModuleOp::Expand(_) => {
                let lead = out_shape.len() - self.shape.len();
                let strides = strides(&self.shape);
                let shape = self.shape.clone();
                let idx = gather_index(&out_shape, |coord| {
                    coord[lead..]
                        .iter()
                        .zip(&shape)
                        .zip(&strides)
                        .map(|((&c, &s), &st)| if s == 1 { 0 } else { c * st })
                        .sum()
                });
                Ok(self.gather(out_shape, &idx))
            }
            _ => Ok(Bounded { shape: out_shape, value: self.value.clone(), bound: self.bound.clone() }),
        }
    }

    fn gather(&self, shape: Vec<usize>, idx: &[usize]) -> Bounded {
        Bounded {
            shape,
            value: idx.iter().map(|&i| self.value[i]).collect(),
            bound: idx.iter().map(|&i| self.bound[i]).collect(),
        }
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn gather_index(shape: &[usize], f: impl Fn(&[usize]) -> usize) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut coord = vec![0; shape.len()];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(f(&coord));
        for d in (0..shape.len()).rev() {
            coord[d] += 1;
            if coord[d] < shape[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    out
}

pub(crate) fn vec_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_device(&Device::Cpu)?.flatten_all()?.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?)
}

/// Checks `|got - want| <= factor * bound` elementwise; the first offending element, if any.
pub fn within(got: &[f32], reference: &Bounded, factor: f64) -> Option<(usize, f64, f64)> {
    got.iter().zip(reference.value.iter().zip(&reference.bound)).enumerate().find_map(|(i, (&g, (&v, &b)))| {
        let d = (g as f64 - v).abs();
        let limit = factor * b;
        // NaN fails
        if d <= limit {
            None
        } else {
            Some((i, d, limit))
        }
    })
}

fn linear(x: &Bounded, l: &Linear) -> Result<Bounded> {
    let w = vec_f64(&l.weight)?;
    let b = vec_f64(&l.bias)?;
    let (out, n) = (l.out_features(), l.in_features());
    let g = gamma(n + 1);
    Ok(x.map_rows(out, |xv, xe, yv, ye| {
        for o in 0..out {
            let row = &w[o * n..(o + 1) * n];
            let (mut s, mut prop, mut mag) = (b[o], 0.0, b[o].abs());
            for j in 0..n {
                s += row[j] * xv[j];
                prop += row[j].abs() * xe[j];
                mag += row[j].abs() * (xv[j].abs() + xe[j]);
            }
            yv[o] = s;
            ye[o] = prop + g * mag;
        }
    }))
}

fn activation(x: &Bounded, a: Activation) -> Bounded {
    let w = x.last();
    x.map_rows(w, |xv, xe, yv, ye| {
        for j in 0..w {
            yv[j] = a.eval_f64(xv[j]);
            ye[j] = a.lipschitz() * xe[j] + a.rounding(xv[j]);
        }
    })
}

fn layer_norm(x: &Bounded, weight: &Tensor, bias: &Tensor) -> Result<Bounded> {
    let g = vec_f64(weight)?;
    let b = vec_f64(bias)?;
    let n = x.last();
    let gm = gamma(2 * n + 8);
    Ok(x.map_rows(n, |xv, xe, yv, ye| {
        let mean = xv.iter().sum::<f64>() / n as f64;
        let var = xv.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let s = (var + LAYER_NORM_EPS).sqrt();
        let mean_abs = xv.iter().map(|v| v.abs()).sum::<f64>() / n as f64;
        let emax = xe.iter().cloned().fold(0.0, f64::max);
        for i in 0..n {
            let xt = (xv[i] - mean) / s;
            yv[i] = xt * g[i] + b[i];
            ye[i] = g[i].abs() / s * (2.0 + xt.abs()) * emax
                + g[i].abs() * gm * (1.0 + xt.abs()) * (1.0 + mean_abs / s)
                + 2.0 * U * yv[i].abs();
        }
    }))
}

fn sphere(x: &Bounded) -> Bounded {
    let n = x.last();
    let g = gamma(n + 3);
    x.map_rows(n, |xv, xe, yv, ye| {
        let r = xv.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        let emax = xe.iter().cloned().fold(0.0, f64::max);
        for i in 0..n {
            yv[i] = xv[i] / r;
            ye[i] = (1.0 + yv[i].abs() * (n as f64).sqrt()) / r * emax + g * yv[i].abs();
        }
    })
}

fn no_statistics(n: &ObsNormalizer) -> PolicyError {
    PolicyError::Graph { path: n.name.clone(), problem: GraphProblem::NoStatistics { name: n.name.clone() } }
}

fn normalize(x: &Bounded, n: &ObsNormalizer) -> Result<Bounded> {
    let st = n.rms.state().ok_or_else(|| no_statistics(n))?;
    let mean: Vec<f64> = vec_f64(&st.mean.to_dtype(candle_core::DType::F32)?)?;
    let std: Vec<f64> = vec_f64(n.rms.std_f32().ok_or_else(|| no_statistics(n))?)?;
    let clamp = n.rms.config().clamp_value.map(|c| c as f32 as f64);
    let w = x.last();
    // u (x - m) + u (division) + 2u (a std one ulp off)
    let g4 = gamma(4);
    Ok(x.map_rows(w, |xv, xe, yv, ye| {
        for j in 0..w {
            let pre = (xv[j] - mean[j]) / std[j];
            let e = xe[j] / std[j] + g4 * pre.abs();
            match clamp {
                Some(c) if pre.abs() - e > c => {
                    yv[j] = c.copysign(pre);
                    ye[j] = 0.0;
                }
                Some(c) => {
                    yv[j] = pre.clamp(-c, c);
                    ye[j] = e;
                }
                None => {
                    yv[j] = pre;
                    ye[j] = e;
                }
            }
        }
    }))
}

/// The MLP with both bounds: the layer-by-layer one (always valid, loose:
/// `|W|` ignores the signs that cancel downstream) and, per row, the
/// first-order one through the signed Jacobians (tight); the smaller wins.
fn mlp(x: &Bounded, m: &Mlp) -> Result<Bounded> {
    let mut h = x.clone();
    let mut stages: Vec<Stage> = Vec::new();
    for layer in &m.hidden {
        h = tighten(x, &mut stages, Stage::linear(&layer.linear, linear(&h, &layer.linear)?)?);
        if let Some(ln) = &layer.layer_norm {
            h = layer_norm(&h, &ln.weight, &ln.bias)?;
            stages.push(Stage::LayerNorm { weight: vec_f64(&ln.weight)?, out: h.clone() });
        }
        h = activation(&h, layer.activation);
        stages.push(Stage::Activation { f: layer.activation, out: h.clone() });
    }
    Ok(tighten(x, &mut stages, Stage::linear(&m.out, linear(&h, &m.out)?)?))
}

/// Appends a Linear stage with its output bound replaced by the smaller of
/// the layer-by-layer and the Jacobian bound, and returns that output: the
/// layers after it (and the kink checks) start from the tighter one.
fn tighten(x: &Bounded, stages: &mut Vec<Stage>, stage: Stage) -> Bounded {
    stages.push(stage);
    let tight = jacobian_bound(x, stages);
    let Some(Stage::Linear { out, .. }) = stages.last_mut() else { return x.clone() };
    for (b, t) in out.bound.iter_mut().zip(tight) {
        if let Some(t) = t {
            *b = b.min(t);
        }
    }
    out.clone()
}

/// One stage of the Sequential with its (loose-bounded) output.
enum Stage {
    Linear { weight: Vec<f64>, bias: Vec<f64>, n_in: usize, n_out: usize, out: Bounded },
    LayerNorm { weight: Vec<f64>, out: Bounded },
    Activation { f: Activation, out: Bounded },
}

impl Stage {
    fn linear(l: &Linear, out: Bounded) -> Result<Stage> {
        Ok(Stage::Linear {
            weight: vec_f64(&l.weight)?,
            bias: vec_f64(&l.bias)?,
            n_in: l.in_features(),
            n_out: l.out_features(),
            out,
        })
    }

    fn out(&self) -> &Bounded {
        match self {
            Stage::Linear { out, .. } | Stage::LayerNorm { out, .. } | Stage::Activation { out, .. } => out,
        }
    }
}

/// Safety factor on the first-order bound for the neglected O(u^2) terms.
const SECOND_ORDER: f64 = 1.01;

/// Per output element of every row: `sum over stages |J_after| r_stage + |J_all| e_in`,
/// where `r_stage` is the stage's own rounding and `J` the signed Jacobian
/// of the rest of the Sequential at the reference point. `None` for a row
/// where a kink (ReLU at 0, where rounding may pick the other side) makes
/// the Jacobian uncertain; the loose bound covers those.
fn jacobian_bound(x: &Bounded, stages: &[Stage]) -> Vec<Option<f64>> {
    let Some(last) = stages.last() else { return vec![None; x.value.len()] };
    let n_out = last.out().last();
    let rows = x.rows();
    let mut out = vec![None; rows * n_out];
    for r in 0..rows {
        // stage inputs of this row
        let input = |i: usize| -> (&[f64], &[f64]) {
            let b = if i == 0 { x } else { stages[i - 1].out() };
            let w = b.last();
            (&b.value[r * w..(r + 1) * w], &b.bound[r * w..(r + 1) * w])
        };
        // G: n_out x width, row-major; starts as the identity at the output
        let mut width = n_out;
        let mut g = vec![0.0; n_out * n_out];
        for i in 0..n_out {
            g[i * n_out + i] = 1.0;
        }
        let mut acc = vec![0.0; n_out];
        let mut uncertain = false;
        for (si, st) in stages.iter().enumerate().rev() {
            let (xin, ein) = input(si);
            let o = st.out();
            let ow = o.last();
            let ov = &o.value[r * ow..(r + 1) * ow];
            // this stage's own rounding at its output
            let own: Vec<f64> = match st {
                Stage::Linear { weight, bias, n_in, n_out: no, .. } => {
                    let gm = gamma(n_in + 1);
                    (0..*no)
                        .map(|j| {
                            let row = &weight[j * n_in..(j + 1) * n_in];
                            gm * (bias[j].abs() + row.iter().zip(xin).map(|(w, v)| w.abs() * v.abs()).sum::<f64>())
                        })
                        .collect()
                }
                Stage::LayerNorm { weight, .. } => {
                    let n = xin.len();
                    let (mean, s, mean_abs) = ln_stats(xin);
                    let gm = gamma(2 * n + 8);
                    (0..n)
                        .map(|i| {
                            let xt = ((xin[i] - mean) / s).abs();
                            weight[i].abs() * gm * (1.0 + xt) * (1.0 + mean_abs / s) + 2.0 * U * ov[i].abs()
                        })
                        .collect()
                }
                Stage::Activation { f, .. } => xin.iter().map(|&z| f.rounding(z)).collect(),
            };
            for (a, grow) in acc.iter_mut().zip(g.chunks_exact(width)) {
                *a += grow.iter().zip(&own).map(|(gv, e): (&f64, &f64)| gv.abs() * e).sum::<f64>();
            }
            // G <- G * J_stage
            g = match st {
                Stage::Linear { weight, n_in, n_out: no, .. } => {
                    let mut ng = vec![0.0; n_out * n_in];
                    for (grow, nrow) in g.chunks_exact(*no).zip(ng.chunks_exact_mut(*n_in)) {
                        for (j, &gj) in grow.iter().enumerate() {
                            if gj != 0.0 {
                                for (nv, w) in nrow.iter_mut().zip(&weight[j * n_in..(j + 1) * n_in]) {
                                    *nv += gj * w;
                                }
                            }
                        }
                    }
                    width = *n_in;
                    ng
                }
                Stage::Activation { f, .. } => {
                    let d: Vec<f64> = xin
                        .iter()
                        .zip(ein)
                        .map(|(&z, &e)| {
                            if *f == Activation::Relu && z.abs() <= e {
                                uncertain = true;
                            }
                            slope(*f, z)
                        })
                        .collect();
                    for grow in g.chunks_exact_mut(width) {
                        for (gv, dv) in grow.iter_mut().zip(&d) {
                            *gv *= dv;
                        }
                    }
                    g
                }
                Stage::LayerNorm { weight, .. } => {
                    let n = xin.len();
                    let (mean, s, _) = ln_stats(xin);
                    let xt: Vec<f64> = xin.iter().map(|v| (v - mean) / s).collect();
                    for grow in g.chunks_exact_mut(width) {
                        for (gv, w) in grow.iter_mut().zip(weight) {
                            *gv *= w / s;
                        }
                        let m1 = grow.iter().sum::<f64>() / n as f64;
                        let mx = grow.iter().zip(&xt).map(|(a, b)| a * b).sum::<f64>() / n as f64;
                        for (gv, t) in grow.iter_mut().zip(&xt) {
                            *gv -= m1 + mx * t;
                        }
                    }
                    g
                }
            };
        }
        if uncertain {
            continue;
        }
        let (_, e0) = input(0);
        for (i, grow) in g.chunks_exact(width).enumerate() {
            let total = acc[i] + grow.iter().zip(e0).map(|(gv, e)| gv.abs() * e).sum::<f64>();
            out[r * n_out + i] = Some(total * SECOND_ORDER);
        }
    }
    out
}

fn ln_stats(x: &[f64]) -> (f64, f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, (var + LAYER_NORM_EPS).sqrt(), x.iter().map(|v| v.abs()).sum::<f64>() / n)
}

/// The derivative of an activation (central difference for the smooth ones).
fn slope(f: Activation, z: f64) -> f64 {
    match f {
        Activation::Relu => {
            if z > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Identity => 1.0,
        _ => {
            let h = 1e-6 * (1.0 + z.abs());
            (f.eval_f64(z + h) - f.eval_f64(z - h)) / (2.0 * h)
        }
    }
}

/// Named bounded arrays (the reference TensorDict) plus normalizer outputs by module path.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    /// Values by key.
    pub values: std::collections::HashMap<String, Bounded>,
    /// Normalizer outputs (2-D, as the normalizer saw them) by state-dict module path.
    pub normalized: Vec<(String, Bounded)>,
    /// Each FSQ quantizer's stages, in forward order.
    pub fsq: Vec<FsqStage>,
}

/// One FSQ quantizer in the reference forward.
#[derive(Debug, Clone)]
pub struct FsqStage {
    /// State-dict module path (`_actor.mu`).
    pub module_path: String,
    /// The bounded latent `tanh(e) * half_L` with its bound.
    pub bounded: Bounded,
    /// The codes (bound 0 where the rounding is certain).
    pub codes: Bounded,
    /// Per element, the distance from the bounded latent to its nearest rounding boundary.
    pub boundary_distance: Vec<f64>,
}

impl FsqStage {
    /// Elements whose code may differ between two float32 forwards (the
    /// bounded latent lies within its bound of a rounding boundary).
    pub fn uncertain(&self) -> usize {
        self.codes.bound.iter().filter(|b| **b > 0.0).count()
    }

    /// The smallest margin `distance - bound` over the elements (negative:
    /// some code may flip).
    pub fn min_margin(&self) -> f64 {
        self.boundary_distance.iter().zip(&self.bounded.bound).map(|(d, b)| d - b).fold(f64::INFINITY, f64::min)
    }
}

fn quantize(f: &FsqNetwork, e: &Bounded) -> Result<FsqStage> {
    let w = e.last();
    let h = f.quantizer.half_l.clone();
    if w != h.len() {
        return Err(PolicyError::BadField {
            path: f.path.clone(),
            field: "num_fsq_scalars".into(),
            problem: FieldProblem::FsqScalars { encoder: w, scalars: h.len() },
        });
    }
    let tanh = Activation::Tanh;
    let bounded = e.map_rows(w, |xv, xe, yv, ye| {
        for j in 0..w {
            let hj = h[j] as f64;
            let t = xv[j].tanh();
            // tanh' = 1 - tanh^2 is largest where |e| is smallest
            let near = (xv[j].abs() - xe[j]).max(0.0);
            let slope = 1.0 - near.tanh().powi(2);
            yv[j] = t * hj;
            ye[j] = hj * (slope * xe[j] + tanh.rounding(xv[j])) + U * yv[j].abs();
        }
    });
    let mut codes = Bounded::exact(bounded.shape.clone(), vec![0.0; bounded.value.len()]);
    let mut dist = Vec::with_capacity(bounded.value.len());
    for (i, (&b, &eb)) in bounded.value.iter().zip(&bounded.bound).enumerate() {
        let c = crate::fsq::round_half_even_f64(b);
        let d = crate::fsq::boundary_distance(b);
        codes.value[i] = c;
        if d <= eb {
            let lo = crate::fsq::round_half_even_f64(b - eb);
            let hi = crate::fsq::round_half_even_f64(b + eb);
            codes.bound[i] = (hi - c).max(c - lo).max(1.0);
        }
        dist.push(d);
    }
    Ok(FsqStage { module_path: f.module_path.clone(), bounded, codes, boundary_distance: dist })
}

fn leaf(l: &Leaf, r: &mut Reference) -> Result<()> {
    let mut parts = Vec::new();
    for k in &l.in_keys {
        parts.push(r.values.get(k).ok_or_else(|| PolicyError::UnprovidedKey { path: l.path.clone(), key: k.clone() })?);
    }
    // concatenate on the last dim
    let rows = parts.first().map_or(0, |p| p.rows());
    let width: usize = parts.iter().map(|p| p.last()).sum();
    let mut value = Vec::with_capacity(rows * width);
    let mut bound = Vec::with_capacity(rows * width);
    for row in 0..rows {
        for p in &parts {
            let w = p.last();
            value.extend_from_slice(&p.value[row * w..(row + 1) * w]);
            bound.extend_from_slice(&p.bound[row * w..(row + 1) * w]);
        }
    }
    let mut shape = parts.first().map_or(vec![0, 0], |p| p.shape.clone());
    if let Some(l) = shape.last_mut() {
        *l = width;
    }
    let mut x = Bounded { shape, value, bound };
    let batch = x.shape.first().copied().unwrap_or(0);
    for (i, op) in l.ops.iter().enumerate() {
        x = match op {
            ModuleOp::Forward => {
                let dims = x.shape.clone();
                if let Some(n) = &l.norm {
                    let flat =
                        Bounded { shape: vec![x.rows(), x.last()], value: x.value.clone(), bound: x.bound.clone() };
                    let z = normalize(&flat, n)?;
                    r.normalized.push((l.module_path.clone(), z.clone()));
                    x = Bounded { shape: dims, value: z.value, bound: z.bound };
                }
                match &l.mlp {
                    Some(m) => mlp(&x, m)?,
                    None => x,
                }
            }
            ModuleOp::SphereProjection => sphere(&x),
            other => x.reshape_like(other, batch).map_err(|problem| PolicyError::ModuleOp {
                path: l.path.clone(),
                index: i,
                op: other.name(),
                problem,
            })?,
        };
    }
    if let Some(a) = l.output_activation {
        x = activation(&x, a);
    }
    r.values.insert(l.out_key.clone(), x);
    Ok(())
}

pub(crate) fn network(n: &Network, r: &mut Reference) -> Result<()> {
    match n {
        Network::Leaf(l) => leaf(l, r),
        Network::Container { models, .. } => models.iter().try_for_each(|m| network(m, r)),
        Network::Fsq(f) => {
            network(&f.encoder, r)?;
            let e = r.values.get(&f.latent_key).ok_or_else(|| PolicyError::Graph {
                path: f.path.clone(),
                problem: GraphProblem::Unwritten { key: f.latent_key.clone() },
            })?;
            let stage = quantize(f, e)?;
            r.values.insert(f.latent_key.clone(), stage.codes.clone());
            r.fsq.push(stage);
            network(&f.decoder, r)
        }
        Network::Transformer(t) => attention::transformer_network(t, r),
    }
}

impl Policy {
    /// The float64 reference forward of every network (actor, critic, and
    /// the AMP ones when `obs` has their keys) on `obs`, with error bounds.
    /// Keys: the actor's `mu_key`, the critic's output key (`value`),
    /// `disc_logits`, `disc_value`, and every intermediate.
    pub fn reference(&self, obs: &TensorMap) -> Result<Reference> {
        let mut r = Reference::default();
        for (k, t) in obs {
            r.values.insert(k.clone(), Bounded::exact(t.dims().to_vec(), vec_f64(t)?));
        }
        network(&self.actor.mu, &mut r)?;
        network(&self.critic, &mut r)?;
        if let Some(a) = &self.amp {
            let keys = self.required_keys(crate::Part::Discriminator);
            if keys.iter().all(|k| obs.contains_key(k)) {
                network(&a.discriminator, &mut r)?;
                network(&a.disc_critic, &mut r)?;
            }
        }
        Ok(r)
    }

    /// The float64 reference forward of the actor alone, with error bounds:
    /// the mean action under the actor's `mu_key` (what a deployed policy
    /// computes; `obs` needs only [`Policy::actor_keys`]).
    pub fn actor_reference(&self, obs: &TensorMap) -> Result<Bounded> {
        let mut r = Reference::default();
        for (k, t) in obs {
            r.values.insert(k.clone(), Bounded::exact(t.dims().to_vec(), vec_f64(t)?));
        }
        network(&self.actor().mu, &mut r)?;
        let key = &self.actor().mu_key;
        r.values.remove(key).ok_or_else(|| PolicyError::Graph {
            path: "agent.model.actor.mu_model".into(),
            problem: GraphProblem::Unwritten { key: key.clone() },
        })
    }
}
