//! The action functions of `protomotions/envs/action/action_functions.py`:
//! the policy's action to PD targets and gains, read from the
//! environment's `action_config` (a dict whose `fn` is a pickled global and
//! whose other entries are the function's arguments).

use crate::configs::Configs;
use crate::error::{ConfigProblem, DeployError, Result};

/// `bm_pd_action`.
pub const BM_PD_ACTION: &str = "protomotions.envs.action.action_functions.bm_pd_action";
/// `normalized_pd_fixed_gains_action`.
pub const NORMALIZED_PD_FIXED_GAINS_ACTION: &str =
    "protomotions.envs.action.action_functions.normalized_pd_fixed_gains_action";

/// v3.1's PD conversion, which has no `env.action_config`: the env clamps
/// the action to `robot.control.clamp_actions` (`BaseEnv.process_actions`)
/// and the simulator takes `offset + scale * action`
/// (`BaseSimulator._action_to_pd_targets`) with the offset and scale
/// `build_pd_action_offset_scale` derives from the joint limits and
/// `robot.control.action_scale`.
pub const V31_BUILD_PD_ACTION_OFFSET_SCALE: &str =
    "protomotions.simulator.base_simulator.utils.build_pd_action_offset_scale";

/// Every action function this crate implements, by qualified name.
pub const SUPPORTED: [&str; 2] = [BM_PD_ACTION, NORMALIZED_PD_FIXED_GAINS_ACTION];

/// How the action is bounded before scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// Used as is (`bm_pd_action`; `action_transform=None`).
    None,
    /// `tanh(a)` (`action_transform="tanh"`, the default).
    Tanh,
    /// `clamp(a, -c, c)` (`action_transform="clamp"`).
    Clamp(f32),
}

impl Transform {
    /// The contract's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Transform::None => "none",
            Transform::Tanh => "tanh",
            Transform::Clamp(_) => "clamp",
        }
    }
}

/// An action function with its per-joint constants:
/// `targets = offset + scale * transform(action)`, fixed gains.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionFunction {
    /// The qualified Python name.
    pub function: &'static str,
    /// `pd_action_offset`.
    pub offset: Vec<f32>,
    /// `action_scale` (bm) or `pd_action_scale` (normalized).
    pub scale: Vec<f32>,
    /// `stiffness`, float32 as the config holds it.
    pub stiffness: Vec<f32>,
    /// `damping`.
    pub damping: Vec<f32>,
    /// The bound applied first.
    pub transform: Transform,
}

