//! v2.3's modules, loaded from a checkpoint and run in eval mode.
//!
//! State-dict names follow v2.3's attribute names: an input model's
//! normalizer is `<path>.input_models.<name>.running_obs_norm` (no `norm.`
//! level as in later releases), its MLP `<path>.input_models.<name>.mlp.<i>`,
//! a `MultiHeadedMLP`'s trunk `<path>.trunk.mlp.<i>`, a `Transformer`'s
//! encoder `<path>.seqTransEncoder.layers.<i>` and output model
//! `<path>.output_model.mlp.<i>`.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};
use pmstate_ckpt::Checkpoint;
use pmstate_norm::{Direction, NormConfig};

use super::config::{InputKind, InputModel, MlpSpec, MultiHeadedSpec, TokenOp, TransformerSpec23, TrunkSpec};
use crate::config::MlpConfig;
use crate::error::{PolicyError, Result};
use crate::mlp::Mlp;
use crate::module_ops::ApplyError;
use crate::network::{ObsNormalizer, NORM_EPSILON};
use crate::problem::{AttentionProblem, GraphProblem};
use crate::transformer::{AttentionMasks, TransformerEncoder, TransformerSpec};

/// Observations by key (float32; masks as 1 = valid, 0 = masked).
pub type Obs = HashMap<String, Tensor>;

/// A plain `MLP` with its config path.
#[derive(Debug, Clone)]
pub struct PlainMlp {
    /// Config path.
    pub path: String,
    /// The Sequential.
    pub mlp: Mlp,
}

impl PlainMlp {
    pub(crate) fn load_spec(
        ckpt: &Checkpoint,
        dict: &str,
        prefix: &str,
        spec: &MlpSpec,
        num_in: Option<usize>,
        dev: &Device,
    ) -> Result<Self> {
        let mlp = Mlp::load(ckpt, dict, prefix, &mlp_config(spec), &spec.path, dev)?;
        if let Some(want) = num_in.or(spec.num_in) {
            if mlp.in_features() != want {
                return Err(PolicyError::WeightShape {
                    file: ckpt.path_str().to_owned(),
                    key: format!("{dict}.{prefix}.mlp.0.weight"),
                    got: mlp.hidden.first().map_or(&mlp.out, |h| &h.linear).weight.dims().to_vec(),
                    expected: format!("[_, {want}] (the inputs' widths)"),
                });
            }
        }
        Ok(PlainMlp { path: spec.path.clone(), mlp })
    }

    /// Output width.
    pub fn num_out(&self) -> usize {
        self.mlp.out.out_features()
    }
}

/// The [`MlpConfig`] `Mlp::load` reads: layers and output width (v2.3's
/// `build_mlp` lays the Sequential out as today's `MLPWithConcat` does).
fn mlp_config(spec: &MlpSpec) -> MlpConfig {
    MlpConfig {
        in_keys: Vec::new(),
        out_key: String::new(),
        norm: Default::default(),
        layers: spec.layers.clone(),
        num_out: spec.num_out,
        output_activation: None,
        module_operations: Vec::new(),
    }
}

/// A `Flatten` or `MLP_WithNorm` input model.
#[derive(Debug, Clone)]
pub struct InputNet {
    /// Its config.
    pub spec: InputModel,
    /// Its normalizer (`normalize_obs`).
    pub norm: Option<ObsNormalizer>,
    /// `MLP_WithNorm`'s MLP.
    pub mlp: Option<Mlp>,
}

impl InputNet {
    fn load(ckpt: &Checkpoint, dict: &str, parent: &str, spec: &InputModel, dev: &Device) -> Result<Self> {
        let prefix = format!("{parent}.input_models.{}", spec.name);
        let norm = if spec.norm.normalize_obs {
            let name = format!("{dict}.{prefix}.running_obs_norm");
            let cfg = NormConfig {
                epsilon: NORM_EPSILON,
                clamp_value: spec.norm.clamp.map(|c| c.as_f64()),
                ema_decay: None,
                ..NormConfig::default()
            };
            let rms = ckpt.load_normalizer(&name, cfg, dev)?;
            let width: Option<usize> = rms.shape().and_then(|s| if s.len() == 1 { Some(s[0]) } else { None });
            match width {
                Some(w) if w == spec.num_in => {}
                Some(w) => {
                    return Err(PolicyError::Graph {
                        path: spec.path.clone(),
                        problem: GraphProblem::NormalizerWidth { normalizer: w, linear: spec.num_in },
                    })
                }
                None => {
                    return Err(PolicyError::Graph {
                        path: spec.path.clone(),
                        problem: match rms.shape() {
                            Some(s) => GraphProblem::NormalizerShape { name, shape: s.to_vec() },
                            None => GraphProblem::NoStatistics { name },
                        },
                    })
                }
            }
            let count = rms.count().unwrap_or(0);
            Some(ObsNormalizer { rms, settings: spec.norm, name, count })
        } else {
            None
        };
        let mlp = match spec.kind {
            InputKind::Flatten => None,
            InputKind::MlpWithNorm => {
                let m = MlpSpec {
                    path: spec.path.clone(),
                    num_in: Some(spec.num_in),
                    num_out: spec.num_out,
                    layers: spec.layers.clone(),
                };
                Some(PlainMlp::load_spec(ckpt, dict, &prefix, &m, Some(spec.num_in), dev)?.mlp)
            }
        };
        Ok(InputNet { spec: spec.clone(), norm, mlp })
    }

