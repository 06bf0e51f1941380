//! `pmstate migrate`: an older release's motion tracker (v3.1) made
//! loadable by today's ProtoMotions, for evaluation and resuming training
//! (`pmstate_policy::migrate`).

use std::path::PathBuf;
use std::process::ExitCode;

use pmstate_policy::migrate::{migrate, Action, MigrateError, MigrateOptions};

use crate::{output, CliError, Global};

/// `pmstate migrate OLD_CKPT OUT_DIR [--force] [--drop-unmatched-terms]`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The old release's checkpoint (its resolved_configs.pt or
    /// resolved_configs_inference.pt next to it).
    old_ckpt: PathBuf,
    /// Where to write last.ckpt, resolved_configs.pt,
    /// resolved_configs_inference.pt and migrate_report.json (created;
    /// refused when it holds files).
    out_dir: PathBuf,
    /// Replace migrate's own files in an existing OUT_DIR (other files there are still refused).
    #[arg(long)]
    force: bool,
    /// Drop rewards and terminations with no same-math counterpart today
    /// instead of refusing; each is reported, and training resumes without it.
    #[arg(long)]
    drop_unmatched_terms: bool,
}

/// Runs the command: exit 0 when written, 1 when refused (the error names
/// the key and why), 2 on a read/write error.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let opts = MigrateOptions { force: a.force, drop_unmatched_terms: a.drop_unmatched_terms };
    let report = match migrate(&a.old_ckpt, &a.out_dir, &opts) {
        Ok(r) => r,
        Err(e) if is_refusal(&e) => {
            // a refusal is exit 1 (as convert's), reported as errors are
            let r = CliError::from(e).report();
            match (g.json, serde_json::to_string(&r)) {
                (true, Ok(line)) => output::err_line(line),
                _ => output::err_line(format!("pmstate: error: {}", r.message)),
            }
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    if g.json {
        output::json_line(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    output::line(format!(
        "migrated {} ({} {}, robot {}) into {} (template {})",
        report.old_checkpoint,
        report.release,
        report.family,
        report.robot,
        a.out_dir.display(),
        report.template
    ));
    if !g.quiet {
        for e in &report.entries {
            let action = match e.action {
                Action::Mapped => "mapped",
                Action::Renamed => "renamed",
                Action::Dropped => "dropped",
                Action::Defaulted => "defaulted",
                Action::Set => "set",
                Action::KeptToday => "kept today's",
            };
            let mut line = format!("  {action:<12} {} {}", e.file, e.key);
            if let Some(f) = &e.from {
                line.push_str(&format!(" from {f}"));
            }
            if let Some(t) = &e.to {
                line.push_str(&format!(" to {t}"));
            }
            if let Some(n) = &e.note {
                line.push_str(&format!(" ({n})"));
            }
            output::line(line);
        }
        for c in &report.caveats {
            output::line(format!("note: {c}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether migrate declined (the input is not something it migrates, or
/// OUT_DIR is in use) rather than failed to read or write.
fn is_refusal(e: &MigrateError) -> bool {
    matches!(
        e,
        MigrateError::UnknownRelease { .. }
            | MigrateError::AlreadyCurrent { .. }
            | MigrateError::NotATracker { .. }
            | MigrateError::NoTemplate { .. }
            | MigrateError::NotMigratable { .. }
            | MigrateError::NoCounterpart { .. }
            | MigrateError::OutDirNotEmpty { .. }
    )
}