impl ActionFunction {
    /// Reads `env.action_config`; `num_dofs` checks the lengths.
    pub(crate) fn read(c: &Configs, num_dofs: usize) -> Result<Self> {
        let base = "env.action_config";
        let key = |k: &str| format!("{base}.{k}");
        let function = match c.node(&key("fn"))? {
            pmstate_ckpt::Node::Global { module, name } => format!("{module}.{name}"),
            other => {
                return Err(c.bad(
                    &key("fn"),
                    ConfigProblem::WrongType { expected: "a function (a pickled global)", found: other.kind().into() },
                ))
            }
        };
        let (function, scale_key, known): (&'static str, _, &[&str]) = match function.as_str() {
            BM_PD_ACTION => {
                (BM_PD_ACTION, "action_scale", &["fn", "pd_action_offset", "action_scale", "stiffness", "damping"])
            }
            NORMALIZED_PD_FIXED_GAINS_ACTION => (
                NORMALIZED_PD_FIXED_GAINS_ACTION,
                "pd_action_scale",
                &[
                    "fn",
                    "pd_action_offset",
                    "pd_action_scale",
                    "stiffness",
                    "damping",
                    "action_transform",
                    "clamp_value",
                ],
            ),
            _ => {
                return Err(DeployError::UnknownFunction {
                    file: c.file.clone(),
                    component: base.into(),
                    function,
                    supported: SUPPORTED.iter().map(|s| (*s).to_owned()).collect(),
                })
            }
        };
        if let Some(d) = c.node(base).ok().and_then(crate::configs::dict_of) {
            for (k, _) in d.entries() {
                if let Some(k) = k.as_str() {
                    if !known.contains(&k) {
                        return Err(c.bad(&key(k), ConfigProblem::UnknownParameter { known: known.join(", ") }));
                    }
                }
            }
        }
        let vector = |k: &str| -> Result<Vec<f32>> {
            let v = c.f32_tensor(&key(k))?;
            if v.len() != num_dofs {
                return Err(c.bad(&key(k), ConfigProblem::Length { got: v.len(), expected: num_dofs }));
            }
            Ok(v)
        };
        let transform = if function == BM_PD_ACTION {
            Transform::None
        } else {
            match c.ckpt.get(&key("action_transform")) {
                None => Transform::Tanh,
                Some(pmstate_ckpt::Node::None) => Transform::None,
                Some(pmstate_ckpt::Node::Str(s)) if s == "tanh" => Transform::Tanh,
                Some(pmstate_ckpt::Node::Str(s)) if s == "clamp" => {
                    let v = c.opt_f64(&key("clamp_value"))?.unwrap_or(1.0);
                    Transform::Clamp(v as f32)
                }
                Some(other) => {
                    return Err(c.bad(
                        &key("action_transform"),
                        ConfigProblem::Unsupported {
                            value: other.as_str().map_or_else(|| other.kind().to_owned(), str::to_owned),
                            supported: "\"tanh\", \"clamp\", None",
                        },
                    ))
                }
            }
        };
        if let Transform::Clamp(v) = transform {
            let k = key("clamp_value");
            crate::limits::domain(&c.file, &k, f64::from(v), v.is_finite() && v > 0.0, "a finite number > 0")?;
        }
        let f = ActionFunction {
            function,
            offset: vector("pd_action_offset")?,
            scale: vector(scale_key)?,
            stiffness: vector("stiffness")?,
            damping: vector("damping")?,
            transform,
        };
        // every number the targets are made of is finite, every gain >= 0
        use crate::limits::check_vector;
        check_vector(&c.file, &key("pd_action_offset"), &f.offset, false)?;
        check_vector(&c.file, &key(scale_key), &f.scale, false)?;
        check_vector(&c.file, &key("stiffness"), &f.stiffness, true)?;
        check_vector(&c.file, &key("damping"), &f.damping, true)?;
        Ok(f)
    }

