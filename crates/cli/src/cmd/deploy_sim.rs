//! `pmstate deploy sim`: the tracker closes the loop against MuJoCo as
//! ProtoMotions' `deployment/test_tracker_mujoco.py` does (pmstate-sim),
//! with sensor noise, latency, dropped readings and pushes on request.
//! The subcommand exists in every build; without the `mujoco` feature it
//! says how to build one that runs it.

use std::path::PathBuf;
use std::process::ExitCode;

use pmstate_sim::{FallCriteria, Perturbations, Push, SensorNoise};

use crate::cmd::policy::PolicyFiles;
use crate::cmd::realtime_args::RealtimeArgs;
use crate::cmd::sensor_stream::EnvelopeArgs;
use crate::{CliError, Global};

/// `pmstate deploy sim [--config CONFIGS] CHECKPOINT --motion CLIP [--mjcf ROBOT.xml] [--out OUT]`
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    #[command(flatten)]
    files: PolicyFiles,
    /// The reference motion: a ProtoMotions .motion file. The robot starts
    /// on its first frame.
    #[arg(long)]
    motion: PathBuf,
    /// The robot's MJCF (default: the contract's robot.mjcf_path, found
    /// under $PMSTATE_PROTOMOTIONS/protomotions/data/assets when relative).
    #[arg(long, value_name = "ROBOT.xml")]
    mjcf: Option<PathBuf>,
    /// Control steps to run (default: the clip's frames at the control rate).
    #[arg(long, value_parser = crate::args::positive)]
    steps: Option<usize>,
    /// Write every step (qpos, qvel before each step; joint_pos_targets,
    /// actions, events; the tracking measurements) as safetensors.
    #[arg(long, value_name = "OUT.safetensors")]
    out: Option<PathBuf>,
    /// Log every step to this file (the flight recorder; docs/deploy.md).
    #[arg(long, value_name = "LOG")]
    record: Option<PathBuf>,
    /// Print a line every this many steps (0: the summary only).
    #[arg(long, default_value_t = 50)]
    every: usize,
    /// Run one control step per control period of the wall clock, as on a
    /// robot (absolute deadlines; missed periods are counted), instead of
    /// as fast as the machine goes.
    #[arg(long)]
    real_time: bool,
    #[command(flatten)]
    realtime: RealtimeArgs,
    #[command(flatten)]
    perturb: PerturbArgs,
    /// The robot is down when its anchor is below this fraction of the
    /// reference anchor's height.
    #[arg(long, default_value_t = 0.5)]
    fall_height_fraction: f64,
    /// ... or tilted from upright by more than this (radians).
    #[arg(long, default_value_t = 1.0, value_name = "RADIANS")]
    fall_tilt: f64,
    #[command(flatten)]
    envelope: EnvelopeArgs,
}

/// What stands between the simulated robot and the tracker.
#[derive(clap::Args, Debug, Clone)]
struct PerturbArgs {
    /// Gaussian noise on the joint encoders (standard deviation, radians).
    #[arg(long, default_value_t = 0.0, value_name = "STD")]
    noise_joint_pos: f64,
    /// ... on the joint velocities (radians per second).
    #[arg(long, default_value_t = 0.0, value_name = "STD")]
    noise_joint_vel: f64,
    /// ... on the gyroscope (radians per second).
    #[arg(long, default_value_t = 0.0, value_name = "STD")]
    noise_gyro: f64,
    /// ... on the anchor's orientation (radians, per axis).
    #[arg(long, default_value_t = 0.0, value_name = "STD")]
    noise_orientation: f64,
    /// The tracker sees readings this many control periods old.
    #[arg(long, default_value_t = 0, value_name = "PERIODS")]
    latency: usize,
    /// Probability that a step's reading is lost (the last one is seen again).
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    drop: f64,
    /// Push the anchor body with this horizontal force (newtons) ...
    #[arg(long, value_name = "NEWTONS")]
    push_force: Option<f64>,
    /// ... for this long each time (seconds) ...
    #[arg(long, default_value_t = 0.1, value_name = "SECONDS")]
    push_duration: f64,
    /// ... every this many seconds ...
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    push_interval: f64,
    /// ... from this time on (seconds).
    #[arg(long, default_value_t = 0.5, value_name = "SECONDS")]
    push_start: f64,
    /// The seed of the noise, the losses and the push directions.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl PerturbArgs {
    fn perturbations(&self) -> Perturbations {
        Perturbations {
            noise: SensorNoise {
                joint_pos: self.noise_joint_pos,
                joint_vel: self.noise_joint_vel,
                gyro: self.noise_gyro,
                orientation: self.noise_orientation,
            },
            latency_periods: self.latency,
            drop_probability: self.drop,
            push: self.push_force.map(|force| Push {
                force,
                duration: self.push_duration,
                interval: self.push_interval,
                start: self.push_start,
            }),
            seed: self.seed,
        }
    }
}

impl SimArgs {
    fn fall(&self) -> FallCriteria {
        FallCriteria { height_fraction: self.fall_height_fraction, max_tilt: self.fall_tilt }
    }
}

