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
}

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
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let missing = critic_keys_missing(&policy, &obs);
    let (actor, value) = if missing.is_empty() {
        let (actor, value) = policy.forward(&obs)?.into_actor_and_value();
        (actor, Some(value))
    } else {
        // a robot's observations: the actor's outputs, as the server gives a
        // request without the critic's own inputs
        if !g.quiet && !g.json {
            output::err_line(format!(
                "pmstate: note: no value: the observations lack the critic's own input(s) {}; the actor ran alone",
                missing.join(", ")
            ));
        }
        (policy.act(&obs)?, None)
    };
    if a.sample {
        // Policy::sample's draw: around the mean with the noise of --seed
        let action = policy.actor().sample(&actor.mean_action, a.seed)?;
        let neglogp = policy.neglogp(&actor.mean_action, &action)?;
        tensors.push(("action".into(), action));
        tensors.push(("neglogp".into(), neglogp));
    }
    tensors.push(("mean_action".into(), actor.mean_action));
    if let Some(v) = value {
        tensors.push(("value".into(), v));
    }
    tensors.push(("std".into(), actor.std));
    if let Some(n) = actor.norm_obs {
        tensors.push(("norm_obs".into(), n));
    }
    if let Some(c) = actor.latent_codes {
        tensors.push(("latent_codes".into(), c));
    }
    if a.discriminator {
        push_discriminator(&policy, &obs, &mut tensors)?;
    }
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

/// The AMP discriminator's outputs (`--discriminator`).
fn push_discriminator(
    policy: &pmstate_policy::Policy,
    obs: &HashMap<String, Tensor>,
    tensors: &mut Vec<(String, Tensor)>,
) -> Result<(), CliError> {
    let d = policy.discriminate(obs)?;
    tensors.push(("disc_logits".into(), d.disc_logits));
    tensors.push(("disc_reward".into(), d.disc_reward));
    tensors.push(("disc_value".into(), d.disc_value));
    Ok(())
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
    let out = model.forward(&obs)?;
    let tensors = vec![
        ("mean_action".to_owned(), out.mean_action),
        ("latent_mu".to_owned(), out.latent_mu),
        ("latent_logvar".to_owned(), out.latent_logvar),
        ("latent".to_owned(), out.latent),
    ];
    write_report(&a.out, &tensors, g)
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
