//! `pmstate convert`: torch <-> safetensors, by extension.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use pmstate_ckpt::{
    save_safetensors, save_torch, stale_temporary_files, Checkpoint, CkptError, Durability, Format, SafetensorsOptions,
    UnsafeGlobals, WriteOptions,
};
use serde::Serialize;

use crate::progress::Progress;
use crate::{output, CliError, Global};

/// `pmstate convert [--select KEY] [--allow-unsafe-globals] [--no-fsync] INPUT OUTPUT`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Export only the dict at this dotted key (e.g. `model`) as plain tensors (safetensors output only).
    #[arg(long)]
    select: Option<String>,
    /// Write globals torch's safe loader rejects (the output then needs weights_only=False).
    #[arg(long)]
    allow_unsafe_globals: bool,
    /// Do not fsync the output before renaming it into place: still
    /// atomic, but not durable against a power loss until written back.
    #[arg(long)]
    no_fsync: bool,
    /// The checkpoint to read.
    input: PathBuf,
    /// Where to write: .safetensors, or .pt/.pth/.ckpt/.bin for torch's zip layout.
    output: PathBuf,
}

#[derive(Serialize)]
struct Report<'a> {
    ok: bool,
    input: String,
    output: String,
    select: Option<&'a str>,
    tensors: usize,
    skipped_non_tensors: Vec<String>,
    seconds: f64,
}

#[derive(Serialize)]
struct Refusal {
    ok: bool,
    refused: String,
}

/// Runs the command: exit 0 written (and it reads back), 1 refused (unsafe
/// globals), 2 an error (nothing written).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let format = Format::for_path(&a.output).ok_or_else(|| {
        CliError::Usage(format!(
            "{}: unknown output format (use .safetensors, or .pt/.pth/.ckpt/.bin for torch)",
            a.output.display()
        ))
    })?;
    let safetensors = matches!(format, Format::Safetensors { .. });
    if a.select.is_some() && !safetensors {
        return Err(CliError::Usage(
            "--select exports to safetensors only (give an OUTPUT ending in .safetensors)".into(),
        ));
    }
    warn_stale_temporary_files(&a.output, g);
    let t0 = Instant::now();
    let ckpt = Checkpoint::open(&a.input)?;
    let total: u64 = ckpt.storages().values().map(|s| s.data.len() as u64).sum();
    let bar = Progress::new(total, "converting", g);
    let progress = |done: u64| {
        crate::test_pause::point();
        bar.update(done)
    };
    let write = WriteOptions {
        unsafe_globals: if a.allow_unsafe_globals { UnsafeGlobals::Allow } else { UnsafeGlobals::Refuse },
        durability: if a.no_fsync { Durability::NoFsync } else { Durability::Fsync },
        progress: Some(&progress),
    };
    let result = if safetensors {
        let opts = SafetensorsOptions { write, select: a.select.clone() };
        save_safetensors(&ckpt, &a.output, &opts).map(Some)
    } else {
        save_torch(&ckpt, &a.output, &write).map(|()| None)
    };
    bar.finish();
    let report = match result {
        Err(e @ CkptError::UnsafeGlobals { .. }) => {
            if g.json {
                output::json_line(&Refusal { ok: false, refused: e.to_string() })?;
            } else {
                output::err_line(format!("pmstate: refused: {e}"));
            }
            return Ok(ExitCode::from(1));
        }
        other => other?,
    };
    let skipped = report.as_ref().map(|r| r.skipped.clone()).unwrap_or_default();
    if g.json {
        output::json_line(&Report {
            ok: true,
            input: a.input.display().to_string(),
            output: a.output.display().to_string(),
            select: a.select.as_deref(),
            tensors: report.as_ref().map_or(ckpt.tensors().len(), |r| r.tensors),
            skipped_non_tensors: skipped,
            seconds: t0.elapsed().as_secs_f64(),
        })?;
    } else if !g.quiet {
        output::line(format!("wrote {} ({:.3} s)", a.output.display(), t0.elapsed().as_secs_f64()));
        // A note, not a result: on stderr, so stdout holds only what was done.
        if !skipped.is_empty() {
            output::err_line(format!(
                "pmstate: note: skipped {} non-tensor value(s) safetensors cannot hold: {}",
                skipped.len(),
                skipped.join(", ")
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Names temporary files a killed pmstate left beside the output (they
/// are harmless, but can be large): `pmstate clean-tmp DIR --delete` removes them.
fn warn_stale_temporary_files(output: &std::path::Path, g: Global) {
    if g.quiet {
        return;
    }
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if let Ok(stale) = stale_temporary_files(dir) {
        for f in stale {
            output::err_line(format!(
                "pmstate: note: {} was left by a killed pmstate; `pmstate clean-tmp {} --delete` removes it",
                f.display(),
                dir.display()
            ));
        }
    }
}
