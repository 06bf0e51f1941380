//! `pmstate replay`: replays pm-trace files and reports per trace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::ValueEnum;
#[cfg(feature = "mpi")]
use pmstate_trace::replay_rank;
use pmstate_trace::{read_file, replay, Mode, ReplayOptions, Report};
use serde::Serialize;

use crate::args::CollectiveArg;
use crate::{CliError, Global};

/// How batch moments and std are obtained.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// torch's batch moments and std fed in: every result bit for bit.
    Pinned,
    /// Computed here: results within the documented bounds.
    Free,
}

/// `pmstate replay [--mode pinned|free] [--timeout S] [--collective inproc|mpi] PATH...`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// pinned: torch's batch moments and std fed in, results bit for bit;
    /// free: computed here, results within the documented bounds.
    #[arg(long, value_enum, default_value = "pinned")]
    mode: ModeArg,
    /// Seconds a rank waits for its peers before the replay fails.
    #[arg(long, default_value_t = 60.0, value_parser = crate::args::positive_seconds)]
    timeout: f64,
    /// inproc: W threads; mpi: this process is one rank of `mpirun -np W`
    /// (rank 0 prints, every rank exits with rank 0's code).
    #[arg(long, value_enum, default_value = "inproc")]
    collective: CollectiveArg,
    /// Trace files (`*.pmtrace.safetensors`) or folders of them.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

/// Runs the command; exit 0 all pass, 1 a mismatch, 2 an unreadable trace.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let mode = match a.mode {
        ModeArg::Pinned => Mode::Pinned,
        ModeArg::Free => Mode::Free,
    };
    let timeout = Duration::from_secs_f64(a.timeout);
    let code = match a.collective {
        CollectiveArg::Inproc => run_inproc(&a.paths, mode, g.json, timeout)?,
        #[cfg(feature = "mpi")]
        CollectiveArg::Mpi => run_mpi(&a.paths, mode, g.json, timeout)?,
        #[cfg(not(feature = "mpi"))]
        CollectiveArg::Mpi => return Err(crate::args::no_mpi()),
    };
    Ok(ExitCode::from(code))
}

