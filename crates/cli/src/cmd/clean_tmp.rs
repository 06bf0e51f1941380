//! `pmstate clean-tmp`: temporary files a killed pmstate left behind.

use std::path::PathBuf;
use std::process::ExitCode;

use pmstate_ckpt::stale_temporary_files;
use serde::Serialize;

use crate::{output, CliError, Global};

/// `pmstate clean-tmp DIR [--delete]`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The folder pmstate wrote into.
    dir: PathBuf,
    /// Remove them (default: only list them).
    #[arg(long)]
    delete: bool,
}

#[derive(Serialize)]
struct Report {
    dir: String,
    stale: Vec<String>,
    deleted: bool,
}

/// Runs the command.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let stale = stale_temporary_files(&a.dir).map_err(|e| CliError::Usage(format!("{}: {e}", a.dir.display())))?;
    if a.delete {
        for f in &stale {
            std::fs::remove_file(f).map_err(|source| CliError::Remove { path: f.clone(), source })?;
        }
    }
    if g.json {
        output::json_line(&Report {
            dir: a.dir.display().to_string(),
            stale: stale.iter().map(|p| p.display().to_string()).collect(),
            deleted: a.delete,
        })?;
    } else {
        let verb = if a.delete { "removed" } else { "stale" };
        for f in &stale {
            output::line(format!("{verb} {}", f.display()));
        }
        if stale.is_empty() && !g.quiet {
            output::line(format!("no stale pmstate temporary files in {}", a.dir.display()));
        }
    }
    Ok(ExitCode::SUCCESS)
}
