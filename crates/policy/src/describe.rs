//! [`Description`]: what a loaded policy is, for `pmstate policy describe`.

use std::fmt;

use serde::Serialize;

use crate::actor::LogstdSource;
use crate::config::{Family, Number};
use crate::error::Result;
use crate::model::Policy;
use crate::network::{Leaf, Network};
use crate::shapes::{OpenWidth, WidthSource, Widths};

/// A policy in words and numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Description {
    /// The checkpoint.
    pub checkpoint: String,
    /// The configs file, when loaded from one.
    pub config: Option<String>,
    /// `_target_` of the model.
    pub model: &'static str,
    /// PPO or AMP.
    pub family: Family,
    /// The keys it takes (its networks' in_keys, then keys only the config lists) with the width
    /// the checkpoint determines (None: only group sums are known).
    pub in_keys: Vec<KeyWidth>,
    /// Sums the checkpoint fixes where single widths are open.
    pub width_groups: Vec<Group>,
    /// Number of actions.
    pub action_size: usize,
    /// Whether the std was trained.
    pub learnable_std: bool,
    /// Where the effective log std came from.
    pub logstd_source: LogstdSource,
    /// The effective std, first and last and mean.
    pub std_mean: f64,
    /// Networks: actor, critic, and for AMP discriminator and disc_critic.
    pub networks: Vec<NetworkDesc>,
}

/// An in_key.
#[derive(Debug, Clone, Serialize)]
pub struct KeyWidth {
    /// The key.
    pub key: String,
    /// Its width, when determined.
    pub width: Option<usize>,
    /// Where the width comes from (None: open).
    pub width_source: Option<WidthSource>,
    /// Why the width is open (None: determined).
    pub open_because: Option<OpenWidth>,
    /// Which networks read it.
    pub read_by: Vec<&'static str>,
}

/// A sum of widths.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// The module.
    pub module: String,
    /// Its in_keys.
    pub keys: Vec<String>,
    /// Their total width.
    pub total: usize,
}

/// One network.
#[derive(Debug, Clone, Serialize)]
pub struct NetworkDesc {
    /// actor, critic, discriminator, disc_critic.
    pub role: &'static str,
    /// Config path.
    pub path: String,
    /// Keys read from outside.
    pub in_keys: Vec<String>,
    /// Key written.
    pub out_key: String,
    /// Its leaf modules.
    pub modules: Vec<ModuleDesc>,
    /// Its FSQ quantizers (between an encoder's leaves and a decoder's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quantizers: Vec<QuantizerDesc>,
}

/// An `FSQAutoEncoder`'s quantizer.
#[derive(Debug, Clone, Serialize)]
pub struct QuantizerDesc {
    /// Config path of the autoencoder.
    pub path: String,
    /// The key the encoder writes and the codes replace.
    pub latent_key: String,
    /// `num_fsq_levels`.
    pub levels: usize,
    /// `num_fsq_scalars`.
    pub scalars: usize,
    /// The (recomputed, non-persistent) `half_L`: `codes = round(tanh(latent) * half_L)`.
    pub half_l: f32,
    /// Codes lie in `[-half_width, half_width]`.
    pub half_width: f32,
}

/// A leaf module.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleDesc {
    /// Config path.
    pub path: String,
    /// `MLPWithConcat` or `ObsProcessor`.
    pub class: &'static str,
    /// Its in_keys.
    pub in_keys: Vec<String>,
    /// Its out key.
    pub out_key: String,
    /// Module operations (class names without the `ModuleOperation`/`Config` affixes).
    pub module_operations: Vec<String>,
    /// Layers as `in->out activation [+LayerNorm]`.
    pub layers: Vec<String>,
    /// Output activation.
    pub output_activation: Option<&'static str>,
    /// Normalizer, if it normalizes.
    pub normalizer: Option<NormDesc>,
}

/// A normalizer.
#[derive(Debug, Clone, Serialize)]
pub struct NormDesc {
    /// Checkpoint name.
    pub name: String,
    /// Width.
    pub width: usize,
    /// Clamp (int or float as configured; None: no clamp).
    pub clamp: Option<Number>,
    /// EMA decay (None: Welford).
    pub ema_decay: Option<f64>,
    /// Whether it was trained with EMA.
    pub ema: bool,
    /// Saved sample count (stays 1 under EMA).
    pub count: i64,
    /// Epsilon under the square root.
    pub epsilon: f64,
}

