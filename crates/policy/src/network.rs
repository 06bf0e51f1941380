//! ProtoMotions' TensorDict modules: `MLPWithConcat`, `ObsProcessor`,
//! containers (`ModuleContainer`, `Discriminator`) and the `FSQAutoEncoder`,
//! each reading named tensors and writing one, with its own normalizer.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};
use pmstate_ckpt::Checkpoint;
use pmstate_norm::{Direction, NormConfig, RunningMeanStd};

use crate::activation::Activation;
use crate::config::{ModuleConfig, NormSettings, TransformerConfig};
use crate::error::{PolicyError, Result};
use crate::fsq::Quantizer;
use crate::mlp::Mlp;
use crate::module_ops::{ApplyError, ModuleOp};
use crate::problem::{AttentionProblem, FieldProblem, GraphProblem};
use crate::transformer::{AttentionMasks, TransformerEncoder, TransformerSpec};

/// The reference's `RunningMeanStd` epsilon (`NormObsBase` never passes one).
pub const NORM_EPSILON: f64 = 1e-5;

/// Named tensors flowing between modules (a TensorDict).
pub type TensorMap = HashMap<String, Tensor>;

/// An observation normalizer with its settings and where it came from.
#[derive(Debug, Clone)]
pub struct ObsNormalizer {
    /// The frozen statistics.
    pub rms: RunningMeanStd,
    /// Settings from the config.
    pub settings: NormSettings,
    /// Its full checkpoint name (`model._actor.mu.norm.running_obs_norm`).
    pub name: String,
    /// The saved count.
    pub count: i64,
}

/// A leaf module: an `MLPWithConcat` (with `mlp`) or an `ObsProcessor` (without).
#[derive(Debug, Clone)]
pub struct Leaf {
    /// Config path (`agent.model.actor.mu_model`).
    pub path: String,
    /// State-dict path (`_actor.mu`).
    pub module_path: String,
    /// Inputs, concatenated.
    pub in_keys: Vec<String>,
    /// Output key.
    pub out_key: String,
    /// Normalizer, when `normalize_obs` and a `Forward` runs it.
    pub norm: Option<ObsNormalizer>,
    /// The Sequential (MLPWithConcat only).
    pub mlp: Option<Mlp>,
    /// Operations.
    pub ops: Vec<ModuleOp>,
    /// Applied to the result.
    pub output_activation: Option<Activation>,
    /// The normalizer's config settings even without a normalizer (for reports).
    pub settings: NormSettings,
}

/// A module of the tree.
#[derive(Debug, Clone)]
pub enum Network {
    /// MLPWithConcat or ObsProcessor.
    Leaf(Box<Leaf>),
    /// Models run in order.
    Container {
        /// Config path.
        path: String,
        /// Its in_keys.
        in_keys: Vec<String>,
        /// The models.
        models: Vec<Network>,
    },
    /// `FSQAutoEncoder`: encoder, quantizer, decoder.
    Fsq(Box<FsqNetwork>),
    /// `Transformer`: tokens through a [`TransformerEncoder`], token 0 out.
    Transformer(Box<TransformerNetwork>),
}

/// ProtoMotions' `Transformer` module: concatenates its token inputs along
/// the sequence (a `[B, d]` input is one token), builds the key-padding
/// mask from `input_and_mask_mapping` (the observation's mask is nonzero
/// for valid tokens; other tokens are never padded), runs the encoder and
/// writes token 0 (then `output_activation`) to `out_key`.
#[derive(Debug, Clone)]
pub struct TransformerNetwork {
    /// Config path (`agent.model.prior.models.7`).
    pub path: String,
    /// State-dict path (`_prior.models.7`); the encoder is `<module_path>.seqTransEncoder`.
    pub module_path: String,
    /// Its config.
    pub config: TransformerConfig,
    /// The encoder.
    pub encoder: TransformerEncoder,
    /// How a mask input fits its tokens (the release's rule).
    pub mask_rule: MaskRule,
}

