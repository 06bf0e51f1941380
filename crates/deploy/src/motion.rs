//! A reference motion clip and its player at the control rate, as
//! ProtoMotions' `deployment/motion_utils.py` (`MotionPlayer`) resamples
//! it with the training interpolation (`calc_frame_blend`,
//! `interpolate_pos`, `interpolate_quat` = `rotations.slerp`), in float32
//! with the reference's order of operations.

use std::path::Path;

use candle_core::{DType, Device};
use pmstate_ckpt::{Checkpoint, Node};

use crate::configs::as_f64;
use crate::error::{DeployError, MotionProblem, Result};

/// One clip as a `.motion` file holds it (a `torch.save` dict of `fps`,
/// `dof_pos [F, D]`, `dof_vel`, `rigid_body_pos [F, B, 3]`,
/// `rigid_body_rot [F, B, 4]` (xyzw), `rigid_body_vel`, `rigid_body_ang_vel`).
#[derive(Debug, Clone, PartialEq)]
pub struct MotionClip {
    /// Source frames per second.
    pub fps: f64,
    /// Source frames.
    pub frames: usize,
    /// Joints.
    pub num_dofs: usize,
    /// Bodies.
    pub num_bodies: usize,
    /// The arrays, row-major by frame.
    pub arrays: MotionArrays,
}

/// The per-frame arrays of a clip or a player.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MotionArrays {
    /// `[F, D]`.
    pub dof_pos: Vec<f32>,
    /// `[F, D]`.
    pub dof_vel: Vec<f32>,
    /// `[F, B, 3]`.
    pub body_pos: Vec<f32>,
    /// `[F, B, 4]`, xyzw.
    pub body_rot: Vec<f32>,
    /// `[F, B, 3]`.
    pub body_vel: Vec<f32>,
    /// `[F, B, 3]`.
    pub body_ang_vel: Vec<f32>,
}

/// The most source frames a clip may have (a day at 120 fps; bounds memory).
pub const MAX_FRAMES: usize = 10_368_000;

impl MotionClip {
    /// Reads a `.motion` file (read inertly, as every checkpoint is).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let ckpt = Checkpoint::open(path)?;
        let bad = |problem| DeployError::Motion { file: file.clone(), problem };
        let fps = ckpt.get("fps").and_then(as_f64).ok_or_else(|| bad(MotionProblem::Missing("fps")))?;
        if !(fps.is_finite() && fps > 0.0 && fps <= crate::limits::MAX_FPS) {
            return Err(bad(MotionProblem::Fps(fps)));
        }
        let read = |key: &'static str| -> Result<(Vec<usize>, Vec<f32>)> {
            match ckpt.get(key) {
                Some(Node::Tensor(_)) => {}
                _ => return Err(bad(MotionProblem::Missing(key))),
            }
            let t = ckpt.candle_tensor(key, &Device::Cpu)?;
            let dims = t.dims().to_vec();
            Ok((dims, t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?))
        };
        let (dd, dof_pos) = read("dof_pos")?;
        let [frames, num_dofs] = dd[..] else { return Err(bad(MotionProblem::Shape { key: "dof_pos", shape: dd })) };
        if frames == 0 || frames > MAX_FRAMES {
            return Err(bad(MotionProblem::Frames(frames)));
        }
        let (pd, body_pos) = read("rigid_body_pos")?;
        let num_bodies = match pd[..] {
            [f, b, 3] if f == frames => b,
            _ => return Err(bad(MotionProblem::Shape { key: "rigid_body_pos", shape: pd })),
        };
        let check = |key: &'static str, want: Vec<usize>| -> Result<Vec<f32>> {
            let (d, v) = read(key)?;
            if d != want {
                return Err(bad(MotionProblem::Shape { key, shape: d }));
            }
            Ok(v)
        };
        let arrays = MotionArrays {
            dof_vel: check("dof_vel", vec![frames, num_dofs])?,
            body_rot: check("rigid_body_rot", vec![frames, num_bodies, 4])?,
            body_vel: check("rigid_body_vel", vec![frames, num_bodies, 3])?,
            body_ang_vel: check("rigid_body_ang_vel", vec![frames, num_bodies, 3])?,
            dof_pos,
            body_pos,
        };
        let clip = MotionClip { fps, frames, num_dofs, num_bodies, arrays };
        clip.validate().map_err(bad)?;
        Ok(clip)
    }

    /// Checks what [`MotionClip::load`] checks, for a clip built in code:
    /// a frame rate in (0, [`crate::limits::MAX_FPS`]], 1 to [`MAX_FRAMES`]
    /// frames, arrays of the lengths the counts imply, every value finite,
    /// every rotation a unit quaternion.
    pub fn validate(&self) -> std::result::Result<(), MotionProblem> {
        if !(self.fps.is_finite() && self.fps > 0.0 && self.fps <= crate::limits::MAX_FPS) {
            return Err(MotionProblem::Fps(self.fps));
        }
        if self.frames == 0 || self.frames > MAX_FRAMES {
            return Err(MotionProblem::Frames(self.frames));
        }
        let (f, nd, nb) = (self.frames, self.num_dofs, self.num_bodies);
        let a = &self.arrays;
        for (key, v, width) in [
            ("dof_pos", &a.dof_pos, nd),
            ("dof_vel", &a.dof_vel, nd),
            ("rigid_body_pos", &a.body_pos, nb.saturating_mul(3)),
            ("rigid_body_rot", &a.body_rot, nb.saturating_mul(4)),
            ("rigid_body_vel", &a.body_vel, nb.saturating_mul(3)),
            ("rigid_body_ang_vel", &a.body_ang_vel, nb.saturating_mul(3)),
        ] {
            if f.checked_mul(width) != Some(v.len()) {
                return Err(MotionProblem::Length { key, got: v.len(), frames: f, width });
            }
        }
        check_values(a, nb)
    }
}

