//! The first-order (signed Jacobian) bound of the transformer: a tape of the
//! encoder's stages, per batch row a reverse pass per output element,
//! `e_out = sum over rounding sites |d out / d site| r_site`, times
//! [`SECOND_ORDER`](super::SECOND_ORDER). See [`super::attention`] for the
//! rounding `r` of each site and why this is much tighter than the
//! layer-by-layer rules (which stay as the fallback: the smaller wins).

use super::attention::ScoreBias;
use super::{activation, gamma, layer_norm, linear, ln_stats, slope, vec_f64, Bounded, SECOND_ORDER, U};
use crate::activation::Activation;
use crate::error::Result;
use crate::mlp::{LayerNorm, Linear};

/// One stage with its layer-by-layer bounded output `[B, S, w]` and, per
/// element, its own rounding `r` (attention's sites are computed in the
/// reverse pass, so its `r` is 0).
struct Node {
    out: Bounded,
    r: Vec<f64>,
    op: Op,
}

enum Op {
    Input,
    Linear { x: usize, weight: Vec<f64>, n_in: usize, n_out: usize },
    Act { x: usize, f: Activation },
    Ln { x: usize, weight: Vec<f64> },
    Add { a: usize, b: usize },
    Attn { qkv: usize, heads: usize },
}

/// The encoder's stages, in forward order (node 0: the input).
pub(super) struct Tape {
    nodes: Vec<Node>,
}

/// Which elements of a node [`Tape::tighten`] rebounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tighten {
    /// Every element (a layer's output, reported per stage).
    All,
    /// Those within their bound of 0: a ReLU input's bound only decides
    /// whether rounding may cross the kink, so only the elements the
    /// layer-by-layer bound leaves in doubt need the (costly) tighter one.
    NearZero,
}

/// Which outputs of the last node get the Jacobian bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seeds {
    /// Every token.
    AllTokens,
    /// Token 0 (ProtoMotions' `Transformer` reads only it).
    FirstToken,
}

impl Tape {
    pub(super) fn new(x: Bounded) -> Tape {
        let r = x.bound.clone();
        Tape { nodes: vec![Node { out: x, r, op: Op::Input }] }
    }

    pub(super) fn out(&self, i: usize) -> &Bounded {
        &self.nodes[i].out
    }

    fn push(&mut self, out: Bounded, r: Vec<f64>, op: Op) -> usize {
        self.nodes.push(Node { out, r, op });
        self.nodes.len() - 1
    }

    pub(super) fn linear(&mut self, x: usize, l: &Linear) -> Result<usize> {
        let out = linear(&self.nodes[x].out, l)?;
        let weight = vec_f64(&l.weight)?;
        let bias = vec_f64(&l.bias)?;
        let (n_in, n_out) = (l.in_features(), l.out_features());
        let xin = &self.nodes[x].out.value;
        let g = gamma(n_in + 1);
        let rows = xin.len() / n_in.max(1);
        let mut r = Vec::with_capacity(rows * n_out);
        for row in 0..rows {
            let xv = &xin[row * n_in..(row + 1) * n_in];
            for o in 0..n_out {
                let w = &weight[o * n_in..(o + 1) * n_in];
                r.push(g * (bias[o].abs() + w.iter().zip(xv).map(|(a, b)| a.abs() * b.abs()).sum::<f64>()));
            }
        }
        Ok(self.push(out, r, Op::Linear { x, weight, n_in, n_out }))
    }

    pub(super) fn act(&mut self, x: usize, f: Activation) -> usize {
        let out = activation(&self.nodes[x].out, f);
        let r = self.nodes[x].out.value.iter().map(|&z| f.rounding(z)).collect();
        self.push(out, r, Op::Act { x, f })
    }

    pub(super) fn layer_norm(&mut self, x: usize, ln: &LayerNorm) -> Result<usize> {
        let out = layer_norm(&self.nodes[x].out, &ln.weight, &ln.bias)?;
        let weight = vec_f64(&ln.weight)?;
        let n = weight.len();
        let gm = gamma(2 * n + 8);
        let xin = &self.nodes[x].out.value;
        let mut r = Vec::with_capacity(xin.len());
        for (row, y) in xin.chunks_exact(n).zip(out.value.chunks_exact(n)) {
            let (mean, s, mean_abs) = ln_stats(row);
            for i in 0..n {
                let xt = ((row[i] - mean) / s).abs();
                r.push(weight[i].abs() * gm * (1.0 + xt) * (1.0 + mean_abs / s) + 2.0 * U * y[i].abs());
            }
        }
        Ok(self.push(out, r, Op::Ln { x, weight }))
    }

