//! [`Pipeline`]: a checkpoint's observation functions, actor and action
//! function chained, from context tensors to PD targets, as ProtoMotions'
//! `UnifiedPipelineModule` (the graph `export_bm_tracker_onnx.py` exports)
//! computes them.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use pmstate_ckpt::{Checkpoint, Node};
use pmstate_policy::{find_config, LoadOptions, Policy};

use crate::actions::ActionFunction;
use crate::configs::{as_usize, dict_of, Configs, Params};
use crate::context::{
    constant, descriptor, input_name, row_shape, v31_context_path, Constant, Dims, Names, ReferenceFrame,
};
use crate::contract::{
    round6, Contract, Control, Fallback, InputEntry, Metadata, Motion, OutputEntry, Robot, Runtime, Timing,
};
use crate::error::{ConfigProblem, DeployError, Result};
use crate::observations::{Function, Need, ANCHOR_BODY_INDEX, SUPPORTED, SUPPORTED_V31};

/// How a release lays out its observation components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Today's `MdpComponent`: `compute_func`, `dynamic_vars` (pickled
    /// `FieldPath`s), `static_params`.
    MdpComponent,
    /// v3.1's `ObservationComponentConfig`: `function`, one `variables`
    /// dict (a string is a context key, anything else a parameter),
    /// `indices_subset`.
    V31,
    /// v3.0's Mimic env: no components; its observations computed in code,
    /// configured by `env.humanoid_obs` and `env.mimic_obs` ([`crate::v30`]).
    V30,
}

/// The layout of `env.observation_components`: v3.1's when a component
/// has `function` and no `compute_func`.
fn layout(comps: &pmstate_ckpt::Dict) -> Layout {
    let v31 = comps
        .entries()
        .iter()
        .filter_map(|(_, n)| dict_of(n))
        .any(|f| f.get("function").is_some() && f.get("compute_func").is_none());
    if v31 {
        Layout::V31
    } else {
        Layout::MdpComponent
    }
}

/// The output names, in the graph's order.
pub const OUTPUT_NAMES: [&str; 4] = ["actions", "joint_pos_targets", "stiffness_targets", "damping_targets"];

/// One pipeline input: a context path the observations read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Its name (the path sanitized, as the exported graph names it).
    pub name: String,
    /// The context path (`current.dof_pos`).
    pub path: String,
    /// The shape of one batch row.
    pub row_shape: Vec<usize>,
}

impl Input {
    /// Floats per batch row.
    pub fn row_len(&self) -> usize {
        self.row_shape.iter().product()
    }

    fn shape_names(&self) -> Vec<String> {
        std::iter::once("B".to_owned()).chain(self.row_shape.iter().map(usize::to_string)).collect()
    }
}

/// One observation the actor reads, computed from the inputs.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Its key (`noisy_reduced_coords_obs`).
    pub key: String,
    /// The qualified name of its compute function.
    pub function: String,
    /// The function with its parameters.
    pub compute: Function,
    /// Each argument read and the input bound to it (`None`: an optional
    /// argument left unbound).
    pub args: Vec<(&'static str, Option<usize>)>,
    /// Output floats per row.
    pub width: usize,
}

/// The pipeline's outputs, each `[B, num_dofs]`.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The actor's mean action.
    pub actions: Tensor,
    /// PD position targets.
    pub joint_pos_targets: Tensor,
    /// Stiffness per joint.
    pub stiffness_targets: Tensor,
    /// Damping per joint.
    pub damping_targets: Tensor,
}

impl Outputs {
    /// The outputs by their graph names, in order.
    pub fn named(&self) -> [(&'static str, &Tensor); 4] {
        [
            (OUTPUT_NAMES[0], &self.actions),
            (OUTPUT_NAMES[1], &self.joint_pos_targets),
            (OUTPUT_NAMES[2], &self.stiffness_targets),
            (OUTPUT_NAMES[3], &self.damping_targets),
        ]
    }
}

/// The buffers of one control step, kept by the [`crate::Tracker`].
#[derive(Debug, Default)]
pub(crate) struct StepScratch {
    obs: Vec<Vec<f32>>,
    actor: pmstate_policy::ActorScratch,
    mean: Vec<f32>,
}

/// A deployable tracker: observations, actor, action function.
#[derive(Debug)]
pub struct Pipeline {
    policy: Policy,
    /// For each of the actor's keys ([`Policy::actor_keys`]), its observation's index.
    actor_obs: Vec<usize>,
    dims: Dims,
    inputs: Vec<Input>,
    observations: Vec<Observation>,
    action: ActionFunction,
    contract: Contract,
    limits: RobotLimits,
    reference_frame: ReferenceFrame,
}

/// The limits a robot config gives, per joint in the contract's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RobotLimits {
    /// `robot.kinematic_info.dof_limits_lower` and `dof_limits_upper`
    /// (radians; infinite: no limit).
    pub joints: Option<crate::envelope::JointLimits>,
    /// `robot.control.control_info.<joint>.velocity_limit` (radians per
    /// second), when every joint has one.
    pub velocity: Option<Vec<f32>>,
}

