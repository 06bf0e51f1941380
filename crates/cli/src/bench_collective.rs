//! `pmstate bench-collective`: the cost of one distributed update (three
//! all_gathers, the combine and update on rank 0, three broadcasts) and of
//! one all_gather alone, on W ranks in lockstep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use pmstate_norm::{Collective, InProcessGroup, Moments, NormConfig, RunningMeanStd};
use serde::Serialize;

use crate::CliError;

/// One timing, measured on rank 0.
#[derive(Debug, Serialize)]
pub struct Record {
    /// `update` (record_batch_moments over the collective) or `all_gather`.
    pub op: &'static str,
    /// `inproc` or `mpi`.
    pub collective: &'static str,
    pub world_size: usize,
    pub dim: usize,
    pub iters: usize,
    /// Median seconds per call.
    pub median_s: f64,
    /// Mean seconds per call.
    pub mean_s: f64,
}

pub struct Options {
    pub dim: usize,
    pub iters: usize,
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
pub fn run_inproc(world_size: usize, opts: &Options) -> Result<Vec<Record>, CliError> {
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
pub fn run_mpi(opts: &Options) -> Result<(bool, Vec<Record>), CliError> {
    let c = Arc::new(pmstate_norm::MpiCollective::init(Duration::from_secs(60))?);
    let rank0 = c.rank() == 0;
    let records = bench_rank(c, "mpi", opts)?;
    Ok((rank0, records))
}
