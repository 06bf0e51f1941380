//! v3.0's observation configs (`MimicEnvConfig.humanoid_obs`,
//! `.mimic_obs`) as the pipeline's components: the observations v3.0's
//! `HumanoidObs.get_obs` and `MimicObs.get_obs` name, each bound to the
//! context paths the tracker sources. Anything v3.0 could turn on that is
//! not implemented here is refused naming its key.

use super::dof_obs::Hinges;
use super::functions::{TargetPoses, V30Function};
use crate::configs::{dict_of, Configs};
use crate::contract::Fallback;
use crate::error::{ConfigProblem, DeployError, Result};
use crate::observations::Function;
use pmstate_ckpt::Node;

/// The key whose presence (with no `env.observation_components`) marks
/// v3.0's Mimic env.
pub const HUMANOID_OBS: &str = "env.humanoid_obs";

/// One component: its key, function and argument bindings (argument to
/// context path).
pub type Component = (String, Function, Vec<(String, String)>);

/// What v3.0's configs give the pipeline.
pub struct V30Observations {
    /// The actor's observations, in `in_keys` order.
    pub components: Vec<Component>,
    /// Past steps the tracker holds (`num_historical_steps - 1`: v3.0's
    /// history includes the current step).
    pub history_steps: usize,
    /// The future steps of the target poses.
    pub future_indices: Vec<usize>,
    /// Where each value came from.
    pub fallbacks: Vec<Fallback>,
}

/// Whether `c` holds v3.0's Mimic env configs.
pub fn is_v30(c: &Configs) -> bool {
    c.ckpt.get(crate::pipeline::COMPONENTS).is_none() && c.ckpt.get(HUMANOID_OBS).is_some()
}

fn flag(c: &Configs, key: &str) -> Result<bool> {
    match c.node(key)? {
        Node::Bool(b) => Ok(*b),
        other => Err(c.bad(key, ConfigProblem::WrongType { expected: "a bool", found: other.kind().into() })),
    }
}