/// Runs `pmstate deploy sim`.
#[cfg(not(feature = "mujoco"))]
pub fn run(a: SimArgs, _g: Global) -> Result<ExitCode, CliError> {
    // the options are checked even here, so a script learns of a bad value first
    a.perturb.perturbations().validate().map_err(CliError::from)?;
    let _ = a.fall();
    Err(CliError::Usage(
        "deploy sim: this pmstate was built without MuJoCo; build it with \
         `eval \"$(scripts/mujoco-lib.sh)\" && cargo build --release -p pmstate-cli --features mujoco` \
         (docs/deploy.md, \"Sim-to-sim\")"
            .into(),
    ))
}

/// Runs `pmstate deploy sim`.
#[cfg(feature = "mujoco")]
pub fn run(a: SimArgs, g: Global) -> Result<ExitCode, CliError> {
    with_mujoco::run(a, g)
}

#[cfg(feature = "mujoco")]
mod with_mujoco {
    use std::path::{Path, PathBuf};
    use std::process::ExitCode;

    use candle_core::{Device, Tensor};
    use pmstate_deploy::{LogMeta, MotionClip, MotionPlayer, Tracker};
    use pmstate_sim::closed_loop::{self, LoopOptions, Pace, Record, Recording};
    use pmstate_sim::mujoco::Robot;
    use pmstate_sim::{StepMetrics, Summary};
    use serde::Serialize;

    use super::SimArgs;
    use crate::args::OutputFormat;
    use crate::cmd::deploy::status_line;
    use crate::cmd::policy::run::write_atomic;
    use crate::{output, CliError, Global};

    /// The MJCF: `--mjcf`, else the contract's path (absolute, or under a
    /// ProtoMotions checkout's assets).
    fn mjcf(a: &SimArgs, named: &str) -> Result<PathBuf, CliError> {
        if let Some(p) = &a.mjcf {
            return Ok(p.clone());
        }
        let p = Path::new(named);
        if p.is_absolute() {
            return Ok(p.to_path_buf());
        }
        if let Some(pm) = std::env::var_os("PMSTATE_PROTOMOTIONS") {
            let c = Path::new(&pm).join("protomotions/data/assets").join(p);
            if c.is_file() {
                return Ok(c);
            }
        }
        Err(CliError::Usage(format!(
            "deploy sim: the contract names the robot's MJCF as {named} (relative to ProtoMotions' \
             protomotions/data/assets); pass --mjcf ROBOT.xml, or set PMSTATE_PROTOMOTIONS to a checkout"
        )))
    }

