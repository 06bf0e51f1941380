//! Arguments several commands share, and value parsers that refuse
//! nonsense at parse time (clap prints the error and exits 2).

use candle_core::Device;
use clap::{Args, ValueEnum};

use crate::error::CliError;

/// Flags every command takes.
#[derive(Args, Debug, Clone, Copy)]
pub struct Global {
    /// Machine-readable output: one JSON object per line (see each command's
    /// help); an error is one JSON object on stderr (kind, message, file, key).
    #[arg(long, global = true)]
    pub json: bool,
    /// Print only results and errors: no progress bars, no notes.
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
}

/// How a command prints, from the global `--json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Lines for people.
    Text,
    /// One JSON object per line.
    Json,
}

impl Global {
    /// The output format `--json` selects.
    pub fn format(self) -> OutputFormat {
        if self.json {
            OutputFormat::Json
        } else {
            OutputFormat::Text
        }
    }
}

/// How the trace's ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CollectiveArg {
    /// W threads in this process, one per rank (at most 64).
    Inproc,
    /// One rank per MPI process (start with `mpirun -np W`; needs the `mpi` feature).
    Mpi,
}

/// The error for `--collective mpi` in a build without MPI.
#[cfg(not(feature = "mpi"))]
pub fn no_mpi() -> CliError {
    CliError::Usage(
        "this pmstate was built without the `mpi` feature (cargo build -p pmstate-cli --features mpi)".into(),
    )
}

/// Where tensors live.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceArg {
    /// The CPU.
    Cpu,
    /// The first CUDA GPU (needs a build with `--features cuda`).
    Cuda,
}

impl DeviceArg {
    /// The device and its name for output.
    pub fn open(self) -> Result<(Device, String), CliError> {
        match self {
            DeviceArg::Cpu => Ok((Device::Cpu, "cpu".into())),
            DeviceArg::Cuda if cfg!(feature = "cuda") => Ok((Device::new_cuda(0)?, "cuda:0".into())),
            DeviceArg::Cuda => Err(CliError::Usage(
                "this pmstate was built without the `cuda` feature (build it with `cargo build --release -p \
                 pmstate-cli --features cuda`, which needs a CUDA toolkit, nvcc, at build time)"
                    .into(),
            )),
        }
    }
}

/// A number of seconds: finite, > 0, and small enough for a `Duration`.
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if v > 0.0 && v.is_finite() && v <= 1e9 {
        Ok(v)
    } else {
        Err(format!("{s}: must be a number of seconds in (0, 1e9]"))
    }
}

/// A finite number >= 0 (tolerances, minimum times).
pub fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if v >= 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{s}: must be a finite number >= 0"))
    }
}

/// A count >= 1 (threads, iterations, sizes).
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err(format!("{s}: must be at least 1")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// `ROWSxCOLS`, both >= 1.
pub fn shape(s: &str) -> Result<(usize, usize), String> {
    let (r, c) = s.split_once('x').ok_or_else(|| format!("{s:?}: expected ROWSxCOLS, e.g. 4096x358"))?;
    Ok((positive(r)?, positive(c)?))
}
