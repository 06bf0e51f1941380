//! Observation widths from the resolved configs: what the environment
//! computes for each observation component, sized from the robot.
//!
//! The checkpoint fixes only each first layer's (or normalizer's) total
//! width, so where a module reads several keys their split stays open
//! (the smpl tracker's 1003). ProtoMotions' own exporter sizes its inputs by
//! running each component's compute function on a sample context; the
//! configs are read inertly here, so each known compute function has its
//! width rule written out below (from `protomotions/envs/obs/*.py`), fed
//! with the robot's body, joint, action and contact counts and the
//! environment's history and future step counts. A function without a rule,
//! or a field the rule needs that the configs lack, leaves the width open
//! with the reason, which `pmstate policy describe` prints.

use std::fmt;

use pmstate_ckpt::{Checkpoint, Node};
use serde::Serialize;

/// The configs path of the observation components.
pub const COMPONENTS: &str = "env.observation_components";

/// One observation component of the configs and its width.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentWidth {
    /// Its key in `env.observation_components` (the in_key it feeds).
    pub component: String,
    /// Its compute function's name (`compute_humanoid_max_coords_observations`).
    pub function: String,
    /// The width, or why it is not known.
    pub width: Result<usize, Unsized>,
}

/// Why a component's width is not known from the configs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unsized {
    /// pmstate has no width rule for this compute function.
    NoRule {
        /// `module.name` of the function.
        function: String,
    },
    /// A value the rule needs is missing or not what the rule reads.
    Field {
        /// Its dotted configs path.
        path: String,
        /// What the rule expected there.
        expected: &'static str,
    },
    /// The width does not fit in usize.
    Overflow,
}

impl fmt::Display for Unsized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsized::NoRule { function } => write!(f, "pmstate has no width rule for {function}"),
            Unsized::Field { path, expected } => write!(f, "the configs' {path} is not {expected}"),
            Unsized::Overflow => write!(f, "the width overflows"),
        }
    }
}

/// The sizes the width rules read, each from its configs path.
struct Env<'a> {
    configs: &'a Checkpoint,
}

impl Env<'_> {
    fn int(&self, path: &str) -> Result<usize, Unsized> {
        match self.configs.get(path) {
            Some(Node::Int(i)) => usize::try_from(*i).map_err(|_| field(path, "a non-negative int")),
            _ => Err(field(path, "a non-negative int")),
        }
    }

    fn bodies(&self) -> Result<usize, Unsized> {
        self.int("robot.kinematic_info.num_bodies")
    }

    fn dofs(&self) -> Result<usize, Unsized> {
        self.int("robot.kinematic_info.num_dofs")
    }

    fn actions(&self) -> Result<usize, Unsized> {
        self.int("robot.number_of_actions")
    }

    /// `len(robot.contact_bodies)` (None: no contact bodies).
    fn contacts(&self) -> Result<usize, Unsized> {
        let path = "robot.contact_bodies";
        match self.configs.get(path) {
            Some(Node::List(l) | Node::Tuple(l)) => Ok(l.len()),
            Some(Node::None) | None => Ok(0),
            _ => Err(field(path, "a list of body names")),
        }
    }

    /// Steps a `history_steps` / `future_steps` parameter selects: an int
    /// N selects N, a list its length, None all of `all`.
    fn steps(
        &self,
        param: Option<&Node>,
        param_path: &str,
        all: impl Fn() -> Result<usize, Unsized>,
    ) -> Result<usize, Unsized> {
        match param {
            None | Some(Node::None) => all(),
            Some(n) => count_steps(n).ok_or_else(|| field(param_path, "an int or a list of step indices")),
        }
    }

    /// Steps the state history buffer holds.
    fn history(&self) -> Result<usize, Unsized> {
        self.int("env.num_state_history_steps")
    }

    /// Future steps the mimic control's context holds (v3.1 names them
    /// `num_future_steps`).
    fn future(&self) -> Result<usize, Unsized> {
        let path = "env.control_components.mimic.future_steps";
        let v31 = "env.control_components.mimic.num_future_steps";
        match (self.configs.get(path), self.configs.get(v31)) {
            (Some(n), _) => count_steps(n).ok_or_else(|| field(path, "an int or a list of step indices")),
            (None, Some(n)) => count_steps(n).ok_or_else(|| field(v31, "an int")),
            (None, None) => Err(field(path, "an int or a list of step indices")),
        }
    }
}

fn count_steps(n: &Node) -> Option<usize> {
    match n {
        Node::Int(i) => usize::try_from(*i).ok(),
        Node::List(l) | Node::Tuple(l) => Some(l.len()),
        _ => None,
    }
}

fn field(path: &str, expected: &'static str) -> Unsized {
    Unsized::Field { path: path.to_owned(), expected }
}

/// A component's static parameters.
struct Params<'a> {
    dict: Option<&'a pmstate_ckpt::Dict>,
    path: String,
}

