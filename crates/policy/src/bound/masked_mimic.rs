//! The bounded float64 reference of MaskedMimic's `forward_inference`: the
//! prior (normalizers, token MLPs and the transformer, through
//! [`super::attention`]), the latent, the trunk.
//!
//! The latent `mu + exp(0.5 logvar) * noise` (the noise is an exact input):
//! `0.5 logvar` is exact in binary, `exp` adds its error and one ulp,
//! `e_exp = exp(a) (exp(e_a) (1 + 2u) - 1)`; the product
//! `e_p = |noise| e_exp + u |p|`; the sum `e = e_mu + e_p + u |mu + p|`.

use std::collections::HashMap;

use candle_core::Tensor;

use super::{network, vec_f64, Bounded, Reference, U};
use crate::error::{PolicyError, Result};
use crate::masked_mimic::{MaskedMimic, VAE_LATENT_KEY, VAE_NOISE_KEY};
use crate::problem::GraphProblem;

impl MaskedMimic {
    /// The float64 reference of [`MaskedMimic::forward`] on `obs`, with
    /// per-element bounds: every key the forward writes (the prior's
    /// `out_keys`, `vae_latent`, the trunk's output, every intermediate) and
    /// each normalizer's output. Refuses what `forward` refuses.
    pub fn reference(&self, obs: &HashMap<String, Tensor>) -> Result<Reference> {
        let obs = self.inputs(obs)?;
        let obs = obs.as_ref();
        self.check(obs)?;
        let mut r = Reference::default();
        for (k, t) in obs {
            r.values.insert(k.clone(), Bounded::exact(t.dims().to_vec(), vec_f64(t)?));
        }
        network(&self.prior, &mut r)?;
        let written = |r: &Reference, key: &str| -> Result<Bounded> {
            r.values.get(key).cloned().ok_or_else(|| PolicyError::Graph {
                path: "agent.model.prior".into(),
                problem: GraphProblem::Unwritten { key: key.into() },
            })
        };
        let mu = written(&r, &self.config.prior_out.0)?;
        let logvar = written(&r, &self.config.prior_out.1)?;
        let noise = r.values.get(VAE_NOISE_KEY);
        let mut latent = mu.clone();
        for i in 0..latent.value.len() {
            let n = noise.map_or(0.0, |n| n.value[i]);
            let a = 0.5 * logvar.value[i];
            let ea = 0.5 * logvar.bound[i];
            let ex = a.exp();
            let e_ex = ex * ((ea.exp()) * (1.0 + 2.0 * U) - 1.0);
            let p = ex * n;
            let e_p = n.abs() * e_ex + U * p.abs();
            latent.value[i] = mu.value[i] + p;
            latent.bound[i] = mu.bound[i] + e_p + U * latent.value[i].abs();
        }
        r.values.insert(VAE_LATENT_KEY.into(), latent);
        network(&self.trunk, &mut r)?;
        Ok(r)
    }
}
