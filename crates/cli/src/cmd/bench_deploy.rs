//! `pmstate bench-deploy`: the tracker's control step (sensors to PD
//! targets: references, alignment, observations, actor, action function,
//! filters) at batch 1, timed step by step over a sensor stream, as a robot
//! runs it every control period. benches/deploy_side_by_side.py runs it
//! against onnxruntime on ProtoMotions' exported pipeline of the same
//! full-size checkpoint.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pmstate_deploy::realtime::Pacer;
use pmstate_deploy::{MotionClip, MotionPlayer, Tracker};
use serde::Serialize;

use crate::args::OutputFormat;
use crate::cmd::policy::PolicyFiles;
use crate::cmd::realtime_args::RealtimeArgs;
use crate::cmd::sensor_stream::{EnvelopeArgs, SensorStream};
use crate::{output, CliError, Global};

/// `pmstate bench-deploy [--config CONFIGS] CHECKPOINT --motion CLIP --sensors S [--steps N] [--threads T]`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    files: PolicyFiles,
    /// The reference motion (.motion).
    #[arg(long)]
    motion: PathBuf,
    /// A sensor stream as `deploy replay` reads it (played in a loop; the
    /// tracker is reset at the end of the clip, outside the timing).
    #[arg(long)]
    sensors: PathBuf,
    /// Steps timed (after 100 untimed ones), at most 100000000.
    #[arg(long, default_value_t = 10_000, value_parser = steps)]
    steps: usize,
    /// Worker threads for the actor's matrix products (default 1: one core, as a robot's control thread).
    #[arg(long, default_value_t = 1, value_parser = crate::args::positive)]
    threads: usize,
    /// The envelope as a robot runs it (default on: the robot config's limits).
    #[command(flatten)]
    envelope: EnvelopeArgs,
    /// One step per control period of the wall clock (absolute deadlines),
    /// as a robot's loop runs, instead of back to back: reports missed
    /// periods and how late the loop woke. 1000 steps take 20 s at 50 Hz.
    #[arg(long)]
    real_time: bool,
    #[command(flatten)]
    realtime: RealtimeArgs,
}

/// The most steps one run times (8 bytes of memory each).
const MAX_STEPS: usize = 100_000_000;

fn steps(s: &str) -> Result<usize, String> {
    match crate::args::positive(s)? {
        n if n > MAX_STEPS => Err(format!("{n}: at most {MAX_STEPS} steps are timed in one run")),
        n => Ok(n),
    }
}

/// What `bench-deploy` measured.
#[derive(Debug, Serialize)]
pub struct DeployBench {
    /// Steps timed.
    pub steps: usize,
    /// Threads.
    pub threads: usize,
    /// Median seconds per step.
    pub p50_seconds: f64,
    /// 99th percentile.
    pub p99_seconds: f64,
    /// Slowest step.
    pub max_seconds: f64,
    /// Mean.
    pub mean_seconds: f64,
    /// The contract's control period.
    pub control_dt: f64,
    /// p50 as a share of the control period.
    pub p50_share_of_period: f64,
    /// With `--real-time`: how the loop kept its periods.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paced: Option<Paced>,
    /// The real-time options applied (`--lock-memory`, `--fifo-priority`, `--cpu`).
    pub realtime: RealtimeReport,
}

/// How a paced run kept its periods.
#[derive(Debug, Serialize)]
pub struct Paced {
    /// Deadlines already passed when the loop came to wait (a step overran).
    pub missed_periods: usize,
    /// Median wake-up after a deadline, seconds.
    pub late_p50_seconds: f64,
    /// 99th percentile of the wake-up lateness.
    pub late_p99_seconds: f64,
    /// Latest wake-up.
    pub late_max_seconds: f64,
}

/// The real-time options a run had.
#[derive(Debug, Serialize)]
pub struct RealtimeReport {
    /// mlockall.
    pub memory_locked: bool,
    /// SCHED_FIFO priority.
    pub fifo_priority: Option<u8>,
    /// The CPU the loop was pinned to.
    pub cpu: Option<usize>,
    /// The pacer's busy-wait before each deadline, seconds.
    pub spin_seconds: f64,
}