/// How a `Transformer`'s mask input fits its tokens: today's module reduces
/// a wider mask (a token is padded where all its entries are 0) and spreads
/// a `[B, 1]` one over every token; v3.0's and v3.1's concatenate the masks
/// as they are, so anything but one entry per token fails there (and is
/// refused here, naming the release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskRule {
    /// Today's: `[B]`, `[B, 1]` or `[B, M >= S]`.
    Reduce,
    /// An older release's (`v3.1`): `[B, S]`, or `[B]` for one token.
    PerToken(&'static str),
}

impl TransformerNetwork {
    /// The error for a mask of `m` entries per row over `seq` tokens that
    /// its [`MaskRule`] does not take (the wider-or-one rule of today's is
    /// checked where it is applied); `None` when it fits.
    pub(crate) fn mask_rule_refusal(&self, key: &str, shape: &[usize], m: usize, seq: usize) -> Option<PolicyError> {
        match self.mask_rule {
            MaskRule::PerToken(release) if m != seq => Some(PolicyError::Attention {
                path: self.path.clone(),
                problem: AttentionProblem::MaskNotPerToken {
                    key: key.to_owned(),
                    shape: shape.to_vec(),
                    tokens: seq,
                    release,
                },
            }),
            _ => None,
        }
    }
}

/// An `FSQAutoEncoder`: the encoder writes `latent_key`, the quantizer
/// replaces it by its codes, the decoder reads them (`AutoEncoder.forward`).
#[derive(Debug, Clone)]
pub struct FsqNetwork {
    /// Config path (`agent.model.actor.mu_model`).
    pub path: String,
    /// State-dict path (`_actor.mu`).
    pub module_path: String,
    /// `encoder` (state dict `<module_path>.encoder`).
    pub encoder: Network,
    /// `quantizer` (no state: its buffers are not persistent).
    pub quantizer: Quantizer,
    /// The key the encoder writes and the codes replace.
    pub latent_key: String,
    /// `decoder` (state dict `<module_path>.decoder`).
    pub decoder: Network,
}

/// What a forward records besides the TensorDict: each normalizer's output
/// and each FSQ quantizer's codes, by module path.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    /// `(module_path, normalized input)` in the order they ran.
    pub norm_outputs: Vec<(String, Tensor)>,
    /// `(module_path, codes)` of each `FSQAutoEncoder`, in the order they ran.
    pub latent_codes: Vec<(String, Tensor)>,
}

