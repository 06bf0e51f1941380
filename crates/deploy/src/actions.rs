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
