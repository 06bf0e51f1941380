//! PPO and AMP policies ([`Policy`]) as a [`Model`]: observations in;
//! `mean_action`, `value`, `std` (and `norm_obs`, `latent_codes` where the
//! actor makes them per row), `action` and `neglogp` drawn with a seed, and
//! for AMP the discriminator's outputs.

use std::any::Any;
use std::path::Path;

use candle_core::Device;

use crate::describe::Description;
use crate::load::{AllowedGlobal, LoadOptions};
use crate::served::{
    by_chunks, resolve_widths, rows_of, share, split_rows, Batch, Datatype, InputSpec, LoadError, Model,
    ModelDescription, ModelOptions, Named, OutputSpec, RowRange, RunError, Signature, Source,
};
use crate::{Part, Policy};

/// A [`Policy`] with its signature (its open widths filled by the pins)
/// and description.
#[derive(Debug)]
pub struct PolicyModel {
    policy: Policy,
    signature: Signature,
    description: ModelDescription,
}

/// The registry's loader of PPO and AMP checkpoints.
pub(crate) fn load(
    checkpoint: &Path,
    config: &Path,
    device: &Device,
    opts: &ModelOptions,
) -> Result<Box<dyn Model>, LoadError> {
    let policy = Policy::load_with(checkpoint, Some(config), device, &LoadOptions { globals: opts.globals })?;
    Ok(Box::new(PolicyModel::new(policy, &opts.pins)?))
}