impl Network {
    /// Builds the module for `cfg` at state-dict path `module_path` (`_actor.mu`), loading weights
    /// from the dict `dict` (`model`) of `ckpt`.
    pub fn load(
        cfg: &ModuleConfig,
        ckpt: &Checkpoint,
        dict: &str,
        module_path: &str,
        path: &str,
        dev: &Device,
    ) -> Result<Self> {
        match cfg {
            ModuleConfig::Container(c) => {
                let models = c
                    .models
                    .iter()
                    .enumerate()
                    .map(|(j, m)| {
                        Network::load(
                            m,
                            ckpt,
                            dict,
                            &format!("{module_path}.models.{j}"),
                            &format!("{path}.models.{j}"),
                            dev,
                        )
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Network::Container { path: path.to_owned(), in_keys: c.in_keys.clone(), models })
            }
            ModuleConfig::Fsq(f) => {
                let encoder = Network::load(
                    &f.encoder,
                    ckpt,
                    dict,
                    &format!("{module_path}.encoder"),
                    &format!("{path}.encoder"),
                    dev,
                )?;
                let decoder = Network::load(
                    &f.decoder,
                    ckpt,
                    dict,
                    &format!("{module_path}.decoder"),
                    &format!("{path}.decoder"),
                    dev,
                )?;
                // FSQAutoEncoder._validate_encoder_output_dim, from the weights
                let widths = crate::shapes::Widths::analyse(&[&encoder]);
                if let Some(&w) = widths.known.get(&f.latent_key) {
                    if w != f.num_fsq_scalars {
                        return Err(PolicyError::BadField {
                            path: path.to_owned(),
                            field: "num_fsq_scalars".into(),
                            problem: FieldProblem::FsqScalars { encoder: w, scalars: f.num_fsq_scalars },
                        });
                    }
                }
                let quantizer = Quantizer::new(f.num_fsq_levels, f.num_fsq_scalars, dev)?;
                Ok(Network::Fsq(Box::new(FsqNetwork {
                    path: path.to_owned(),
                    module_path: module_path.to_owned(),
                    encoder,
                    quantizer,
                    latent_key: f.latent_key.clone(),
                    decoder,
                })))
            }
            ModuleConfig::Transformer(t) => {
                let spec = TransformerSpec {
                    d_model: t.latent_dim,
                    heads: t.num_heads,
                    ff: t.ff_size,
                    layers: t.num_layers,
                    activation: t.activation,
                };
                let encoder =
                    TransformerEncoder::load(ckpt, dict, &format!("{module_path}.seqTransEncoder"), spec, path, dev)?;
                Ok(Network::Transformer(Box::new(TransformerNetwork {
                    path: path.to_owned(),
                    module_path: module_path.to_owned(),
                    config: (**t).clone(),
                    encoder,
                    mask_rule: MaskRule::Reduce,
                })))
            }
            ModuleConfig::Mlp(m) => {
                let has_forward = m.module_operations.contains(&ModuleOp::Forward);
                if m.norm.normalize_obs && !has_forward {
                    return Err(PolicyError::Graph {
                        path: path.to_owned(),
                        problem: GraphProblem::NormalizeWithoutForward,
                    });
                }
                let norm = if m.norm.normalize_obs {
                    Some(load_norm(ckpt, dict, module_path, m.norm, path, dev)?)
                } else {
                    None
                };
                let mlp = Mlp::load(ckpt, dict, module_path, m, path, dev)?;
                if let Some(n) = &norm {
                    let w = n.rms.shape().map_or(0, |s| s.iter().product());
                    if w != mlp.in_features() {
                        return Err(PolicyError::Graph {
                            path: path.to_owned(),
                            problem: GraphProblem::NormalizerWidth { normalizer: w, linear: mlp.in_features() },
                        });
                    }
                }
                Ok(Network::Leaf(Box::new(Leaf {
                    path: path.to_owned(),
                    module_path: module_path.to_owned(),
                    in_keys: m.in_keys.clone(),
                    out_key: m.out_key.clone(),
                    norm,
                    mlp: Some(mlp),
                    ops: m.module_operations.clone(),
                    output_activation: m.output_activation,
                    settings: m.norm,
                })))
            }
            ModuleConfig::ObsProcessor(o) => {
                // Without a Forward the normalizer never runs and never materializes (quirk 3).
                let runs = o.norm.normalize_obs && o.module_operations.contains(&ModuleOp::Forward);
                let norm = if runs { Some(load_norm(ckpt, dict, module_path, o.norm, path, dev)?) } else { None };
                Ok(Network::Leaf(Box::new(Leaf {
                    path: path.to_owned(),
                    module_path: module_path.to_owned(),
                    in_keys: o.in_keys.clone(),
                    out_key: o.out_key.clone(),
                    norm,
                    mlp: None,
                    ops: o.module_operations.clone(),
                    output_activation: None,
                    settings: o.norm,
                })))
            }
        }
    }

    /// Runs the module on `td`, adding its output(s).
    pub fn forward(&self, td: &mut TensorMap, trace: &mut Trace) -> Result<()> {
        match self {
            Network::Container { models, .. } => {
                for m in models {
                    m.forward(td, trace)?;
                }
                Ok(())
            }
            Network::Leaf(l) => {
                let y = l.forward(td, trace)?;
                td.insert(l.out_key.clone(), y);
                Ok(())
            }
            Network::Fsq(f) => {
                f.encoder.forward(td, trace)?;
                let latent = td.get(&f.latent_key).ok_or_else(|| PolicyError::Graph {
                    path: f.path.clone(),
                    problem: GraphProblem::Unwritten { key: f.latent_key.clone() },
                })?;
                let width = latent.dims().last().copied().unwrap_or(0);
                // half_L.unsqueeze(0) broadcasts over the last dim, whatever the rank
                if width != f.quantizer.scalars {
                    return Err(PolicyError::BadField {
                        path: f.path.clone(),
                        field: "num_fsq_scalars".into(),
                        problem: FieldProblem::FsqScalars { encoder: width, scalars: f.quantizer.scalars },
                    });
                }
                let codes = f.quantizer.quantize(latent)?;
                trace.latent_codes.push((f.module_path.clone(), codes.clone()));
                td.insert(f.latent_key.clone(), codes);
                f.decoder.forward(td, trace)
            }
            Network::Transformer(t) => {
                let y = t.forward(td)?;
                td.insert(t.config.out_key.clone(), y);
                Ok(())
            }
        }
    }

    /// Makes every transformer in it follow `rule` (an older release's).
    pub(crate) fn set_mask_rule(&mut self, rule: MaskRule) {
        match self {
            Network::Transformer(t) => t.mask_rule = rule,
            Network::Container { models, .. } => models.iter_mut().for_each(|m| m.set_mask_rule(rule)),
            Network::Fsq(f) => {
                f.encoder.set_mask_rule(rule);
                f.decoder.set_mask_rule(rule);
            }
            Network::Leaf(_) => {}
        }
    }

    /// Chooses the CPU matrix product of every MLP in it.
    pub fn set_cpu_kernels(&mut self, kernels: crate::mlp::CpuKernels) -> Result<()> {
        match self {
            Network::Leaf(l) => match &mut l.mlp {
                Some(m) => m.set_cpu_kernels(kernels),
                None => Ok(()),
            },
            Network::Container { models, .. } => models.iter_mut().try_for_each(|m| m.set_cpu_kernels(kernels)),
            Network::Fsq(f) => {
                f.encoder.set_cpu_kernels(kernels)?;
                f.decoder.set_cpu_kernels(kernels)
            }
            // the encoder's Linears run through candle's matmul
            Network::Transformer(_) => Ok(()),
        }
    }

    /// Every leaf, in forward order.
    pub fn leaves(&self) -> Vec<&Leaf> {
        match self {
            Network::Leaf(l) => vec![l],
            Network::Container { models, .. } => models.iter().flat_map(|m| m.leaves()).collect(),
            Network::Fsq(f) => f.encoder.leaves().into_iter().chain(f.decoder.leaves()).collect(),
            Network::Transformer(_) => vec![],
        }
    }

    /// Every transformer in it, in forward order.
    pub fn transformers(&self) -> Vec<&TransformerNetwork> {
        match self {
            Network::Leaf(_) => vec![],
            Network::Container { models, .. } => models.iter().flat_map(|m| m.transformers()).collect(),
            Network::Fsq(f) => f.encoder.transformers().into_iter().chain(f.decoder.transformers()).collect(),
            Network::Transformer(t) => vec![t],
        }
    }

    /// `(in_keys, out_key)` of every leaf and transformer, in forward order.
    fn io(&self) -> Vec<(&[String], &str)> {
        match self {
            Network::Leaf(l) => vec![(&l.in_keys, &l.out_key)],
            Network::Container { models, .. } => models.iter().flat_map(|m| m.io()).collect(),
            Network::Fsq(f) => f.encoder.io().into_iter().chain(f.decoder.io()).collect(),
            Network::Transformer(t) => vec![(&t.config.in_keys, &t.config.out_key)],
        }
    }

    /// Every FSQ autoencoder in it, in forward order.
    pub fn fsq_modules(&self) -> Vec<&FsqNetwork> {
        match self {
            Network::Leaf(_) | Network::Transformer(_) => vec![],
            Network::Container { models, .. } => models.iter().flat_map(|m| m.fsq_modules()).collect(),
            Network::Fsq(f) => {
                let mut v = f.encoder.fsq_modules();
                v.push(f);
                v.extend(f.decoder.fsq_modules());
                v
            }
        }
    }

    /// The keys it reads from outside.
    pub fn external_keys(&self) -> Vec<String> {
        // leaves in forward order; the latent key is written by the
        // encoder's last leaf, so it counts as produced before the decoder
        let mut produced: Vec<&str> = Vec::new();
        let mut out: Vec<String> = Vec::new();
        for (in_keys, out_key) in self.io() {
            for k in in_keys {
                if !produced.contains(&k.as_str()) && !out.contains(k) {
                    out.push(k.clone());
                }
            }
            produced.push(out_key);
        }
        out
    }

    /// The key it writes last.
    pub fn out_key(&self) -> &str {
        match self {
            Network::Leaf(l) => &l.out_key,
            Network::Container { models, .. } => models.last().map_or("", |m| m.out_key()),
            Network::Fsq(f) => f.decoder.out_key(),
            Network::Transformer(t) => &t.config.out_key,
        }
    }

    /// Its config path.
    pub fn path(&self) -> &str {
        match self {
            Network::Leaf(l) => &l.path,
            Network::Container { path, .. } => path,
            Network::Fsq(f) => &f.path,
            Network::Transformer(t) => &t.path,
        }
    }
}

impl Leaf {
    fn forward(&self, td: &TensorMap, trace: &mut Trace) -> Result<Tensor> {
        let mut parts = Vec::with_capacity(self.in_keys.len());
        for k in &self.in_keys {
            let t = td.get(k).ok_or_else(|| PolicyError::UnprovidedKey { path: self.path.clone(), key: k.clone() })?;
            parts.push(t);
        }
        let mut x = if parts.len() == 1 { parts[0].clone() } else { Tensor::cat(&parts, D::Minus1)? };
        let batch = x.dims().first().copied().unwrap_or(0);
        for (i, op) in self.ops.iter().enumerate() {
            x = match op {
                ModuleOp::Forward => self.forward_op(&x, trace)?,
                other => other.apply(&x, batch).map_err(|e| match e {
                    ApplyError::Op(problem) => {
                        PolicyError::ModuleOp { path: self.path.clone(), index: i, op: other.name(), problem }
                    }
                    ApplyError::Candle(e) => PolicyError::Candle(e),
                })?,
            };
        }
        if let Some(a) = self.output_activation {
            x = a.apply(&x)?;
        }
        Ok(x)
    }