    /// `NormObsBase.forward` (NaN refused before and after), then the MLP:
    /// `x` is `[N, num_in]` (`Flatten` flattens first).
    fn encode(&self, x: &Tensor) -> Result<Tensor> {
        let x = match self.spec.kind {
            InputKind::Flatten if x.rank() > 2 => x.flatten_from(1)?,
            _ => x.clone(),
        };
        self.refuse_nan(&x)?;
        let x = match &self.norm {
            Some(n) => {
                let dims = x.dims().to_vec();
                let last = dims.last().copied().unwrap_or(0);
                let z = n
                    .rms
                    .apply(&x.reshape(((), last))?.contiguous()?, Direction::Normalize)
                    .map_err(|e| PolicyError::Norm { path: n.name.clone(), source: Box::new(e) })?;
                let z = z.reshape(dims.as_slice())?;
                self.refuse_nan(&z)?;
                z
            }
            None => x,
        };
        match &self.mlp {
            Some(m) => m.forward(&x),
            None => Ok(x),
        }
    }

    fn refuse_nan(&self, x: &Tensor) -> Result<()> {
        // NaN != NaN: any element unequal to itself
        let nan = x.ne(x)?.flatten_all()?.max(0)?.to_scalar::<u8>()? != 0;
        if nan {
            return Err(PolicyError::NanObservation { module: self.spec.path.clone(), key: self.spec.obs_key.clone() });
        }
        Ok(())
    }

    /// The observation, as float32.
    fn observation<'a>(&self, obs: &'a Obs) -> Result<&'a Tensor> {
        obs.get(&self.spec.obs_key)
            .ok_or_else(|| PolicyError::MissingObs { key: self.spec.obs_key.clone(), width: None })
    }
}

/// `MultiHeadedMLP`.
#[derive(Debug, Clone)]
pub struct MultiHeaded {
    /// Config path.
    pub path: String,
    /// Input models, in the config's order.
    pub inputs: Vec<InputNet>,
    /// The trunk.
    pub trunk: PlainMlp,
}

impl MultiHeaded {
    pub(crate) fn load(
        ckpt: &Checkpoint,
        dict: &str,
        prefix: &str,
        spec: &MultiHeadedSpec,
        dev: &Device,
    ) -> Result<Self> {
        let inputs =
            spec.inputs.iter().map(|i| InputNet::load(ckpt, dict, prefix, i, dev)).collect::<Result<Vec<_>>>()?;
        let width = inputs.iter().try_fold(0usize, |a, i| a.checked_add(i.spec.num_out));
        let trunk = PlainMlp::load_spec(ckpt, dict, &format!("{prefix}.trunk"), &spec.trunk, width, dev)?;
        Ok(MultiHeaded { path: spec.path.clone(), inputs, trunk })
    }

    /// Each input model on its observation, concatenated, then the trunk.
    pub fn forward(&self, obs: &Obs) -> Result<Tensor> {
        let mut outs = Vec::with_capacity(self.inputs.len());
        for i in &self.inputs {
            outs.push(i.encode(i.observation(obs)?)?);
        }
        self.trunk.mlp.forward(&Tensor::cat(&outs, D::Minus1)?)
    }
}

/// v2.3's `Transformer`.
#[derive(Debug, Clone)]
pub struct Transformer23 {
    /// Its config.
    pub spec: TransformerSpec23,
    /// Input models, in the config's order.
    pub inputs: Vec<InputNet>,
    /// `seqTransEncoder`.
    pub encoder: TransformerEncoder,
    /// `output_model`.
    pub output: Option<PlainMlp>,
}

impl Transformer23 {
    pub(crate) fn load(
        ckpt: &Checkpoint,
        dict: &str,
        prefix: &str,
        spec: &TransformerSpec23,
        dev: &Device,
    ) -> Result<Self> {
        let inputs =
            spec.inputs.iter().map(|i| InputNet::load(ckpt, dict, prefix, i, dev)).collect::<Result<Vec<_>>>()?;
        let tspec = TransformerSpec {
            d_model: spec.latent_dim,
            heads: spec.heads,
            ff: spec.ff,
            layers: spec.layers,
            activation: spec.activation,
        };
        let encoder =
            TransformerEncoder::load(ckpt, dict, &format!("{prefix}.seqTransEncoder"), tspec, &spec.path, dev)?;
        let output = spec
            .output
            .as_ref()
            .map(|o| PlainMlp::load_spec(ckpt, dict, &format!("{prefix}.output_model"), o, Some(spec.latent_dim), dev))
            .transpose()?;
        Ok(Transformer23 { spec: spec.clone(), inputs, encoder, output })
    }