fn leaf_desc(l: &Leaf) -> ModuleDesc {
    let layers = match &l.mlp {
        None => vec![],
        Some(m) => {
            let mut v: Vec<String> = m
                .hidden
                .iter()
                .map(|h| {
                    let ln = if h.layer_norm.is_some() { " +LayerNorm" } else { "" };
                    format!("{}->{}{ln} {}", h.linear.in_features(), h.linear.out_features(), h.activation.name())
                })
                .collect();
            v.push(format!("{}->{}", m.out.in_features(), m.out.out_features()));
            v
        }
    };
    ModuleDesc {
        path: l.path.clone(),
        class: if l.mlp.is_some() { "MLPWithConcat" } else { "ObsProcessor" },
        in_keys: l.in_keys.clone(),
        out_key: l.out_key.clone(),
        module_operations: l
            .ops
            .iter()
            .map(|o| o.name().trim_start_matches("ModuleOperation").trim_end_matches("Config").to_owned())
            .collect(),
        layers,
        output_activation: l.output_activation.map(|a| a.name()),
        normalizer: l.norm.as_ref().map(|n| NormDesc {
            name: n.name.clone(),
            width: n.rms.shape().map_or(0, |s| s.iter().product()),
            clamp: n.settings.clamp,
            ema_decay: n.settings.ema_decay,
            ema: n.settings.ema_decay.is_some(),
            count: n.count,
            epsilon: n.rms.config().epsilon,
        }),
    }
}

fn network_desc(role: &'static str, n: &Network) -> NetworkDesc {
    NetworkDesc {
        role,
        path: n.path().to_owned(),
        in_keys: n.external_keys(),
        out_key: n.out_key().to_owned(),
        modules: n.leaves().into_iter().map(leaf_desc).collect(),
        quantizers: n
            .fsq_modules()
            .into_iter()
            .map(|f| QuantizerDesc {
                path: f.path.clone(),
                latent_key: f.latent_key.clone(),
                levels: f.quantizer.levels,
                scalars: f.quantizer.scalars,
                half_l: f.quantizer.half_l.first().copied().unwrap_or(0.0),
                half_width: f.quantizer.half_width,
            })
            .collect(),
    }
}

/// Each key with its width and where the width comes from, and which of `networks` read it.
fn key_widths(widths: &Widths, keys: Vec<String>, networks: &[NetworkDesc]) -> Vec<KeyWidth> {
    let mut resolved = widths.resolve(&keys);
    keys.into_iter()
        .map(|k| {
            let (width, width_source, open_because) = match resolved.remove(&k) {
                Some(Ok((w, s))) => (Some(w), Some(s), None),
                Some(Err(why)) => (None, None, Some(why)),
                None => (None, None, Some(OpenWidth::NoComponent)),
            };
            KeyWidth {
                width,
                width_source,
                open_because,
                read_by: networks.iter().filter(|n| n.in_keys.contains(&k)).map(|n| n.role).collect(),
                key: k,
            }
        })
        .collect()
}

fn width_groups(widths: &Widths) -> Vec<Group> {
    widths
        .groups
        .iter()
        .filter(|g| g.keys.len() > 1)
        .map(|g| Group { module: g.path.clone(), keys: g.keys.clone(), total: g.total })
        .collect()
}

/// A `Transformer` module.
#[derive(Debug, Clone, Serialize)]
pub struct TransformerDesc {
    /// Config path.
    pub path: String,
    /// The token inputs, in sequence order.
    pub tokens: Vec<String>,
    /// `token key -> mask key` (mask nonzero = the token is attended to).
    pub masks: Vec<(String, String)>,
    /// The key token 0 is written to.
    pub out_key: String,
    /// `latent_dim`.
    pub d_model: usize,
    /// `num_heads`.
    pub heads: usize,
    /// `ff_size`.
    pub ff: usize,
    /// `num_layers`.
    pub layers: usize,
    /// The feed-forward activation.
    pub activation: &'static str,
    /// Applied to token 0.
    pub output_activation: Option<&'static str>,
}

/// A MaskedMimic model in words and numbers (`pmstate policy describe`).
#[derive(Debug, Clone, Serialize)]
pub struct MaskedMimicDescription {
    /// The checkpoint.
    pub checkpoint: String,
    /// `_target_` of the model.
    pub model: &'static str,
    /// The observations it reads, with widths.
    pub in_keys: Vec<KeyWidth>,
    /// Sums the checkpoint fixes where single widths are open.
    pub width_groups: Vec<Group>,
    /// The optional noise input and its width (`vae_noise`, `vae_latent_dim`).
    pub optional_inputs: Vec<(String, usize)>,
    /// Number of actions, when the weights fix it.
    pub action_size: Option<usize>,
    /// `vae_latent_dim`.
    pub latent_dim: usize,
    /// How ProtoMotions draws the noise in a rollout (here: an input, zero when absent).
    pub vae_noise_type: crate::masked_mimic::VaeNoiseType,
    /// prior and trunk.
    pub networks: Vec<NetworkDesc>,
    /// The prior's transformers.
    pub transformers: Vec<TransformerDesc>,
    /// The older release whose layout it was read from (`None`: today's).
    pub release: Option<crate::releases::Release>,
    /// That release's layout, in words.
    pub layout: Option<&'static str>,
}