/// Reads [`RobotLimits`], each value held to its domain: limits not NaN
/// with lower <= upper, velocity limits finite and > 0.
fn robot_limits(c: &Configs, joints: &[String]) -> Result<RobotLimits> {
    let nd = joints.len();
    let (lo_key, hi_key) = ("robot.kinematic_info.dof_limits_lower", "robot.kinematic_info.dof_limits_upper");
    let joint_limits = match (c.ckpt.get(lo_key), c.ckpt.get(hi_key)) {
        (Some(Node::Tensor(_)), Some(Node::Tensor(_))) => {
            let (lower, upper) = (c.f32_tensor(lo_key)?, c.f32_tensor(hi_key)?);
            for (key, v) in [(lo_key, &lower), (hi_key, &upper)] {
                if v.len() != nd {
                    return Err(c.bad(key, ConfigProblem::Length { got: v.len(), expected: nd }));
                }
            }
            for (j, (lo, hi)) in lower.iter().zip(&upper).enumerate() {
                let ok = !lo.is_nan() && !hi.is_nan() && lo <= hi;
                crate::limits::domain(
                    &c.file,
                    &format!("{lo_key}[{j}]"),
                    f64::from(*lo),
                    ok,
                    "not NaN and <= dof_limits_upper",
                )?;
            }
            Some(crate::envelope::JointLimits { lower, upper })
        }
        _ => None,
    };
    let mut velocity = Vec::with_capacity(nd);
    for j in joints {
        let key = format!("robot.control.control_info.{j}.velocity_limit");
        match c.ckpt.get(&key) {
            None | Some(Node::None) => break,
            Some(_) => {
                let v = c.f64(&key)?;
                crate::limits::domain(&c.file, &key, v, v.is_finite() && v > 0.0, "a finite number > 0, or None")?;
                velocity.push(v as f32);
            }
        }
    }
    Ok(RobotLimits { joints: joint_limits, velocity: (velocity.len() == nd && nd > 0).then_some(velocity) })
}

pub(crate) const COMPONENTS: &str = "env.observation_components";

impl Pipeline {
    /// Loads the pipeline of a ProtoMotions checkpoint: the actor as
    /// [`Policy::load`] does, the observation and action components from
    /// the resolved configs next to it (or `config`).
    pub fn load(checkpoint: impl AsRef<Path>, config: Option<&Path>) -> Result<Self> {
        Self::load_with(checkpoint, config, &LoadOptions::default())
    }

    /// [`Pipeline::load`] with explicit options.
    pub fn load_with(checkpoint: impl AsRef<Path>, config: Option<&Path>, opts: &LoadOptions) -> Result<Self> {
        let checkpoint = checkpoint.as_ref();
        let policy = Policy::load_with(checkpoint, config, &Device::Cpu, opts)?;
        let config_path = find_config(checkpoint, config)?;
        let c = Configs { ckpt: Checkpoint::open(&config_path)?, file: config_path.display().to_string() };
        Self::build(policy, &c, checkpoint.display().to_string())
    }

