//! `pmstate diff`: two checkpoints compared.

use std::path::PathBuf;
use std::process::ExitCode;

use pmstate_ckpt::{diff_with_progress, tensor_bytes, Difference, Tolerance};
use serde::Serialize;

use crate::progress::Progress;
use crate::{output, CliError, Global};

/// `pmstate diff [--rtol R] [--atol A] A B`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Relative tolerance for floats (>= 0).
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::non_negative)]
    rtol: f64,
    /// Absolute tolerance (>= 0); integers are compared exactly within it.
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::non_negative)]
    atol: f64,
    /// The first checkpoint.
    a: PathBuf,
    /// The second checkpoint.
    b: PathBuf,
}

#[derive(Serialize)]
struct Report<'a> {
    a: String,
    b: String,
    rtol: f64,
    atol: f64,
    equal: bool,
    differences: &'a [Difference],
}

/// Runs the command: exit 0 equal, 1 different.
pub fn run(args: Args, g: Global) -> Result<ExitCode, CliError> {
    let a = crate::progress::open_checkpoint(&args.a, g)?;
    let b = crate::progress::open_checkpoint(&args.b, g)?;
    let tol = Tolerance { rtol: args.rtol, atol: args.atol };
    crate::test_pause::point();
    // a bar over A's tensor bytes (large files only, never with --json or --quiet)
    let bar = Progress::new(tensor_bytes(&a), "comparing", g);
    let diffs = diff_with_progress(&a, &b, tol, &|done| bar.update(done))?;
    bar.finish();
    // The tensors were read after the structure: a file rewritten meanwhile
    // (a training job saving over it) would make the comparison meaningless.
    a.check_unchanged()?;
    b.check_unchanged()?;
    if g.json {
        output::json_line(&Report {
            a: args.a.display().to_string(),
            b: args.b.display().to_string(),
            rtol: tol.rtol,
            atol: tol.atol,
            equal: diffs.is_empty(),
            differences: &diffs,
        })?;
    } else if diffs.is_empty() {
        output::line(format!("no differences (rtol {:?}, atol {:?})", tol.rtol, tol.atol));
    } else {
        for d in &diffs {
            output::line(d);
        }
        output::line(format!("{} difference(s)", diffs.len()));
    }
    Ok(if diffs.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
