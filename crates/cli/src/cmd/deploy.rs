//! `pmstate deploy contract|run`: a tracker's deployment pipeline (sensors
//! and reference motion in, PD targets out), as ProtoMotions' exported
//! ONNX pipeline computes it, straight from the checkpoint.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::Tensor;
use pmstate_deploy::{BodyState, DeployError, MotionClip, MotionPlayer, Pipeline, Sensors, Tracker, TrackerOptions};
use pmstate_norm::Dims;
use serde::Serialize;

use crate::args::OutputFormat;
use crate::cmd::policy::obs::{read_tensors, Schema};
use crate::cmd::policy::run::{by_chunks, write_atomic, DEFAULT_CHUNK_ROWS};
use crate::cmd::policy::PolicyFiles;
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
    /// [T, B, 3] and ground_height [T, 1]; OUT gets actions and
    /// joint_pos_targets [T, D] per step (the targets after the contract's
    /// acceleration clamp and EMA filter).
    Replay(ReplayArgs),
}

/// `pmstate deploy replay [--config CONFIGS] CHECKPOINT --motion CLIP --sensors S --out OUT`
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    files: PolicyFiles,
    /// The reference motion: a ProtoMotions .motion file.
    #[arg(long)]
    motion: PathBuf,
    /// The sensor stream (safetensors).
    #[arg(long)]
    sensors: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// The EMA filter's alpha (default: the contract's control.action_ema_alpha).
    #[arg(long)]
    action_ema_alpha: Option<f64>,
}

/// The sensor stream of `deploy replay`: the known sensors, f32 `[T, ...]`.
struct SensorSchema {
    num_dofs: usize,
    num_bodies: usize,
}

impl SensorSchema {
    const NAMES: [&'static str; 10] = [
        "dof_pos",
        "dof_vel",
        "anchor_rot",
        "root_local_ang_vel",
        "anchor_pos",
        "body_pos",
        "body_rot",
        "body_vel",
        "body_ang_vel",
        "ground_height",
    ];

    /// The shape of one step.
    fn row_shape(&self, name: &str) -> Option<Vec<usize>> {
        Some(match name {
            "dof_pos" | "dof_vel" => vec![self.num_dofs],
            "anchor_rot" => vec![4],
            "root_local_ang_vel" | "anchor_pos" => vec![3],
            "body_pos" | "body_vel" | "body_ang_vel" => vec![self.num_bodies, 3],
            "body_rot" => vec![self.num_bodies, 4],
            "ground_height" => vec![1],
            _ => return None,
        })
    }
}

