//! `pmstate policy describe`: what a policy takes and computes.

use std::process::ExitCode;

use candle_core::Device;

use super::PolicyFiles;
use crate::args::OutputFormat;
use crate::{output, CliError, Global};

/// `pmstate policy describe [--config CONFIGS] CHECKPOINT`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    files: PolicyFiles,
}

/// Prints the policy's [`pmstate_policy::Description`]: its text form, or the JSON object (`--json`).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    if a.files.is_masked_mimic()? {
        let d = a.files.load_masked_mimic(&Device::Cpu)?.describe();
        match g.format() {
            OutputFormat::Json => output::json_line(&d)?,
            OutputFormat::Text => {
                for l in d.to_string().lines() {
                    output::line(l);
                }
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let policy = match a.files.load_model(&Device::Cpu)? {
        super::Loaded::Policy(p) => p,
        super::Loaded::Prior(p) => {
            let d = p.describe();
            match g.format() {
                OutputFormat::Json => output::json_line(&d)?,
                OutputFormat::Text => {
                    for l in d.to_string().lines() {
                        output::line(l);
                    }
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let d = policy.describe()?;
    match g.format() {
        OutputFormat::Json => output::json_line(&d)?,
        OutputFormat::Text => {
            for l in d.to_string().lines() {
                output::line(l);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
