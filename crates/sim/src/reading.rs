//! One control step's readings, owned (the simulator writes them, the
//! perturbations delay and hold them), and the tracker's view of them.

use pmstate_deploy::{Sensors, Stamp};

/// What a robot's sensors report at one control step (xyzw quaternions,
/// float32 as ProtoMotions' loop converts them).
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// Joint positions (`qpos[7:]`).
    pub dof_pos: Vec<f32>,
    /// Joint velocities (`qvel[6:]`).
    pub dof_vel: Vec<f32>,
    /// The anchor body's orientation (`xquat`, the root's from `qpos[3:7]`).
    pub anchor_rot: [f32; 4],
    /// The root's angular velocity in its own frame (`qvel[3:6]`).
    pub root_local_ang_vel: [f32; 3],
    /// The anchor's position (`xpos`).
    pub anchor_pos: [f32; 3],
    /// When it was taken, seconds of simulated time.
    pub taken: f64,
}

impl Reading {
    /// All zeros, for a robot of `num_dofs` joints.
    pub fn zeros(num_dofs: usize) -> Self {
        Reading {
            dof_pos: vec![0.0; num_dofs],
            dof_vel: vec![0.0; num_dofs],
            anchor_rot: [0.0; 4],
            root_local_ang_vel: [0.0; 3],
            anchor_pos: [0.0; 3],
            taken: 0.0,
        }
    }

    /// Copies `other` in place (same joint count; no allocation).
    pub fn copy_from(&mut self, other: &Reading) {
        self.dof_pos.copy_from_slice(&other.dof_pos);
        self.dof_vel.copy_from_slice(&other.dof_vel);
        self.anchor_rot = other.anchor_rot;
        self.root_local_ang_vel = other.root_local_ang_vel;
        self.anchor_pos = other.anchor_pos;
        self.taken = other.taken;
    }

    /// The tracker's sensors; with `now`, stamped for the stale-sensor guard.
    pub fn sensors(&self, now: Option<f64>) -> Sensors<'_> {
        Sensors {
            dof_pos: &self.dof_pos,
            dof_vel: &self.dof_vel,
            anchor_rot: self.anchor_rot,
            root_local_ang_vel: self.root_local_ang_vel,
            anchor_pos: Some(self.anchor_pos),
            bodies: None,
            stamp: now.map(|now| Stamp { taken: self.taken, now }),
        }
    }
}
