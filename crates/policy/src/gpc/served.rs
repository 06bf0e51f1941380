//! The GPC prior ([`LatentPrior`]) as a [`Model`]: its observations and
//! the optional INT64 `prior_tokens` `[-1, tokens]` (values in
//! `[0, vocab)`) in; `logits` `[-1, tokens, vocab]`, `mean_action`,
//! `latent_codes` out, teacher forced on the tokens when a batch carries
//! them, else generated, each row drawing as its row of its own segment
//! under that segment's seed ([`RowDraw`]): the tokens a caller gets do not
//! depend on what it was batched with; generated tokens are the
//! `prior_tokens` output.

use std::any::Any;
use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::config::LATENT_PRIOR_MODEL;
use super::{LatentPrior, RowDraw};
use crate::load::{AllowedGlobal, LoadOptions};
use crate::served::{
    share, Batch, Datatype, InputSpec, LoadError, Model, ModelDescription, ModelOptions, Named, OutputSpec, PinError,
    PinProblem, RunError, Signature, Source, MAX_LOGITS_PER_FORWARD,
};

/// The name of a GPC prior's generated-tokens output (its token key's name
/// as ProtoMotions writes it).
pub const PRIOR_TOKENS_OUTPUT: &str = "prior_tokens";

/// A [`LatentPrior`] with its signature and description; its forwards hold
/// at most [`MAX_LOGITS_PER_FORWARD`] logits.
#[derive(Debug)]
pub struct PriorModel {
    prior: LatentPrior,
    signature: Signature,
    description: ModelDescription,
}

/// The registry's loader of GPC prior checkpoints; `--width` pins do not
/// apply (its widths are the checkpoint's). Refused when one row's logits
/// pass [`MAX_LOGITS_PER_FORWARD`].
pub(crate) fn load(
    checkpoint: &Path,
    config: &Path,
    device: &Device,
    opts: &ModelOptions,
) -> Result<Box<dyn Model>, LoadError> {
    if let Some((key, _)) = opts.pins.first() {
        let problem = PinProblem::NotPinnable { model: LATENT_PRIOR_MODEL };
        return Err(PinError { key: key.clone(), problem }.into());
    }
    let prior = LatentPrior::load_with(checkpoint, Some(config), device, &LoadOptions { globals: opts.globals })?;
    Ok(Box::new(PriorModel::new(prior, &checkpoint.display().to_string())?))
}

impl PriorModel {
    /// `prior` as a [`Model`], its forwards bounded by
    /// [`MAX_LOGITS_PER_FORWARD`]; refused when one row's logits pass it
    /// (`checkpoint` names it in the error).
    pub fn new(prior: LatentPrior, checkpoint: &str) -> Result<Self, LoadError> {
        let signature = signature(&prior);
        let per_row = signature.logits_per_row.unwrap_or(usize::MAX);
        if per_row > MAX_LOGITS_PER_FORWARD {
            return Err(LoadError::TooManyLogits {
                path: checkpoint.to_owned(),
                per_row,
                limit: MAX_LOGITS_PER_FORWARD,
            });
        }
        let description = ModelDescription::of(&prior.describe())?;
        Ok(PriorModel { prior: prior.with_max_logits(MAX_LOGITS_PER_FORWARD), signature, description })
    }

    /// The prior.
    pub fn prior(&self) -> &LatentPrior {
        &self.prior
    }
}

