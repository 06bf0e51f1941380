//! v2.3 models as a [`Model`]: the tracker gives `mean_action`, `value`
//! and `std`; MaskedMimic gives `mean_action`, `latent_mu`,
//! `latent_logvar` and `latent` (with the optional `vae_noise`, zero when
//! left out), as today's families name them.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use candle_core::Device;
use serde::Serialize;

use super::config::{class, InputKind, TokenOp, V23Spec};
use super::net::{InputNet, MultiHeaded, Trunk};
use super::{open_checkpoint, read_spec, V23Net, VAE_LATENT_KEY, VAE_NOISE_KEY};
use crate::load::{AllowedGlobal, LoadOptions};
use crate::module_ops::{ModuleOp, ReshapeDim};
use crate::served::{
    by_chunks, share, Batch, Datatype, InputSpec, LoadError, Model, ModelDescription, ModelOptions, Named, OutputSpec,
    PinError, PinProblem, RunError, Signature, Source,
};

/// A v2.3 model with its signature and description.
#[derive(Debug)]
pub struct V23Model {
    net: V23Net,
    spec: V23Spec,
    device: Device,
    config_path: String,
    allowed: Vec<AllowedGlobal>,
    signature: Signature,
    description: ModelDescription,
}

/// The registry's loader of v2.3 checkpoints (`config` is the
/// `config.yaml`); `--width` pins do not apply (every width is the config's).
pub(crate) fn load(
    checkpoint: &Path,
    config: &Path,
    device: &Device,
    opts: &ModelOptions,
) -> Result<Box<dyn Model>, LoadError> {
    Ok(Box::new(V23Model::load(checkpoint, config, device, opts)?))
}

impl V23Model {
    /// Loads `checkpoint` with the v2.3 `config.yaml` at `config`.
    pub fn load(checkpoint: &Path, config: &Path, device: &Device, opts: &ModelOptions) -> Result<Self, LoadError> {
        let spec = read_spec(config)?;
        if let Some((key, _)) = opts.pins.first() {
            return Err(PinError { key: key.clone(), problem: PinProblem::NotPinnable { model: spec.class() } }.into());
        }
        let (ckpt, allowed) = open_checkpoint(checkpoint, &LoadOptions { globals: opts.globals })?;
        let net = V23Net::load(&ckpt, &spec, device)?;
        let signature = signature(&net, &spec);
        let description = ModelDescription::of(&describe(&net, &spec, config, &ckpt))?;
        Ok(V23Model {
            net,
            spec,
            device: device.clone(),
            config_path: config.display().to_string(),
            allowed,
            signature,
            description,
        })
    }

    /// The network.
    pub fn net(&self) -> &V23Net {
        &self.net
    }

    /// Its config.
    pub fn spec(&self) -> &V23Spec {
        &self.spec
    }
}

/// Tokens an input makes: the middle size of its last `batch_size`
/// reshape (`[batch_size, T, d]`), else 1.
fn tokens(i: &InputNet) -> usize {
    let Some(ops) = &i.spec.operations else { return 1 };
    ops.iter()
        .rev()
        .find_map(|op| match op {
            TokenOp::Shape(ModuleOp::Reshape(dims)) => match dims.as_slice() {
                [ReshapeDim::Batch(_), ReshapeDim::Size(t), ReshapeDim::Size(_)] if *t > 0 => usize::try_from(*t).ok(),
                _ => None,
            },
            _ => None,
        })
        .unwrap_or(1)
}

/// The width of an input model's observation: `num_in` for one whose rows
/// are its inputs, `num_in x tokens` for one that encodes each token, none
/// (open) for other operations.
fn width(i: &InputNet) -> Option<usize> {
    match &i.spec.operations {
        None => Some(i.spec.num_in),
        Some(ops) => {
            let encodes_tokens =
                ops.iter().all(|o| matches!(o, TokenOp::Encode | TokenOp::Shape(ModuleOp::Reshape(_))));
            encodes_tokens.then(|| i.spec.num_in.checked_mul(tokens(i))).flatten()
        }
    }
}

