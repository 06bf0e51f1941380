//! `pmstate policy run`: the eval-mode forward on a file of observations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use candle_core::Tensor;
use pmstate_norm::Dims;
use pmstate_policy::served::{Batch, Segment, Signature, Source, Wanted};
use pmstate_policy::PolicyError;
use serde::Serialize;

use super::PolicyFiles;
use crate::args::{DeviceArg, OutputFormat};
use crate::{output, CliError, Global};

/// `pmstate policy run [--config CONFIGS] CHECKPOINT --obs OBS --out OUT [--sample [--seed S]] [--discriminator]`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    files: PolicyFiles,
    /// Observations: a safetensors file of one f32 [B, D_key] tensor per in_key (a bool tensor, such as a mask, reads as 0.0 / 1.0).
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

/// Runs the model, whatever its family, and writes its outputs; prints
/// what it wrote (one line, or a JSON object with `--json`).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let (device, _) = a.device.open()?;
    let model = a.files.load_model(&device)?;
    let sig = model.signature();
    for (flag, source) in [("--sample", Source::Sample), ("--discriminator", Source::Discriminator)] {
        let asked = if source == Source::Sample { a.sample } else { a.discriminator };
        if asked && !sig.outputs.iter().any(|o| o.source == source) {
            return Err(CliError::Usage(format!("{flag}: {} has no {}", sig.model, source_outputs(source))));
        }
    }
    let obs = super::obs::read_obs(&a.obs, sig)?;
    for input in sig.drawn_inputs() {
        let given = obs.contains_key(&input.name);
        if given && a.sample {
            return Err(CliError::Usage(format!(
                "--sample draws {0}: leave {0} out of --obs to generate, or drop --sample to teacher-force on it",
                input.name
            )));
        }
        if !given && !a.sample {
            return Err(PolicyError::MissingObs { key: input.name.clone(), width: input.width }.into());
        }
    }
    let missing = critic_inputs_missing(sig, &obs);
    if !missing.is_empty() && !g.quiet && !g.json {
        // a robot's observations: the actor's outputs, as the server gives a
        // request without the critic's own inputs
        output::err_line(format!(
            "pmstate: note: no value: the observations lack the critic's own input(s) {}; the actor ran alone",
            missing.join(", ")
        ));
    }
    let mut sources = vec![Source::Actor];
    if missing.is_empty() {
        sources.push(Source::Critic);
    }
    if a.sample {
        sources.push(Source::Sample);
    }
    if a.discriminator {
        sources.push(Source::Discriminator);
    }
    let rows = obs.values().next().and_then(|t| t.dims().first().copied()).unwrap_or(0);
    let segment = Segment { rows, seed: a.sample.then_some(a.seed), wanted: Wanted::Sources(&sources) };
    let batch = Batch { inputs: &obs, segments: &[segment], chunk_rows: a.chunk_rows };
    let out = model.run(&batch)?.into_iter().next().unwrap_or_default();
    let tensors: Vec<(String, Tensor)> = out.into_iter().map(|(k, t)| (k.to_owned(), t)).collect();
    write_report(&a.out, &tensors, g)
}

/// What the outputs of `source` are, in a usage error.
fn source_outputs(source: Source) -> &'static str {
    match source {
        Source::Sample => "drawn outputs (action noise or generated tokens)",
        Source::Discriminator => "discriminator",
        Source::Actor | Source::Critic | Source::Pipeline => "such outputs",
    }
}

/// The inputs only the critic reads that `obs` lacks, when it has every
/// input the actor reads (else none: the whole forward names what is
/// missing).
fn critic_inputs_missing(sig: &Signature, obs: &HashMap<String, Tensor>) -> Vec<String> {
    let actor_has_all = sig.inputs.iter().filter(|i| i.actor && !i.optional).all(|i| obs.contains_key(&i.name));
    if !actor_has_all {
        return Vec::new();
    }
    sig.inputs
        .iter()
        .filter(|i| i.actor_critic && !i.actor && !i.optional && !obs.contains_key(&i.name))
        .map(|i| i.name.clone())
        .collect()
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