impl<'a> Params<'a> {
    fn get(&self, name: &str) -> Option<&'a Node> {
        self.dict.and_then(|d| d.get(name))
    }

    fn path(&self, name: &str) -> String {
        format!("{}.{name}", self.path)
    }

    /// A bool parameter, `default` when absent (the function's default).
    fn flag(&self, name: &str, default: bool) -> Result<bool, Unsized> {
        match self.get(name) {
            None => Ok(default),
            Some(Node::Bool(b)) => Ok(*b),
            Some(_) => Err(field(&self.path(name), "a bool")),
        }
    }
}

/// Overflow-checked `a * b + c` etc. read as a small expression.
fn mul(a: usize, b: usize) -> Result<usize, Unsized> {
    a.checked_mul(b).ok_or(Unsized::Overflow)
}

fn add(parts: &[usize]) -> Result<usize, Unsized> {
    parts.iter().try_fold(0usize, |s, &p| s.checked_add(p)).ok_or(Unsized::Overflow)
}

/// `compute_humanoid_max_coords_observations`: root height (always one
/// column, zeros when off), body positions but the anchor's (3 each),
/// tan-norm rotations (6), velocities and angular velocities (3 each),
/// contacts when observed.
fn max_coords(env: &Env, p: &Params) -> Result<usize, Unsized> {
    let b = env.bodies()?;
    let c = if p.flag("observe_contacts", false)? { env.contacts()? } else { 0 };
    add(&[
        1,
        mul(3, b.checked_sub(1).ok_or_else(|| field("robot.kinematic_info.num_bodies", "at least 1"))?)?,
        mul(12, b)?,
        c,
    ])
}

/// `compute_humanoid_reduced_coords_observations`: joint positions and
/// velocities, root angular velocity and projected gravity (3 each), root
/// velocity (3) and height (1) when asked.
fn reduced_coords(env: &Env, p: &Params) -> Result<usize, Unsized> {
    let d = env.dofs()?;
    let vel = if p.flag("root_vel_obs", false)? { 3 } else { 0 };
    let h = if p.flag("root_height_obs", false)? { 1 } else { 0 };
    add(&[mul(2, d)?, 6, vel, h])
}

/// The width of a component computed by `function`, from its static params
/// (v3.1's `num_steps` / `num_future_steps` where today's has
/// `history_steps` / `future_steps`).
fn rule(function: &str, env: &Env, p: &Params) -> Result<usize, Unsized> {
    let name = function.rsplit('.').next().unwrap_or(function);
    let named = |today: &'static str, v31: &'static str| {
        if p.get(today).is_none() && p.get(v31).is_some() {
            v31
        } else {
            today
        }
    };
    let (h, f) = (named("history_steps", "num_steps"), named("future_steps", "num_future_steps"));
    let history = || env.steps(p.get(h), &p.path(h), || env.history());
    let future = || env.steps(p.get(f), &p.path(f), || env.future());
    match name {
        "compute_humanoid_max_coords_observations" => max_coords(env, p),
        "compute_humanoid_reduced_coords_observations" => reduced_coords(env, p),
        // each selected history step is one max-coords (reduced-coords without root velocity or height) observation
        "compute_historical_max_coords_from_state" => mul(history()?, max_coords(env, p)?),
        "compute_historical_reduced_coords_from_state" => mul(history()?, add(&[mul(2, env.dofs()?)?, 6])?),
        "compute_historical_actions_from_state" => mul(history()?, env.actions()?),
        // per future step: positions from the anchor (3 per body) and rotations (6), their relative
        // counterparts when with_relative, velocity and angular velocity differences (3 + 3) when with_velocities
        "build_max_coords_target_poses" => {
            let b = env.bodies()?;
            let rel = if p.flag("with_relative", true)? { 2 } else { 1 };
            let vel = if p.flag("with_velocities", false)? { 6 } else { 0 };
            mul(future()?, mul(b, add(&[mul(rel, 9)?, vel])?)?)
        }
        // per future step: relative and absolute positions (3 + 3 per body) and rotations (6 + 6)
        "build_max_coords_target_poses_future_rel" => mul(future()?, mul(env.bodies()?, 18)?),
        // per future step: anchor rotation (6), joint velocities and positions, xy offset (2), height (1),
        // anchor velocity and angular velocity (3 each), each when asked
        "build_reduced_coords_target_poses" => {
            let d = env.dofs()?;
            let opt = |flag: &str, default: bool, w: usize| p.flag(flag, default).map(|on| if on { w } else { 0 });
            let per = add(&[
                6,
                opt("include_dof_vel", true, d)?,
                d,
                opt("include_xy_offset", false, 2)?,
                opt("include_height", false, 1)?,
                opt("include_anchor_vel", false, 3)?,
                opt("include_anchor_ang_vel", false, 3)?,
            ])?;
            mul(future()?, per)
        }
        // the vector to the nearest terrain or object surface (3) per observed body:
        // `body_ids` when given, else every body
        "compute_nearest_surface_vectors" => {
            let bodies = match p.get("body_ids") {
                None | Some(Node::None) => env.bodies()?,
                Some(Node::List(l) | Node::Tuple(l)) => l.len(),
                Some(_) => return Err(field(&p.path("body_ids"), "a list of body indices")),
            };
            mul(3, bodies)
        }
        _ => Err(Unsized::NoRule { function: function.to_owned() }),
    }
}