/// Every observation `trunks` read (masks included), with its width and
/// whether the actor reads it, in first-read order.
fn observations<'a>(trunks: impl Iterator<Item = (&'a [InputNet], bool)>) -> Vec<(String, Option<usize>, bool)> {
    let mut out: Vec<(String, Option<usize>, bool)> = Vec::new();
    let mut add = |key: &str, w: Option<usize>, actor: bool| match out.iter_mut().find(|(k, ..)| k == key) {
        Some(e) => e.2 |= actor,
        None => out.push((key.to_owned(), w, actor)),
    };
    for (inputs, actor) in trunks {
        for i in inputs {
            if i.spec.obs_key == VAE_LATENT_KEY {
                continue;
            }
            add(&i.spec.obs_key, width(i), actor);
            if let Some(m) = &i.spec.mask_key {
                add(m, Some(tokens(i)), actor);
            }
        }
    }
    out
}

fn signature(net: &V23Net, spec: &V23Spec) -> Signature {
    let out = |name, shape, source| OutputSpec { name, shape, source, datatype: Datatype::Fp32 };
    let (obs, outputs, action_size) = match net {
        V23Net::Ppo { mu, critic, .. } => {
            let a = mu.num_out();
            let obs = observations([(mu.inputs(), true), (critic.inputs(), false)].into_iter());
            let outputs = vec![
                out("mean_action", vec![-1, a as i64], Source::Actor),
                out("value", vec![-1, critic.num_out() as i64], Source::Critic),
                out("std", vec![a as i64], Source::Actor),
            ];
            (obs, outputs, a)
        }
        V23Net::Vae { prior, trunk, latent_dim } => {
            let a = trunk.trunk.num_out();
            let l = *latent_dim as i64;
            let obs = observations([(prior.trunk.inputs(), true), (trunk.inputs.as_slice(), true)].into_iter());
            let outputs = [("mean_action", a as i64), ("latent_mu", l), ("latent_logvar", l), ("latent", l)]
                .into_iter()
                .map(|(name, w)| out(name, vec![-1, w], Source::Actor))
                .collect();
            (obs, outputs, a)
        }
    };
    let mut inputs: Vec<InputSpec> =
        obs.into_iter().map(|(k, w, actor)| InputSpec { actor, ..InputSpec::observation(k, w) }).collect();
    let mut ignored = Vec::new();
    if let V23Net::Vae { latent_dim, .. } = net {
        inputs.push(InputSpec::optional(VAE_NOISE_KEY.to_owned(), *latent_dim, Datatype::Fp32, None));
        // the encoder's observations (training only) are accepted and not read
        if let V23Spec::Vae(v) = spec {
            for i in v.encoder.trunk.inputs() {
                for k in std::iter::once(&i.obs_key).chain(i.mask_key.as_ref()) {
                    if !inputs.iter().any(|s| &s.name == k) && !ignored.contains(k) {
                        ignored.push(k.clone());
                    }
                }
            }
        }
    }
    Signature { inputs, ignored, groups: Vec::new(), outputs, action_size, model: spec.class(), logits_per_row: None }
}

impl V23Model {
    /// The observation checks every family runs: each key accepted, each
    /// required key there, float32 `[B, W]` at the widths the config fixes.
    fn check(&self, inputs: &std::collections::HashMap<String, candle_core::Tensor>) -> Result<(), RunError> {
        let sig = &self.signature;
        let accepted: Vec<String> =
            sig.inputs.iter().map(|i| i.name.clone()).chain(sig.ignored.iter().cloned()).collect();
        let required: Vec<String> = sig.inputs.iter().filter(|i| !i.optional).map(|i| i.name.clone()).collect();
        let optional: Vec<(&str, usize)> =
            sig.inputs.iter().filter(|i| i.optional).filter_map(|i| Some((i.name.as_str(), i.width?))).collect();
        let known: BTreeMap<String, usize> =
            sig.inputs.iter().filter(|i| !i.optional).filter_map(|i| Some((i.name.clone(), i.width?))).collect();
        let keys =
            crate::obs_check::ObsKeys { accepted: &accepted, required: &required, optional: &optional, known: &known };
        crate::obs_check::check_obs(inputs, &keys)?;
        Ok(())
    }
}

