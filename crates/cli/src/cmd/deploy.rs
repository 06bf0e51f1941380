//! `pmstate deploy contract|run`: a tracker's deployment pipeline (sensors
//! and reference motion in, PD targets out), as ProtoMotions' exported
//! ONNX pipeline computes it, straight from the checkpoint.

use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::Tensor;
use pmstate_deploy::{
    read_log, DeployError, LogMeta, MotionClip, MotionPlayer, Pipeline, PipelineModel, RecordKind, Tracker,
    TrackerStatus,
};
use pmstate_norm::Dims;
use pmstate_policy::served::{Batch, Model, Segment, Source, Wanted};
use serde::Serialize;

use crate::args::OutputFormat;
use crate::cmd::policy::obs::{read_tensors, Schema};
use crate::cmd::policy::run::{write_atomic, DEFAULT_CHUNK_ROWS};
use crate::cmd::policy::PolicyFiles;
use crate::cmd::sensor_stream::{EnvelopeArgs, SensorStream};
use crate::{output, CliError, Global};

/// `pmstate deploy contract|run`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: DeployCommand,
}

#[derive(clap::Subcommand, Debug)]
enum DeployCommand {
    /// Print the deployment contract as YAML (the fields and values of the
    /// unified_pipeline.yaml ProtoMotions' exporter writes, with its
    /// corrections listed in docs/deploy.md), or as JSON with --json.
    Contract(ContractArgs),
    /// Run the pipeline on a file of inputs named as the exported graph's
    /// inputs (current_anchor_rot, mimic_future_dof_pos, ...; `deploy
    /// contract` lists them); OUT gets actions, joint_pos_targets,
    /// stiffness_targets, damping_targets.
    Run(RunArgs),
    /// Run the tracker's control loop over a recorded sensor stream and a
    /// reference motion: SENSORS holds dof_pos [T, D], dof_vel [T, D],
    /// anchor_rot [T, 4] (xyzw), root_local_ang_vel [T, 3]; for pipelines
    /// that read positions anchor_pos [T, 3]; for max-coords pipelines every
    /// body's body_pos [T, B, 3], body_rot [T, B, 4], body_vel, body_ang_vel
    /// [T, B, 3] and ground_height [T, 1]; for the stale-sensor guard stamp
    /// [T, 2] float64 (taken, now). OUT gets actions and joint_pos_targets
    /// [T, D] per step (after the contract's acceleration clamp and EMA
    /// filter and the safety envelope; a refused reading's row holds the last
    /// targets) and events, one value per step (its event bits, docs/deploy.md).
    /// With --from-log, a flight-recorder log is replayed and checked instead.
    Replay(ReplayArgs),
    /// Close the loop against MuJoCo as ProtoMotions' deployment check
    /// (deployment/test_tracker_mujoco.py) does: the robot starts on the
    /// clip's first frame, the tracker (and its safety envelope) commands
    /// MuJoCo's PD actuators at the control rate; prints tracking errors,
    /// falls and guard events, optionally with sensor noise, latency,
    /// dropped readings and pushes. Needs a pmstate built with
    /// `--features mujoco` (docs/deploy.md, "Sim-to-sim").
    Sim(crate::cmd::deploy_sim::SimArgs),
}

/// `pmstate deploy replay [--config CONFIGS] CHECKPOINT --motion CLIP (--sensors S | --from-log LOG) [--out OUT]`
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    files: PolicyFiles,
    /// The reference motion: a ProtoMotions .motion file.
    #[arg(long)]
    motion: PathBuf,
    /// The sensor stream (safetensors).
    #[arg(long, required_unless_present = "from_log", conflicts_with = "from_log")]
    sensors: Option<PathBuf>,
    /// A flight-recorder log (`--record`, the C ABI's pmstate_tracker_record):
    /// its readings are stepped again with its options, and every step's
    /// targets, actions and gains must equal the logged ones bit for bit
    /// (exit 1 naming the first that does not).
    #[arg(long, value_name = "LOG")]
    from_log: Option<PathBuf>,
    /// Where to write the outputs (safetensors); required with --sensors.
    #[arg(long, required_unless_present = "from_log")]
    out: Option<PathBuf>,
    /// Log every step to this file (the flight recorder; docs/deploy.md).
    #[arg(long, value_name = "LOG")]
    record: Option<PathBuf>,
    #[command(flatten)]
    envelope: EnvelopeArgs,
}

/// `pmstate deploy contract [--config CONFIGS] CHECKPOINT`
#[derive(clap::Args, Debug)]
pub struct ContractArgs {
    #[command(flatten)]
    files: PolicyFiles,
}

/// `pmstate deploy run [--config CONFIGS] CHECKPOINT --inputs IN --out OUT`
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    files: PolicyFiles,
    /// The inputs: a safetensors file of one f32 [B, ...] tensor per pipeline input.
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Rows per forward: the memory a forward takes grows with it, the
    /// outputs do not change (rows are independent, bit for bit).
    #[arg(long, default_value_t = DEFAULT_CHUNK_ROWS, value_parser = crate::args::positive)]
    chunk_rows: usize,
}

