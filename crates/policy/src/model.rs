//! [`Policy`]: `PPOModel` / `AMPModel` in eval mode.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use pmstate_ckpt::Checkpoint;

use crate::actor::Actor;
use crate::config::{Family, ModelConfig};
use crate::error::{PolicyError, Result};
use crate::network::{Network, TensorMap, Trace};
use crate::obs_check::{check_obs, ObsKeys};
use crate::problem::GraphProblem;
use crate::shapes::Widths;

/// A ProtoMotions policy: actor and critic (and for AMP the discriminator
/// and its critic), frozen normalizers, weights from a checkpoint. Built
/// by [`Policy::load`] or [`Policy::from_parts`].
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) config: ModelConfig,
    pub(crate) actor: Actor,
    pub(crate) critic: Network,
    pub(crate) amp: Option<AmpNetworks>,
    pub(crate) widths: Widths,
    pub(crate) device: Device,
    pub(crate) checkpoint: String,
    pub(crate) config_file: Option<String>,
    /// Globals let through by `Globals::Allow` at load.
    pub(crate) allowed_globals: Vec<crate::load::AllowedGlobal>,
}

/// The AMP-only networks.
#[derive(Debug, Clone)]
pub struct AmpNetworks {
    /// Writes `disc_logits`.
    pub discriminator: Network,
    /// Writes `disc_value`.
    pub disc_critic: Network,
}

/// What [`Policy::forward`] returns.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The actor's mean, `[B, A]` (what ProtoMotions' evaluator acts with).
    pub mean_action: Tensor,
    /// `exp(logstd)`, `[A]`.
    pub std: Tensor,
    /// The critic's output, `[B, 1]`.
    pub value: Tensor,
    /// The actor's (first) normalizer output, as that normalizer saw its
    /// input: `[B, sum of widths]` unless module operations reshaped it
    /// (then `[rows, width]`); `None` when the actor normalizes nothing.
    pub norm_obs: Option<Tensor>,
    /// Every normalizer output of actor and critic, by state-dict module path (`_critic`).
    pub normalized: Vec<(String, Tensor)>,
    /// The codes the actor's (first) `FSQAutoEncoder` hands its decoder,
    /// `[B, num_fsq_scalars]` (integers in `[-levels/2, levels/2]` as f32);
    /// `None` for an actor without one.
    pub latent_codes: Option<Tensor>,
}

/// What [`Policy::act`] returns: [`Outputs`] without the critic's value.
#[derive(Debug, Clone)]
pub struct ActorOutputs {
    /// The actor's mean, `[B, A]`.
    pub mean_action: Tensor,
    /// `exp(logstd)`, `[A]`.
    pub std: Tensor,
    /// As [`Outputs::norm_obs`].
    pub norm_obs: Option<Tensor>,
    /// As [`Outputs::latent_codes`].
    pub latent_codes: Option<Tensor>,
}

impl Outputs {
    /// The actor's outputs ([`Policy::act`]'s, the same bits) and the value.
    pub fn into_actor_and_value(self) -> (ActorOutputs, Tensor) {
        let Outputs { mean_action, std, value, norm_obs, normalized: _, latent_codes } = self;
        (ActorOutputs { mean_action, std, norm_obs, latent_codes }, value)
    }
}

/// What [`Policy::sample`] adds.
#[derive(Debug, Clone)]
pub struct Sampled {
    /// The deterministic outputs.
    pub outputs: Outputs,
    /// `mean + std * eps`, `[B, A]`.
    pub action: Tensor,
    /// `-log_prob(action).sum(-1)`, `[B]`.
    pub neglogp: Tensor,
}

/// What [`Policy::discriminate`] returns (AMP only).
#[derive(Debug, Clone)]
pub struct DiscOutputs {
    /// The discriminator's logits, `[B, 1]`.
    pub disc_logits: Tensor,
    /// `-log(max(1 - sigmoid(logits), 1e-4))`.
    pub disc_reward: Tensor,
    /// The discriminator critic's output.
    pub disc_value: Tensor,
    /// Their normalizer outputs by module path.
    pub normalized: Vec<(String, Tensor)>,
}