fn signature(p: &LatentPrior) -> Signature {
    let tok = p.tokenization();
    let mut inputs: Vec<InputSpec> = p
        .obs_keys()
        .into_iter()
        .map(|k| {
            let width = p.widths().known.get(&k).copied();
            InputSpec::observation(k, width)
        })
        .collect();
    inputs.push(InputSpec::optional(p.token_key().to_owned(), tok.tokens, Datatype::Int64, Some(tok.vocab)));
    let a = p.action_size().map_or(-1, |a| a as i64);
    let (t, v) = (tok.tokens as i64, tok.vocab as i64);
    let out = |name, shape, source, datatype| OutputSpec { name, shape, source, datatype };
    let outputs = vec![
        out("logits", vec![-1, t, v], Source::Actor, Datatype::Fp32),
        out("mean_action", vec![-1, a], Source::Actor, Datatype::Fp32),
        out("latent_codes", vec![-1, tok.scalars as i64], Source::Actor, Datatype::Fp32),
        out(PRIOR_TOKENS_OUTPUT, vec![-1, t], Source::Sample, Datatype::Int64),
    ];
    let groups = p.widths().groups.iter().map(|g| (g.path.clone(), g.keys.clone(), g.total)).collect();
    Signature {
        inputs,
        ignored: Vec::new(),
        groups,
        outputs,
        action_size: p.action_size().unwrap_or(0),
        model: LATENT_PRIOR_MODEL,
        logits_per_row: tok.tokens.checked_mul(tok.vocab),
    }
}

impl Model for PriorModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn description(&self) -> &ModelDescription {
        &self.description
    }

    /// Chunks of at most `chunk_rows` rows, and fewer when their logits
    /// would pass [`MAX_LOGITS_PER_FORWARD`]; each row's draws are its
    /// segment's seed and its index within the segment, whatever the chunk.
    fn run(&self, batch: &Batch<'_>) -> Result<Vec<Named>, RunError> {
        let p = &self.prior;
        let teacher_forced = batch.inputs.contains_key(p.token_key());
        let draws: Vec<RowDraw> = batch
            .segments
            .iter()
            .flat_map(|s| {
                let seed = s.seed.unwrap_or(0);
                (0..s.rows as u64).map(move |row| RowDraw { seed, row })
            })
            .collect();
        let rows = batch.rows();
        let chunk = self.signature.max_rows(batch.chunk_rows.max(1));
        let forward = |obs: &HashMap<String, Tensor>, draws: &[RowDraw]| -> Result<Named, RunError> {
            let o = if teacher_forced { p.teacher_forced(obs)? } else { p.generate_rows(obs, p.sampling(0), draws)? };
            let mut out = vec![("mean_action", o.mean_action), ("logits", o.logits), ("latent_codes", o.latent_codes)];
            out.extend(o.norm_obs.map(|n| ("norm_obs", n)));
            if !teacher_forced {
                out.push((PRIOR_TOKENS_OUTPUT, o.tokens));
            }
            Ok(out)
        };
        let same_rows = batch.inputs.values().all(|t| t.dims().first() == Some(&rows));
        let out = if rows <= chunk || !same_rows || draws.len() != rows {
            forward(batch.inputs, &draws)?
        } else {
            let mut parts: Vec<(&'static str, Vec<Tensor>)> = Vec::new();
            for start in (0..rows).step_by(chunk) {
                let len = chunk.min(rows - start);
                let obs = batch
                    .inputs
                    .iter()
                    .map(|(k, t)| Ok((k.clone(), t.narrow(0, start, len)?)))
                    .collect::<candle_core::Result<HashMap<_, _>>>()?;
                let out = forward(&obs, &draws[start..start + len])?;
                if parts.is_empty() {
                    parts = out.into_iter().map(|(k, t)| (k, vec![t])).collect();
                } else {
                    for ((_, acc), (_, t)) in parts.iter_mut().zip(out) {
                        acc.push(t);
                    }
                }
            }
            parts.into_iter().map(|(k, ts)| Ok((k, Tensor::cat(&ts, 0)?))).collect::<candle_core::Result<_>>()?
        };
        let idx: Vec<usize> = (0..batch.segments.len()).collect();
        let mut outs = vec![Vec::new(); idx.len()];
        let source = |name: &str| if name == PRIOR_TOKENS_OUTPUT { Source::Sample } else { Source::Actor };
        share(batch, &idx, rows, out, &mut outs, source)?;
        Ok(outs)
    }

    fn device(&self) -> &Device {
        self.prior.device()
    }

    fn config_path(&self) -> Option<&str> {
        self.prior.config_path()
    }

    fn allowed_globals(&self) -> &[AllowedGlobal] {
        self.prior.allowed_globals()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