/// An enum member's value (`FuturePoseType.MAX_COORDS_SIMPLE` pickles as
/// the class called with `'max-coords-simple'`), or a plain string.
fn enum_value(n: &Node) -> Option<&str> {
    match n {
        Node::Str(s) => Some(s),
        Node::Object(o) => match &o.args {
            Node::Tuple(v) | Node::List(v) => match v.first() {
                Some(Node::Str(s)) => Some(s),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

fn refuse_on(c: &Configs, key: &str, supported: &'static str) -> Result<()> {
    if c.ckpt.get(key).is_some() && flag(c, key)? {
        return Err(c.bad(key, ConfigProblem::Unsupported { value: "True".into(), supported }));
    }
    Ok(())
}

/// `robot.kinematic_info.hinge_axes_map`: per body (in body order, as the
/// map is built), its hinge axes.
fn hinges(c: &Configs, num_dofs: usize) -> Result<Hinges> {
    let key = "robot.kinematic_info.hinge_axes_map";
    let map = c.node(key)?;
    let map = dict_of(map).ok_or_else(|| {
        c.bad(key, ConfigProblem::WrongType { expected: "a dict of body id to hinge axes", found: map.kind().into() })
    })?;
    let mut ids = Vec::new();
    for (k, _) in map.entries() {
        let Node::Int(id) = k else {
            return Err(c.bad(key, ConfigProblem::WrongType { expected: "int body ids", found: k.kind().into() }));
        };
        ids.push(*id);
    }
    let mut bodies = Vec::new();
    for id in ids {
        let at = format!("{key}.{id}");
        let v = c.f32_tensor(&at)?;
        if v.is_empty() || v.len() % 3 != 0 || v.len() > 9 {
            return Err(c.bad(&at, ConfigProblem::Length { got: v.len(), expected: 3 }));
        }
        if v.len() == 9 {
            // dof_to_local reads a 3-joint body as an exponential map
            return Err(c.bad(
                &at,
                ConfigProblem::Unsupported {
                    value: "3 joints (an exponential map in dof_to_obs)".into(),
                    supported: "1 or 2 hinges per body",
                },
            ));
        }
        bodies.push(v.chunks(3).map(|a| [a[0], a[1], a[2]]).collect());
    }
    let h = Hinges { bodies };
    if h.num_dofs() != num_dofs {
        return Err(c.bad(key, ConfigProblem::Length { got: h.num_dofs(), expected: num_dofs }));
    }
    Ok(h)
}

/// The components of the actor's `in_keys` from v3.0's configs; `dt` is
/// the env's control period (`decimation / fps`).
pub fn observations(c: &Configs, actor_keys: &[String], num_dofs: usize, dt: f64) -> Result<V30Observations> {
    let ho = HUMANOID_OBS;
    let mo = "env.mimic_obs";
    let tp = "env.mimic_obs.mimic_target_pose";
    let mut fallbacks = vec![Fallback {
        field: "observations",
        release: "v3.0",
        key: ho.into(),
        semantics: "Mimic env observations computed in code (HumanoidObs, MimicObs), no components: reduced_coords_obs, historical_reduced_coords_obs and mimic_target_poses bound to the robot's root body (bodies[0]: rotation, world angular velocity, position), its joints and the reference",
    }];
    let bind = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, p)| ((*a).to_owned(), (*p).to_owned())).collect();
    let root_reduced: [(&str, &str); 4] = [
        ("dof_pos", "current.dof_pos"),
        ("dof_vel", "current.dof_vel"),
        ("body_rot", "current.rigid_body_rot"),
        ("body_ang_vel", "current.rigid_body_ang_vel"),
    ];
    let mut components = Vec::new();
    let mut history_steps = 0;
    let mut future_indices = Vec::new();
    for key in actor_keys {
        let component: Component = match key.as_str() {
            "reduced_coords_obs" | "historical_reduced_coords_obs" => {
                let rc = format!("{ho}.reduced_coords_obs");
                if !flag(c, &format!("{rc}.enabled"))? {
                    return Err(c.bad(
                        &format!("{rc}.enabled"),
                        ConfigProblem::Unsupported { value: "False".into(), supported: "True: the actor reads it" },
                    ));
                }
                let h = hinges(c, num_dofs)?;
                if key == "reduced_coords_obs" {
                    (key.clone(), Function::V30(V30Function::ReducedCoords(h)), bind(&root_reduced))
                } else {
                    let hk = format!("{rc}.num_historical_steps");
                    let steps = c.usize(&hk)?;
                    if steps == 0 || steps > crate::limits::MAX_HISTORY_STEPS {
                        return Err(
                            c.bad(&hk, ConfigProblem::Bound { value: steps, bound: crate::limits::MAX_HISTORY_STEPS })
                        );
                    }
                    history_steps = history_steps.max(steps - 1);
                    fallbacks.push(Fallback {
                        field: "history_steps",
                        release: "v3.0",
                        key: hk,
                        semantics: "HumanoidObs' HistoryBuffer of the reduced coords: num_historical_steps rows, the current step first, then the past ones; after a reset every row is the first reading (reset_hist_default; v3.0's reference resets, reset_hist_ref, fill it from the clip instead)",
                    });
                    let mut b: Vec<(String, String)> = bind(&root_reduced);
                    b.extend(bind(&[
                        ("historical_dof_pos", "historical.dof_pos"),
                        ("historical_dof_vel", "historical.dof_vel"),
                        ("historical_root_rot", "historical.root_rot"),
                        ("historical_root_ang_vel", "historical.root_ang_vel"),
                    ]));
                    (key.clone(), Function::V30(V30Function::HistoricalReducedCoords { hinges: h, steps }), b)
                }
            }
            "mimic_target_poses" => {
                if !flag(c, &format!("{mo}.enabled"))? || !flag(c, &format!("{tp}.enabled"))? {
                    return Err(c.bad(
                        &format!("{tp}.enabled"),
                        ConfigProblem::Unsupported { value: "False".into(), supported: "True: the actor reads it" },
                    ));
                }
                let tk = format!("{tp}.type");
                let kind = enum_value(c.node(&tk)?);
                if kind != Some("max-coords-simple") {
                    return Err(c.bad(
                        &tk,
                        ConfigProblem::Unsupported {
                            value: kind.map_or_else(|| "not an enum value".to_owned(), str::to_owned),
                            supported: "max-coords-simple",
                        },
                    ));
                }
                refuse_on(c, &format!("{tp}.with_contacts"), "False (the reference's contacts)")?;
                let with_velocities = flag(c, &format!("{tp}.with_velocities"))?;
                let with_time = flag(c, &format!("{tp}.with_time"))?;
                let fk = format!("{tp}.future_steps");
                let steps: Vec<usize> = match c.node(&fk)? {
                    Node::List(v) | Node::Tuple(v) => v
                        .iter()
                        .map(|n| {
                            crate::configs::as_usize(n).ok_or_else(|| {
                                c.bad(
                                    &fk,
                                    ConfigProblem::WrongType { expected: "a list of ints", found: n.kind().into() },
                                )
                            })
                        })
                        .collect::<Result<_>>()?,
                    _ => {
                        // an int: MimicObs takes arange(1, num_future_steps + 1)
                        let nk = format!("{tp}.num_future_steps");
                        let n = c.usize(&nk)?;
                        if n > crate::limits::MAX_FUTURE_STEPS {
                            return Err(
                                c.bad(&nk, ConfigProblem::Bound { value: n, bound: crate::limits::MAX_FUTURE_STEPS })
                            );
                        }
                        (1..=n).collect()
                    }
                };
                if steps.len() > crate::limits::MAX_FUTURE_STEPS {
                    return Err(c.bad(
                        &fk,
                        ConfigProblem::Bound { value: steps.len(), bound: crate::limits::MAX_FUTURE_STEPS },
                    ));
                }
                if let Some(&far) = steps.iter().find(|&&s| s > crate::limits::MAX_FUTURE_OFFSET) {
                    return Err(
                        c.bad(&fk, ConfigProblem::Bound { value: far, bound: crate::limits::MAX_FUTURE_OFFSET })
                    );
                }
                future_indices.clone_from(&steps);
                fallbacks.push(Fallback {
                    field: "future_steps",
                    release: "v3.0",
                    key: fk,
                    semantics: "MimicObs: an int future_steps means arange(1, num_future_steps + 1); the references at motion time t + k dt, clamped to the clip's length",
                });
                fallbacks.push(Fallback {
                    field: "reference_frame",
                    release: "v3.0",
                    key: "env.motion_manager.realign_motion_with_humanoid_on_each_step".into(),
                    semantics: "the reference in the clip's own frame (no yaw alignment), its xy shifted by respawn_root_offset, which align_motion_with_humanoid sets after each step to the robot root's xy minus the reference root's; at the first step after a reset, this step's",
                });
                let mut b: Vec<(String, String)> = bind(&[
                    ("cur_gt", "current.rigid_body_pos"),
                    ("cur_gr", "current.rigid_body_rot"),
                    ("flat_target_pos", "mimic.future_pos"),
                    ("flat_target_rot", "mimic.future_rot"),
                    ("realign_offset", "mimic.realign_offset"),
                    ("motion_time", "mimic.motion_time"),
                    ("motion_length", "mimic.motion_length"),
                ]);
                if with_velocities {
                    b.extend(bind(&[
                        ("flat_target_vel", "mimic.future_vel"),
                        ("flat_target_ang_vel", "mimic.future_ang_vel"),
                    ]));
                }
                let f = TargetPoses { with_velocities, with_time, steps, dt: dt as f32 };
                (key.clone(), Function::V30(V30Function::TargetPoses(f)), b)
            }
            other => {
                return Err(DeployError::UnknownFunction {
                    file: c.file.clone(),
                    component: format!("{ho} ({other})"),
                    function: format!("v3.0's observation {other}"),
                    supported: ["reduced_coords_obs", "historical_reduced_coords_obs", "mimic_target_poses"]
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect(),
                })
            }
        };
        components.push(component);
    }
    // the realignment is what v3.0's published trackers were trained with
    let rk = "env.motion_manager.realign_motion_with_humanoid_on_each_step";
    if c.ckpt.get(rk).is_some() && !flag(c, rk)? {
        return Err(c.bad(
            rk,
            ConfigProblem::Unsupported {
                value: "False".into(),
                supported: "True (the reference realigned with the robot each step)",
            },
        ));
    }
    Ok(V30Observations { components, history_steps, future_indices, fallbacks })
}
