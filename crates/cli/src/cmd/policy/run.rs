//! `pmstate policy run`: the eval-mode forward on a file of observations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use candle_core::Tensor;
use pmstate_norm::Dims;
use pmstate_policy::gpc::LatentPrior;
use serde::Serialize;

use super::PolicyFiles;
use crate::args::{DeviceArg, OutputFormat};
use crate::{output, CliError, Global};

/// `pmstate policy run [--config CONFIGS] CHECKPOINT --obs OBS --out OUT [--sample [--seed S]] [--discriminator]`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    files: PolicyFiles,
    /// Observations: a safetensors file of one f32 [B, D_key] tensor per in_key.
    #[arg(long)]
    obs: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Where the policy runs.
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Also draw actions around the mean (the noise stream of --seed).
    #[arg(long)]
    sample: bool,
    /// The seed of the action noise (with --sample).
    #[arg(long, default_value_t = 0, requires = "sample")]
    seed: u64,
    /// Also run the AMP discriminator and its critic.
    #[arg(long)]
    discriminator: bool,
    /// Rows per forward (PPO/AMP policies and MaskedMimic models): the
    /// memory a forward takes grows with it, the outputs do not change (every
    /// row's outputs are the same bits whatever else is in its batch).
    #[arg(long, default_value_t = DEFAULT_CHUNK_ROWS, value_parser = crate::args::positive)]
    chunk_rows: usize,
}

/// `--chunk-rows`' default: a few MB of activations per layer for the
/// published trackers, a few hundred MB for MaskedMimic at its published
/// sizes (about 285 KB a row).
pub(crate) const DEFAULT_CHUNK_ROWS: usize = 1024;

#[derive(Serialize)]
struct RunReport {
    out: String,
    tensors: Vec<(String, Vec<usize>)>,
}

/// Runs the policy and writes its outputs; prints what it wrote (one line, or a JSON object with `--json`).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let (device, _) = a.device.open()?;
    let policy = match a.files.load_model(&device)? {
        super::Loaded::Policy(p) => p,
        super::Loaded::MaskedMimic(m) => return run_masked_mimic(&a, &m, g),
        super::Loaded::Prior(p) => return run_prior(&a, &p, g),
    };
    let obs = super::obs::read_obs(&a.obs, &policy)?;
    let missing = critic_keys_missing(&policy, &obs);
    if !missing.is_empty() && !g.quiet && !g.json {
        // a robot's observations: the actor's outputs, as the server gives a
        // request without the critic's own inputs
        output::err_line(format!(
            "pmstate: note: no value: the observations lack the critic's own input(s) {}; the actor ran alone",
            missing.join(", ")
        ));
    }
    // the action distribution's std is one row for the whole batch: kept from the first chunk
    let mut std = None;
    let mut per_row = by_chunks(&obs, a.chunk_rows, |o| {
        let (actor, value) = if missing.is_empty() {
            let (actor, value) = policy.forward(o)?.into_actor_and_value();
            (actor, Some(value))
        } else {
            (policy.act(o)?, None)
        };
        std.get_or_insert(actor.std);
        let mut out = vec![("mean_action", actor.mean_action)];
        out.extend(value.map(|v| ("value", v)));
        out.extend(actor.norm_obs.map(|n| ("norm_obs", n)));
        out.extend(actor.latent_codes.map(|c| ("latent_codes", c)));
        if a.discriminator {
            let d = policy.discriminate(o)?;
            out.extend([("disc_logits", d.disc_logits), ("disc_reward", d.disc_reward), ("disc_value", d.disc_value)]);
        }
        Ok(out)
    })?;
    let mut take = |name: &str| per_row.iter().position(|(k, _)| k == name).map(|i| per_row.remove(i));
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mean = take("mean_action");
    if a.sample {
        if let Some((_, mean)) = &mean {
            // Policy::sample's draw: around the mean with the noise of --seed
            let action = policy.actor().sample(mean, a.seed)?;
            let neglogp = policy.neglogp(mean, &action)?;
            tensors.push(("action".into(), action));
            tensors.push(("neglogp".into(), neglogp));
        }
    }
    tensors.extend(mean);
    tensors.extend(take("value"));
    tensors.extend(std.map(|s| ("std".to_owned(), s)));
    tensors.extend(per_row);
    write_report(&a.out, &tensors, g)
}

/// The keys only the critic reads that `obs` lacks, when it has every key
/// the actor reads (else none: the whole forward names what is missing).
fn critic_keys_missing(policy: &pmstate_policy::Policy, obs: &HashMap<String, Tensor>) -> Vec<String> {
    let actor = policy.actor_keys();
    if !actor.iter().all(|k| obs.contains_key(k)) {
        return Vec::new();
    }
    policy
        .required_keys(pmstate_policy::Part::ActorCritic)
        .into_iter()
        .filter(|k| !actor.contains(k) && !obs.contains_key(k))
        .collect()
}