/// Every value finite and every rotation a unit quaternion (within
/// [`crate::limits::QUAT_NORM_TOLERANCE`]): a clip is checked once, so a
/// step never meets a NaN reference.
fn check_values(a: &MotionArrays, num_bodies: usize) -> std::result::Result<(), MotionProblem> {
    for (key, v) in [
        ("dof_pos", &a.dof_pos),
        ("dof_vel", &a.dof_vel),
        ("rigid_body_pos", &a.body_pos),
        ("rigid_body_rot", &a.body_rot),
        ("rigid_body_vel", &a.body_vel),
        ("rigid_body_ang_vel", &a.body_ang_vel),
    ] {
        if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(MotionProblem::NonFinite { key, index, value });
        }
    }
    for (i, q) in a.body_rot.chunks_exact(4).enumerate() {
        let norm = q.iter().map(|x| x * x).sum::<f32>().sqrt();
        if (norm - 1.0).abs() > crate::limits::QUAT_NORM_TOLERANCE {
            let nb = num_bodies.max(1);
            return Err(MotionProblem::NotUnit { frame: i / nb, body: i % nb, norm });
        }
    }
    Ok(())
}

/// `torch.linspace(start, end, steps)` in float32 as torch's CPU kernel
/// computes it: from both ends toward the middle, `start + step * i` and
/// `end - step * (steps - 1 - i)`, each one fused multiply-add (the
/// compiler contracts the kernel's expression; checked bit for bit against
/// torch on the recorded clip's 161 times, where separate roundings differ
/// in 7 of them).
pub fn linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let halfway = steps / 2;
    (0..steps)
        .map(|i| if i < halfway { step.mul_add(i as f32, start) } else { (-step).mul_add((steps - i - 1) as f32, end) })
        .collect()
}

/// `calc_frame_blend` for one time: the two source frames and the blend.
pub fn frame_blend(time: f32, length: f32, frames: usize, dt: f32) -> (usize, usize, f32) {
    let time = time.max(0.0).min(length);
    let phase = (time / length).clamp(0.0, 1.0);
    let last = frames.saturating_sub(1);
    // `.long()` truncates toward zero; phase is in [0, 1] (NaN gives 0, as a cast does)
    let f0 = ((phase * last as f32) as usize).min(last);
    let f1 = (f0 + 1).min(last);
    let blend = ((time - f0 as f32 * dt) / dt).clamp(0.0, 1.0);
    (f0, f1, blend)
}