impl crate::masked_mimic::MaskedMimic {
    /// Describes the model.
    pub fn describe(&self) -> MaskedMimicDescription {
        let networks = vec![network_desc("prior", &self.prior), network_desc("trunk", &self.trunk)];
        let transformers = self
            .prior
            .transformers()
            .into_iter()
            .chain(self.trunk.transformers())
            .map(|t| TransformerDesc {
                path: t.path.clone(),
                tokens: t.config.token_keys().into_iter().cloned().collect(),
                masks: t.config.masks.clone(),
                out_key: t.config.out_key.clone(),
                d_model: t.config.latent_dim,
                heads: t.config.num_heads,
                ff: t.config.ff_size,
                layers: t.config.num_layers,
                activation: t.config.activation.name(),
                output_activation: t.config.output_activation.map(|a| a.name()),
            })
            .collect();
        MaskedMimicDescription {
            checkpoint: self.checkpoint_path().to_owned(),
            model: self.model_class(),
            in_keys: key_widths(&self.widths, self.in_keys(), &networks),
            width_groups: width_groups(&self.widths),
            optional_inputs: vec![(crate::masked_mimic::VAE_NOISE_KEY.to_owned(), self.config.latent_dim)],
            action_size: self.action_size(),
            latent_dim: self.config.latent_dim,
            vae_noise_type: self.config.noise_type,
            networks,
            transformers,
            release: self.release(),
            layout: self.release().map(crate::releases::Release::layout),
        }
    }
}

impl fmt::Display for MaskedMimicDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "checkpoint: {}", self.checkpoint)?;
        writeln!(f, "model: {} (MaskedMimic, inference: prior -> latent -> trunk)", self.model)?;
        if let (Some(r), Some(layout)) = (self.release, self.layout) {
            writeln!(
                f,
                "release: ProtoMotions {}, {layout}; Welford normalizers; masks: one entry per token, bool or float",
                r.name()
            )?;
        }
        let a = self.action_size.map_or("?".to_string(), |a| a.to_string());
        writeln!(f, "actions: {a}")?;
        writeln!(
            f,
            "latent: {} = latent_mu + exp(0.5 * latent_logvar) * vae_noise (vae_noise optional, zero when absent; \
             ProtoMotions draws it {} per episode)",
            self.latent_dim,
            self.vae_noise_type.name()
        )?;
        writeln!(f, "in_keys:")?;
        let kw = self.in_keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
        for k in &self.in_keys {
            let w = k.width.map_or("?".to_string(), |w| w.to_string());
            writeln!(f, "  {:<kw$}  {w:>5}  ({})", k.key, k.read_by.join(", "))?;
        }
        for (k, w) in &self.optional_inputs {
            writeln!(f, "  {k:<kw$}  {w:>5}  (optional)")?;
        }
        for g in &self.width_groups {
            writeln!(f, "  width sum: {} = {} ({})", g.keys.join(" + "), g.total, g.module)?;
        }
        write!(f, "networks:")?;
        for n in &self.networks {
            write!(f, "\n  {}: {} -> {}", n.role, n.path, n.out_key)?;
            for m in &n.modules {
                write!(f, "\n{m}")?;
            }
            for t in self.transformers.iter().filter(|t| t.path.starts_with(&n.path)) {
                let masks: Vec<String> = t.masks.iter().map(|(k, m)| format!("{k} masked by {m}")).collect();
                write!(
                    f,
                    "\n    Transformer {} [{}] -> {} (token 0): d {}, {} heads, ff {}, {} layers, {}{}{}",
                    t.path,
                    t.tokens.join(", "),
                    t.out_key,
                    t.d_model,
                    t.heads,
                    t.ff,
                    t.layers,
                    t.activation,
                    t.output_activation.map_or(String::new(), |a| format!(", output activation {a}")),
                    if masks.is_empty() { String::new() } else { format!("; {}", masks.join(", ")) }
                )?;
            }
        }
        Ok(())
    }
}