/// The width of every observation component of a resolved-configs file
/// (empty when it has none), in the configs' order.
pub fn observation_widths(configs: &Checkpoint) -> Vec<ComponentWidth> {
    let env = Env { configs };
    let Some(comps) = configs.get(COMPONENTS).and_then(node_fields) else { return Vec::new() };
    comps
        .entries()
        .iter()
        .filter_map(|(k, v)| {
            let component = k.as_str()?.to_owned();
            let path = format!("{COMPONENTS}.{component}");
            let fields = node_fields(v);
            // today's MdpComponent (compute_func, static_params) or v3.1's
            // ObservationComponentConfig (function, variables: constants beside context keys)
            let (func, params) = match fields.map(|f| f.get("compute_func").is_some()) {
                Some(false) if fields.and_then(|f| f.get("function")).is_some() => ("function", "variables"),
                _ => ("compute_func", "static_params"),
            };
            let function = match fields.and_then(|f| f.get(func)) {
                Some(Node::Global { module, name }) => format!("{module}.{name}"),
                _ => {
                    let width = Err(field(&format!("{path}.{func}"), "a function"));
                    return Some(ComponentWidth { component, function: String::new(), width });
                }
            };
            let params = Params {
                dict: fields.and_then(|f| f.get(params)).and_then(node_fields),
                path: format!("{path}.{params}"),
            };
            let width = rule(&function, &env, &params);
            Some(ComponentWidth { component, function, width })
        })
        .collect()
}

/// A dict's entries, or an object's fields.
fn node_fields(n: &Node) -> Option<&pmstate_ckpt::Dict> {
    match n {
        Node::Dict(d) => Some(d),
        Node::Object(o) => o.fields(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(rel: &str) -> String {
        format!("{}/../../testdata/policy/{rel}", env!("CARGO_MANIFEST_DIR"))
    }

    /// Every component of every bundled configs file has the width
    /// record_policy.py got by running its compute function on stand-in
    /// tensors (manifest.json: `real_obs_widths`, else `obs_widths`).
    #[test]
    fn widths_match_what_the_reference_functions_computed() {
        let text = std::fs::read_to_string(data("manifest.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut checked = 0;
        for v in manifest["variants"].as_array().unwrap() {
            let name = v["name"].as_str().unwrap();
            let reference = if v["real_obs_widths"].is_object() { &v["real_obs_widths"] } else { &v["obs_widths"] };
            for file in crate::CONFIG_NAMES {
                let Ok(c) = Checkpoint::open(data(&format!("{name}/{file}"))) else { continue };
                for cw in observation_widths(&c) {
                    if let Some(want) = reference.get(&cw.component).and_then(|w| w.as_u64()) {
                        assert_eq!(cw.width, Ok(want as usize), "{name}/{file}: {}", cw.component);
                        checked += 1;
                    }
                }
            }
        }
        // smpl (3, two files) and g1 (8 + 6)
        assert!(checked >= 20, "only {checked} widths compared");
    }

    /// v3.1's component format (`function`, `variables`, `num_steps`,
    /// `num_future_steps`): the G1 tracker's widths as v3.1's own observation
    /// code computed them (testdata/deploy/manifest.json, recorded by
    /// record_releases_deploy.py).
    #[test]
    fn v31_components_have_the_widths_v31_computed() {
        let dir = format!("{}/../../testdata/deploy", env!("CARGO_MANIFEST_DIR"));
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}/manifest.json")).unwrap()).unwrap();
        let want = &manifest["releases"]["cases"]["v31_g1_tracker"]["obs_widths"];
        let c = Checkpoint::open(format!("{dir}/v31_g1_tracker/resolved_configs_inference.pt")).unwrap();
        let widths = observation_widths(&c);
        let mut checked = 0;
        for (k, w) in want.as_object().unwrap() {
            let cw = widths.iter().find(|c| &c.component == k).unwrap_or_else(|| panic!("{k}"));
            assert_eq!(cw.width, Ok(w.as_u64().unwrap() as usize), "{k}");
            checked += 1;
        }
        assert_eq!(checked, 4);
    }

    #[test]
    fn an_unknown_function_is_open_with_its_name() {
        let c = Checkpoint::open(data("smpl_tracker/resolved_configs.pt")).unwrap();
        let env = Env { configs: &c };
        let p = Params { dict: None, path: "x.static_params".into() };
        assert_eq!(
            rule("protomotions.envs.obs.steering.compute_steering_obs", &env, &p),
            Err(Unsized::NoRule { function: "protomotions.envs.obs.steering.compute_steering_obs".into() })
        );
    }
}