/// `rotations.slerp(q0, q1, t)` for one pair (xyzw), in torch's order.
pub fn slerp(q0: [f32; 4], q1: [f32; 4], t: f32) -> [f32; 4] {
    let mut c = q0[0] * q1[0] + q0[1] * q1[1] + q0[2] * q1[2] + q0[3] * q1[3];
    let q1 = if c < 0.0 { q1.map(|x| -x) } else { q1 };
    c = c.abs();
    let half = c.acos();
    let s = (1.0 - c * c).sqrt();
    let ra = ((1.0 - t) * half).sin() / s;
    let rb = (t * half).sin() / s;
    if c >= 1.0 {
        q0
    } else if s.abs() < 0.001 {
        std::array::from_fn(|i| 0.5 * q0[i] + 0.5 * q1[i])
    } else {
        std::array::from_fn(|i| ra * q0[i] + rb * q1[i])
    }
}

/// A clip resampled to the control rate.
#[derive(Debug, Clone, PartialEq)]
pub struct MotionPlayer {
    control_dt: f64,
    frames: usize,
    num_dofs: usize,
    num_bodies: usize,
    /// The clip's length in seconds, float32 (`(frames - 1) / fps`).
    length: f32,
    arrays: MotionArrays,
}

/// One frame of a player.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// `[D]`.
    pub dof_pos: &'a [f32],
    /// `[D]`.
    pub dof_vel: &'a [f32],
    /// `[B, 3]`.
    pub body_pos: &'a [f32],
    /// `[B, 4]`.
    pub body_rot: &'a [f32],
    /// `[B, 3]`.
    pub body_vel: &'a [f32],
    /// `[B, 3]`.
    pub body_ang_vel: &'a [f32],
}

impl MotionPlayer {
    /// Resamples `clip` to one frame per `control_dt` seconds over its
    /// length (`round(length / dt) + 1` frames), as `MotionPlayer` does.
    pub fn new(clip: &MotionClip, control_dt: f64) -> Result<Self> {
        if !(control_dt.is_finite() && control_dt > 0.0 && control_dt <= crate::limits::MAX_CONTROL_DT) {
            return Err(DeployError::ControlDt(control_dt));
        }
        clip.validate().map_err(|problem| DeployError::Motion { file: "the motion clip".into(), problem })?;
        let src_dt = 1.0 / clip.fps;
        let length = src_dt * clip.frames.saturating_sub(1) as f64;
        // a float-to-int cast saturates: a huge ratio is caught by the bound below
        let n = ((length / control_dt).round_ties_even() as usize).saturating_add(1).max(1);
        let (nd, nb) = (clip.num_dofs, clip.num_bodies);
        // the bound first, in checked arithmetic: floats per frame, then bytes
        let per_frame = nd
            .checked_mul(2)
            .and_then(|d| nb.checked_mul(13).and_then(|b| d.checked_add(b)))
            .and_then(|f| f.checked_mul(std::mem::size_of::<f32>()));
        let bytes = per_frame.and_then(|f| f.checked_mul(n));
        match bytes {
            Some(b) if b <= crate::limits::MAX_PLAYER_BYTES && n <= MAX_FRAMES => {}
            _ => {
                return Err(DeployError::Motion {
                    file: "the motion clip".into(),
                    problem: MotionProblem::TooLong { control_dt, frames: n, bytes: bytes.unwrap_or(usize::MAX) },
                })
            }
        }
        let times = linspace_f32(0.0, length as f32, n);
        let (len32, dt32) = (length as f32, src_dt as f32);
        let src = &clip.arrays;
        let cap = |width: usize, what| crate::limits::with_capacity::<f32>(n * width, what);
        let mut a = MotionArrays {
            dof_pos: cap(nd, "the player's joint positions")?,
            dof_vel: cap(nd, "the player's joint velocities")?,
            body_pos: cap(nb * 3, "the player's body positions")?,
            body_rot: cap(nb * 4, "the player's body rotations")?,
            body_vel: cap(nb * 3, "the player's body velocities")?,
            body_ang_vel: cap(nb * 3, "the player's body angular velocities")?,
        };
        for t in times {
            let (f0, f1, blend) = frame_blend(t, len32, clip.frames, dt32);
            let w0 = 1.0 - blend;
            let lerp = |v: &[f32], width: usize, out: &mut Vec<f32>| {
                let (r0, r1) = (&v[f0 * width..(f0 + 1) * width], &v[f1 * width..(f1 + 1) * width]);
                out.extend(r0.iter().zip(r1).map(|(x, y)| w0 * x + blend * y));
            };
            lerp(&src.dof_pos, nd, &mut a.dof_pos);
            lerp(&src.dof_vel, nd, &mut a.dof_vel);
            lerp(&src.body_pos, nb * 3, &mut a.body_pos);
            lerp(&src.body_vel, nb * 3, &mut a.body_vel);
            lerp(&src.body_ang_vel, nb * 3, &mut a.body_ang_vel);
            for b in 0..nb {
                let q = |f: usize| -> [f32; 4] { std::array::from_fn(|i| src.body_rot[(f * nb + b) * 4 + i]) };
                a.body_rot.extend(slerp(q(f0), q(f1), blend));
            }
        }
        Ok(MotionPlayer { control_dt, frames: n, num_dofs: nd, num_bodies: nb, length: len32, arrays: a })
    }

