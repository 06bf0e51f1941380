//! `pmstate policy describe|run`: a ProtoMotions policy from a checkpoint
//! and its resolved configs, described or run on observations.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::{CliError, Global};

pub mod describe;
pub mod run;

/// `pmstate policy describe|run`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(clap::Subcommand, Debug)]
enum PolicyCommand {
    /// in_keys and their widths, action size, layers, normalizer settings and counts.
    Describe(describe::Args),
    /// Run the eval-mode forward on observations: OBS holds one f32 [B, D]
    /// tensor per in_key; OUT gets mean_action, value, std, norm_obs (and
    /// action, neglogp with --sample; disc_logits, disc_reward, disc_value
    /// with --discriminator).
    Run(run::Args),
}

/// The checkpoint and configs file both subcommands load.
#[derive(clap::Args, Debug)]
pub struct PolicyFiles {
    /// The resolved configs (default: resolved_configs_inference.pt, else resolved_configs.pt, next to CHECKPOINT).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A ProtoMotions checkpoint (last.ckpt, inference_last.ckpt, or its safetensors conversion).
    checkpoint: PathBuf,
}

/// Runs `pmstate policy ...`.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    match a.command {
        PolicyCommand::Describe(d) => describe::run(d, g),
        PolicyCommand::Run(r) => run::run(r, g),
    }
}