impl Policy {
    /// Describes the policy.
    pub fn describe(&self) -> Result<Description> {
        let mut networks = vec![network_desc("actor", &self.actor.mu), network_desc("critic", &self.critic)];
        if let Some(a) = &self.amp {
            networks.push(network_desc("discriminator", &a.discriminator));
            networks.push(network_desc("disc_critic", &a.disc_critic));
        }
        let in_keys = key_widths(&self.widths, self.accepted_keys(), &networks);
        let width_groups = width_groups(&self.widths);
        let std = self.actor.std.to_device(&candle_core::Device::Cpu)?.to_vec1::<f32>()?;
        let std_mean = std.iter().map(|&s| s as f64).sum::<f64>() / std.len().max(1) as f64;
        Ok(Description {
            checkpoint: self.checkpoint.clone(),
            config: self.config_file.clone(),
            model: self.config.family.target(),
            family: self.config.family,
            in_keys,
            width_groups,
            action_size: self.action_size(),
            learnable_std: self.actor.learnable_std,
            logstd_source: self.actor.logstd_source,
            std_mean,
            networks,
        })
    }
}

/// The text `pmstate policy describe` prints: one fact per line, indented
/// by network and module.
impl fmt::Display for Description {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "checkpoint: {}", self.checkpoint)?;
        if let Some(c) = &self.config {
            writeln!(f, "config: {c}")?;
        }
        let fam = match self.family {
            Family::Ppo => "PPO",
            Family::Amp => "AMP",
        };
        writeln!(f, "model: {} ({fam})", self.model)?;
        let std = match (self.learnable_std, self.logstd_source) {
            (true, _) => "learnable std",
            (false, LogstdSource::Checkpoint) => "fixed std",
            (false, LogstdSource::ConfigOverride) => "fixed std (the config's actor_logstd overrides the checkpoint's)",
        };
        writeln!(f, "actions: {} ({std}, mean std {:.6})", self.action_size, self.std_mean)?;
        writeln!(f, "in_keys:")?;
        let kw = self.in_keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
        for k in &self.in_keys {
            let w = k.width.map_or("?".to_string(), |w| w.to_string());
            let by = if k.read_by.is_empty() {
                "listed by the config, read by no network".to_string()
            } else {
                k.read_by.join(", ")
            };
            let from = match (&k.width_source, &k.open_because) {
                (Some(WidthSource::Checkpoint), _) => "checkpoint".to_string(),
                (Some(WidthSource::Given), _) => "given".to_string(),
                (Some(WidthSource::CheckpointSum { module }), _) => format!("checkpoint sum of {module}"),
                (Some(WidthSource::Config { component, function }), _) => {
                    let f = function.rsplit('.').next().unwrap_or(function);
                    format!("configs: {component} = {f}")
                }
                (None, Some(why)) => format!("open: {why}"),
                (None, None) => "open".to_string(),
            };
            writeln!(f, "  {:<kw$}  {w:>5}  ({by}; {from})", k.key)?;
        }
        for g in &self.width_groups {
            writeln!(f, "  width sum: {} = {} ({})", g.keys.join(" + "), g.total, g.module)?;
        }
        write!(f, "networks:")?;
        for n in &self.networks {
            write!(f, "\n  {}: {} -> {}", n.role, n.path, n.out_key)?;
            for m in &n.modules {
                write!(f, "\n{m}")?;
            }
            for q in &n.quantizers {
                write!(f, "\n{q}")?;
            }
        }
        Ok(())
    }
}

/// A module's lines of [`Description`]'s text (indented four spaces).
impl fmt::Display for ModuleDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "    {} {} [{}] -> {}", self.class, self.path, self.in_keys.join(", "), self.out_key)?;
        if self.module_operations != ["Forward"] {
            write!(f, "\n      module operations: {}", self.module_operations.join(", "))?;
        }
        if !self.layers.is_empty() {
            write!(f, "\n      layers: {}", self.layers.join(", "))?;
        }
        if let Some(a) = self.output_activation {
            write!(f, "\n      output activation: {a}")?;
        }
        match &self.normalizer {
            Some(nd) => write!(f, "\n      normalizer {nd}"),
            None => write!(f, "\n      normalizer: none"),
        }
    }
}

/// `FSQ quantizer PATH: S scalars x L levels, ...` (indented four spaces).
impl fmt::Display for QuantizerDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "    FSQ quantizer {}: {} scalars x {} levels, {} = round_half_even(tanh({}) * {}), codes in [-{}, {}]",
            self.path,
            self.scalars,
            self.levels,
            self.latent_key,
            self.latent_key,
            self.half_l,
            self.half_width,
            self.half_width
        )
    }
}

/// `NAME: width W, clamp C, EMA D | Welford, count N, epsilon E`.
impl fmt::Display for NormDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clamp = self.clamp.map_or("none".to_string(), |c| c.to_string());
        let mode = match self.ema_decay {
            Some(e) => format!("EMA {e}"),
            None => "Welford".into(),
        };
        write!(
            f,
            "{}: width {}, clamp {clamp}, {mode}, count {}, epsilon {:e}",
            self.name, self.width, self.count, self.epsilon
        )
    }
}
