//! What `deploy replay` and `bench-deploy` share: the recorded sensor
//! stream (one tensor per sensor, every one `[T, ...]` with one T) and the
//! safety envelope's flags.

use std::collections::HashMap;
use std::path::Path;

use pmstate_deploy::{BodyState, EndOfClip, Pipeline, SafePose, Sensors, Stamp, TrackerOptions};

use crate::cmd::policy::obs::{read_tensors, Schema};
use crate::CliError;

/// The sensor stream's schema: the known sensors, f32 `[T, ...]` (`stamp`: f64 `[T, 2]`).
struct SensorSchema {
    num_dofs: usize,
    num_bodies: usize,
}

impl SensorSchema {
    const NAMES: [&'static str; 11] = [
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
        "stamp",
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
            "stamp" => vec![2],
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
        let want = if key == "stamp" { "F64" } else { "F32" };
        let fits = dims.len() == row.len() + 1
            && dims[1..].iter().zip(&row).all(|(&d, &w)| usize::try_from(d).ok() == Some(w));
        if dtype != want || !fits {
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            let row: Vec<String> = row.iter().map(usize::to_string).collect();
            let kind = if key == "stamp" { "float64" } else { "float32" };
            return Err(CliError::Usage(format!(
                "--sensors: {key}: expected {kind} [T, {}], got {} [{}]",
                row.join(", "),
                dtype.to_lowercase(),
                dims.join(", ")
            )));
        }
        Ok(())
    }
}

/// A recorded sensor stream, checked: every sensor `T` steps, the four the
/// tracker reads every step present.
pub(crate) struct SensorStream {
    steps: usize,
    num_dofs: usize,
    num_bodies: usize,
    columns: HashMap<&'static str, Vec<f32>>,
    stamps: Option<Vec<f64>>,
}