/// The pipeline's inputs, each f32 of its row shape.
struct PipelineSchema<'a> {
    pipeline: &'a Pipeline,
}

impl Schema for PipelineSchema<'_> {
    fn flag(&self) -> &'static str {
        "--inputs"
    }

    fn check_entry(&self, key: &str, dtype: &str, dims: &[u64]) -> Result<(), CliError> {
        let names = || self.pipeline.inputs().iter().map(|i| i.name.clone()).collect::<Vec<_>>();
        let Some(input) = self.pipeline.inputs().iter().find(|i| i.name == key) else {
            return Err(DeployError::UnknownInput { name: key.to_owned(), names: names() }.into());
        };
        let row_ok = dims.len() == input.row_shape.len() + 1
            && dims[1..].iter().zip(&input.row_shape).all(|(&d, &w)| usize::try_from(d).is_ok_and(|d| d == w));
        if dtype != "F32" || !row_ok {
            let expected =
                std::iter::once("B".to_owned()).chain(input.row_shape.iter().map(usize::to_string)).collect();
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            return Err(DeployError::InputShape {
                name: key.to_owned(),
                expected,
                found: format!("{} [{}]", dtype.to_lowercase(), dims.join(", ")),
            }
            .into());
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct RunReport {
    out: String,
    tensors: Vec<(String, Vec<usize>)>,
}

/// Runs `pmstate deploy ...`.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    match a.command {
        DeployCommand::Contract(c) => {
            let p = c.files.load_pipeline()?;
            match g.format() {
                OutputFormat::Json => output::json_line(p.contract())?,
                OutputFormat::Text => {
                    for l in p.contract().to_yaml().lines() {
                        output::line(l);
                    }
                }
            }
        }
        DeployCommand::Run(r) => {
            let model = PipelineModel::new(r.files.load_pipeline()?)?;
            let inputs = read_tensors(&r.inputs, &PipelineSchema { pipeline: model.pipeline() })?;
            let rows = inputs.values().next().and_then(|t| t.dims().first().copied()).unwrap_or(0);
            let segment = Segment { rows, seed: None, wanted: Wanted::Sources(&[Source::Pipeline]) };
            let batch = Batch { inputs: &inputs, segments: &[segment], chunk_rows: r.chunk_rows };
            let out = model.run(&batch)?.into_iter().next().unwrap_or_default();
            let named: Vec<(String, Tensor)> = out.into_iter().map(|(k, t)| (k.to_owned(), t)).collect();
            write_atomic(&r.out, &named)?;
            let report = RunReport {
                out: r.out.display().to_string(),
                tensors: named.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect(),
            };
            match g.format() {
                OutputFormat::Json => output::json_line(&report)?,
                OutputFormat::Text => {
                    let parts: Vec<String> = report.tensors.iter().map(|(k, s)| format!("{k} {}", Dims(s))).collect();
                    output::line(format!("wrote {}: {}", report.out, parts.join(", ")));
                }
            }
        }
        DeployCommand::Replay(r) => return replay(r, g),
        DeployCommand::Sim(s) => return crate::cmd::deploy_sim::run(s, g),
    }
    Ok(ExitCode::SUCCESS)
}

