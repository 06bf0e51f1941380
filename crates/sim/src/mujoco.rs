//! The robot in MuJoCo, set up as ProtoMotions' deployment check sets it up
//! (`test_tracker_mujoco.py`: `load_mujoco_model`, `set_initial_pose`,
//! `read_robot_state`): the patched MJCF compiled from a file beside the
//! original (so its relative asset paths resolve), the physics step set to
//! the contract's `physics_dt`, passive stiffness, damping and friction
//! loss zeroed, every actuator an implicit PD controller with the
//! contract's gains, the state read from `qpos`, `qvel` and `xquat`.
//!
//! mujoco-rs (MuJoCo 3.17's C API with safe views over its arrays) is the
//! binding: it is maintained, tracks MuJoCo's releases, and links the
//! `libmujoco.so` the PyPI wheel of the same version ships, so the library
//! ProtoMotions' Python loop runs is the one this runs.
#![allow(unsafe_code)]

use std::io::Write;
use std::path::Path;

use mujoco_rs::mujoco_c::mjtBias;
use mujoco_rs::prelude::{MjData, MjModel};
use pmstate_deploy::motion::Frame;
use pmstate_deploy::Contract;

use crate::error::{Result, SimError};
use crate::mjcf::{self, Patched};
use crate::reading::Reading;

/// A free root (7 positions, 6 velocities) before the robot's joints.
const FREE_QPOS: usize = 7;
const FREE_QVEL: usize = 6;

/// The simulated robot.
pub struct Robot {
    data: MjData<Box<MjModel>>,
    file: String,
    num_dofs: usize,
    anchor: usize,
    root: usize,
    decimation: usize,
    patched: Patched,
}

impl std::fmt::Debug for Robot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Robot").field("file", &self.file).field("num_dofs", &self.num_dofs).finish_non_exhaustive()
    }
}

impl Robot {
    /// The robot of `contract` from the MJCF at `mjcf`.
    pub fn load(mjcf: &Path, contract: &Contract) -> Result<Self> {
        let file = mjcf.display().to_string();
        let io = |source| SimError::Io { path: file.clone(), source };
        let text = std::fs::read_to_string(mjcf).map_err(io)?;
        let (patched_xml, patched) = mjcf::patch(&text, &file)?;
        // beside the original, as ProtoMotions writes it: meshes and
        // includes are named relative to the file's folder
        let dir = mjcf.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut tmp = tempfile::Builder::new()
            .prefix(".pmstate-mjcf-")
            .suffix(".xml")
            .tempfile_in(dir)
            .map_err(|source| SimError::Io { path: dir.display().to_string(), source })?;
        tmp.write_all(patched_xml.as_bytes()).and_then(|()| tmp.flush()).map_err(io)?;
        let mut model = MjModel::from_xml(tmp.path())
            .map_err(|e| SimError::Mujoco { file: file.clone(), reason: e.to_string() })?;
        drop(tmp);
        let robot = &contract.robot;
        let control = &contract.control;
        let nd = robot.num_dofs;
        let (nq, nv, nu, nbody) = {
            let m = model.ffi();
            let n = |x: i64| usize::try_from(x).unwrap_or(0);
            (n(m.nq), n(m.nv), n(m.nu), n(m.nbody))
        };
        let mismatch = |what, model, contract: usize| SimError::Mismatch {
            file: file.clone(),
            what,
            model,
            contract: format!("has {contract}"),
        };
        if nu != nd || control.stiffness.len() != nd || control.damping.len() != nd {
            return Err(mismatch("actuators", nu, nd));
        }
        if nq != FREE_QPOS + nd {
            return Err(mismatch("qpos entries (a free root and one per joint)", nq, FREE_QPOS + nd));
        }
        if nv != FREE_QVEL + nd {
            return Err(mismatch("qvel entries", nv, FREE_QVEL + nd));
        }
        // world body first
        if nbody <= robot.anchor_body_index.max(robot.root_body_index) + 1 {
            return Err(mismatch("bodies besides the world", nbody.saturating_sub(1), robot.num_bodies));
        }
        let t = contract.timing.physics_dt;
        if !(t.is_finite() && t > 0.0) || contract.timing.decimation == 0 {
            return Err(SimError::Option {
                option: "timing",
                value: format!("physics_dt {t}, decimation {}", contract.timing.decimation),
                domain: "physics_dt finite and > 0, decimation >= 1",
            });
        }
        model.opt_mut().timestep = t;
        model.jnt_stiffness_mut().fill(0.0);
        model.dof_damping_mut().fill(0.0);
        model.dof_frictionloss_mut().fill(0.0);
        for (i, (&kp, &kd)) in control.stiffness.iter().zip(&control.damping).enumerate() {
            // SAFETY: a fixed gain and an affine bias are valid values of
            // MuJoCo's enums and parameters; no pipeline stage runs while the
            // model is edited (no data exists yet).
            unsafe {
                model.actuator_gainprm_mut()[i][0] = kp;
                model.actuator_biastype_mut()[i] = mjtBias::mjBIAS_AFFINE;
            }
            let bias = &mut model.actuator_biasprm_mut()[i];
            bias[0] = 0.0;
            bias[1] = -kp;
            bias[2] = -kd;
            model.actuator_ctrllimited_mut()[i] = false;
        }
        let data = MjData::new(Box::new(model));
        Ok(Robot {
            data,
            file,
            num_dofs: nd,
            anchor: robot.anchor_body_index,
            root: robot.root_body_index,
            decimation: contract.timing.decimation,
            patched,
        })
    }