/// Which networks a call runs (and so which observations it needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Actor and critic.
    ActorCritic,
    /// Discriminator and its critic.
    Discriminator,
}

impl Policy {
    /// Builds the policy of `config` with the weights and normalizer
    /// statistics of `checkpoint` (its `model` state dict, or the root when
    /// the file is a bare state dict), on `device`.
    pub fn from_parts(config: ModelConfig, checkpoint: &Checkpoint, device: &Device) -> Result<Self> {
        let dict = match checkpoint.get("model") {
            Some(pmstate_ckpt::Node::Dict(_)) => "model",
            _ => "",
        };
        let base = "agent.model";
        let actor = Actor::load(&config.actor, checkpoint, dict, &format!("{base}.actor"), device)?;
        let critic = Network::load(&config.critic, checkpoint, dict, "_critic", &format!("{base}.critic"), device)?;
        let amp = match &config.amp {
            None => None,
            Some(a) => Some(AmpNetworks {
                discriminator: Network::load(
                    &a.discriminator,
                    checkpoint,
                    dict,
                    "_discriminator",
                    &format!("{base}.discriminator"),
                    device,
                )?,
                disc_critic: Network::load(
                    &a.disc_critic,
                    checkpoint,
                    dict,
                    "_disc_critic",
                    &format!("{base}.disc_critic"),
                    device,
                )?,
            }),
        };
        let mut nets: Vec<&Network> = vec![&actor.mu, &critic];
        if let Some(a) = &amp {
            nets.push(&a.discriminator);
            nets.push(&a.disc_critic);
        }
        let widths = Widths::analyse(&nets);
        if let Some(w) = widths.known.get(&actor.mu_key) {
            if *w != actor.action_size() {
                return Err(PolicyError::Graph {
                    path: format!("{base}.actor"),
                    problem: GraphProblem::ActionSize { mu_width: *w, logstd: actor.action_size() },
                });
            }
        }
        if critic.out_key().is_empty() {
            return Err(PolicyError::Graph { path: format!("{base}.critic"), problem: GraphProblem::NoOutKey });
        }
        Ok(Policy {
            config,
            actor,
            critic,
            amp,
            widths,
            device: device.clone(),
            checkpoint: checkpoint.path_str().to_owned(),
            config_file: None,
            allowed_globals: Vec::new(),
        })
    }

    /// Uses `kernels` for every Linear on CPU (a no-op on other devices).
    pub fn with_cpu_kernels(mut self, kernels: crate::mlp::CpuKernels) -> Result<Self> {
        let mut nets: Vec<&mut Network> = vec![&mut self.actor.mu, &mut self.critic];
        if let Some(a) = &mut self.amp {
            nets.push(&mut a.discriminator);
            nets.push(&mut a.disc_critic);
        }
        for n in nets {
            n.set_cpu_kernels(kernels)?;
        }
        Ok(self)
    }

    /// The parsed model config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The actor.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// The critic.
    pub fn critic(&self) -> &Network {
        &self.critic
    }

    /// The AMP networks, if any.
    pub fn amp(&self) -> Option<&AmpNetworks> {
        self.amp.as_ref()
    }

    /// Widths the checkpoint determines.
    pub fn widths(&self) -> &Widths {
        &self.widths
    }

    /// The checkpoint it was loaded from (for messages).
    pub fn checkpoint_path(&self) -> &str {
        &self.checkpoint
    }

    /// The configs file it was built from, when loaded by [`Policy::load`].
    pub fn config_path(&self) -> Option<&str> {
        self.config_file.as_deref()
    }

    /// Number of actions.
    pub fn action_size(&self) -> usize {
        self.actor.action_size()
    }