    /// `Forward`: rows of the last dim through the normalizer, then the MLP.
    fn forward_op(&self, x: &Tensor, trace: &mut Trace) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let last = dims.last().copied().unwrap_or(0);
        let mut x = x.clone();
        if let Some(n) = &self.norm {
            let x2 = x.reshape(((), last))?.contiguous()?;
            let z = n
                .rms
                .apply(&x2, Direction::Normalize)
                .map_err(|e| PolicyError::Norm { path: n.name.clone(), source: Box::new(e) })?;
            trace.norm_outputs.push((self.module_path.clone(), z.clone()));
            x = z.reshape(dims.as_slice())?;
        }
        match &self.mlp {
            Some(m) => m.forward(&x),
            None => Ok(x),
        }
    }
}

impl TransformerNetwork {
    fn err(&self, problem: AttentionProblem) -> PolicyError {
        PolicyError::Attention { path: self.path.clone(), problem }
    }

    /// `Transformer.forward`: tokens, masks, encoder, token 0, activation.
    fn forward(&self, td: &TensorMap) -> Result<Tensor> {
        let get = |k: &String| {
            td.get(k).ok_or_else(|| PolicyError::UnprovidedKey { path: self.path.clone(), key: k.clone() })
        };
        let d = self.config.latent_dim;
        let mut tokens = Vec::new();
        let mut masks = Vec::new();
        for k in self.config.token_keys() {
            let t = get(k)?;
            let t = match t.dims() {
                [_, w] if *w == d => t.unsqueeze(1)?,
                [_, _, w] if *w == d => t.clone(),
                other => {
                    return Err(self.err(AttentionProblem::TokenShape { key: k.clone(), shape: other.to_vec(), d }))
                }
            };
            let (b, seq, _) = t.dims3()?;
            let padded = match self.config.masks.iter().find(|(tok, _)| tok == k) {
                None => Tensor::zeros((b, seq), DType::U8, t.device())?,
                Some((_, mask_key)) => {
                    let given = get(mask_key)?;
                    // ProtoMotions' masks are 1 for valid: padded = logical_not
                    let raw = match given.rank() {
                        1 => given.unsqueeze(1)?,
                        2 => given.clone(),
                        _ => {
                            return Err(self.err(AttentionProblem::MaskShape {
                                key: mask_key.clone(),
                                shape: given.dims().to_vec(),
                                tokens: seq,
                            }))
                        }
                    };
                    let invalid = raw.eq(0f64)?;
                    let m = invalid.dims()[1];
                    if invalid.dims()[0] != b || (m < seq && m != 1) {
                        return Err(self.err(AttentionProblem::MaskShape {
                            key: mask_key.clone(),
                            shape: raw.dims().to_vec(),
                            tokens: seq,
                        }));
                    }
                    if let Some(e) = self.mask_rule_refusal(mask_key, given.dims(), m, seq) {
                        return Err(e);
                    }
                    if m > seq {
                        // a token is padded only if every entry is (mask.all(-1))
                        invalid.min_keepdim(1)?.broadcast_as((b, seq))?.contiguous()?
                    } else {
                        invalid.broadcast_as((b, seq))?.contiguous()?
                    }
                }
            };
            tokens.push(t);
            masks.push(padded);
        }
        let tokens = Tensor::cat(&tokens, 1)?;
        let padding = Tensor::cat(&masks, 1)?;
        let first =
            self.encoder.forward_first(&tokens, &AttentionMasks { key_padding: Some(&padding), additive: None })?;
        Ok(match self.config.output_activation {
            Some(a) => a.apply(&first)?,
            None => first,
        })
    }
}