    fn build(policy: Policy, c: &Configs, checkpoint: String) -> Result<Self> {
        let joints = c.strings("robot.kinematic_info.dof_names")?;
        let bodies = c.strings("robot.kinematic_info.body_names")?;
        let num_dofs = joints.len();
        let anchor_name = match c.ckpt.get("robot.anchor_body_name") {
            None | Some(Node::None) => None,
            Some(_) => Some(c.str("robot.anchor_body_name")?),
        };
        let v30_no_anchor = crate::v30::config::is_v30(c) && c.ckpt.get("robot.anchor_body_index").is_none();
        // v3.0's robot configs name no anchor: its observations read the root
        let anchor_index = if v30_no_anchor { 0 } else { anchor_body_index(c)? };
        let Some(anchor_body) = bodies.get(anchor_index) else {
            return Err(c.bad(
                "robot.anchor_body_index",
                ConfigProblem::Unsupported {
                    value: anchor_index.to_string(),
                    supported: "an index into robot.kinematic_info.body_names",
                },
            ));
        };
        // where the config names no anchor, body `anchor_body_index` is it
        let anchor = anchor_name.clone().unwrap_or_else(|| anchor_body.clone());
        // The actor's observations, in the order the environment lists them.
        let actor_keys = policy.actor_keys();
        let mut fallbacks = Vec::new();
        if v30_no_anchor {
            fallbacks.push(Fallback {
                field: "anchor_body_index",
                release: "v3.0",
                key: "robot.kinematic_info.body_names".into(),
                semantics: "no anchor body: v3.0's observations read the root (body 0), which is the anchor here (its rotation drives the tilt guard)",
            });
        }
        let (layout, mut parsed, future_indices, v30_history) = if crate::v30::config::is_v30(c) {
            let dt = timing(c)?.control_dt;
            let o = crate::v30::config::observations(c, &actor_keys, num_dofs, dt)?;
            fallbacks.extend(o.fallbacks);
            (Layout::V30, o.components, o.future_indices, o.history_steps)
        } else {
            let comps = c.node(COMPONENTS)?;
            let comps = dict_of(comps).ok_or_else(|| {
                c.bad(COMPONENTS, ConfigProblem::WrongType { expected: "a dict", found: comps.kind().into() })
            })?;
            let layout = layout(comps);
            if layout == Layout::V31 {
                fallbacks.push(Fallback {
                    field: "observations",
                    release: "v3.1",
                    key: COMPONENTS.into(),
                    semantics: "ObservationComponentConfig: `function` and `variables` (a string is a context key of BaseEnv or MimicControl, mapped to a context path; anything else a parameter); noisy_* keys are the same readings (observation noise is off on a robot)",
                });
            }
            let (future_indices, future_source) = future_step_indices(c)?;
            fallbacks.extend(future_source);
            for k in &actor_keys {
                if comps.get(k).is_none() {
                    return Err(DeployError::MissingObservation { file: c.file.clone(), key: k.clone() });
                }
            }
            let mut parsed = Vec::new();
            for (k, node) in comps.entries() {
                let Some(key) = k.as_str() else { continue };
                if actor_keys.iter().any(|a| a == key) {
                    parsed.push(match layout {
                        Layout::MdpComponent => read_component(c, key, node)?,
                        Layout::V31 | Layout::V30 => read_v31_component(c, key, node)?,
                    });
                }
            }
            (layout, parsed, future_indices, 0)
        };
        // Constant bindings (the anchor's index) become parameters.
        for (key, f, bindings) in &mut parsed {
            for (arg, path) in bindings.iter() {
                let at = || format!("{COMPONENTS}.{key}.dynamic_vars.{arg}");
                match constant(path) {
                    Some(Constant::AnchorIndex) if arg == ANCHOR_BODY_INDEX && f.takes_anchor_index() => {
                        f.set_anchor_index(anchor_index)
                    }
                    Some(_) if f.arguments().iter().any(|(a, _)| a == arg) => {
                        return Err(c.bad(
                            &at(),
                            ConfigProblem::WrongType { expected: "a tensor context path", found: path.clone() },
                        ))
                    }
                    None if arg == ANCHOR_BODY_INDEX && f.takes_anchor_index() => {
                        return Err(c.bad(
                            &at(),
                            ConfigProblem::Unsupported {
                                value: path.clone(),
                                supported: "current.anchor_idx or mimic.anchor_idx (the robot's anchor_body_index)",
                            },
                        ))
                    }
                    _ => {}
                }
            }
        }
        let needed = parsed.iter().map(|(_, f, _)| f.history_needed()).max().unwrap_or(0).max(1);
        let history_steps = match layout {
            Layout::MdpComponent => needed,
            // v3.0's HistoryBuffer holds the current step and the past ones
            Layout::V30 => v30_history.max(1),
            // v3.1's StateHistoryBuffer holds num_state_history_steps past
            // steps, and a function with num_steps None reads them all
            Layout::V31 => {
                let key = "env.num_state_history_steps";
                let h = c.usize(key)?;
                if h > crate::limits::MAX_HISTORY_STEPS {
                    return Err(c.bad(key, ConfigProblem::Bound { value: h, bound: crate::limits::MAX_HISTORY_STEPS }));
                }
                if h == 0
                    && parsed.iter().any(|(_, f, _)| {
                        matches!(f, Function::HistoricalActions(_) | Function::HistoricalReducedCoords(_))
                    })
                {
                    return Err(c.bad(
                        key,
                        ConfigProblem::Unsupported {
                            value: "0".into(),
                            supported: "1 or more: the actor reads the state history",
                        },
                    ));
                }
                fallbacks.push(Fallback {
                    field: "history_steps",
                    release: "v3.1",
                    key: key.into(),
                    semantics: "StateHistoryBuffer: the past num_state_history_steps steps, most recent first, every slot the first reading after a reset (reset_from_single_state); its actions are the clamped actions pushed with the state they led to, so historical_actions start two steps back, zeros after a reset",
                });
                h.max(1)
            }
        };
        if history_steps > crate::limits::MAX_HISTORY_STEPS {
            return Err(c.bad(
                COMPONENTS,
                ConfigProblem::Bound { value: history_steps, bound: crate::limits::MAX_HISTORY_STEPS },
            ));
        }
        let dims = Dims { num_dofs, num_bodies: bodies.len(), future_steps: future_indices.len(), history_steps };

        // Inputs: every path a read argument is bound to, sorted (the graph's order).
        let mut all_paths = BTreeSet::new();
        let mut read_paths = BTreeSet::new();
        for (key, f, bindings) in &parsed {
            let component = format!("{COMPONENTS}.{key}");
            for (arg, path) in bindings {
                if constant(path).is_some() {
                    // a constant of the graph, not a context key
                    continue;
                }
                all_paths.insert(path.clone());
                if f.arguments().iter().any(|(a, _)| a == arg) {
                    if row_shape(path, &dims).is_none() {
                        return Err(DeployError::UnknownContextPath {
                            file: c.file.clone(),
                            component,
                            argument: arg.clone(),
                            path: path.clone(),
                        });
                    }
                    read_paths.insert(path.clone());
                }
            }
            for (arg, need) in f.arguments() {
                if need == Need::Required && !bindings.iter().any(|(a, _)| a == arg) {
                    return Err(c.bad(&format!("{component}.dynamic_vars.{arg}"), ConfigProblem::Missing));
                }
            }
        }
        let inputs: Vec<Input> = read_paths
            .iter()
            .map(|p| Input { name: input_name(p), path: p.clone(), row_shape: row_shape(p, &dims).unwrap_or_default() })
            .collect();
        let mut observations = Vec::new();
        for (key, f, bindings) in parsed {
            let width = f.width(&dims).ok_or_else(|| {
                c.bad(
                    &format!("{COMPONENTS}.{key}.static_params"),
                    ConfigProblem::Unsupported {
                        value: "a step beyond what the context holds".into(),
                        supported: "steps within the configured future steps and history",
                    },
                )
            })?;
            let args = f
                .arguments()
                .into_iter()
                .map(|(a, _)| {
                    let idx = bindings
                        .iter()
                        .find(|(b, _)| b == a)
                        .and_then(|(_, p)| inputs.iter().position(|i| &i.path == p));
                    (a, idx)
                })
                .collect();
            let function = f.qualified_name().to_owned();
            observations.push(Observation { key, function, compute: f, args, width });
        }
        check_actor_widths(c, &policy, &observations)?;
        let action = match (layout, c.ckpt.get("env.action_config")) {
            (Layout::V31 | Layout::V30, None) => {
                fallbacks.push(Fallback {
                    field: "action",
                    release: if layout == Layout::V30 { "v3.0" } else { "v3.1" },
                    key: "robot.control".into(),
                    semantics: "no env.action_config: BaseEnv.process_actions clamps to clamp_actions, the simulator's targets are offset + scale * action with build_pd_action_offset_scale of the joint limits and action_scale; gains from control_info",
                });
                ActionFunction::read_v31(c, &joints)?
            }
            _ => ActionFunction::read(c, num_dofs)?,
        };
        if policy.action_size() != num_dofs {
            return Err(c.bad(
                "robot.kinematic_info.dof_names",
                ConfigProblem::Length { got: num_dofs, expected: policy.action_size() },
            ));
        }
        let names = Names { joints: &joints, bodies: &bodies, anchor: &anchor };
        let contract = contract(
            c,
            &ContractParts {
                checkpoint,
                dims: &dims,
                names: &names,
                anchor_index,
                anchor_name,
                inputs: &inputs,
                all_paths: all_paths.into_iter().collect(),
                future_indices,
                action: &action,
                fallbacks,
            },
        )?;
        // every actor key has an observation (checked above, MissingObservation)
        let actor_obs = policy
            .actor_keys()
            .iter()
            .map(|k| observations.iter().position(|o| &o.key == k))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| DeployError::MissingObservation {
                file: c.file.clone(),
                key: policy.actor_keys().join(", "),
            })?;
        let limits = robot_limits(c, &joints)?;
        let reference_frame =
            if layout == Layout::V30 { ReferenceFrame::ClipRealigned } else { ReferenceFrame::StartAligned };
        Ok(Pipeline { policy, actor_obs, dims, inputs, observations, action, contract, limits, reference_frame })
    }

    /// Where the tracker expresses the references ([`ReferenceFrame`]).
    pub fn reference_frame(&self) -> ReferenceFrame {
        self.reference_frame
    }

    /// The joint position and velocity limits the robot config gives (the
    /// safety envelope's defaults, [`crate::TrackerOptions::new`]).
    pub fn limits(&self) -> &RobotLimits {
        &self.limits
    }

    /// The inputs, in the graph's order.
    pub fn inputs(&self) -> &[Input] {
        &self.inputs
    }

    /// The observations the actor reads, in the environment's order.
    pub fn observations(&self) -> &[Observation] {
        &self.observations
    }

    /// The robot and motion sizes.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    /// The action function.
    pub fn action(&self) -> &ActionFunction {
        &self.action
    }

    /// The policy (actor, critic and any discriminator).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The deployment contract.
    pub fn contract(&self) -> &Contract {
        &self.contract
    }

    /// Checks `inputs` (every input present, float32 `[B, ...row_shape]`,
    /// one B, nothing else) and returns them flattened, in input order.
    fn check_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<(usize, Vec<Vec<f32>>)> {
        let names: Vec<String> = self.inputs.iter().map(|i| i.name.clone()).collect();
        let mut given: Vec<&String> = inputs.keys().collect();
        given.sort();
        if let Some(extra) = given.into_iter().find(|g| !names.contains(g)) {
            return Err(DeployError::UnknownInput { name: extra.clone(), names });
        }
        let mut batch: Option<(usize, &str)> = None;
        let mut flat = Vec::with_capacity(self.inputs.len());
        for i in &self.inputs {
            let t = inputs.get(&i.name).ok_or_else(|| DeployError::MissingInput {
                name: i.name.clone(),
                expected: i.shape_names(),
                names: names.clone(),
            })?;
            let dims = t.dims();
            if t.dtype() != DType::F32 || dims.len() != i.row_shape.len() + 1 || dims[1..] != i.row_shape[..] {
                return Err(DeployError::InputShape {
                    name: i.name.clone(),
                    expected: i.shape_names(),
                    found: format!("{} [{}]", t.dtype().as_str(), crate::error::join(dims)),
                });
            }
            match batch {
                None => batch = Some((dims[0], &i.name)),
                Some((b, _)) if b != dims[0] => {
                    return Err(DeployError::Batch { name: i.name.clone(), got: dims[0], others: b })
                }
                _ => {}
            }
            flat.push(t.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok((batch.map_or(0, |(b, _)| b), flat))
    }

    /// The observations of `inputs`, by key, each `[B, width]`.
    pub fn compute_observations(&self, inputs: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
        let (batch, flat) = self.check_inputs(inputs)?;
        self.observations_of(batch, &flat)
    }

    fn observations_of(&self, batch: usize, flat: &[Vec<f32>]) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for o in &self.observations {
            let mut v = vec![0f32; batch * o.width];
            for r in 0..batch {
                let arg = |name: &str| -> Option<&[f32]> {
                    let (_, idx) = o.args.iter().find(|(a, _)| *a == name)?;
                    let idx = (*idx)?;
                    let len = self.inputs[idx].row_len();
                    flat[idx].get(r * len..(r + 1) * len)
                };
                self.compute_row(o, &arg, &mut v[r * o.width..(r + 1) * o.width]);
            }
            out.insert(o.key.clone(), Tensor::from_vec(v, (batch, o.width), &Device::Cpu)?);
        }
        Ok(out)
    }

    fn compute_row<'a>(&self, o: &Observation, arg: &dyn Fn(&str) -> Option<&'a [f32]>, out: &mut [f32]) {
        o.compute.compute_row(&self.dims, arg, out);
    }

    /// Runs the pipeline: observations, the actor's mean action, PD targets.
    pub fn forward(&self, inputs: &HashMap<String, Tensor>) -> Result<Outputs> {
        let (batch, flat) = self.check_inputs(inputs)?;
        self.forward_flat(batch, &flat)
    }

    /// One row through the pipeline in the caller's buffers (`flat`: the
    /// inputs in input order, one row each): observations, the actor's mean
    /// action (allocation-free for a flat actor, see
    /// [`Policy::mean_action_into`]), the action function. Once `scratch`
    /// has grown, a step allocates nothing when the actor is flat; otherwise
    /// it runs [`Pipeline::forward_flat`] and copies.
    pub(crate) fn step_into(
        &self,
        flat: &[Vec<f32>],
        scratch: &mut StepScratch,
        actions: &mut [f32],
        targets: &mut [f32],
    ) -> Result<()> {
        let StepScratch { obs, actor, mean } = scratch;
        obs.resize_with(self.observations.len(), Vec::new);
        for (o, buf) in self.observations.iter().zip(obs.iter_mut()) {
            buf.clear();
            buf.resize(o.width, 0.0);
            let arg = |name: &str| -> Option<&[f32]> {
                let (_, idx) = o.args.iter().find(|(a, _)| *a == name)?;
                flat.get((*idx)?).map(Vec::as_slice)
            };
            o.compute.compute_row(&self.dims, &arg, buf);
        }
        let obs: &[Vec<f32>] = obs;
        let ran = self.policy.mean_action_into(1, &|i| obs[self.actor_obs[i]].as_slice(), actor, mean)?;
        if ran {
            actions.copy_from_slice(mean);
        } else {
            let out = self.forward_flat(1, flat)?;
            actions.copy_from_slice(&out.actions.flatten_all()?.to_vec1::<f32>()?);
        }
        self.action.targets(actions, targets);
        Ok(())
    }

    /// [`Pipeline::forward`] on inputs already checked and flattened, in
    /// input order, each `batch` rows of its row length.
    pub(crate) fn forward_flat(&self, batch: usize, flat: &[Vec<f32>]) -> Result<Outputs> {
        let obs = self.observations_of(batch, flat)?;
        let actions = self.policy.mean_action(&obs)?;
        let nd = self.dims.num_dofs;
        let a = actions.flatten_all()?.to_vec1::<f32>()?;
        let mut targets = vec![0f32; a.len()];
        for (row, out) in a.chunks(nd).zip(targets.chunks_mut(nd)) {
            self.action.targets(row, out);
        }
        let repeat = |v: &[f32]| -> Result<Tensor> {
            let mut all = Vec::with_capacity(batch * nd);
            for _ in 0..batch {
                all.extend_from_slice(v);
            }
            Ok(Tensor::from_vec(all, (batch, nd), &Device::Cpu)?)
        };
        Ok(Outputs {
            joint_pos_targets: Tensor::from_vec(targets, (batch, nd), &Device::Cpu)?,
            stiffness_targets: repeat(&self.action.stiffness)?,
            damping_targets: repeat(&self.action.damping)?,
            actions,
        })
    }
}