impl Model for V23Model {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn run(&self, batch: &Batch<'_>) -> Result<Vec<Named>, RunError> {
        self.check(batch.inputs)?;
        let outputs = &self.signature.outputs;
        let idx: Vec<usize> = (0..batch.segments.len()).collect();
        let wants_value = batch.segments.iter().any(|s| s.wanted.wants_source(outputs, Source::Critic));
        let out = by_chunks(batch.inputs, batch.chunk_rows, &["std"], |o| -> Result<Named, RunError> {
            let r = self.net.forward(o, wants_value)?;
            let mut named = vec![("mean_action", r.mean_action)];
            if let Some(v) = r.value {
                named.push(("value", v));
            }
            if let V23Net::Ppo { logstd, .. } = &self.net {
                named.push(("std", logstd.exp()?));
            }
            if let Some((mu, logvar, z)) = r.latent {
                named.extend([("latent_mu", mu), ("latent_logvar", logvar), ("latent", z)]);
            }
            Ok(named)
        })?;
        let mut outs = vec![Vec::new(); idx.len()];
        let source_of = |name: &str| if name == "value" { Source::Critic } else { Source::Actor };
        share(batch, &idx, batch.rows(), out, &mut outs, source_of)?;
        Ok(outs)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn config_path(&self) -> Option<&str> {
        Some(&self.config_path)
    }

    fn allowed_globals(&self) -> &[AllowedGlobal] {
        &self.allowed
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What `describe` says of a v2.3 model.
#[derive(Debug, Clone, Serialize)]
pub struct V23Description {
    /// `v2.3`.
    pub release: &'static str,
    /// The model class.
    pub class: &'static str,
    /// The `config.yaml` read.
    pub config: String,
    /// The checkpoint read.
    pub checkpoint: String,
    /// Actions per row.
    pub action_size: usize,
    /// The latent width (MaskedMimic).
    pub latent_dim: Option<usize>,
    /// The networks run at inference, in order.
    pub networks: Vec<NetworkDescription>,
}

/// One network (`actor`, `critic`, `prior`, `trunk`).
#[derive(Debug, Clone, Serialize)]
pub struct NetworkDescription {
    /// Its role.
    pub role: &'static str,
    /// Config path.
    pub path: String,
    /// `MultiHeadedMLP` or `Transformer`.
    pub class: &'static str,
    /// The transformer's sizes.
    pub transformer: Option<BTreeMap<&'static str, usize>>,
    /// Its input models.
    pub inputs: Vec<InputDescription>,
    /// Hidden widths of the trunk or output MLP, then its output width.
    pub mlp: Vec<usize>,
}

/// One input model.
#[derive(Debug, Clone, Serialize)]
pub struct InputDescription {
    /// Its name among the input models.
    pub name: String,
    /// `Flatten` or `MLP_WithNorm`.
    pub kind: InputKind,
    /// The observation read.
    pub obs_key: String,
    /// Tokens made (transformer inputs).
    pub tokens: usize,
    /// `num_in`, `num_out`.
    pub num_in: usize,
    /// Output width per token.
    pub num_out: usize,
    /// The normalizer's clamp and count, when it normalizes.
    pub normalizer: Option<NormalizerDescription>,
    /// The mask observation.
    pub mask_key: Option<String>,
}

/// A normalizer.
#[derive(Debug, Clone, Serialize)]
pub struct NormalizerDescription {
    /// Its state-dict name.
    pub name: String,
    /// Its clamp (`None`: none).
    pub clamp: Option<f64>,
    /// Rows it saw.
    pub count: i64,
}

fn describe_inputs(inputs: &[InputNet]) -> Vec<InputDescription> {
    inputs
        .iter()
        .map(|i| InputDescription {
            name: i.spec.name.clone(),
            kind: i.spec.kind,
            obs_key: i.spec.obs_key.clone(),
            tokens: tokens(i),
            num_in: i.spec.num_in,
            num_out: i.spec.num_out,
            normalizer: i.norm.as_ref().map(|n| NormalizerDescription {
                name: n.name.clone(),
                clamp: n.settings.clamp.map(|c| c.as_f64()),
                count: n.count,
            }),
            mask_key: i.spec.mask_key.clone(),
        })
        .collect()
}

fn mlp_widths(m: &crate::mlp::Mlp) -> Vec<usize> {
    m.hidden.iter().map(|h| h.linear.out_features()).chain([m.out.out_features()]).collect()
}

fn describe_multi(role: &'static str, m: &MultiHeaded) -> NetworkDescription {
    NetworkDescription {
        role,
        path: m.path.clone(),
        class: class::MULTI_HEADED_MLP,
        transformer: None,
        inputs: describe_inputs(&m.inputs),
        mlp: mlp_widths(&m.trunk.mlp),
    }
}

fn describe_trunk(role: &'static str, t: &Trunk) -> NetworkDescription {
    match t {
        Trunk::MultiHeaded(m) => describe_multi(role, m),
        Trunk::Transformer(t) => NetworkDescription {
            role,
            path: t.spec.path.clone(),
            class: class::TRANSFORMER,
            transformer: Some(BTreeMap::from([
                ("latent_dim", t.spec.latent_dim),
                ("num_heads", t.spec.heads),
                ("ff_size", t.spec.ff),
                ("num_layers", t.spec.layers),
            ])),
            inputs: describe_inputs(&t.inputs),
            mlp: t.output.as_ref().map(|o| mlp_widths(&o.mlp)).unwrap_or_default(),
        },
    }
}

fn describe(net: &V23Net, spec: &V23Spec, config: &Path, ckpt: &pmstate_ckpt::Checkpoint) -> V23Description {
    let (networks, action_size, latent_dim) = match net {
        V23Net::Ppo { mu, critic, .. } => {
            (vec![describe_trunk("actor", mu), describe_trunk("critic", critic)], mu.num_out(), None)
        }
        V23Net::Vae { prior, trunk, latent_dim } => {
            let mut p = describe_trunk("prior", &prior.trunk);
            p.mlp = mlp_widths(&prior.mu_head.mlp);
            (vec![p, describe_multi("trunk", trunk)], trunk.trunk.num_out(), Some(*latent_dim))
        }
    };
    V23Description {
        release: "v2.3",
        class: spec.class(),
        config: config.display().to_string(),
        checkpoint: ckpt.path_str().to_owned(),
        action_size,
        latent_dim,
        networks,
    }
}

impl fmt::Display for V23Description {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} (ProtoMotions {}, Hydra config {})", self.class, self.release, self.config)?;
        write!(f, "  actions: {}", self.action_size)?;
        if let Some(l) = self.latent_dim {
            write!(f, ", latent: {l}")?;
        }
        writeln!(f)?;
        for n in &self.networks {
            let short = n.class.rsplit('.').next().unwrap_or(n.class);
            write!(f, "  {} ({short} at {})", n.role, n.path)?;
            if let Some(t) = &n.transformer {
                let sizes: Vec<String> = t.iter().map(|(k, v)| format!("{k} {v}")).collect();
                write!(f, ": {}", sizes.join(", "))?;
            }
            writeln!(f)?;
            for i in &n.inputs {
                write!(f, "    {} <- {} ({})", i.name, i.obs_key, i.kind.name())?;
                write!(f, " {} -> {}", i.num_in, i.num_out)?;
                if i.tokens > 1 {
                    write!(f, " x {} tokens", i.tokens)?;
                }
                if let Some(m) = &i.mask_key {
                    write!(f, ", mask {m}")?;
                }
                if let Some(n) = &i.normalizer {
                    match n.clamp {
                        Some(c) => write!(f, ", normalized (clamp {c}, count {})", n.count)?,
                        None => write!(f, ", normalized (count {})", n.count)?,
                    }
                }
                writeln!(f)?;
            }
            if !n.mlp.is_empty() {
                let w: Vec<String> = n.mlp.iter().map(usize::to_string).collect();
                writeln!(f, "    mlp: {}", w.join(" -> "))?;
            }
        }
        Ok(())
    }
}