fn replay(r: ReplayArgs, g: Global) -> Result<ExitCode, CliError> {
    if let Some(log) = &r.from_log {
        return replay_log(&r, log, g);
    }
    let (Some(sensors), Some(out)) = (&r.sensors, &r.out) else {
        return Err(CliError::Usage("deploy replay: --sensors and --out, or --from-log".into()));
    };
    let p = r.files.load_pipeline()?;
    let (nd, nb) = (p.dims().num_dofs, p.dims().num_bodies);
    let stream = SensorStream::read(sensors, nd, nb)?;
    let steps = stream.steps();
    let clip = MotionClip::load(&r.motion)?;
    let player = MotionPlayer::new(&clip, p.contract().dt)?;
    let opts = r.envelope.options(&p);
    let mut tracker = Tracker::new(p, player, opts)?;
    if let Some(log) = &r.record {
        tracker.record_to(log, &log_meta(&r))?;
    }
    let mut actions = Vec::with_capacity(steps * nd);
    let mut targets = Vec::with_capacity(steps * nd);
    let mut events = Vec::with_capacity(steps);
    // a refused reading: the robot holds the last targets (zeros before the first)
    let mut held = (vec![0f32; nd], vec![0f32; nd]);
    for k in 0..steps {
        match tracker.step(&stream.sensors(k)) {
            Ok(out) => {
                held.0.copy_from_slice(&out.actions);
                held.1.copy_from_slice(&out.joint_pos_targets);
            }
            Err(e) if e.is_refused_reading() => {
                if !g.quiet {
                    output::err_line(format!("step {k}: reading refused ({e}); the last targets held"));
                }
            }
            Err(e) => return Err(e.into()),
        }
        actions.extend_from_slice(&held.0);
        targets.extend_from_slice(&held.1);
        events.push(tracker.status().last_events);
    }
    tracker.finish_recording()?;
    let status = tracker.status();
    let dev = candle_core::Device::Cpu;
    let named = [
        ("actions".to_owned(), Tensor::from_vec(actions, (steps, nd), &dev)?),
        ("joint_pos_targets".to_owned(), Tensor::from_vec(targets, (steps, nd), &dev)?),
        ("events".to_owned(), Tensor::from_vec(events, steps, &dev)?),
    ];
    write_atomic(out, &named)?;
    #[derive(Serialize)]
    struct ReplayReport {
        out: String,
        steps: usize,
        clip_frames: usize,
        status: TrackerStatus,
    }
    let report = ReplayReport { out: out.display().to_string(), steps, clip_frames: clip.frames, status };
    match g.format() {
        OutputFormat::Json => output::json_line(&report)?,
        OutputFormat::Text => {
            output::line(format!(
                "wrote {}: actions, joint_pos_targets [{steps}, {nd}], events [{steps}] ({steps} steps; the clip has {} frames at {} fps)",
                report.out, clip.frames, clip.fps
            ));
            output::line(status_line(&status));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The tracker's counts in one line.
pub(crate) fn status_line(s: &TrackerStatus) -> String {
    let safe = s.safe_mode.map_or_else(|| "off".to_owned(), |r| format!("on ({r})"));
    format!(
        "safe mode {safe}; refused readings {}, joint-limit clamps {}, rate-limited {}, soft-start steps {}, safe-mode steps {}",
        s.refused_readings, s.joint_limit_clamps, s.rate_limited, s.soft_start_steps, s.safe_mode_steps
    )
}

fn log_meta(r: &ReplayArgs) -> LogMeta {
    LogMeta {
        checkpoint: r.files.checkpoint().display().to_string(),
        config: r.files.config().map(|c| c.display().to_string()),
        motion: r.motion.display().to_string(),
    }
}

/// `deploy replay --from-log`: the logged readings stepped again with the
/// logged options; every output compared bit for bit.
fn replay_log(r: &ReplayArgs, log: &std::path::Path, g: Global) -> Result<ExitCode, CliError> {
    let p = r.files.load_pipeline()?;
    let mut reader = read_log(log)?;
    let (nd, nb) = (p.dims().num_dofs, p.dims().num_bodies);
    if reader.dims() != (nd, nb) {
        return Err(CliError::Usage(format!(
            "--from-log {}: logged for {} joints and {} bodies; the checkpoint's robot has {nd} and {nb}",
            log.display(),
            reader.dims().0,
            reader.dims().1
        )));
    }
    let clip = MotionClip::load(&r.motion)?;
    let player = MotionPlayer::new(&clip, p.contract().dt)?;
    let mut tracker = Tracker::new(p, player, reader.options())?;
    let (mut records, mut steps, mut refused, mut mismatch): (u64, u64, u64, Option<String>) = (0, 0, 0, None);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    while let Some(rec) = reader.next_record()? {
        records += 1;
        match (rec.kind, &rec.sensors) {
            (RecordKind::Reset, _) => tracker.reset(),
            (RecordKind::Stop, _) => tracker.stop(),
            (kind, Some(s)) => {
                let got = tracker.step(&s.sensors());
                let same = match (kind, got) {
                    (RecordKind::Step, Ok(out)) => {
                        steps += 1;
                        bits(&out.joint_pos_targets) == bits(&rec.out.joint_pos_targets)
                            && bits(&out.actions) == bits(&rec.out.actions)
                            && bits(&out.stiffness) == bits(&rec.out.stiffness)
                            && bits(&out.damping) == bits(&rec.out.damping)
                    }
                    (RecordKind::Refused, Err(e)) if e.is_refused_reading() => {
                        refused += 1;
                        true
                    }
                    (_, Err(e)) if !e.is_refused_reading() => return Err(e.into()),
                    _ => false,
                };
                let events = tracker.status().last_events;
                if (!same || events != rec.events) && mismatch.is_none() {
                    mismatch = Some(format!(
                        "record {} (sequence {}): the replay differs from the log (logged {} with events {:#x}, replayed events {events:#x})",
                        records - 1,
                        rec.seq,
                        rec.kind.as_str(),
                        rec.events
                    ));
                }
            }
            (_, None) => {
                return Err(CliError::Usage(format!("--from-log {}: a step record without readings", log.display())))
            }
        }
    }
    #[derive(Serialize)]
    struct LogReport {
        log: String,
        records: u64,
        steps: u64,
        refused: u64,
        identical: bool,
        first_difference: Option<String>,
    }
    let report = LogReport {
        log: log.display().to_string(),
        records,
        steps,
        refused,
        identical: mismatch.is_none(),
        first_difference: mismatch.clone(),
    };
    match g.format() {
        OutputFormat::Json => output::json_line(&report)?,
        OutputFormat::Text => output::line(match &mismatch {
            None => format!(
                "{}: {records} records replayed ({steps} steps, {refused} refused readings): every output bit for bit as logged",
                report.log
            ),
            Some(m) => format!("{}: {m}", report.log),
        }),
    }
    // a difference is the command's verdict (exit 1), as `diff`'s
    Ok(if mismatch.is_some() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
