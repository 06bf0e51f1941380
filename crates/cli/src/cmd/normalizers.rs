//! `pmstate normalizers`: a checkpoint's normalizer groups.

use std::path::PathBuf;
use std::process::ExitCode;

use pmstate_ckpt::{Checkpoint, NormalizerSummary};
use serde::Serialize;

use crate::cmd::inspect::{normalizer_report, print_normalizers};
use crate::{output, CliError, Global};

/// `pmstate normalizers FILE`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A .pt/.pth/.ckpt/.bin (torch zip or legacy) or .safetensors file.
    file: PathBuf,
}

#[derive(Serialize)]
struct Report {
    file: String,
    normalizers: Vec<NormalizerSummary>,
    lazy: Vec<String>,
}

/// Runs the command.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let ckpt = Checkpoint::open(&a.file)?;
    let (normalizers, lazy) = normalizer_report(&ckpt)?;
    // The buffers were read after the structure: both from one file's content?
    ckpt.check_unchanged()?;
    if g.json {
        output::json_line(&Report { file: a.file.display().to_string(), normalizers, lazy })?;
    } else {
        print_normalizers(&normalizers, &lazy);
    }
    Ok(ExitCode::SUCCESS)
}
