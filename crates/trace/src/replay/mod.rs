//! The replay engine: runs a trace's steps on our normalizers, with W real
//! participants of a collective, and compares every recorded result.
//!
//! [`run`] drives one rank, [`judge`] compares the ranks' observations with
//! the trace into a [`report`], and `wire` carries observations between
//! processes.

mod judge;
mod report;
mod run;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use pmstate_norm::{Collective, InProcessGroup};

use self::judge::judge;
pub use self::report::{Mode, Report};
use self::run::{run_rank, Obs};
use crate::error::{ReplayFailure, Result, TraceError, TraceLimit};
use crate::model::*;

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Pinned or free.
    pub mode: Mode,
    /// How long a rank waits for its peers before the collective fails.
    pub timeout: Duration,
    /// Most bytes the observations of all ranks may take (every rank keeps
    /// its state after every step until the judge has seen them): a small
    /// trace of many steps over a large module or many ranks is refused
    /// with [`TraceError::Limit`] instead of exhausting memory. Default 1 GiB.
    pub max_observation_bytes: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self { mode: Mode::Pinned, timeout: Duration::from_secs(60), max_observation_bytes: 1 << 30 }
    }
}

/// The most ranks [`replay`] runs in one process (one thread each). Larger
/// recorded worlds replay one rank per process with [`replay_rank`] over
/// MPI (`pmstate replay --collective mpi` under `mpirun -np W`).
pub const MAX_INPROC_WORLD_SIZE: usize = 64;

/// Replays `trace` and compares every recorded result.
///
/// ```no_run
/// use pmstate_trace::{read_file, replay, ReplayOptions};
/// let trace = read_file("testdata/traces/lazy_welford.pmtrace.safetensors".as_ref())?;
/// let report = replay(&trace, &ReplayOptions::default())?;
/// assert!(report.pass);
/// # Ok::<(), pmstate_trace::TraceError>(())
/// ```
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<Report> {
    let w = trace.world_size;
    if w > MAX_INPROC_WORLD_SIZE {
        return Err(TraceError::Limit {
            limit: TraceLimit::InprocWorldSize,
            max: MAX_INPROC_WORLD_SIZE as u64,
            needed: w as u64,
        });
    }
    check_observation_budget(trace, w, opts)?;
    let observed: Vec<Vec<Obs>> = if w == 1 {
        vec![run_rank(trace, opts.mode, 0, Arc::new(pmstate_norm::SingleProcess), None)]
    } else {
        let groups: Vec<Arc<InProcessGroup>> = InProcessGroup::new(w, opts.timeout).into_iter().map(Arc::new).collect();
        std::thread::scope(|s| {
            let mut handles = Vec::with_capacity(w);
            for (rank, g) in groups.iter().enumerate() {
                let g = g.clone();
                let spawned =
                    std::thread::Builder::new().name(format!("replay-rank-{rank}")).spawn_scoped(s, move || {
                        run_rank(trace, opts.mode, rank, g.clone() as Arc<dyn Collective>, Some(g))
                    });
                match spawned {
                    Ok(h) => handles.push(h),
                    Err(source) => {
                        // Release the ranks already started, then report.
                        groups.iter().for_each(|g| g.abort("a peer's thread could not be started"));
                        return Err(TraceError::Replay(ReplayFailure::Spawn { rank, source }));
                    }
                }
            }
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, h)| h.join().map_err(|_| TraceError::Replay(ReplayFailure::Panicked { rank })))
                .collect::<Result<Vec<_>>>()
        })?
    };
    Ok(judge(trace, opts.mode, &observed))
}