    /// The observation keys `part` reads, in first-use order (actor's first).
    pub fn required_keys(&self, part: Part) -> Vec<String> {
        let nets: Vec<&Network> = match (part, &self.amp) {
            (Part::ActorCritic, _) => vec![&self.actor.mu, &self.critic],
            (Part::Discriminator, Some(a)) => vec![&a.discriminator, &a.disc_critic],
            (Part::Discriminator, None) => vec![],
        };
        let mut out: Vec<String> = Vec::new();
        for n in nets {
            for k in n.external_keys() {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        out
    }

    /// The model's in_keys: the union of its networks' (actor, critic,
    /// then the AMP ones), in first-use order.
    pub fn in_keys(&self) -> Vec<String> {
        let mut out = self.required_keys(Part::ActorCritic);
        for k in self.required_keys(Part::Discriminator) {
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    /// The keys an observation map may hold: [`Policy::in_keys`] and the
    /// keys the config's `in_keys` lists although no network reads them
    /// (g1-bones-deploy's `clean_*` keys, quirk 15). Anything else is an error.
    pub fn accepted_keys(&self) -> Vec<String> {
        let mut out = self.in_keys();
        for k in &self.config.in_keys {
            if !out.contains(k) {
                out.push(k.clone());
            }
        }
        out
    }

    /// The model family.
    pub fn family(&self) -> Family {
        self.config.family
    }

    /// Checks `obs` for `part`: every needed key present, no unknown key,
    /// each a float32 `[B, D]` with one B, widths as the checkpoint requires.
    pub fn check_obs(&self, obs: &HashMap<String, Tensor>, part: Part) -> Result<usize> {
        self.check_required(obs, self.required_keys(part))
    }

    /// The observation keys the actor alone reads (what a deployed policy
    /// needs: no critic, no discriminator), in first-use order.
    pub fn actor_keys(&self) -> Vec<String> {
        self.actor.mu.external_keys()
    }

    /// The eval-mode mean action alone (no critic): what ProtoMotions'
    /// exported deployment graph computes. `obs` needs only
    /// [`Policy::actor_keys`]; checked as [`Policy::check_obs`] does.
    pub fn mean_action(&self, obs: &HashMap<String, Tensor>) -> Result<Tensor> {
        self.check_required(obs, self.actor_keys())?;
        let mut td = self.obs_map(obs)?;
        Ok(self.run_actor(&mut td)?.0)
    }

    /// The eval-mode actor alone: [`Policy::forward`]'s outputs but the
    /// value, at the actor's cost (the critic is most of the rest: 40 % of
    /// the full-size smpl tracker's multiply-adds). What a caller that acts
    /// and never asks for the value needs, as the server's requests for
    /// `mean_action` alone. `obs` needs only [`Policy::actor_keys`].
    pub fn act(&self, obs: &HashMap<String, Tensor>) -> Result<ActorOutputs> {
        self.check_required(obs, self.actor_keys())?;
        let mut td = self.obs_map(obs)?;
        let (mean_action, trace) = self.run_actor(&mut td)?;
        Ok(ActorOutputs {
            mean_action,
            std: self.actor.std.clone(),
            norm_obs: trace.norm_outputs.into_iter().next().map(|(_, t)| t),
            latent_codes: trace.latent_codes.into_iter().next().map(|(_, t)| t),
        })
    }

    /// The actor's mean over `td` (which it extends), and what it traced.
    fn run_actor(&self, td: &mut TensorMap) -> Result<(Tensor, Trace)> {
        let mut trace = Trace::default();
        self.actor.mu.forward(td, &mut trace)?;
        let mean_action = td.get(&self.actor.mu_key).cloned().ok_or_else(|| PolicyError::Graph {
            path: "agent.model.actor.mu_model".into(),
            problem: GraphProblem::Unwritten { key: self.actor.mu_key.clone() },
        })?;
        Ok((mean_action, trace))
    }

    fn check_required(&self, obs: &HashMap<String, Tensor>, required: Vec<String>) -> Result<usize> {
        let accepted = self.accepted_keys();
        let keys = ObsKeys { accepted: &accepted, required: &required, optional: &[], known: &self.widths.known };
        let batch = check_obs(obs, &keys)?;
        // group sums, for keys whose own width the checkpoint leaves open
        for g in &self.widths.groups {
            let ws: Option<Vec<usize>> = g
                .keys
                .iter()
                .map(|k| {
                    obs.get(k).and_then(|t| t.dims().get(1).copied()).or_else(|| self.widths.known.get(k).copied())
                })
                .collect();
            let Some(ws) = ws else { continue };
            if !g.keys.iter().all(|k| obs.contains_key(k) || self.widths.known.contains_key(k)) {
                continue;
            }
            let sum: usize = ws.iter().sum();
            if sum != g.total && g.keys.iter().any(|k| required.contains(k)) {
                let key = g.keys.iter().find(|k| !self.widths.known.contains_key(*k)).unwrap_or(&g.keys[0]).clone();
                return Err(PolicyError::ObsGroupWidth {
                    key,
                    module: g.path.clone(),
                    parts: g.keys.iter().cloned().zip(ws).collect(),
                    sum,
                    total: g.total,
                });
            }
        }
        Ok(batch)
    }

    fn obs_map(&self, obs: &HashMap<String, Tensor>) -> Result<TensorMap> {
        obs.iter().map(|(k, v)| Ok((k.clone(), v.to_device(&self.device)?))).collect()
    }

    /// The eval-mode forward of actor and critic (normalizers frozen): the
    /// mean action (what ProtoMotions' evaluator acts with), std, value.
    pub fn forward(&self, obs: &HashMap<String, Tensor>) -> Result<Outputs> {
        self.check_obs(obs, Part::ActorCritic)?;
        let mut td = self.obs_map(obs)?;
        let (mean_action, actor_trace) = self.run_actor(&mut td)?;
        let mut critic_trace = Trace::default();
        self.critic.forward(&mut td, &mut critic_trace)?;
        let value = td.get(self.critic.out_key()).cloned().ok_or_else(|| PolicyError::Graph {
            path: "agent.model.critic".into(),
            problem: GraphProblem::Unwritten { key: self.critic.out_key().to_owned() },
        })?;
        let norm_obs = actor_trace.norm_outputs.first().map(|(_, t)| t.clone());
        let latent_codes = actor_trace.latent_codes.into_iter().next().map(|(_, t)| t);
        let mut normalized = actor_trace.norm_outputs;
        normalized.extend(critic_trace.norm_outputs);
        Ok(Outputs { mean_action, std: self.actor.std.clone(), value, norm_obs, normalized, latent_codes })
    }

    /// [`Policy::forward`] plus an action drawn around the mean with the
    /// noise stream of `seed` ([`crate::sample`]) and its neglogp.
    pub fn sample(&self, obs: &HashMap<String, Tensor>, seed: u64) -> Result<Sampled> {
        let outputs = self.forward(obs)?;
        let action = self.actor.sample(&outputs.mean_action, seed)?;
        let neglogp = self.actor.neglogp(&outputs.mean_action, &action)?;
        Ok(Sampled { outputs, action, neglogp })
    }

    /// `-log_prob(action).sum(-1)` of given actions under `N(mean, std)`.
    pub fn neglogp(&self, mean_action: &Tensor, action: &Tensor) -> Result<Tensor> {
        self.actor.neglogp(mean_action, action)
    }

    /// AMP: the discriminator's logits, its reward and the discriminator critic's value.
    pub fn discriminate(&self, obs: &HashMap<String, Tensor>) -> Result<DiscOutputs> {
        let a = self
            .amp
            .as_ref()
            .ok_or_else(|| PolicyError::NoDiscriminator { class: self.config.family.target().into() })?;
        self.check_obs(obs, Part::Discriminator)?;
        let mut td = self.obs_map(obs)?;
        let mut trace = Trace::default();
        a.discriminator.forward(&mut td, &mut trace)?;
        a.disc_critic.forward(&mut td, &mut trace)?;
        let get = |k: &str, path: &str| {
            td.get(k).cloned().ok_or_else(|| PolicyError::Graph {
                path: path.into(),
                problem: GraphProblem::Unwritten { key: k.into() },
            })
        };
        let disc_logits = get(a.discriminator.out_key(), "agent.model.discriminator")?;
        let disc_value = get(a.disc_critic.out_key(), "agent.model.disc_critic")?;
        let disc_reward = crate::discriminator::disc_reward(&disc_logits)?;
        Ok(DiscOutputs { disc_logits, disc_reward, disc_value, normalized: trace.norm_outputs })
    }
}