/// One actor observation component: its key, function, bindings (argument, path).
type Component = (String, Function, Vec<(String, String)>);

fn read_component(c: &Configs, key: &str, node: &Node) -> Result<Component> {
    let component = format!("{COMPONENTS}.{key}");
    let fields = dict_of(node).ok_or_else(|| {
        c.bad(&component, ConfigProblem::WrongType { expected: "an MdpComponent", found: node.kind().into() })
    })?;
    let func_key = format!("{component}.compute_func");
    let qualified = match fields.get("compute_func") {
        Some(Node::Global { module, name }) => format!("{module}.{name}"),
        Some(other) => {
            return Err(c.bad(
                &func_key,
                ConfigProblem::WrongType { expected: "a function (a pickled global)", found: other.kind().into() },
            ))
        }
        None => return Err(c.bad(&func_key, ConfigProblem::Missing)),
    };
    let params =
        Params::new(&c.file, format!("{component}.static_params"), fields.get("static_params").and_then(dict_of));
    let Some(function) = Function::from_params(&qualified, &params)? else {
        return Err(DeployError::UnknownFunction {
            file: c.file.clone(),
            component,
            function: qualified,
            supported: SUPPORTED.iter().map(|s| (*s).to_owned()).collect(),
        });
    };
    let mut bindings = Vec::new();
    if let Some(vars) = fields.get("dynamic_vars").and_then(dict_of) {
        for (arg, path) in vars.entries() {
            let Some(arg) = arg.as_str() else { continue };
            let at = format!("{component}.dynamic_vars.{arg}");
            let path = context_path(path).ok_or_else(|| {
                c.bad(
                    &at,
                    ConfigProblem::WrongType { expected: "a context path (FieldPath)", found: path.kind().into() },
                )
            })?;
            bindings.push((arg.to_owned(), path));
        }
    }
    Ok((key.to_owned(), function, bindings))
}

