//! `PPOActor`: a mean network, a log std, and the Gaussian around them.

use candle_core::{DType, Device, Tensor};
use pmstate_ckpt::Checkpoint;
use serde::Serialize;

use crate::config::ActorConfig;
use crate::error::{PolicyError, Result};
use crate::mlp::load_f32;
use crate::network::Network;

/// `log(sqrt(2 pi))`, the constant of `Normal.log_prob`.
const LOG_SQRT_2PI: f64 = 0.918_938_533_204_672_7;

/// Where the effective log std came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogstdSource {
    /// The checkpoint's `_actor.logstd` (learnable, or equal to the config's).
    Checkpoint,
    /// The config's `actor_logstd`: the std is fixed and the checkpoint's
    /// differs, so the reference's loader keeps the config value (quirk 6).
    ConfigOverride,
}

/// The actor.
#[derive(Debug, Clone)]
pub struct Actor {
    /// The mean network.
    pub mu: Network,
    /// The key it writes the mean to.
    pub mu_key: String,
    /// Effective log std, `[A]`.
    pub logstd: Tensor,
    /// `exp(logstd)`, `[A]`.
    pub std: Tensor,
    /// Where `logstd` came from.
    pub logstd_source: LogstdSource,
    /// Whether the std was trained.
    pub learnable_std: bool,
}

impl Actor {
    pub(crate) fn load(cfg: &ActorConfig, ckpt: &Checkpoint, dict: &str, path: &str, dev: &Device) -> Result<Self> {
        let mu = Network::load(&cfg.mu_model, ckpt, dict, "_actor.mu", &format!("{path}.mu_model"), dev)?;
        let saved = load_f32(ckpt, dict, "_actor.logstd", path, dev)?;
        if saved.dims() != [cfg.num_out] {
            return Err(PolicyError::WeightShape {
                file: ckpt.path_str().to_owned(),
                key: "_actor.logstd".into(),
                got: saved.dims().to_vec(),
                expected: format!("[{}] (actor num_out)", cfg.num_out),
            });
        }
        let (logstd, logstd_source) = if cfg.learnable_std {
            (saved, LogstdSource::Checkpoint)
        } else {
            // PPO._load_model_state_dict: torch.allclose(config, saved, atol=1e-6) (rtol 1e-5)
            let c = cfg.actor_logstd as f32;
            let saved_v = saved.to_vec1::<f32>()?;
            let close = saved_v.iter().all(|&s| ((c - s).abs() as f64) <= 1e-6 + 1e-5 * (s.abs() as f64));
            if close {
                (saved, LogstdSource::Checkpoint)
            } else {
                (Tensor::full(c, cfg.num_out, dev)?, LogstdSource::ConfigOverride)
            }
        };
        let std = logstd.exp()?;
        Ok(Actor { mu, mu_key: cfg.mu_key.clone(), logstd, std, logstd_source, learnable_std: cfg.learnable_std })
    }

    /// Number of actions.
    pub fn action_size(&self) -> usize {
        self.logstd.dims()[0]
    }

    /// `-Normal(mean, std).log_prob(action).sum(-1)` in float32, as torch computes it.
    pub fn neglogp(&self, mean: &Tensor, action: &Tensor) -> Result<Tensor> {
        let var = self.std.sqr()?;
        let log_scale = self.std.log()?;
        let d2 = action.sub(mean)?.sqr()?;
        let quad = d2.broadcast_div(&(var * 2.0)?)?;
        // -(quad) - log_scale - c, summed, negated
        let lp = quad.neg()?.broadcast_sub(&log_scale)?;
        let lp = (lp - LOG_SQRT_2PI)?;
        Ok(lp.sum(candle_core::D::Minus1)?.neg()?)
    }

    /// `mean + std * eps` with eps standard normal from `seed` (see [`crate::sample`]).
    pub fn sample(&self, mean: &Tensor, seed: u64) -> Result<Tensor> {
        let n = mean.elem_count();
        let eps = crate::sample::standard_normal(seed, n);
        let eps = Tensor::from_vec(eps, mean.dims(), &Device::Cpu)?.to_device(mean.device())?.to_dtype(DType::F32)?;
        Ok(eps.broadcast_mul(&self.std)?.add(mean)?)
    }
}