    pub(super) fn add(&mut self, a: usize, b: usize) -> usize {
        let out = super::attention::add(&self.nodes[a].out, &self.nodes[b].out);
        let r = out.value.iter().map(|v| U * v.abs()).collect();
        self.push(out, r, Op::Add { a, b })
    }

    pub(super) fn attention(&mut self, qkv: usize, heads: usize, out: Bounded) -> usize {
        let r = vec![0.0; out.value.len()];
        self.push(out, r, Op::Attn { qkv, heads })
    }

    /// The last node's output with each seeded element's bound replaced by
    /// the smaller of the layer-by-layer and the Jacobian bound.
    pub(super) fn tightened(&self, bias: &ScoreBias, seeds: Seeds) -> Bounded {
        let last = self.nodes.len() - 1;
        let mut out = self.nodes[last].out.clone();
        let (b, s, w) = (out.shape[0], out.shape[1], out.shape[2]);
        let tokens = if seeds == Seeds::FirstToken { 1.min(s) } else { s };
        for row in 0..b {
            for o in 0..tokens * w {
                let e = self.reverse(last, row, b, o, bias) * SECOND_ORDER;
                let i = row * s * w + o;
                out.bound[i] = out.bound[i].min(e);
            }
        }
        out
    }

    /// Replaces node `i`'s bounds by the smaller of the layer-by-layer and
    /// the Jacobian bound, in place, for the elements `which` picks.
    pub(super) fn tighten(&mut self, i: usize, bias: &ScoreBias, which: Tighten) {
        let b = self.nodes[i].out.shape[0];
        let len = self.nodes[i].out.value.len() / b.max(1);
        let mut bound = self.nodes[i].out.bound.clone();
        let value = &self.nodes[i].out.value;
        for row in 0..b {
            for o in 0..len {
                let k = row * len + o;
                if which == Tighten::NearZero && value[k].abs() > bound[k] {
                    continue;
                }
                let e = self.reverse(i, row, b, o, bias) * SECOND_ORDER;
                bound[k] = bound[k].min(e);
            }
        }
        self.nodes[i].out.bound = bound;
    }

    /// `sum over sites |d out_o / d site| r_site` for output element `o` of batch row `row`.
    ///
    /// A ReLU input within its bound `e` of 0 (rounding may put it on either
    /// side) gets the slope 1/2 and the extra site `e / 2`: `relu(z + d) -
    /// relu(z) = s d` for some `s` in [0, 1], and `|(s - 1/2) d| <= e / 2`.
    fn reverse(&self, start: usize, row: usize, batch: usize, o: usize, bias: &ScoreBias) -> f64 {
        let slice = |n: &Node| {
            let len = n.out.value.len() / batch;
            row * len..(row + 1) * len
        };
        let mut adj: Vec<Vec<f64>> = self.nodes.iter().map(|n| vec![0.0; n.out.value.len() / batch]).collect();
        adj[start][o] = 1.0;
        let mut total = 0.0;
        for i in (0..=start).rev() {
            let node = &self.nodes[i];
            let a = std::mem::take(&mut adj[i]);
            if a.iter().all(|v| *v == 0.0) {
                continue;
            }
            total += a.iter().zip(&node.r[slice(node)]).map(|(g, r)| g.abs() * r).sum::<f64>();
            match &node.op {
                Op::Input => {}
                Op::Linear { x, weight, n_in, n_out } => {
                    let dst = &mut adj[*x];
                    for (t, arow) in a.chunks_exact(*n_out).enumerate() {
                        let drow = &mut dst[t * n_in..(t + 1) * n_in];
                        for (j, &g) in arow.iter().enumerate() {
                            if g != 0.0 {
                                for (d, w) in drow.iter_mut().zip(&weight[j * n_in..(j + 1) * n_in]) {
                                    *d += g * w;
                                }
                            }
                        }
                    }
                }
                Op::Act { x, f } => {
                    let xn = &self.nodes[*x];
                    let span = slice(xn);
                    let (xin, ein) = (&xn.out.value[span.clone()], &xn.out.bound[span]);
                    for (((d, g), z), e) in adj[*x].iter_mut().zip(&a).zip(xin).zip(ein) {
                        if *f == Activation::Relu && z.abs() <= *e {
                            *d += 0.5 * g;
                            total += 0.5 * g.abs() * e;
                        } else {
                            *d += g * slope(*f, *z);
                        }
                    }
                }
                Op::Ln { x, weight } => {
                    let n = weight.len();
                    let xin = &self.nodes[*x].out.value[slice(&self.nodes[*x])];
                    let dst = &mut adj[*x];
                    for ((arow, xrow), drow) in a.chunks_exact(n).zip(xin.chunks_exact(n)).zip(dst.chunks_exact_mut(n))
                    {
                        let (mean, s, _) = ln_stats(xrow);
                        let gw: Vec<f64> = arow.iter().zip(weight).map(|(g, w)| g * w / s).collect();
                        let m1 = gw.iter().sum::<f64>() / n as f64;
                        let mx = gw.iter().zip(xrow).map(|(g, v)| g * (v - mean) / s).sum::<f64>() / n as f64;
                        for ((d, g), v) in drow.iter_mut().zip(&gw).zip(xrow) {
                            *d += g - m1 - mx * (v - mean) / s;
                        }
                    }
                }
                Op::Add { a: x, b: y } => {
                    for (d, g) in adj[*x].iter_mut().zip(&a) {
                        *d += g;
                    }
                    for (d, g) in adj[*y].iter_mut().zip(&a) {
                        *d += g;
                    }
                }
                Op::Attn { qkv, heads } => {
                    let qv = &self.nodes[*qkv].out.value[slice(&self.nodes[*qkv])];
                    total += attention_vjp(qv, &a, &mut adj[*qkv], *heads, row, bias);
                }
            }
        }
        total
    }
}