/// A v3.1 `ObservationComponentConfig`: its function, its `variables`
/// (strings bind arguments to context keys, mapped by
/// [`v31_context_path`]; a key with no counterpart is kept as is, so that
/// an argument reading it is refused by name), its parameters.
fn read_v31_component(c: &Configs, key: &str, node: &Node) -> Result<Component> {
    let component = format!("{COMPONENTS}.{key}");
    let fields = dict_of(node).ok_or_else(|| {
        c.bad(
            &component,
            ConfigProblem::WrongType { expected: "an ObservationComponentConfig", found: node.kind().into() },
        )
    })?;
    let func_key = format!("{component}.function");
    let qualified = match fields.get("function") {
        Some(Node::Global { module, name }) => format!("{module}.{name}"),
        Some(other) => {
            return Err(c.bad(
                &func_key,
                ConfigProblem::WrongType { expected: "a function (a pickled global)", found: other.kind().into() },
            ))
        }
        None => return Err(c.bad(&func_key, ConfigProblem::Missing)),
    };
    match fields.get("indices_subset") {
        None | Some(Node::None) => {}
        Some(other) => {
            return Err(c.bad(
                &format!("{component}.indices_subset"),
                ConfigProblem::Unsupported { value: other.kind().into(), supported: "None (every body)" },
            ))
        }
    }
    let vars = fields.get("variables").and_then(dict_of);
    let params = Params::inline(&c.file, format!("{component}.variables"), vars);
    let Some(function) = Function::from_v31_params(&qualified, &params)? else {
        return Err(DeployError::UnknownFunction {
            file: c.file.clone(),
            component,
            function: qualified,
            supported: SUPPORTED_V31.iter().map(|s| (*s).to_owned()).collect(),
        });
    };
    let mut bindings = Vec::new();
    for (arg, value) in vars.map(|d| d.entries()).unwrap_or_default() {
        let (Some(arg), Node::Str(ctx)) = (arg.as_str(), value) else { continue };
        let path = v31_context_path(ctx).map_or_else(|| ctx.clone(), str::to_owned);
        bindings.push((arg.to_owned(), path));
    }
    Ok((key.to_owned(), function, bindings))
}