    /// What the MJCF patch changed.
    pub fn patched(&self) -> Patched {
        self.patched
    }

    /// The MJCF's path, as given.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// `set_initial_pose`: the root at the frame's first body, the joints at
    /// its joint positions, every velocity zero, then `mj_forward`.
    pub fn set_initial_pose(&mut self, frame: &Frame<'_>) {
        let qpos = self.data.qpos_mut();
        for (q, &p) in qpos[..3].iter_mut().zip(&frame.body_pos[..3]) {
            *q = f64::from(p);
        }
        // xyzw -> MuJoCo's wxyz
        let r = &frame.body_rot[..4];
        qpos[3] = f64::from(r[3]);
        qpos[4] = f64::from(r[0]);
        qpos[5] = f64::from(r[1]);
        qpos[6] = f64::from(r[2]);
        for (q, &d) in qpos[FREE_QPOS..].iter_mut().zip(frame.dof_pos) {
            *q = f64::from(d);
        }
        self.data.qvel_mut().fill(0.0);
        self.data.forward();
    }

    /// `read_robot_state`: joints from `qpos[7:]` and `qvel[6:]`, the
    /// gyroscope from `qvel[3:6]`, the anchor from `xquat`/`xpos` (the root's
    /// orientation from `qpos[3:7]`), each rounded to float32 as NumPy's
    /// `astype(np.float32)` rounds.
    pub fn read(&self, out: &mut Reading) {
        let qpos = self.data.qpos();
        let qvel = self.data.qvel();
        for (o, &q) in out.dof_pos.iter_mut().zip(&qpos[FREE_QPOS..]) {
            *o = q as f32;
        }
        for (o, &v) in out.dof_vel.iter_mut().zip(&qvel[FREE_QVEL..]) {
            *o = v as f32;
        }
        out.root_local_ang_vel = [qvel[3] as f32, qvel[4] as f32, qvel[5] as f32];
        let wxyz = if self.anchor == self.root {
            [qpos[3], qpos[4], qpos[5], qpos[6]]
        } else {
            self.data.xquat()[self.anchor + 1]
        };
        out.anchor_rot = [wxyz[1] as f32, wxyz[2] as f32, wxyz[3] as f32, wxyz[0] as f32];
        let p = self.data.xpos()[self.anchor + 1];
        out.anchor_pos = [p[0] as f32, p[1] as f32, p[2] as f32];
        out.taken = self.data.time();
    }

    /// Body `b`'s position (the contract's body order; world frame).
    pub fn body_pos(&self, b: usize) -> [f64; 3] {
        self.data.xpos().get(b + 1).copied().unwrap_or([f64::NAN; 3])
    }

    /// The anchor body's orientation, xyzw.
    pub fn anchor_rot(&self) -> [f64; 4] {
        let q = self.data.xquat()[self.anchor + 1];
        [q[1], q[2], q[3], q[0]]
    }

    /// MuJoCo's positions.
    pub fn qpos(&self) -> &[f64] {
        self.data.qpos()
    }

    /// The joints' positions (`qpos` after the free root).
    pub fn joint_positions(&self) -> &[f64] {
        &self.data.qpos()[FREE_QPOS..]
    }

    /// MuJoCo's velocities.
    pub fn qvel(&self) -> &[f64] {
        self.data.qvel()
    }

    /// Simulated seconds.
    pub fn time(&self) -> f64 {
        self.data.time()
    }

    /// Bodies besides the world.
    pub fn num_bodies(&self) -> usize {
        self.data.xpos().len().saturating_sub(1)
    }

    /// One control period: `ctrl = targets`, then `decimation` physics
    /// steps; `push(time)` gives the force on the anchor during each.
    pub fn step(&mut self, targets: &[f32], push: impl Fn(f64) -> Option<[f64; 3]>) {
        for (c, &t) in self.data.ctrl_mut().iter_mut().zip(targets) {
            *c = f64::from(t);
        }
        let anchor = self.anchor + 1;
        for _ in 0..self.decimation {
            let force = push(self.data.time()).unwrap_or([0.0; 3]);
            let applied = &mut self.data.xfrc_applied_mut()[anchor];
            applied[..3].copy_from_slice(&force);
            self.data.step();
        }
    }

    /// The first quantity of the state that is not finite, if one is not.
    pub fn non_finite(&self) -> Option<&'static str> {
        if !self.data.qpos().iter().all(|x| x.is_finite()) {
            Some("qpos")
        } else if !self.data.qvel().iter().all(|x| x.is_finite()) {
            Some("qvel")
        } else {
            None
        }
    }
}
