//! `pmstate bench-collective`: the cost of one distributed update (three
//! all_gathers, the combine and update on rank 0, three broadcasts) and of
//! one all_gather alone, on W ranks in lockstep.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use pmstate_norm::{Collective, InProcessGroup, Moments, NormConfig, RunningMeanStd};
use serde::Serialize;

use crate::args::CollectiveArg;
use crate::{output, CliError, Global};

/// `pmstate bench-collective [--collective inproc|mpi] [--world-size W]... [--dim D] [--iters N]`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// inproc: W threads (each --world-size); mpi: this process is one
    /// rank of `mpirun -np W`, rank 0 prints.
    #[arg(long, value_enum, default_value = "inproc")]
    collective: CollectiveArg,
    /// World sizes for inproc (repeatable; default 2 and 4).
    #[arg(long = "world-size", value_parser = crate::args::positive)]
    world_sizes: Vec<usize>,
    /// Features per state (D).
    #[arg(long, default_value_t = 358, value_parser = crate::args::positive)]
    dim: usize,
    /// Timed calls per op (after a tenth as many warm-up calls).
    #[arg(long, default_value_t = 2000, value_parser = crate::args::positive)]
    iters: usize,
}

/// Runs the benchmark: a table, or (`--json`) one object per line with op,
/// collective, world_size, dim, iters, median_s, mean_s.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let opts = Options { dim: a.dim, iters: a.iters };
    let (print, records) = match a.collective {
        CollectiveArg::Inproc => {
            let ws = if a.world_sizes.is_empty() { vec![2, 4] } else { a.world_sizes };
            let mut all = vec![];
            for w in ws {
                all.extend(run_inproc(w, &opts)?);
            }
            (true, all)
        }
        #[cfg(feature = "mpi")]
        CollectiveArg::Mpi => run_mpi(&opts)?,
        #[cfg(not(feature = "mpi"))]
        CollectiveArg::Mpi => return Err(crate::args::no_mpi()),
    };
    if print {
        if !g.json {
            output::line(format!(
                "{:<11} {:<7} {:>2} {:>5} {:>12} {:>12}",
                "op", "coll", "W", "D", "median µs", "mean µs"
            ));
        }
        for r in &records {
            if g.json {
                output::json_line(r)?;
            } else {
                output::line(format!(
                    "{:<11} {:<7} {:>2} {:>5} {:>12.1} {:>12.1}",
                    r.op,
                    r.collective,
                    r.world_size,
                    r.dim,
                    r.median_s * 1e6,
                    r.mean_s * 1e6
                ));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One timing, measured on rank 0.
#[derive(Debug, Serialize)]
struct Record {
    /// `update` (record_batch_moments over the collective) or `all_gather`.
    op: &'static str,
    /// `inproc` or `mpi`.
    collective: &'static str,
    world_size: usize,
    dim: usize,
    iters: usize,
    /// Median seconds per call.
    median_s: f64,
    /// Mean seconds per call.
    mean_s: f64,
}

struct Options {
    dim: usize,
    iters: usize,
}

/// What each rank runs: warm-up, then `iters` timed calls of each op.
/// Returns rank 0's records (other ranks: empty).
fn bench_rank(c: Arc<dyn Collective>, name: &'static str, opts: &Options) -> Result<Vec<Record>, CliError> {
    let (rank, w, d) = (c.rank(), c.world_size(), opts.dim);
    let dev = Device::Cpu;
    let mean = Tensor::from_vec((0..d).map(|i| (i + rank) as f32 * 0.01).collect::<Vec<_>>(), d, &dev)?;
    let var = Tensor::from_vec((0..d).map(|i| 1.0 + (i % 7) as f32 * 0.1).collect::<Vec<_>>(), d, &dev)?;
    let moments = Moments { mean, var, count: 4096 };
    let mut norm = RunningMeanStd::new(NormConfig::default(), Some(&[d]), &dev)?.with_collective(c.clone());
    let mut out = vec![];
    for op in ["update", "all_gather"] {
        let mut call = || -> Result<(), CliError> {
            match op {
                "update" => {
                    norm.record_batch_moments(moments.clone())?;
                }
                _ => {
                    std::hint::black_box(c.all_gather(&moments.mean)?);
                }
            }
            Ok(())
        };
        for _ in 0..opts.iters.div_ceil(10).max(5) {
            call()?;
        }
        let mut samples = Vec::with_capacity(opts.iters);
        for _ in 0..opts.iters {
            let t = Instant::now();
            call()?;
            samples.push(t.elapsed().as_secs_f64());
        }
        let mean_s = samples.iter().sum::<f64>() / samples.len() as f64;
        samples.sort_by(f64::total_cmp);
        if rank == 0 {
            out.push(Record {
                op,
                collective: name,
                world_size: w,
                dim: d,
                iters: opts.iters,
                median_s: samples[samples.len() / 2],
                mean_s,
            });
        }
    }
    Ok(out)
}

/// W threads over an in-process group.
fn run_inproc(world_size: usize, opts: &Options) -> Result<Vec<Record>, CliError> {
    let groups = InProcessGroup::new(world_size, Duration::from_secs(60));
    let per_rank: Vec<Result<Vec<Record>, CliError>> = std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                let g: Arc<dyn Collective> = Arc::new(g);
                s.spawn(move || bench_rank(g, "inproc", opts))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(CliError::Usage("a benchmark thread panicked".into()))))
            .collect()
    });
    let mut out = vec![];
    for r in per_rank {
        out.extend(r?);
    }
    Ok(out)
}

/// This process as one rank of MPI_COMM_WORLD; records on rank 0 only.
#[cfg(feature = "mpi")]
fn run_mpi(opts: &Options) -> Result<(bool, Vec<Record>), CliError> {
    let c = Arc::new(pmstate_norm::MpiCollective::init(Duration::from_secs(60))?);
    let rank0 = c.rank() == 0;
    let records = bench_rank(c, "mpi", opts)?;
    Ok((rank0, records))
}