/// `robot.anchor_body_index`: an int, or a string holding one (v3.1's
/// YAML dumps of the resolved configs write every value as a string).
fn anchor_body_index(c: &Configs) -> Result<usize> {
    let key = "robot.anchor_body_index";
    match c.node(key)? {
        Node::Int(i) => usize::try_from(*i).map_err(|_| {
            c.bad(key, ConfigProblem::OutOfDomain { value: i.to_string(), domain: "a body index (an int >= 0)" })
        }),
        Node::Str(s) => s.trim().parse::<usize>().map_err(|_| {
            c.bad(
                key,
                ConfigProblem::WrongType {
                    expected: "an int, or a string holding a non-negative integer",
                    found: format!("the string '{s}'"),
                },
            )
        }),
        other => Err(c.bad(key, ConfigProblem::WrongType { expected: "an int", found: other.kind().into() })),
    }
}

/// The dotted path of a pickled `FieldPath` (`__reduce_ex__` state
/// `(None, {name, _parent_path})`), or of a plain string.
fn context_path(n: &Node) -> Option<String> {
    let fields = match n {
        Node::Str(s) => return Some(s.clone()),
        Node::Object(o) => match &o.state {
            Some(Node::Tuple(t)) | Some(Node::List(t)) => t.iter().find_map(dict_of)?,
            Some(other) => dict_of(other)?,
            None => return None,
        },
        _ => return None,
    };
    let name = fields.get("name")?.as_str()?;
    let parent = fields.get("_parent_path").and_then(Node::as_str).unwrap_or("");
    Some(if parent.is_empty() { name.to_owned() } else { format!("{parent}.{name}") })
}

