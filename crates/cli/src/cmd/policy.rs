//! `pmstate policy describe|run` and `pmstate bench-policy`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use candle_core::{Device, Tensor};
use pmstate_policy::config::Family;
use pmstate_policy::{Description, Policy};
use serde::Serialize;

use crate::args::DeviceArg;
use crate::{output, CliError, Global};

/// How a command prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Lines for people.
    Text,
    /// JSON.
    Json,
}

impl Format {
    fn of(g: Global) -> Format {
        if g.json {
            Format::Json
        } else {
            Format::Text
        }
    }
}

/// `pmstate policy describe|run`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(clap::Subcommand, Debug)]
enum PolicyCommand {
    /// in_keys and their widths, action size, layers, normalizer settings and counts.
    Describe {
        /// The resolved configs (default: resolved_configs_inference.pt, else resolved_configs.pt, next to CHECKPOINT).
        #[arg(long)]
        config: Option<PathBuf>,
        /// A ProtoMotions checkpoint (last.ckpt, inference_last.ckpt, or its safetensors conversion).
        checkpoint: PathBuf,
    },
    /// Run the eval-mode forward on observations: OBS holds one f32 [B, D]
    /// tensor per in_key; OUT gets mean_action, value, std, norm_obs (and
    /// action, neglogp with --sample; disc_logits, disc_reward, disc_value
    /// with --discriminator).
    Run {
        /// The resolved configs (default: resolved_configs_inference.pt, else resolved_configs.pt, next to CHECKPOINT).
        #[arg(long)]
        config: Option<PathBuf>,
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
        /// A ProtoMotions checkpoint.
        checkpoint: PathBuf,
    },
}

/// Runs `pmstate policy ...`.
pub fn run_command(a: Args, g: Global) -> Result<ExitCode, CliError> {
    match a.command {
        PolicyCommand::Describe { config, checkpoint } => describe(&checkpoint, config.as_deref(), Format::of(g)),
        PolicyCommand::Run { config, obs, out, device, sample, seed, discriminator, checkpoint } => {
            let (device, _) = device.open()?;
            let opts =
                RunOptions { checkpoint, config, obs, out, device, sample: sample.then_some(seed), discriminator };
            run(&opts, Format::of(g))
        }
    }
}