/// Expands folders into their `*.pmtrace.safetensors` files (sorted).
fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    let mut out = vec![];
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| CliError::Usage(format!("{}: {e}", p.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.to_string_lossy().ends_with(".pmtrace.safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(CliError::Usage(format!("{}: no *.pmtrace.safetensors files", p.display())));
            }
            out.extend(found);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(CliError::Usage(format!("{}: no such file or folder", p.display())));
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct Line<'a> {
    path: String,
    pass: bool,
    mode: Mode,
    world_size: usize,
    steps: usize,
    fields: usize,
    worst: Option<&'a pmstate_trace::FieldReport>,
    error: Option<String>,
}

fn name(p: &Path) -> String {
    p.display().to_string()
}

/// Counts outcomes and prints one line (or JSON object) per trace.
struct Tally {
    mode: Mode,
    json: bool,
    passed: usize,
    failed: usize,
    broken: usize,
}

impl Tally {
    fn new(mode: Mode, json: bool) -> Self {
        Tally { mode, json, passed: 0, failed: 0, broken: 0 }
    }

    fn add(&mut self, f: &Path, outcome: &Result<Report, String>) -> Result<(), CliError> {
        let (mode, json) = (self.mode, self.json);
        match outcome {
            Ok(r) if r.pass => self.passed += 1,
            Ok(_) => self.failed += 1,
            Err(_) => self.broken += 1,
        }
        if json {
            let line = match outcome {
                Ok(r) => Line {
                    path: name(f),
                    pass: r.pass,
                    mode,
                    world_size: r.world_size,
                    steps: r.steps,
                    fields: r.fields.len(),
                    worst: r.worst(),
                    error: None,
                },
                Err(e) => Line {
                    path: name(f),
                    pass: false,
                    mode,
                    world_size: 0,
                    steps: 0,
                    fields: 0,
                    worst: None,
                    error: Some(e.clone()),
                },
            };
            crate::output::json_line(&line)?;
        } else {
            match outcome {
                Ok(r) => {
                    let verdict = if r.pass { "PASS" } else { "FAIL" };
                    crate::output::line(format!("{verdict} {} ({r})", name(f)));
                }
                // An error, not a result: stderr (the summary line still counts it).
                Err(e) => crate::output::err_line(format!("ERROR {}: {e}", name(f))),
            }
        }
        Ok(())
    }

    /// Prints the summary; returns the exit code (0 all pass, 1 a mismatch,
    /// 2 a trace that could not be read or replayed).
    fn finish(&self, collective: &str) -> u8 {
        let (mode, passed, failed, broken) = (self.mode, self.passed, self.failed, self.broken);
        if self.json {
            let summary = serde_json::json!({"summary": true, "mode": mode, "collective": collective,
                "passed": passed, "failed": failed, "unreadable": broken});
            crate::output::json_line(&summary).expect("a JSON value always serializes");
        } else {
            crate::output::line(format!("replay ({mode}, {collective}): {passed} passed, {} failed", failed + broken));
        }
        if broken > 0 {
            2
        } else if failed > 0 {
            1
        } else {
            0
        }
    }
}

/// Replays every file with in-process ranks; returns the process exit code
/// (0 all pass, 1 a mismatch, 2 a trace that could not be read).
fn run_inproc(paths: &[PathBuf], mode: Mode, json: bool, timeout: Duration) -> Result<u8, CliError> {
    let files = collect(paths)?;
    let opts = ReplayOptions { mode, timeout, ..ReplayOptions::default() };
    let mut tally = Tally::new(mode, json);
    for f in &files {
        let outcome: Result<Report, String> =
            read_file(f).map_err(|e| e.to_string()).and_then(|t| replay(&t, &opts).map_err(|e| e.to_string()));
        tally.add(f, &outcome)?;
    }
    Ok(tally.finish("inproc"))
}

/// Replays every file with this process as one rank of MPI_COMM_WORLD
/// (started by `mpirun`): each trace's world size must equal the number of
/// processes. Rank 0 prints; every rank returns rank 0's exit code. If the
/// communicator broke (a peer timed out), every rank that knows returns 2
/// and leaves without MPI_Finalize, so that mpirun ends the job.
#[cfg(feature = "mpi")]
fn run_mpi(paths: &[PathBuf], mode: Mode, json: bool, timeout: Duration) -> Result<u8, CliError> {
    use std::sync::Arc;

    use candle_core::{Device, Tensor};
    use pmstate_norm::{Collective, MpiCollective};

    let coll = Arc::new(MpiCollective::init(timeout)?);
    let rank0 = coll.rank() == 0;
    let files = match collect(paths) {
        Ok(f) => f,
        // Every rank sees the same error: only rank 0 reports it.
        Err(e) if rank0 => return Err(e),
        Err(_) => return Ok(2),
    };
    let opts = ReplayOptions { mode, timeout, ..ReplayOptions::default() };
    let mut tally = Tally::new(mode, json);
    for f in &files {
        let trace = read_file(f).map_err(|e| e.to_string());
        // Every rank must have read the trace before any replays it.
        let agreed = Tensor::new(&[i64::from(trace.is_ok())], &Device::Cpu)
            .map_err(pmstate_norm::NormError::from)
            .and_then(|t| coll.all_gather(&t))
            .and_then(|v| v.iter().map(|t| Ok(t.to_vec1::<i64>()?[0])).collect::<pmstate_norm::Result<Vec<i64>>>());
        let outcome: Result<Option<Report>, String> = match (agreed, trace) {
            (Err(e), _) => Err(e.to_string()),
            (Ok(_), Err(e)) => Err(e),
            (Ok(oks), Ok(_)) if oks.contains(&0) => {
                let r = oks.iter().position(|&ok| ok == 0).unwrap_or(0);
                Err(format!("rank {r} could not read this trace"))
            }
            (Ok(_), Ok(t)) => replay_rank(&t, &opts, coll.clone() as Arc<dyn Collective>).map_err(|e| e.to_string()),
        };
        if rank0 {
            tally.add(f, &outcome.map(|r| r.expect("rank 0 gets the report")))?;
        }
    }
    let code = if rank0 { tally.finish("mpi") } else { 0 };
    // Everyone ends with rank 0's code.
    let code = Tensor::new(&[i64::from(code)], &Device::Cpu)
        .map_err(pmstate_norm::NormError::from)
        .and_then(|t| coll.broadcast(&t, 0))
        .and_then(|t| Ok(t.to_vec1::<i64>()?[0]));
    match (code, coll.broken()) {
        (Ok(c), None) => Ok(u8::try_from(c).unwrap_or(2)),
        (_, b) => {
            if rank0 {
                crate::output::err_line(format!(
                    "pmstate: the MPI communicator is broken ({}); leaving without MPI_Finalize so that mpirun ends \
                     the job",
                    b.map_or_else(|| "the final broadcast failed".to_owned(), |p| p.to_string())
                ));
            }
            Ok(2)
        }
    }
}