impl PolicyModel {
    /// `policy` with the widths `pins` fix where its checkpoint leaves them open.
    pub fn new(policy: Policy, pins: &[(String, usize)]) -> Result<Self, LoadError> {
        let signature = signature(&policy, pins)?;
        let description = ModelDescription::of(&policy.describe()?)?;
        Ok(PolicyModel { policy, signature, description })
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

fn signature(policy: &Policy, pins: &[(String, usize)]) -> Result<Signature, LoadError> {
    let ac = policy.required_keys(Part::ActorCritic);
    let actor = policy.actor_keys();
    let disc = policy.required_keys(Part::Discriminator);
    let widths = resolve_widths(policy, pins)?;
    let inputs = policy
        .in_keys()
        .into_iter()
        .map(|k| InputSpec {
            actor_critic: ac.contains(&k),
            actor: actor.contains(&k),
            discriminator: disc.contains(&k),
            ..InputSpec::observation(k.clone(), widths.get(&k).copied())
        })
        .collect::<Vec<_>>();
    let ignored = policy.accepted_keys().into_iter().filter(|k| !inputs.iter().any(|i| &i.name == k)).collect();
    let groups = policy.widths().groups.iter().map(|g| (g.path.clone(), g.keys.clone(), g.total)).collect();
    let a = policy.action_size() as i64;
    let value = policy.widths().known.get(policy.critic().out_key()).map_or(-1, |&w| w as i64);
    let out = |name, shape, source| OutputSpec { name, shape, source, datatype: Datatype::Fp32 };
    let mut outputs = vec![
        out("mean_action", vec![-1, a], Source::Actor),
        out("value", vec![-1, value], Source::Critic),
        out("std", vec![a], Source::Actor),
    ];
    let description = policy.describe()?;
    if let Some(w) = per_row_norm_width(&description) {
        outputs.push(out("norm_obs", vec![-1, w as i64], Source::Actor));
    }
    if let Some(scalars) = actor_fsq_scalars(&description) {
        outputs.push(out("latent_codes", vec![-1, scalars as i64], Source::Actor));
    }
    outputs.push(out("action", vec![-1, a], Source::Sample));
    outputs.push(out("neglogp", vec![-1], Source::Sample));
    if let Some(amp) = policy.amp() {
        let w = |k: &str| policy.widths().known.get(k).map_or(-1, |&w| w as i64);
        let logits = w(amp.discriminator.out_key());
        outputs.push(out("disc_logits", vec![-1, logits], Source::Discriminator));
        outputs.push(out("disc_reward", vec![-1, logits], Source::Discriminator));
        outputs.push(out("disc_value", vec![-1, w(amp.disc_critic.out_key())], Source::Discriminator));
    }
    Ok(Signature {
        inputs,
        ignored,
        groups,
        outputs,
        action_size: policy.action_size(),
        model: policy.family().target(),
        logits_per_row: None,
    })
}

/// The width of `norm_obs` when it has one row per observation row: the
/// actor's first normalizing module runs `Forward` alone (module operations
/// that reshape first make its rows something else, and it is not offered).
fn per_row_norm_width(d: &Description) -> Option<usize> {
    let actor = d.networks.iter().find(|n| n.role == "actor")?;
    let m = actor.modules.iter().find(|m| m.normalizer.is_some())?;
    (m.module_operations == ["Forward"]).then(|| m.normalizer.as_ref().map(|n| n.width)).flatten()
}

/// The codes per row of an FSQ actor's quantizer (`num_fsq_scalars`), when
/// the actor has one: `latent_codes` is then an output.
fn actor_fsq_scalars(d: &Description) -> Option<usize> {
    let actor = d.networks.iter().find(|n| n.role == "actor")?;
    actor.quantizers.first().map(|q| q.scalars)
}

/// The source of a policy output (`value` the critic's, the rest the actor's).
fn source_of(name: &str) -> Source {
    match name {
        "value" => Source::Critic,
        "action" | "neglogp" => Source::Sample,
        "disc_logits" | "disc_reward" | "disc_value" => Source::Discriminator,
        _ => Source::Actor,
    }
}

impl Model for PolicyModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn description(&self) -> &ModelDescription {
        &self.description
    }

    /// The actor (and the critic, only when some segment wants `value`: a
    /// deployment asks for actions, and the critic is 40 % of the full-size
    /// tracker's work) over the segments wanting actor, critic or sampled
    /// outputs; actions drawn per segment from its own mean rows with its
    /// seed, as [`Policy::sample`] on its rows alone; the discriminator over
    /// the segments wanting its outputs.
    fn run(&self, batch: &Batch<'_>) -> Result<Vec<Named>, RunError> {
        let p = &self.policy;
        let outputs = &self.signature.outputs;
        let segments = batch.segments;
        let ranges = batch.ranges();
        let all = batch.rows();
        let mut outs: Vec<Named> = vec![Vec::new(); segments.len()];
        let wanting = |sources: &[Source]| -> Vec<usize> {
            (0..segments.len())
                .filter(|&i| sources.iter().any(|&s| segments[i].wanted.wants_source(outputs, s)))
                .collect()
        };
        let rows_of_idx = |idx: &[usize]| -> (Vec<RowRange>, usize) {
            let r: Vec<RowRange> = idx.iter().map(|&i| ranges[i]).collect();
            let n = r.iter().map(|r| r.len).sum();
            (r, n)
        };
        let ac = wanting(&[Source::Actor, Source::Critic, Source::Sample]);
        if !ac.is_empty() {
            let wants_value = ac.iter().any(|&i| segments[i].wanted.wants_source(outputs, Source::Critic));
            let (sub, rows) = rows_of_idx(&ac);
            let obs = rows_of(batch.inputs, &sub, all)?;
            let out = by_chunks(&obs, batch.chunk_rows, &["std"], |o| -> Result<Named, RunError> {
                let (actor, value) = if wants_value {
                    let (actor, value) = p.forward(o)?.into_actor_and_value();
                    (actor, Some(value))
                } else {
                    (p.act(o)?, None)
                };
                let mut out = vec![("mean_action", actor.mean_action)];
                out.extend(value.map(|v| ("value", v)));
                out.push(("std", actor.std));
                out.extend(actor.norm_obs.map(|n| ("norm_obs", n)));
                out.extend(actor.latent_codes.map(|c| ("latent_codes", c)));
                Ok(out)
            })?;
            // actions drawn first: `policy run` writes them first
            let mean = out.iter().find(|(k, _)| *k == "mean_action").map(|(_, t)| t.clone());
            if let Some(mean) = mean {
                let lens: Vec<usize> = ac.iter().map(|&i| segments[i].rows).collect();
                for (m, &i) in split_rows(&mean, &lens)?.iter().zip(&ac) {
                    let s = &segments[i];
                    let wants = s.wanted.wants("action", Source::Sample) || s.wanted.wants("neglogp", Source::Sample);
                    if let (Some(seed), true) = (s.seed, wants) {
                        let action = p.actor().sample(m, seed)?;
                        let neglogp = p.neglogp(m, &action)?;
                        outs[i].push(("action", action));
                        outs[i].push(("neglogp", neglogp));
                    }
                }
            }
            share(batch, &ac, rows, out, &mut outs, source_of)?;
        }
        let disc = wanting(&[Source::Discriminator]);
        if !disc.is_empty() {
            let (sub, rows) = rows_of_idx(&disc);
            let obs = rows_of(batch.inputs, &sub, all)?;
            let out = by_chunks(&obs, batch.chunk_rows, &[], |o| -> Result<Named, RunError> {
                let d = p.discriminate(o)?;
                Ok(vec![("disc_logits", d.disc_logits), ("disc_reward", d.disc_reward), ("disc_value", d.disc_value)])
            })?;
            share(batch, &disc, rows, out, &mut outs, source_of)?;
        }
        Ok(outs)
    }

    fn device(&self) -> &Device {
        self.policy.device()
    }

    fn config_path(&self) -> Option<&str> {
        self.policy.config_path()
    }

    fn allowed_globals(&self) -> &[AllowedGlobal] {
        self.policy.allowed_globals()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