    fn err(&self, problem: AttentionProblem) -> PolicyError {
        PolicyError::Attention { path: self.spec.path.clone(), problem }
    }

    /// One input's tokens `[B, T, d]`: its operations (or the input model
    /// alone), a `[B, d]` result made one token.
    fn tokens(&self, i: &InputNet, x: &Tensor, batch: usize) -> Result<Tensor> {
        let out = match &i.spec.operations {
            None => i.encode(x)?,
            Some(ops) => {
                let mut x = x.clone();
                for (index, op) in ops.iter().enumerate() {
                    x = match op {
                        TokenOp::Encode => i.encode(&x)?,
                        TokenOp::Shape(shape) => shape.apply(&x, batch).map_err(|e| match e {
                            ApplyError::Op(problem) => PolicyError::ModuleOp {
                                path: format!("{}.config.operations", i.spec.path),
                                index,
                                op: op.name(),
                                problem,
                            },
                            ApplyError::Candle(c) => c.into(),
                        })?,
                    };
                }
                x
            }
        };
        let out = if out.rank() == 2 { out.unsqueeze(1)? } else { out };
        match out.dims() {
            [b, _, d] if *b == batch && *d == self.spec.latent_dim => Ok(out),
            _ => Err(self.err(AttentionProblem::TokenShape {
                key: i.spec.obs_key.clone(),
                shape: out.dims().to_vec(),
                d: self.spec.latent_dim,
            })),
        }
    }

    /// The padding of one input's `t` tokens: its mask's `logical_not`
    /// (v2.3's masks are 1 for valid), or none padded.
    fn padding(&self, i: &InputNet, obs: &Obs, batch: usize, t: usize) -> Result<Tensor> {
        let Some(key) = &i.spec.mask_key else {
            return Ok(Tensor::zeros((batch, t), DType::U8, obs_device(obs))?);
        };
        let m = obs.get(key).ok_or_else(|| PolicyError::MissingObs { key: key.clone(), width: Some(t) })?;
        if m.dims() != [batch, t] {
            return Err(self.err(AttentionProblem::MaskShape {
                key: key.clone(),
                shape: m.dims().to_vec(),
                tokens: t,
            }));
        }
        Ok(m.eq(0f64)?)
    }

    /// Token 0 of the encoder (then the output model): `[B, d]` or `[B, num_out]`.
    pub fn forward(&self, obs: &Obs) -> Result<Tensor> {
        let batch = batch_of(obs);
        let mut tokens = Vec::with_capacity(self.inputs.len());
        let mut padding = Vec::with_capacity(self.inputs.len());
        for i in &self.inputs {
            let t = self.tokens(i, i.observation(obs)?, batch)?;
            padding.push(self.padding(i, obs, batch, t.dims()[1])?);
            tokens.push(t);
        }
        let tokens = Tensor::cat(&tokens, 1)?;
        let padding = Tensor::cat(&padding, 1)?;
        let first =
            self.encoder.forward_first(&tokens, &AttentionMasks { key_padding: Some(&padding), additive: None })?;
        match &self.output {
            Some(o) => o.mlp.forward(&first),
            None => Ok(first),
        }
    }

    /// Output width.
    pub fn num_out(&self) -> usize {
        self.output.as_ref().map_or(self.spec.latent_dim, PlainMlp::num_out)
    }
}

fn batch_of(obs: &Obs) -> usize {
    obs.values().next().map_or(0, |t| t.dims().first().copied().unwrap_or(0))
}

fn obs_device(obs: &Obs) -> &Device {
    obs.values().next().map_or(&Device::Cpu, Tensor::device)
}

/// A loaded trunk.
#[derive(Debug, Clone)]
pub enum Trunk {
    /// `MultiHeadedMLP`.
    MultiHeaded(Box<MultiHeaded>),
    /// `Transformer`.
    Transformer(Box<Transformer23>),
}

impl Trunk {
    pub(crate) fn load(ckpt: &Checkpoint, dict: &str, prefix: &str, spec: &TrunkSpec, dev: &Device) -> Result<Self> {
        Ok(match spec {
            TrunkSpec::MultiHeaded(m) => Trunk::MultiHeaded(Box::new(MultiHeaded::load(ckpt, dict, prefix, m, dev)?)),
            TrunkSpec::Transformer(t) => Trunk::Transformer(Box::new(Transformer23::load(ckpt, dict, prefix, t, dev)?)),
        })
    }

    /// Runs it.
    pub fn forward(&self, obs: &Obs) -> Result<Tensor> {
        match self {
            Trunk::MultiHeaded(m) => m.forward(obs),
            Trunk::Transformer(t) => t.forward(obs),
        }
    }

    /// Output width.
    pub fn num_out(&self) -> usize {
        match self {
            Trunk::MultiHeaded(m) => m.trunk.num_out(),
            Trunk::Transformer(t) => t.num_out(),
        }
    }

    /// The input models.
    pub fn inputs(&self) -> &[InputNet] {
        match self {
            Trunk::MultiHeaded(m) => &m.inputs,
            Trunk::Transformer(t) => &t.inputs,
        }
    }
}