/// `pmstate policy describe`.
pub fn describe(checkpoint: &Path, config: Option<&Path>, format: Format) -> Result<ExitCode, CliError> {
    let policy = Policy::load(checkpoint, config, &Device::Cpu)?;
    let d = policy.describe()?;
    match format {
        Format::Json => output::json_line(&d)?,
        Format::Text => {
            for l in describe_text(&d) {
                output::line(l);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn describe_text(d: &Description) -> Vec<String> {
    let mut out = vec![format!("checkpoint: {}", d.checkpoint)];
    if let Some(c) = &d.config {
        out.push(format!("config: {c}"));
    }
    let fam = match d.family {
        Family::Ppo => "PPO",
        Family::Amp => "AMP",
    };
    out.push(format!("model: {} ({fam})", d.model));
    let std = if d.learnable_std {
        "learnable std"
    } else {
        match d.logstd_source {
            pmstate_policy::actor::LogstdSource::Checkpoint => "fixed std",
            pmstate_policy::actor::LogstdSource::ConfigOverride => {
                "fixed std (the config's actor_logstd overrides the checkpoint's)"
            }
        }
    };
    out.push(format!("actions: {} ({std}, mean std {:.6})", d.action_size, d.std_mean));
    out.push("in_keys:".into());
    let kw = d.in_keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
    for k in &d.in_keys {
        let w = k.width.map_or("?".to_string(), |w| w.to_string());
        let by = if k.read_by.is_empty() {
            "listed by the config, read by no network".to_string()
        } else {
            k.read_by.join(", ")
        };
        out.push(format!("  {:<kw$}  {w:>5}  ({by})", k.key));
    }
    for g in &d.width_groups {
        out.push(format!("  width sum: {} = {} ({})", g.keys.join(" + "), g.total, g.module));
    }
    out.push("networks:".into());
    for n in &d.networks {
        out.push(format!("  {}: {} -> {}", n.role, n.path, n.out_key));
        for m in &n.modules {
            out.push(format!("    {} {} [{}] -> {}", m.class, m.path, m.in_keys.join(", "), m.out_key));
            if m.module_operations != ["Forward"] {
                out.push(format!("      module operations: {}", m.module_operations.join(", ")));
            }
            if !m.layers.is_empty() {
                out.push(format!("      layers: {}", m.layers.join(", ")));
            }
            if let Some(a) = m.output_activation {
                out.push(format!("      output activation: {a}"));
            }
            match &m.normalizer {
                Some(nd) => {
                    let clamp = nd.clamp.map_or("none".to_string(), |c| c.to_string());
                    let mode = match nd.ema_decay {
                        Some(e) => format!("EMA {e}"),
                        None => "Welford".into(),
                    };
                    out.push(format!(
                        "      normalizer {}: width {}, clamp {clamp}, {mode}, count {}, epsilon {:e}",
                        nd.name, nd.width, nd.count, nd.epsilon
                    ));
                }
                None => out.push("      normalizer: none".into()),
            }
        }
    }
    out
}

/// Options of `pmstate policy run`.
pub struct RunOptions {
    /// The checkpoint.
    pub checkpoint: PathBuf,
    /// The configs file (default: next to the checkpoint).
    pub config: Option<PathBuf>,
    /// Observations.
    pub obs: PathBuf,
    /// Output file.
    pub out: PathBuf,
    /// Device.
    pub device: Device,
    /// Draw actions with this seed.
    pub sample: Option<u64>,
    /// Also run the discriminator (AMP).
    pub discriminator: bool,
}

#[derive(Serialize)]
struct RunReport {
    out: String,
    tensors: Vec<(String, Vec<usize>)>,
}

/// `pmstate policy run`.
pub fn run(opts: &RunOptions, format: Format) -> Result<ExitCode, CliError> {
    let policy = Policy::load(&opts.checkpoint, opts.config.as_deref(), &opts.device)?;
    let obs = candle_core::safetensors::load(&opts.obs, &Device::Cpu)
        .map_err(|e| CliError::Usage(format!("{}: {e}", opts.obs.display())))?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let outputs = match opts.sample {
        Some(seed) => {
            let s = policy.sample(&obs, seed)?;
            tensors.push(("action".into(), s.action));
            tensors.push(("neglogp".into(), s.neglogp));
            s.outputs
        }
        None => policy.forward(&obs)?,
    };
    tensors.push(("mean_action".into(), outputs.mean_action));
    tensors.push(("value".into(), outputs.value));
    tensors.push(("std".into(), outputs.std));
    if let Some(n) = outputs.norm_obs {
        tensors.push(("norm_obs".into(), n));
    }
    if opts.discriminator {
        let d = policy.discriminate(&obs)?;
        tensors.push(("disc_logits".into(), d.disc_logits));
        tensors.push(("disc_reward".into(), d.disc_reward));
        tensors.push(("disc_value".into(), d.disc_value));
    }
    let map: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<_, CliError>>()?;
    write_atomic(&opts.out, &map)?;
    let report = RunReport {
        out: opts.out.display().to_string(),
        tensors: tensors.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect(),
    };
    match format {
        Format::Json => output::json_line(&report)?,
        Format::Text => {
            let parts: Vec<String> = report.tensors.iter().map(|(k, s)| format!("{k} {s:?}")).collect();
            output::line(format!("wrote {}: {}", report.out, parts.join(", ")));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes next to the target, then renames over it.
fn write_atomic(path: &Path, map: &HashMap<String, Tensor>) -> Result<(), CliError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    candle_core::safetensors::save(map, &tmp).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CliError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    })
}