/// `env.control_components.mimic.future_steps`: a list of step offsets, or
/// N for 1..=N. A release whose mimic control has no `future_steps` but
/// `num_future_steps` (v3.1's `MimicControlConfig`: references at times
/// `t + k dt`, k = 1..=N) gives 1..=N, and says so (the [`Fallback`]).
fn future_step_indices(c: &Configs) -> Result<(Vec<usize>, Option<Fallback>)> {
    use crate::limits::{MAX_FUTURE_OFFSET, MAX_FUTURE_STEPS};
    let today = "env.control_components.mimic.future_steps";
    let v31 = "env.control_components.mimic.num_future_steps";
    let (key, fallback) = match (c.ckpt.get(today), c.ckpt.get(v31)) {
        (None, Some(_)) => (
            v31,
            Some(Fallback {
                field: "future_steps",
                release: "v3.1",
                key: v31.into(),
                semantics: "v3.1 mimic control num_future_steps: MimicControl's references at t + k dt, k = 1..=N",
            }),
        ),
        _ => (today, None),
    };
    let bound = |value: usize, bound: usize| c.bad(key, ConfigProblem::Bound { value, bound });
    let steps: Vec<usize> = match c.node(key)? {
        Node::List(v) | Node::Tuple(v) if fallback.is_none() => {
            if v.len() > MAX_FUTURE_STEPS {
                return Err(bound(v.len(), MAX_FUTURE_STEPS));
            }
            v.iter()
                .map(|n| {
                    as_usize(n).ok_or_else(|| {
                        c.bad(key, ConfigProblem::WrongType { expected: "a list of ints", found: n.kind().into() })
                    })
                })
                .collect::<Result<_>>()?
        }
        n => {
            let expected = if fallback.is_some() { "an int" } else { "an int or a list of ints" };
            let count =
                as_usize(n).ok_or_else(|| c.bad(key, ConfigProblem::WrongType { expected, found: n.kind().into() }))?;
            // checked before the list is made: a huge count is an error, not an allocation
            if count > MAX_FUTURE_STEPS {
                return Err(bound(count, MAX_FUTURE_STEPS));
            }
            (1..=count).collect()
        }
    };
    if let Some(&far) = steps.iter().find(|&&s| s > MAX_FUTURE_OFFSET) {
        return Err(bound(far, MAX_FUTURE_OFFSET));
    }
    Ok((steps, fallback))
}

/// The observations the configs imply against the widths the actor's
/// checkpoint reads: each key whose width the checkpoint fixes, and each
/// sum a first layer fixes over several keys. A mismatch (future or history
/// steps that do not fit the trained actor) is refused here, at load,
/// naming both widths, rather than failing every step.
fn check_actor_widths(c: &Configs, policy: &Policy, observations: &[Observation]) -> Result<()> {
    let widths = policy.widths();
    let width_of = |k: &str| observations.iter().find(|o| o.key == k).map(|o| o.width);
    for o in observations {
        if let Some(&actor) = widths.known.get(&o.key) {
            if actor != o.width {
                return Err(DeployError::Width {
                    file: c.file.clone(),
                    key: o.key.clone(),
                    observations: o.width,
                    actor,
                });
            }
        }
    }
    for g in &widths.groups {
        let parts: Option<Vec<usize>> =
            g.keys.iter().map(|k| width_of(k).or_else(|| widths.known.get(k).copied())).collect();
        let Some(parts) = parts else { continue };
        if !g.keys.iter().any(|k| width_of(k).is_some()) {
            continue;
        }
        let sum = parts.iter().try_fold(0usize, |a, &w| a.checked_add(w)).unwrap_or(usize::MAX);
        if sum != g.total {
            return Err(DeployError::Width {
                file: c.file.clone(),
                key: format!("{} (at {})", g.keys.join(" + "), g.path),
                observations: sum,
                actor: g.total,
            });
        }
    }
    Ok(())
}

struct ContractParts<'a> {
    checkpoint: String,
    dims: &'a Dims,
    names: &'a Names<'a>,
    anchor_index: usize,
    anchor_name: Option<String>,
    inputs: &'a [Input],
    all_paths: Vec<String>,
    future_indices: Vec<usize>,
    action: &'a ActionFunction,
    fallbacks: Vec<Fallback>,
}

/// Per-joint values of `robot.control.control_info[joint].<field>`.
fn per_joint(c: &Configs, joints: &[String], field: &str) -> Result<Vec<f64>> {
    joints.iter().map(|j| c.f64(&format!("robot.control.control_info.{j}.{field}"))).collect()
}

/// Timing as the exporter derives it: MuJoCo's parameters of the robot
/// config (what `update_simulator_config_for_test` switches to), else the
/// training simulator's, else 1 kHz physics at decimation 20.
///
/// A source whose keys are present is used and held to its domain (fps in
/// (0, [`crate::limits::MAX_FPS`]], decimation in 1 to
/// [`crate::limits::MAX_DECIMATION`], the control period at most
/// [`crate::limits::MAX_CONTROL_DT`]): a decimation of 0 is an error, not a
/// control period of 0.
fn timing(c: &Configs) -> Result<Timing> {
    use crate::limits::{domain, MAX_CONTROL_DT, MAX_DECIMATION, MAX_FPS};
    let read = |base: &str| -> Result<Option<(f64, usize)>> {
        let (fps_key, dec_key) = (format!("{base}.fps"), format!("{base}.decimation"));
        if c.ckpt.get(&fps_key).is_none() || c.ckpt.get(&dec_key).is_none() {
            return Ok(None);
        }
        let fps = c.f64(&fps_key)?;
        domain(&c.file, &fps_key, fps, fps.is_finite() && fps > 0.0 && fps <= MAX_FPS, "a frame rate in (0, 100000]")?;
        let dec = c.usize(&dec_key)?;
        domain(&c.file, &dec_key, dec as f64, (1..=MAX_DECIMATION).contains(&dec), "an int in 1 to 10000")?;
        let control_dt = dec as f64 / fps;
        domain(&c.file, &dec_key, dec as f64, control_dt <= MAX_CONTROL_DT, "at most 1 s of physics per control step")?;
        Ok(Some((fps, dec)))
    };
    let source = match read("robot.simulation_params.mujoco")? {
        Some(s) => Some(s),
        None => read("simulator.sim")?,
    };
    let (physics_dt, decimation) = source.map_or((0.001, 20), |(fps, dec)| (1.0 / fps, dec));
    Ok(Timing { control_dt: physics_dt * decimation as f64, physics_dt, decimation })
}

