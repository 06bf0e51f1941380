//! `pmstate policy describe|run`: a ProtoMotions policy from a checkpoint
//! and its resolved configs, described or run on observations.

use std::path::PathBuf;
use std::process::ExitCode;

use pmstate_policy::served::{self, Model, ModelOptions};
use pmstate_policy::{AllowedGlobal, Globals, LoadOptions};

use crate::{output, CliError, Global};

pub mod describe;
pub mod obs;
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
    /// latent_codes for an FSQ actor; action, neglogp with --sample;
    /// disc_logits, disc_reward, disc_value with --discriminator). A GPC
    /// prior: OBS may hold int64 [B, T] prior_tokens (teacher forcing);
    /// OUT gets mean_action, logits, latent_codes, norm_obs; with --sample
    /// the tokens are drawn (--seed) and written as prior_tokens; for a
    /// MaskedMimic model OBS may also hold vae_noise [B, latent] (zero when
    /// absent) and OUT gets mean_action, latent_mu, latent_logvar, latent.
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
    /// Load a checkpoint holding globals torch's safe loader rejects, or
    /// configs holding globals outside ProtoMotions', torch's and Python's
    /// inert builtins (each is named on stderr; nothing is ever run).
    #[arg(long)]
    allow_unsafe_globals: bool,
}

impl PolicyFiles {
    /// The checkpoint named.
    pub(crate) fn checkpoint(&self) -> &std::path::Path {
        &self.checkpoint
    }

    /// The configs file named, if one was.
    pub(crate) fn config(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    /// How the files are read: unexpected globals refused unless allowed.
    fn options(&self) -> LoadOptions {
        LoadOptions { globals: if self.allow_unsafe_globals { Globals::Allow } else { Globals::Refuse } }
    }

    /// Loads what the files hold, whatever its family (the registry,
    /// [`pmstate_policy::served::load`], decides by the configs' model
    /// class), refusing unexpected globals unless allowed (then naming each
    /// on stderr).
    pub fn load_model(&self, device: &candle_core::Device) -> Result<Box<dyn Model>, CliError> {
        let opts = ModelOptions { globals: self.options().globals, pins: Vec::new() };
        let model = served::load(&self.checkpoint, self.config.as_deref(), device, &opts)?;
        warn_allowed(model.allowed_globals());
        Ok(model)
    }

    /// Loads the deployment pipeline (observations, actor, action function)
    /// of the same files, under the same rules for globals.
    pub fn load_pipeline(&self) -> Result<pmstate_deploy::Pipeline, CliError> {
        let model = pmstate_deploy::PipelineModel::load(&self.checkpoint, self.config.as_deref(), &self.options())?;
        warn_allowed(model.allowed_globals());
        Ok(model.into_pipeline())
    }
}

/// Names on stderr each global `--allow-unsafe-globals` let through.
fn warn_allowed(allowed: &[AllowedGlobal]) {
    for g in allowed {
        output::err_line(format!(
            "pmstate: warning: {}: loading the global {} at {} (--allow-unsafe-globals)",
            g.file, g.global, g.key
        ));
    }
}

/// Runs `pmstate policy ...`.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    match a.command {
        PolicyCommand::Describe(d) => describe::run(d, g),
        PolicyCommand::Run(r) => run::run(r, g),
    }
}