    /// v3.1's conversion ([`V31_BUILD_PD_ACTION_OFFSET_SCALE`]), read from
    /// the robot config: the joint limits, `hinge_axes_map` (how many joints
    /// each body has, in body order), `control.action_scale` and
    /// `clamp_actions`, the gains of `control.control_info`. In float32 as
    /// NumPy computes it there (float32 arrays, Python floats weak).
    pub(crate) fn read_v31(c: &Configs, joints: &[String]) -> Result<Self> {
        let nd = joints.len();
        let (lo_key, hi_key) = ("robot.kinematic_info.dof_limits_lower", "robot.kinematic_info.dof_limits_upper");
        let (mut lo, mut hi) = (c.f32_tensor(lo_key)?, c.f32_tensor(hi_key)?);
        for (key, v) in [(lo_key, &lo), (hi_key, &hi)] {
            if v.len() != nd {
                return Err(c.bad(key, ConfigProblem::Length { got: v.len(), expected: nd }));
            }
        }
        let action_scale = c.f64("robot.control.action_scale")? as f32;
        let hinge = "robot.kinematic_info.hinge_axes_map";
        let map = c.node(hinge)?;
        let map = crate::configs::dict_of(map).ok_or_else(|| {
            c.bad(
                hinge,
                ConfigProblem::WrongType { expected: "a dict of body id to hinge axes", found: map.kind().into() },
            )
        })?;
        let mut bodies: Vec<(i64, usize)> = Vec::new();
        for (k, v) in map.entries() {
            let pmstate_ckpt::Node::Int(id) = k else {
                return Err(c.bad(hinge, ConfigProblem::WrongType { expected: "int body ids", found: k.kind().into() }));
            };
            let rows = match v {
                pmstate_ckpt::Node::Tensor(t) => t.shape.first().copied().unwrap_or(0),
                other => {
                    return Err(c.bad(
                        &format!("{hinge}.{id}"),
                        ConfigProblem::WrongType { expected: "a tensor of hinge axes", found: other.kind().into() },
                    ))
                }
            };
            bodies.push((*id, rows));
        }
        bodies.sort_unstable();
        let mut at = 0usize;
        for (id, size) in bodies {
            let range = at..at.saturating_add(size);
            if range.end > nd || !(size == 1 || size == 3) {
                return Err(c.bad(
                    &format!("{hinge}.{id}"),
                    ConfigProblem::Unsupported {
                        value: format!("{size} joints from joint {at}"),
                        supported: "1 or 3 joints per body, within the robot's joints",
                    },
                ));
            }
            if size == 3 {
                let m = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
                let s =
                    (2.0 * action_scale * m(&lo[range.clone()]).max(m(&hi[range.clone()]))).min(std::f32::consts::PI);
                lo[range.clone()].iter_mut().for_each(|x| *x = -s);
                hi[range].iter_mut().for_each(|x| *x = s);
            } else {
                let (l, h) = (lo[at], hi[at]);
                let mid = 0.5 * (h + l);
                let s = action_scale * (h - l);
                lo[at] = mid - s;
                hi[at] = mid + s;
            }
            at += size;
        }
        if at != nd {
            return Err(c.bad(hinge, ConfigProblem::Length { got: at, expected: nd }));
        }
        let offset: Vec<f32> = lo.iter().zip(&hi).map(|(l, h)| 0.5 * (h + l)).collect();
        let scale: Vec<f32> = lo.iter().zip(&hi).map(|(l, h)| 0.5 * (h - l)).collect();
        let transform = match c.opt_f64("robot.control.clamp_actions")? {
            None => Transform::None,
            Some(v) => {
                let k = "robot.control.clamp_actions";
                crate::limits::domain(&c.file, k, v, v.is_finite() && v > 0.0, "a finite number > 0, or None")?;
                Transform::Clamp(v as f32)
            }
        };
        let gains = |field: &str| -> Result<Vec<f32>> {
            joints.iter().map(|j| Ok(c.f64(&format!("robot.control.control_info.{j}.{field}"))? as f32)).collect()
        };
        let f = ActionFunction {
            function: V31_BUILD_PD_ACTION_OFFSET_SCALE,
            offset,
            scale,
            stiffness: gains("stiffness")?,
            damping: gains("damping")?,
            transform,
        };
        use crate::limits::check_vector;
        check_vector(&c.file, lo_key, &f.offset, false)?;
        check_vector(&c.file, "robot.control.action_scale", &f.scale, false)?;
        check_vector(&c.file, "robot.control.control_info.*.stiffness", &f.stiffness, true)?;
        check_vector(&c.file, "robot.control.control_info.*.damping", &f.damping, true)?;
        Ok(f)
    }

    /// PD targets of one row: `offset + scale * transform(action)`, in
    /// float32 as torch computes it (the product rounded, then the sum).
    pub fn targets(&self, action: &[f32], out: &mut [f32]) {
        for (((o, a), off), s) in out.iter_mut().zip(action).zip(&self.offset).zip(&self.scale) {
            let a = match self.transform {
                Transform::None => *a,
                // in float64, rounded: the correctly rounded tanh but for
                // rare double roundings, as torch's kernel (SLEEF, 1 ulp)
                // gives it on the recordings but for one element in a
                // thousand (f32::tanh, the platform's tanhf, is further off)
                Transform::Tanh => f64::from(*a).tanh() as f32,
                // torch.clamp: NaN stays NaN
                Transform::Clamp(c) => {
                    if a.is_nan() {
                        *a
                    } else {
                        a.max(-c).min(c)
                    }
                }
            };
            *o = off + s * a;
        }
    }
}