impl Schema for SensorSchema {
    fn flag(&self) -> &'static str {
        "--sensors"
    }

    fn check_entry(&self, key: &str, dtype: &str, dims: &[u64]) -> Result<(), CliError> {
        let Some(row) = self.row_shape(key) else {
            return Err(CliError::Usage(format!(
                "--sensors: {key} is no sensor the tracker reads ({})",
                Self::NAMES.join(", ")
            )));
        };
        let fits = dims.len() == row.len() + 1
            && dims[1..].iter().zip(&row).all(|(&d, &w)| usize::try_from(d).ok() == Some(w));
        if dtype != "F32" || !fits {
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            let row: Vec<String> = row.iter().map(usize::to_string).collect();
            return Err(CliError::Usage(format!(
                "--sensors: {key}: expected float32 [T, {}], got {} [{}]",
                row.join(", "),
                dtype.to_lowercase(),
                dims.join(", ")
            )));
        }
        Ok(())
    }
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
            let p = r.files.load_pipeline()?;
            let inputs = read_tensors(&r.inputs, &PipelineSchema { pipeline: &p })?;
            let named = by_chunks(&inputs, r.chunk_rows, |chunk| {
                Ok(p.forward(chunk)?.named().iter().map(|(k, t)| (*k, (*t).clone())).collect())
            })?;
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
        DeployCommand::Replay(r) => replay(r, g)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn replay(r: ReplayArgs, g: Global) -> Result<(), CliError> {
    let p = r.files.load_pipeline()?;
    let nd = p.dims().num_dofs;
    let nb = p.dims().num_bodies;
    let sensors = read_tensors(&r.sensors, &SensorSchema { num_dofs: nd, num_bodies: nb })?;
    let mut columns = HashMap::new();
    let mut steps = None;
    for name in SensorSchema::NAMES {
        let Some(t) = sensors.get(name) else { continue };
        let rows = t.dims()[0];
        match steps {
            None => steps = Some(rows),
            Some(s) if s != rows => {
                return Err(CliError::Usage(format!("--sensors: {name} has {rows} steps, the other sensors {s}")))
            }
            _ => {}
        }
        columns.insert(name, t.flatten_all()?.to_vec1::<f32>()?);
    }
    let steps = steps.unwrap_or(0);
    for name in ["dof_pos", "dof_vel", "anchor_rot", "root_local_ang_vel"] {
        if !columns.contains_key(name) {
            return Err(CliError::Usage(format!("--sensors: no {name} (the tracker reads it every step)")));
        }
    }
    let clip = MotionClip::load(&r.motion)?;
    let player = MotionPlayer::new(&clip, p.contract().dt)?;
    let mut opts = TrackerOptions::from_contract(p.contract());
    if let Some(a) = r.action_ema_alpha {
        opts.action_ema_alpha = a;
    }
    let mut tracker = Tracker::new(p, player, opts)?;
    let row = |name: &str, k: usize, w: usize| -> &[f32] { &columns[name][k * w..(k + 1) * w] };
    let mut actions = Vec::with_capacity(steps * nd);
    let mut targets = Vec::with_capacity(steps * nd);
    for k in 0..steps {
        let q = row("anchor_rot", k, 4);
        let v = row("root_local_ang_vel", k, 3);
        let s = Sensors {
            dof_pos: row("dof_pos", k, nd),
            dof_vel: row("dof_vel", k, nd),
            anchor_rot: [q[0], q[1], q[2], q[3]],
            root_local_ang_vel: [v[0], v[1], v[2]],
            anchor_pos: columns.contains_key("anchor_pos").then(|| {
                let a = row("anchor_pos", k, 3);
                [a[0], a[1], a[2]]
            }),
            bodies: columns.contains_key("body_pos").then(|| BodyState {
                pos: row("body_pos", k, nb * 3),
                rot: columns.get("body_rot").map_or(&[][..], |_| row("body_rot", k, nb * 4)),
                vel: columns.get("body_vel").map_or(&[][..], |_| row("body_vel", k, nb * 3)),
                ang_vel: columns.get("body_ang_vel").map_or(&[][..], |_| row("body_ang_vel", k, nb * 3)),
                ground_height: columns.get("ground_height").map_or(0.0, |_| row("ground_height", k, 1)[0]),
            }),
        };
        let out = tracker.step(&s)?;
        actions.extend_from_slice(&out.actions);
        targets.extend_from_slice(&out.joint_pos_targets);
    }
    let dev = candle_core::Device::Cpu;
    let named = [
        ("actions".to_owned(), Tensor::from_vec(actions, (steps, nd), &dev)?),
        ("joint_pos_targets".to_owned(), Tensor::from_vec(targets, (steps, nd), &dev)?),
    ];
    write_atomic(&r.out, &named)?;
    #[derive(Serialize)]
    struct ReplayReport {
        out: String,
        steps: usize,
        clip_frames: usize,
    }
    let report = ReplayReport { out: r.out.display().to_string(), steps, clip_frames: clip.frames };
    match g.format() {
        OutputFormat::Json => output::json_line(&report)?,
        OutputFormat::Text => output::line(format!(
            "wrote {}: actions, joint_pos_targets [{steps}, {nd}] ({steps} steps; the clip has {} frames at {} fps)",
            report.out, clip.frames, clip.fps
        )),
    }
    Ok(())
}