impl SensorStream {
    /// Reads `path` for a robot of `num_dofs` joints and `num_bodies` bodies.
    pub(crate) fn read(path: &Path, num_dofs: usize, num_bodies: usize) -> Result<Self, CliError> {
        let tensors = read_tensors(path, &SensorSchema { num_dofs, num_bodies })?;
        let mut columns = HashMap::new();
        let mut steps: Option<(usize, &str)> = None;
        let mut stamps = None;
        for name in SensorSchema::NAMES {
            let Some(t) = tensors.get(name) else { continue };
            let rows = t.dims()[0];
            match steps {
                None => steps = Some((rows, name)),
                Some((s, first)) if s != rows => {
                    return Err(CliError::Usage(format!(
                        "--sensors: {name} has {rows} steps, {first} has {s}: every sensor needs one row per step"
                    )))
                }
                _ => {}
            }
            if name == "stamp" {
                stamps = Some(t.flatten_all()?.to_vec1::<f64>()?);
            } else {
                columns.insert(name, t.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        for name in ["dof_pos", "dof_vel", "anchor_rot", "root_local_ang_vel"] {
            if !columns.contains_key(name) {
                return Err(CliError::Usage(format!("--sensors: no {name} (the tracker reads it every step)")));
            }
        }
        let body = ["body_pos", "body_rot", "body_vel", "body_ang_vel"];
        let given = body.iter().filter(|b| columns.contains_key(*b)).count();
        if given != 0 && given != body.len() {
            let missing: Vec<&str> = body.iter().copied().filter(|b| !columns.contains_key(b)).collect();
            return Err(CliError::Usage(format!(
                "--sensors: a body state needs all four arrays; no {}",
                missing.join(", ")
            )));
        }
        let steps = steps.map_or(0, |(s, _)| s);
        if steps == 0 {
            return Err(CliError::Usage("--sensors: the stream has no steps".into()));
        }
        Ok(SensorStream { steps, num_dofs, num_bodies, columns, stamps })
    }

    /// Steps in the stream.
    pub(crate) fn steps(&self) -> usize {
        self.steps
    }

    fn row(&self, name: &str, k: usize, w: usize) -> &[f32] {
        &self.columns[name][k * w..(k + 1) * w]
    }

    /// The readings of step `k` (`k < steps`).
    pub(crate) fn sensors(&self, k: usize) -> Sensors<'_> {
        let (nd, nb) = (self.num_dofs, self.num_bodies);
        let q = self.row("anchor_rot", k, 4);
        let v = self.row("root_local_ang_vel", k, 3);
        Sensors {
            dof_pos: self.row("dof_pos", k, nd),
            dof_vel: self.row("dof_vel", k, nd),
            anchor_rot: [q[0], q[1], q[2], q[3]],
            root_local_ang_vel: [v[0], v[1], v[2]],
            anchor_pos: self.columns.contains_key("anchor_pos").then(|| {
                let a = self.row("anchor_pos", k, 3);
                [a[0], a[1], a[2]]
            }),
            bodies: self.columns.contains_key("body_pos").then(|| BodyState {
                pos: self.row("body_pos", k, nb * 3),
                rot: self.row("body_rot", k, nb * 4),
                vel: self.row("body_vel", k, nb * 3),
                ang_vel: self.row("body_ang_vel", k, nb * 3),
                ground_height: self.columns.get("ground_height").map_or(0.0, |g| g[k]),
            }),
            stamp: self.stamps.as_ref().map(|s| Stamp { taken: s[2 * k], now: s[2 * k + 1] }),
        }
    }
}

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// `--end-of-clip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum EndOfClipArg {
    /// Keep tracking the last frame.
    Hold,
    /// Enter the safe mode.
    Stop,
}

/// The tracker's filters and safety envelope (docs/deploy.md, "Safety").
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct EnvelopeArgs {
    /// The envelope's defaults from the robot config (targets clamped to its
    /// joint limits, rate-limited to its velocity limits); `off` runs
    /// ProtoMotions' loop as it is (readings are still checked, and a
    /// non-finite output still enters the safe mode).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    envelope: Switch,
    /// The EMA filter's alpha, in (0, 1] (default: the contract's control.action_ema_alpha).
    #[arg(long)]
    action_ema_alpha: Option<f64>,
    /// Blend from the measured pose to the policy's targets over this many seconds.
    #[arg(long, value_name = "SECONDS")]
    soft_start: Option<f64>,
    /// Enter the safe mode when the anchor tilts more than this from upright (radians).
    #[arg(long, value_name = "RADIANS")]
    max_tilt: Option<f32>,
    /// Enter the safe mode on a reading older than this many control periods
    /// (the stream then needs `stamp` [T, 2] float64: taken, now).
    #[arg(long, value_name = "PERIODS")]
    stale_after: Option<u32>,
    /// After the clip's last frame: keep tracking it, or enter the safe mode.
    #[arg(long, value_enum, default_value_t = EndOfClipArg::Hold)]
    end_of_clip: EndOfClipArg,
    /// The safe mode's pose, one value per joint, comma-separated (default:
    /// the measured joints, so the PD loop only damps).
    #[arg(long, value_name = "RADIANS,...", value_delimiter = ',')]
    safe_pose: Option<Vec<f32>>,
}

impl EnvelopeArgs {
    /// The options these flags give for `p` (checked when the tracker is made).
    pub(crate) fn options(&self, p: &Pipeline) -> TrackerOptions {
        let mut o = match self.envelope {
            Switch::On => TrackerOptions::new(p),
            Switch::Off => TrackerOptions::reference(p.contract()),
        };
        if let Some(a) = self.action_ema_alpha {
            o.action_ema_alpha = a;
        }
        let e = &mut o.envelope;
        if let Some(s) = self.soft_start {
            e.soft_start_seconds = s;
        }
        e.max_tilt = self.max_tilt;
        e.stale_after_periods = self.stale_after;
        e.end_of_clip = match self.end_of_clip {
            EndOfClipArg::Hold => EndOfClip::Hold,
            EndOfClipArg::Stop => EndOfClip::Stop,
        };
        if let Some(p) = &self.safe_pose {
            e.safe_pose = SafePose::Pose(p.clone());
        }
        o
    }
}