    /// Frames at the control rate.
    pub fn total_frames(&self) -> usize {
        self.frames
    }

    /// The clip's length in seconds, float32: what v3.0's motion lib
    /// clamps a target's time to.
    pub fn length(&self) -> f32 {
        self.length
    }

    /// The control period.
    pub fn control_dt(&self) -> f64 {
        self.control_dt
    }

    /// Joints.
    pub fn num_dofs(&self) -> usize {
        self.num_dofs
    }

    /// Bodies.
    pub fn num_bodies(&self) -> usize {
        self.num_bodies
    }

    /// The resampled arrays.
    pub fn arrays(&self) -> &MotionArrays {
        &self.arrays
    }

    /// Frame `i`, clamped to the last (`get_state_at_frame`).
    pub fn frame(&self, i: usize) -> Frame<'_> {
        let i = i.min(self.frames - 1);
        let (nd, nb) = (self.num_dofs, self.num_bodies);
        let a = &self.arrays;
        Frame {
            dof_pos: &a.dof_pos[i * nd..(i + 1) * nd],
            dof_vel: &a.dof_vel[i * nd..(i + 1) * nd],
            body_pos: &a.body_pos[i * nb * 3..(i + 1) * nb * 3],
            body_rot: &a.body_rot[i * nb * 4..(i + 1) * nb * 4],
            body_vel: &a.body_vel[i * nb * 3..(i + 1) * nb * 3],
            body_ang_vel: &a.body_ang_vel[i * nb * 3..(i + 1) * nb * 3],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_hits_both_ends_and_blends_stay_in_range() {
        let t = linspace_f32(0.0, 3.2, 161);
        assert_eq!((t[0], t[160]), (0.0, 3.2));
        for w in t.windows(2) {
            assert!(w[1] > w[0]);
        }
        for x in t {
            let (f0, f1, b) = frame_blend(x, 3.2, 97, (1.0f64 / 30.0) as f32);
            assert!(f0 <= f1 && f1 <= 96 && (0.0..=1.0).contains(&b));
        }
    }

    #[test]
    fn slerp_ends_and_sign_flip() {
        let a = [0.0, 0.0, 0.0, 1.0];
        let s = std::f32::consts::FRAC_1_SQRT_2;
        let b = [0.0, 0.0, s, s];
        assert_eq!(slerp(a, b, 0.0), a);
        let end = slerp(a, b, 1.0);
        for i in 0..4 {
            assert!((end[i] - b[i]).abs() < 1e-6);
        }
        // -b is the same rotation: the same path
        let flipped = slerp(a, b.map(|x| -x), 0.5);
        let direct = slerp(a, b, 0.5);
        assert_eq!(flipped, direct);
        assert_eq!(slerp(a, a, 0.3), a);
    }
}
