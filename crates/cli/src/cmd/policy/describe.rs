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

/// Prints the model's description, whatever its family: its text form,
/// or the JSON object (`--json`).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let model = a.files.load_model(&Device::Cpu)?;
    print(model.description(), g)
}

/// A description as text lines, or one JSON object (`--json`).
fn print(d: &(impl std::fmt::Display + serde::Serialize), g: Global) -> Result<ExitCode, CliError> {
    match g.format() {
        OutputFormat::Json => output::json_line(d)?,
        OutputFormat::Text => {
            for l in d.to_string().lines() {
                output::line(l);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