/// Refuses a replay whose kept observations would pass
/// [`ReplayOptions::max_observation_bytes`], counted per step before
/// anything runs: every rank keeps up to six tensors of the module's size
/// per step (state mean and var, batch and combined moments), and a step
/// whose output has its input's size (normalize, the discounted reward)
/// keeps that too. The trace shares one tensor among the steps that name
/// it, but each step's output is its own: 8000 steps normalizing one
/// 256 KiB input keep 8000 outputs.
fn check_observation_budget(trace: &Trace, ranks: usize, opts: &ReplayOptions) -> Result<()> {
    let elems = match &trace.module.shape {
        // Checked: a product that wrapped would slip under the budget.
        Some(s) => s.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX).max(1),
        None => first_input_features(trace).unwrap_or(1),
    };
    let per_rank_step = (elems as u64).saturating_mul(6 * 8);
    let mut kept_outputs = 0u64;
    for step in &trace.steps {
        let outputs = match &step.op {
            Op::Normalize { x, .. } => x.elem_count() as u64,
            Op::RecordReward { reward, .. } => reward.iter().map(|r| r.elem_count() as u64).sum(),
            _ => 0,
        };
        kept_outputs = kept_outputs.saturating_add(outputs);
    }
    let needed = (ranks as u64)
        .saturating_mul(trace.steps.len() as u64)
        .saturating_mul(per_rank_step)
        .saturating_add(kept_outputs.saturating_mul(8));
    if needed > opts.max_observation_bytes {
        return Err(TraceError::Limit {
            limit: TraceLimit::Observations { ranks, steps: trace.steps.len(), features: elems, kept_outputs },
            max: opts.max_observation_bytes,
            needed,
        });
    }
    Ok(())
}

/// The feature count of a lazy module: its first input's `x.shape[1:]`.
fn first_input_features(trace: &Trace) -> Option<usize> {
    trace.steps.iter().find_map(|s| {
        let x = match &s.op {
            Op::RecordMoments { x, .. } => x.first()?,
            Op::RecordReward { reward, .. } => reward.first()?,
            Op::Normalize { x, .. } => x,
            _ => return None,
        };
        Some(x.dims().iter().skip(1).try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX).max(1))
    })
}

/// Replays one rank of `trace` in this process over `coll` (one rank per
/// process, e.g. `pmstate_norm::MpiCollective` with the
/// `mpi` feature), then hands every rank's observations to rank 0, which
/// judges them as [`replay`] does (every rank must end each step with rank
/// 0's state). Returns the report on rank 0 and `None` on the others.
///
/// Every rank must call this with the same trace and options. A collective
/// whose world size differs from the trace's is an error on every rank
/// (before any communication). If gathering the observations fails (a peer
/// failed or timed out), every rank that notices returns an error naming
/// its own first failed step.
///
/// ```
/// use std::sync::Arc;
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::SingleProcess;
/// use pmstate_trace::{replay_rank, Direction, ModuleClass, ModuleSpec, Recorder, ReplayOptions};
/// // A one-rank trace of a lazy Welford normalizer, recorded here.
/// let spec = ModuleSpec { class: ModuleClass::RunningMeanStd, shape: None, epsilon: 1e-5,
///                         clamp_value: None, ema_decay: None, gamma: None };
/// let mut rec = Recorder::new(spec, "replay_rank example")?;
/// rec.record_moments(&Tensor::new(&[[1f32, 2.], [3., 5.]], &Device::Cpu)?)?;
/// rec.normalize(&Tensor::new(&[[0f32, 1.]], &Device::Cpu)?, Direction::Normalize)?;
/// let trace = rec.finish();
/// let report = replay_rank(&trace, &ReplayOptions::default(), Arc::new(SingleProcess))?;
/// assert!(report.expect("rank 0 gets the report").pass);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn replay_rank(trace: &Trace, opts: &ReplayOptions, coll: Arc<dyn Collective>) -> Result<Option<Report>> {
    let (rank, w) = (coll.rank(), coll.world_size());
    if w != trace.world_size {
        return Err(TraceError::Replay(ReplayFailure::WorldSize { trace: trace.world_size, collective: w }));
    }
    check_observation_budget(trace, w, opts)?;
    let mine = run_rank(trace, opts.mode, rank, coll.clone(), None);
    let first_failure = || {
        mine.iter().enumerate().find_map(|(i, o)| match o {
            Obs::Failed(e) if trace.steps[i].error.is_none() => Some((i, e.clone())),
            _ => None,
        })
    };
    let gathered = if w == 1 { Ok(vec![]) } else { wire::gather_bytes(coll.as_ref(), &wire::encode(&mine)?) };
    let gathered = gathered.map_err(|source| {
        TraceError::Replay(ReplayFailure::Gather { source: Box::new(source), first_failure: first_failure() })
    })?;
    if rank != 0 {
        return Ok(None);
    }
    let mut observed = vec![mine];
    for (r, bytes) in gathered.iter().enumerate().skip(1) {
        let decoded = wire::decode(bytes, trace.steps.len())
            .map_err(|problem| TraceError::Replay(ReplayFailure::PeerObservations { rank: r, problem }))?;
        observed.push(decoded);
    }
    Ok(Some(judge(trace, opts.mode, &observed)))
}