fn contract(c: &Configs, p: &ContractParts<'_>) -> Result<Contract> {
    let joints = p.names.joints.to_vec();
    let bodies = p.names.bodies.to_vec();
    let stiffness = per_joint(c, &joints, "stiffness")?;
    let damping = per_joint(c, &joints, "damping")?;
    let effort_limits = per_joint(c, &joints, "effort_limit").ok();
    for (field, values) in
        [("stiffness", Some(&stiffness)), ("damping", Some(&damping)), ("effort_limit", effort_limits.as_ref())]
    {
        for (j, &v) in joints.iter().zip(values.into_iter().flatten()) {
            let key = format!("robot.control.control_info.{j}.{field}");
            crate::limits::domain(&c.file, &key, v, v.is_finite() && v >= 0.0, "a finite number >= 0")?;
        }
    }
    let timing = timing(c)?;
    let pd_target_max_accel = c.opt_f64("simulator.pd_target_max_accel")?;
    if let Some(a) = pd_target_max_accel {
        let key = "simulator.pd_target_max_accel";
        crate::limits::domain(&c.file, key, a, a.is_finite() && a > 0.0, "a finite number > 0, or None")?;
    }
    let nf = p.future_indices.len();
    let mut policy_inputs = Vec::new();
    let mut name_to_key = serde_json::Map::new();
    for i in p.inputs {
        let d = descriptor(&i.path, p.names);
        let mut shape = vec![1];
        shape.extend(&i.row_shape);
        policy_inputs.push(InputEntry {
            name: i.name.clone(),
            key: i.path.clone(),
            shape,
            kind: d.as_ref().map_or("unknown", |d| d.kind),
            output_key: d.as_ref().and_then(|d| d.feedback).map(|f| f.output_key()),
            future_steps: d.as_ref().filter(|d| d.future).map(|_| nf),
            element_names: d.and_then(|d| d.element_names),
        });
        name_to_key.insert(i.name.clone(), serde_json::Value::String(i.path.clone()));
    }
    let out = |name: &'static str, joints_listed: bool| OutputEntry {
        name,
        kind: name,
        key: name,
        shape: vec![1, p.dims.num_dofs],
        joint_names: joints_listed.then(|| joints.clone()),
    };
    let in_names: Vec<String> = p.inputs.iter().map(|i| i.name.clone()).collect();
    let read: Vec<&String> = p.inputs.iter().map(|i| &i.path).collect();
    let f64s = |v: &[f32]| v.iter().map(|x| f64::from(*x)).collect::<Vec<f64>>();
    Ok(Contract {
        kind: "unified_pipeline",
        dt: timing.control_dt,
        joint_names: joints.clone(),
        body_names: bodies.clone(),
        default_joint_stiffness: stiffness.clone(),
        default_joint_damping: damping.clone(),
        policy_inputs,
        policy_outputs: vec![
            out("actions", false),
            out("joint_pos_targets", true),
            out("stiffness_targets", true),
            out("damping_targets", true),
        ],
        runtime: Runtime {
            onnx_in_names: in_names,
            onnx_out_names: OUTPUT_NAMES.iter().map(|s| (*s).to_owned()).collect(),
            onnx_name_to_in_key: name_to_key,
            passthrough_keys: p.all_paths.iter().filter(|k| !read.contains(k)).cloned().collect(),
            obs_context_keys: p.all_paths.clone(),
        },
        metadata: Metadata { checkpoint: p.checkpoint.clone(), control_type: "BUILT_IN_PD" },
        robot: Robot {
            mjcf_path: c.str("robot.asset.asset_file_name")?,
            num_bodies: p.dims.num_bodies,
            num_dofs: p.dims.num_dofs,
            anchor_body_name: p.anchor_name.clone(),
            anchor_body_index: p.anchor_index,
            root_body_name: bodies.first().cloned().unwrap_or_default(),
            root_body_index: 0,
            body_names: bodies,
            joint_names: joints,
        },
        control: Control {
            stiffness,
            damping,
            effort_limits,
            action_scale: Some(f64s(&p.action.scale)),
            pd_action_offset: Some(f64s(&p.action.offset)),
            pd_target_max_accel,
            action_ema_alpha: 1.0,
            action_function: p.action.function.rsplit('.').next().unwrap_or(p.action.function).to_owned(),
            action_transform: p.action.transform.name(),
        },
        motion: Motion {
            future_dt_seconds: p.future_indices.iter().map(|s| round6(*s as f64 * timing.control_dt)).collect(),
            future_step_indices: p.future_indices.clone(),
        },
        timing,
        fallbacks: p.fallbacks.clone(),
    })
}