/// A GPC prior: teacher-forced on the file's tokens, or (`--sample`)
/// generating its own with the config's temperature and top-p from `--seed`.
fn run_prior(a: &Args, prior: &LatentPrior, g: Global) -> Result<ExitCode, CliError> {
    if a.discriminator {
        return Err(CliError::Usage("--discriminator: a GPC prior has no discriminator".into()));
    }
    let obs = super::obs::read_prior_obs(&a.obs, prior)?;
    let out = if a.sample { prior.generate(&obs, prior.sampling(a.seed))? } else { prior.teacher_forced(&obs)? };
    let mut tensors: Vec<(String, Tensor)> = vec![
        ("mean_action".into(), out.mean_action),
        ("logits".into(), out.logits),
        ("latent_codes".into(), out.latent_codes),
    ];
    if let Some(n) = out.norm_obs {
        tensors.push(("norm_obs".into(), n));
    }
    if a.sample {
        tensors.push(("prior_tokens".into(), out.tokens));
    }
    write_report(&a.out, &tensors, g)
}

/// A MaskedMimic model: `forward_inference` with the optional `vae_noise`.
fn run_masked_mimic(a: &Args, model: &pmstate_policy::MaskedMimic, g: Global) -> Result<ExitCode, CliError> {
    if a.sample || a.discriminator {
        let flag = if a.sample { "--sample" } else { "--discriminator" };
        return Err(CliError::Usage(format!(
            "{flag}: a MaskedMimic model has no action noise or discriminator (its randomness is the vae_noise input)"
        )));
    }
    let obs = super::obs::read_masked_mimic_obs(&a.obs, model)?;
    let tensors = by_chunks(&obs, a.chunk_rows, |o| {
        let out = model.forward(o)?;
        Ok(vec![
            ("mean_action", out.mean_action),
            ("latent_mu", out.latent_mu),
            ("latent_logvar", out.latent_logvar),
            ("latent", out.latent),
        ])
    })?;
    write_report(&a.out, &tensors, g)
}

/// Runs `forward` on `chunk_rows` rows of `obs` at a time and joins each
/// of its outputs along the rows, so that a forward's working memory is
/// bounded by the chunk, not by the file. Every output of `forward` must
/// have one row per input row. Observations whose batch sizes differ are
/// passed whole, for the model to name the mismatch.
pub(crate) fn by_chunks(
    obs: &HashMap<String, Tensor>,
    chunk_rows: usize,
    mut forward: impl FnMut(&HashMap<String, Tensor>) -> Result<Vec<(&'static str, Tensor)>, CliError>,
) -> Result<Vec<(String, Tensor)>, CliError> {
    let owned = |out: Vec<(&str, Tensor)>| out.into_iter().map(|(k, t)| (k.to_owned(), t)).collect();
    let mut batch = obs.values().map(|t| t.dims().first().copied().unwrap_or(0));
    let rows = batch.next().unwrap_or(0);
    if rows <= chunk_rows || !batch.all(|b| b == rows) {
        return forward(obs).map(owned);
    }
    let mut parts: Vec<(&'static str, Vec<Tensor>)> = Vec::new();
    for start in (0..rows).step_by(chunk_rows) {
        let len = chunk_rows.min(rows - start);
        let chunk =
            obs.iter().map(|(k, t)| Ok((k.clone(), t.narrow(0, start, len)?))).collect::<Result<_, CliError>>()?;
        let out = forward(&chunk)?;
        if parts.is_empty() {
            parts = out.into_iter().map(|(k, t)| (k, vec![t])).collect();
        } else {
            for ((_, acc), (_, t)) in parts.iter_mut().zip(out) {
                acc.push(t);
            }
        }
    }
    parts.into_iter().map(|(k, ts)| Ok((k.to_owned(), Tensor::cat(&ts, 0)?))).collect()
}

/// Writes `tensors` to `out` and prints what was written.
fn write_report(out: &Path, tensors: &[(String, Tensor)], g: Global) -> Result<ExitCode, CliError> {
    write_atomic(out, tensors)?;
    let report = RunReport {
        out: out.display().to_string(),
        tensors: tensors.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect(),
    };
    match g.format() {
        OutputFormat::Json => output::json_line(&report)?,
        OutputFormat::Text => {
            let parts: Vec<String> = report.tensors.iter().map(|(k, s)| format!("{k} {}", Dims(s))).collect();
            output::line(format!("wrote {}: {}", report.out, parts.join(", ")));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `tensors` (in this order) as safetensors at `path`, atomically:
/// through the checkpoint writer's temporary file (removed on an error or
/// a signal, recognized by `pmstate clean-tmp` if the process is killed),
/// synced, then renamed over `path`.
pub(crate) fn write_atomic(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), CliError> {
    pmstate_ckpt::save_tensors(path, tensors, pmstate_ckpt::Durability::Fsync)?;
    Ok(())
}