/// The attention's reverse pass for one batch row: adds `d out / d qkv` to
/// `adj_qkv` and returns the contribution of its internal rounding sites
/// (scores, weights, the weighted sum), each `|adjoint| r` (see [`super::attention`]).
fn attention_vjp(qkv: &[f64], adj_ctx: &[f64], adj_qkv: &mut [f64], heads: usize, row: usize, bias: &ScoreBias) -> f64 {
    let s = bias.seq;
    let w3 = qkv.len() / s.max(1);
    let d = w3 / 3;
    let hd = d / heads;
    let inv = 1.0 / (hd as f64).sqrt();
    let g_dot = gamma(hd + 4);
    let mut total = 0.0;
    for h in 0..heads {
        for i in 0..s {
            let q0 = i * w3 + h * hd;
            let keys: Vec<usize> = (0..s).filter(|&j| bias.at(row, i, j) != f64::NEG_INFINITY).collect();
            if keys.is_empty() {
                continue;
            }
            let n = keys.len();
            let mut sv = Vec::with_capacity(n);
            let mut rs = Vec::with_capacity(n);
            for &j in &keys {
                let m = bias.at(row, i, j);
                let k0 = j * w3 + d + h * hd;
                let (mut dot, mut mag) = (0.0, 0.0);
                for c in 0..hd {
                    dot += qkv[q0 + c] * qkv[k0 + c];
                    mag += (qkv[q0 + c] * qkv[k0 + c]).abs();
                }
                let v = dot * inv + m;
                sv.push(v);
                rs.push(g_dot * mag * inv + if m != 0.0 { U * v.abs() } else { 0.0 });
            }
            let mx = sv.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = sv.iter().map(|v| (v - mx).exp()).collect();
            let z: f64 = p.iter().sum();
            let w: Vec<f64> = p.iter().map(|v| v / z).collect();
            let dj: Vec<f64> = sv.iter().map(|v| U * (v - mx).abs() + 2.0 * U).collect();
            let rw = super::attention::weight_errors(&w, &dj, gamma(n + 4));
            let g_sum = gamma(n + 1);
            let a0 = i * d + h * hd;
            let ag = &adj_ctx[a0..a0 + hd];
            let mut aw = vec![0.0; n];
            for (t, &j) in keys.iter().enumerate() {
                let v0 = j * w3 + 2 * d + h * hd;
                for c in 0..hd {
                    aw[t] += ag[c] * qkv[v0 + c];
                    adj_qkv[v0 + c] += w[t] * ag[c];
                }
            }
            for c in 0..hd {
                let mag: f64 = keys.iter().zip(&w).map(|(&j, wt)| wt * qkv[j * w3 + 2 * d + h * hd + c].abs()).sum();
                total += ag[c].abs() * g_sum * mag;
            }
            let dot_aw: f64 = w.iter().zip(&aw).map(|(a, b)| a * b).sum();
            for (t, &j) in keys.iter().enumerate() {
                total += aw[t].abs() * rw[t];
                let a_s = w[t] * (aw[t] - dot_aw);
                total += a_s.abs() * rs[t];
                let k0 = j * w3 + d + h * hd;
                for c in 0..hd {
                    adj_qkv[q0 + c] += a_s * qkv[k0 + c] * inv;
                    adj_qkv[k0 + c] += a_s * qkv[q0 + c] * inv;
                }
            }
        }
    }
    total
}