    #[derive(Serialize)]
    struct StepLine<'a> {
        kind: &'static str,
        step: usize,
        #[serde(flatten)]
        metrics: &'a StepMetrics,
        events: u32,
    }

    #[derive(Serialize)]
    struct SummaryLine<'a> {
        kind: &'static str,
        mjcf: String,
        out: Option<String>,
        #[serde(flatten)]
        summary: &'a Summary,
    }

    pub(super) fn run(a: SimArgs, g: Global) -> Result<ExitCode, CliError> {
        let perturbations = a.perturb.perturbations();
        perturbations.validate()?;
        let fall = a.fall();
        if !(fall.height_fraction.is_finite() && fall.height_fraction >= 0.0) {
            return Err(CliError::Usage(format!(
                "--fall-height-fraction {}: must be finite and >= 0",
                fall.height_fraction
            )));
        }
        if !(fall.max_tilt.is_finite() && fall.max_tilt > 0.0) {
            return Err(CliError::Usage(format!("--fall-tilt {}: must be finite and > 0", fall.max_tilt)));
        }
        let p = a.files.load_pipeline()?;
        let contract = p.contract().clone();
        let mjcf = mjcf(&a, &contract.robot.mjcf_path)?;
        let mut robot = Robot::load(&mjcf, &contract)?;
        let clip = MotionClip::load(&a.motion)?;
        let player = MotionPlayer::new(&clip, contract.dt)?;
        let opts = a.envelope.options(&p);
        let mut tracker = Tracker::new(p, player, opts)?;
        if let Some(log) = &a.record {
            let meta = LogMeta {
                checkpoint: a.files.checkpoint().display().to_string(),
                config: a.files.config().map(|c| c.display().to_string()),
                motion: a.motion.display().to_string(),
            };
            tracker.record_to(log, &meta)?;
        }
        let record = if a.out.is_some() || a.every > 0 { Recording::EveryStep } else { Recording::Summary };
        let pace = if a.real_time { Pace::RealTime { spin: a.realtime.spin() } } else { Pace::AsFast };
        let options = LoopOptions { steps: a.steps, perturbations, fall, record, pace };
        // on this thread, which runs the loop (after loading: the loads'
        // allocations are done before memory is locked)
        a.realtime.realtime().apply().map_err(|e| CliError::Usage(format!("deploy sim: {e}")))?;
        let (summary, rec) = closed_loop::run(&mut tracker, &mut robot, &options)?;
        tracker.finish_recording()?;
        if a.every > 0 && !g.quiet {
            for (k, m) in rec.metrics.iter().enumerate().filter(|(k, _)| k % a.every == 0) {
                let events = rec.events[k];
                match g.format() {
                    OutputFormat::Json => output::json_line(&StepLine { kind: "step", step: k, metrics: m, events })?,
                    OutputFormat::Text => output::line(step_line(k, m, events)),
                }
            }
        }
        if let Some(out) = &a.out {
            write_atomic(out, &tensors(&rec)?)?;
        }
        match g.format() {
            OutputFormat::Json => output::json_line(&SummaryLine {
                kind: "summary",
                mjcf: mjcf.display().to_string(),
                out: a.out.as_ref().map(|o| o.display().to_string()),
                summary: &summary,
            })?,
            OutputFormat::Text => {
                for l in summary_lines(&summary, &mjcf, a.out.as_deref(), options.perturbations.any(), a.real_time) {
                    output::line(l);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    fn step_line(k: usize, m: &StepMetrics, events: u32) -> String {
        format!(
            "step {k:6}  joints {:.4} rad (max {:.4})  anchor {:.4} m  bodies {:.4} m  height {:.3} m  tilt {:.3} rad{}{}",
            m.joint_error_mean,
            m.joint_error_max,
            m.anchor_error,
            m.body_error,
            m.anchor_height,
            m.tilt,
            if m.fallen { "  DOWN" } else { "" },
            if events != 0 { format!("  events {events:#x}") } else { String::new() }
        )
    }

    fn summary_lines(s: &Summary, mjcf: &Path, out: Option<&Path>, perturbed: bool, real_time: bool) -> Vec<String> {
        let mut v = vec![
            format!(
                "deploy sim on {}: {} steps, {:.2} s simulated in {:.3} s ({:.1}x real time)",
                mjcf.display(),
                s.steps,
                s.sim_seconds,
                s.wall_seconds,
                s.real_time_factor
            ),
            "                 mean       max".to_owned(),
            format!("joint error  {:9.4} {:9.4}  rad", s.joint_error_mean, s.joint_error_max),
            format!("anchor error {:9.4} {:9.4}  m", s.anchor_error_mean, s.anchor_error_max),
            format!("body error   {:9.4}         -  m", s.body_error_mean),
            match s.first_fall {
                Some(k) => format!("fell: first down at step {k} ({} of {} steps down)", s.fallen_steps, s.steps),
                None => "fell: no".to_owned(),
            },
            status_line(&s.tracker),
            format!(
                "control step (reading + tracker): p50 {:.1} us, p99 {:.1} us, max {:.1} us",
                s.control_step.p50_seconds * 1e6,
                s.control_step.p99_seconds * 1e6,
                s.control_step.max_seconds * 1e6
            ),
        ];
        if real_time {
            v.push(format!(
                "paced at the control period: {} periods missed, latest wake-up {:.1} us after its deadline",
                s.missed_periods,
                s.max_late_seconds * 1e6
            ));
        }
        if perturbed || s.held_steps > 0 {
            v.push(format!(
                "readings lost on the way {}; steps holding the last targets (refused readings) {}",
                s.dropped_readings, s.held_steps
            ));
        }
        if let Some(o) = out {
            v.push(format!("wrote {}", o.display()));
        }
        v
    }

    /// The record as named tensors, `[T, ...]`.
    fn tensors(r: &Record) -> Result<Vec<(String, Tensor)>, CliError> {
        let dev = Device::Cpu;
        let t = r.events.len();
        let (nq, nv, nd) = r.widths;
        let col = |f: fn(&StepMetrics) -> f32| r.metrics.iter().map(f).collect::<Vec<f32>>();
        let mut named = vec![
            ("qpos".to_owned(), Tensor::from_slice(&r.qpos, (t, nq), &dev)?),
            ("qvel".to_owned(), Tensor::from_slice(&r.qvel, (t, nv), &dev)?),
            ("joint_pos_targets".to_owned(), Tensor::from_slice(&r.joint_pos_targets, (t, nd), &dev)?),
            ("actions".to_owned(), Tensor::from_slice(&r.actions, (t, nd), &dev)?),
            ("events".to_owned(), Tensor::from_slice(&r.events, t, &dev)?),
            ("fallen".to_owned(), Tensor::from_vec(r.metrics.iter().map(|m| u8::from(m.fallen)).collect(), t, &dev)?),
        ];
        for (name, f) in [
            ("joint_error_mean", (|m: &StepMetrics| m.joint_error_mean) as fn(&StepMetrics) -> f32),
            ("joint_error_max", |m| m.joint_error_max),
            ("anchor_error", |m| m.anchor_error),
            ("body_error", |m| m.body_error),
            ("anchor_height", |m| m.anchor_height),
            ("tilt", |m| m.tilt),
        ] {
            named.push((name.to_owned(), Tensor::from_vec(col(f), t, &dev)?));
        }
        Ok(named)
    }
}
