//! [`Policy::mean_action_into`]: the actor's mean action on slices, in the
//! caller's buffers, for the shape every published tracker's actor has
//! (one `MLPWithConcat`: concatenated inputs, the observation normalizer,
//! Linear layers with ReLU or nothing after them, packed CPU kernels). A
//! control loop calls it every step: at a batch below one kernel block it
//! allocates nothing once the buffers have grown, and enters no thread
//! pool. The arithmetic is the candle path's, in the same order: the same
//! bits (tests/flat_actor.rs).

use candle_core::{Storage, Tensor};

use crate::activation::Activation;
use crate::error::{PolicyError, Result};
use crate::kernels::{Epilogue, KernelScratch};
use crate::model::Policy;
use crate::module_ops::ModuleOp;
use crate::network::Network;
use crate::problem::GraphProblem;

/// The buffers of [`Policy::mean_action_into`], kept across calls.
#[derive(Debug, Default, Clone)]
pub struct ActorScratch {
    x: Vec<f32>,
    h: Vec<f32>,
    kernel: KernelScratch,
}

/// `f(slice)` of a contiguous float32 CPU tensor, without copying it.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else { return None };
    let all = cpu.as_slice::<f32>().ok()?;
    let (a, b) = layout.contiguous_offsets()?;
    Some(f(all.get(a..b)?))
}

/// The normalizer's clamp, as `pmstate_norm`'s kernel applies it (NaN stays).
fn clamp(v: f32, c: Option<(f32, f32)>) -> f32 {
    match c {
        Some((lo, _)) if v < lo => lo,
        Some((_, hi)) if v > hi => hi,
        _ => v,
    }
}

impl Policy {
    /// The actor's mean action of `rows` rows into `out` (`rows x actions`,
    /// row-major), when the actor has the flat shape (see the module docs):
    /// `input(i)` is the `rows x width` slice of the actor's `i`-th key of
    /// [`Policy::actor_keys`]. `Ok(false)` (nothing written) for another
    /// shape, or off the CPU: run [`Policy::mean_action`] then.
    pub fn mean_action_into<'a>(
        &self,
        rows: usize,
        input: &dyn Fn(usize) -> &'a [f32],
        scratch: &mut ActorScratch,
        out: &mut Vec<f32>,
    ) -> Result<bool> {
        let Network::Leaf(leaf) = &self.actor().mu else { return Ok(false) };
        let Some(mlp) = &leaf.mlp else { return Ok(false) };
        let fused = |a: Activation| match a {
            Activation::Relu => Some(Epilogue::Relu),
            Activation::Identity => Some(Epilogue::Identity),
            _ => None,
        };
        let flat = leaf.ops.len() == 1
            && matches!(leaf.ops[0], ModuleOp::Forward)
            && leaf.output_activation.is_none()
            && leaf.out_key == self.actor().mu_key
            && mlp
                .hidden
                .iter()
                .all(|h| h.layer_norm.is_none() && fused(h.activation).is_some() && h.linear.packed.is_some())
            && mlp.out.packed.is_some();
        if !flat || rows == 0 {
            return Ok(false);
        }
        let width = mlp.in_features();
        let ActorScratch { x, h, kernel } = scratch;
        x.clear();
        let mut total = 0;
        for (i, key) in leaf.in_keys.iter().enumerate() {
            let s = input(i);
            if !s.len().is_multiple_of(rows) {
                return Err(PolicyError::ObsWidth { key: key.clone(), got: s.len() / rows, expected: width });
            }
            total += s.len() / rows;
        }
        if total != width {
            return Err(PolicyError::Graph {
                path: leaf.path.clone(),
                problem: GraphProblem::Unwritten {
                    key: format!("{} (inputs {total} wide, the first Linear takes {width})", leaf.out_key),
                },
            });
        }
        for r in 0..rows {
            for i in 0..leaf.in_keys.len() {
                let s = input(i);
                let w = s.len() / rows;
                x.extend_from_slice(&s[r * w..(r + 1) * w]);
            }
        }
        if let Some(n) = &leaf.norm {
            let (Some(mean), Some(std)) = (n.rms.mean_f32(), n.rms.std_f32()) else { return Ok(false) };
            let c = n.rms.config().clamp_value.map(|c| ((-c) as f32, c as f32));
            let done = with_f32(mean, |m| {
                with_f32(std, |s| {
                    if m.len() != width || s.len() != width {
                        return false;
                    }
                    for row in x.chunks_exact_mut(width) {
                        for ((v, m), s) in row.iter_mut().zip(m).zip(s) {
                            *v = clamp((*v - m) / s, c);
                        }
                    }
                    true
                })
            });
            if done.flatten() != Some(true) {
                return Ok(false);
            }
        }
        for layer in &mlp.hidden {
            let (Some(p), Some(ep)) = (layer.linear.packed.as_ref(), fused(layer.activation)) else { return Ok(false) };
            p.forward_into_scratch(x, rows, ep, h, kernel);
            std::mem::swap(x, h);
        }
        let Some(p) = mlp.out.packed.as_ref() else { return Ok(false) };
        p.forward_into_scratch(x, rows, Epilogue::Identity, out, kernel);
        Ok(true)
    }
}