fn load_norm(
    ckpt: &Checkpoint,
    dict: &str,
    module_path: &str,
    settings: NormSettings,
    path: &str,
    dev: &Device,
) -> Result<ObsNormalizer> {
    let name = if dict.is_empty() {
        format!("{module_path}.norm.running_obs_norm")
    } else {
        format!("{dict}.{module_path}.norm.running_obs_norm")
    };
    let clamp_value = match settings.clamp {
        Some(c) if c.as_f64() <= 0.0 => {
            return Err(PolicyError::BadField {
                path: path.to_owned(),
                field: "norm_clamp_value".into(),
                problem: FieldProblem::ClampNotPositive { value: c.to_string() },
            })
        }
        c => c.map(|c| c.as_f64()),
    };
    let cfg = NormConfig { epsilon: NORM_EPSILON, clamp_value, ema_decay: settings.ema_decay, ..NormConfig::default() };
    let rms = ckpt.load_normalizer(&name, cfg, dev)?;
    let count = rms.count().unwrap_or(0);
    if rms.shape().is_none_or(|s| s.len() != 1) {
        return Err(PolicyError::Graph {
            path: path.to_owned(),
            problem: match rms.shape() {
                Some(s) => GraphProblem::NormalizerShape { name: name.to_owned(), shape: s.to_vec() },
                None => GraphProblem::NoStatistics { name: name.to_owned() },
            },
        });
    }
    Ok(ObsNormalizer { rms, settings, name, count })
}