/// Runs the benchmark and prints its record (a line, or JSON with `--json`).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()
        .map_err(|e| CliError::Usage(format!("--threads {}: {e}", a.threads)))?;
    let p = a.files.load_pipeline()?;
    let stream = SensorStream::read(&a.sensors, p.dims().num_dofs, p.dims().num_bodies)?;
    let rows = stream.steps();
    let clip = MotionClip::load(&a.motion)?;
    let dt = p.contract().dt;
    let player = MotionPlayer::new(&clip, dt)?;
    let opts = a.envelope.options(&p);
    let mut tracker = Tracker::new(p, player, opts)?;
    // up to MAX_STEPS x 8 bytes: reserved fallibly, so a machine (or an
    // address-space limit) without that much memory gets an error, not an abort
    let mut times: Vec<f64> = Vec::new();
    times.try_reserve_exact(a.steps).map_err(|_| {
        CliError::Usage(format!(
            "--steps {}: could not allocate {} bytes for the step times (ask for fewer steps)",
            a.steps,
            a.steps.saturating_mul(std::mem::size_of::<f64>())
        ))
    })?;
    let mut lates: Vec<f64> = Vec::new();
    if a.real_time {
        lates
            .try_reserve_exact(a.steps)
            .map_err(|_| CliError::Usage(format!("--steps {}: could not allocate the wake-up times", a.steps)))?;
    }
    let mut missed = 0usize;
    let rt = a.realtime.realtime();
    let mut k = 0usize;
    pool.install(|| -> Result<(), CliError> {
        // on the thread that runs the loop (the pool's first worker)
        rt.apply().map_err(|e| CliError::Usage(format!("bench-deploy: {e}")))?;
        let mut pacer = a.real_time.then(|| Pacer::new(Duration::from_secs_f64(dt)).with_spin(a.realtime.spin()));
        for i in 0..a.steps + 100 {
            if let Some(p) = &mut pacer {
                let w = p.wait();
                if i >= 100 {
                    missed += usize::from(w.missed);
                    lates.push(w.late.as_secs_f64());
                }
            }
            if tracker.finished() || k >= rows {
                tracker.reset();
                k = 0;
            }
            let s = stream.sensors(k);
            let t = Instant::now();
            let out = tracker.step(&s)?;
            let e = t.elapsed().as_secs_f64();
            std::hint::black_box(out);
            if i >= 100 {
                times.push(e);
            }
            k += 1;
        }
        Ok(())
    })?;
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(f64::total_cmp);
    let pct = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    lates.sort_by(f64::total_cmp);
    let paced = (!lates.is_empty()).then(|| {
        let late = |q: f64| lates[((lates.len() - 1) as f64 * q).round() as usize];
        Paced {
            missed_periods: missed,
            late_p50_seconds: late(0.5),
            late_p99_seconds: late(0.99),
            late_max_seconds: late(1.0),
        }
    });
    let r = DeployBench {
        steps: times.len(),
        threads: a.threads,
        p50_seconds: pct(0.5),
        p99_seconds: pct(0.99),
        max_seconds: pct(1.0),
        mean_seconds: mean,
        control_dt: dt,
        p50_share_of_period: pct(0.5) / dt,
        paced,
        realtime: RealtimeReport {
            memory_locked: rt.memory == pmstate_deploy::realtime::MemoryLock::Locked,
            fifo_priority: rt.fifo_priority,
            cpu: rt.cpu,
            spin_seconds: a.realtime.spin().as_secs_f64(),
        },
    };
    match g.format() {
        OutputFormat::Json => output::json_line(&r)?,
        OutputFormat::Text => output::line(format!(
            "tracker step, batch 1, {} thread(s), {} steps: p50 {:.1} us, p99 {:.1} us (p99/p50 {:.2}), max {:.1} us; p50 is {:.2}% of the {} ms control period",
            r.threads,
            r.steps,
            r.p50_seconds * 1e6,
            r.p99_seconds * 1e6,
            r.p99_seconds / r.p50_seconds,
            r.max_seconds * 1e6,
            100.0 * r.p50_share_of_period,
            r.control_dt * 1e3
        )),
    }
    if let (OutputFormat::Text, Some(p)) = (g.format(), &r.paced) {
        output::line(format!(
            "paced at {} ms: {} periods missed; woke after its deadline by p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            r.control_dt * 1e3,
            p.missed_periods,
            p.late_p50_seconds * 1e6,
            p.late_p99_seconds * 1e6,
            p.late_max_seconds * 1e6
        ));
    }
    Ok(ExitCode::SUCCESS)
}
