//! The class, field and function mapping tables, per release: what of an
//! old config becomes what of today's, and what has no counterpart.
//!
//! A component (reward, termination, observation) is mapped only when the
//! old function, bound to the same context values, computes the same math
//! as today's function (both releases' sources were read side by side; the
//! `note` says what differs in how today's code feeds it). The key is the
//! old function *and* its context bindings: v3.1's generic kernels
//! (`mean_squared_error_exp`) became one named function per quantity today.

/// Which kind of component table a dict of the old env holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `env.reward_components`.
    Reward,
    /// `env.termination_components`.
    Termination,
    /// `env.observation_components`.
    Observation,
}

impl Kind {
    /// The env field holding the components (the same name in v3.1 and today).
    pub(crate) fn field(self) -> &'static str {
        match self {
            Kind::Reward => "reward_components",
            Kind::Termination => "termination_components",
            Kind::Observation => "observation_components",
        }
    }
}

/// One v3.1 component and today's equivalent.
pub(crate) struct ComponentMap {
    /// Which table it is found in.
    pub kind: Kind,
    /// v3.1's function, `module.name`.
    pub old_fn: &'static str,
    /// v3.1's context bindings that select this mapping (`variables` entries
    /// whose value is a context key string).
    pub bindings: &'static [(&'static str, &'static str)],
    /// Today's function, `module.name` (its context bindings, `dynamic_vars`,
    /// are taken from today's template component computing it).
    pub today_fn: &'static str,
    /// v3.1 literal `variables` carried into today's `static_params`, renamed.
    pub params: &'static [(&'static str, &'static str)],
    /// v3.1 literal `variables` that must hold the given JSON-ish value
    /// (`None` as "null") to be mapped; anything else is refused.
    pub require: &'static [(&'static str, &'static str)],
    /// What differs in how today's code feeds it, if anything.
    pub note: &'static str,
    /// Whether today's template component must read today's noisy context
    /// (`Some(true)`), must not (`Some(false)`), or either (`None`): v3.1's
    /// noisy and clean bindings of one function are today's components of
    /// that function bound to `noisy` or to `current`.
    pub today_noisy: Option<bool>,
    /// Context bindings today's template component must have, as
    /// (argument, `parent.name` context path): where one function reads
    /// other values through other bindings (the policy's actions or the
    /// processed ones), the one v3.1 read.
    pub today_binds: &'static [(&'static str, &'static str)],
    /// v3.1 computes it in the root's frame (body 0): today's template
    /// component must not bind `anchor_body_index` (its function's default
    /// is body 0) unless the robot's anchor is the root.
    pub root_frame: bool,
}

const MSE_EXP: &str = "protomotions.envs.rewards.base.mean_squared_error_exp";
const ROT_EXP: &str = "protomotions.envs.rewards.base.rotation_error_exp";

/// The fields most entries leave at their defaults (no required literal,
/// no note, either context), for `..NO_EXTRAS` in the tables below; its
/// own kind and functions are never read.
const NO_EXTRAS: ComponentMap = ComponentMap {
    kind: Kind::Reward,
    old_fn: "",
    bindings: &[],
    today_fn: "",
    params: &[],
    require: &[],
    note: "",
    today_noisy: None,
    today_binds: &[],
    root_frame: false,
};

/// v3.1's components with a same-math counterpart today.
pub(crate) const V31_COMPONENTS: &[ComponentMap] = &[
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_rigid_body_pos"), ("ref_x", "ref_state_rigid_body_pos")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gt_rew",
        params: &[("coefficient", "coefficient")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: ROT_EXP,
        bindings: &[("q", "current_state_rigid_body_rot"), ("ref_q", "ref_state_rigid_body_rot")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gr_rew",
        params: &[("coefficient", "coefficient")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_rigid_body_vel"), ("ref_x", "ref_state_rigid_body_vel")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gv_rew",
        params: &[("coefficient", "coefficient")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_rigid_body_ang_vel"), ("ref_x", "ref_state_rigid_body_ang_vel")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gav_rew",
        params: &[("coefficient", "coefficient")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_root_height"), ("ref_x", "ref_state_root_height")],
        today_fn: "protomotions.envs.rewards.tracking.compute_rh_rew",
        params: &[("coefficient", "coefficient")],
        note: "today's takes the reference root height as the z of the reference's body 0 (the root)",
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.base.power_consumption_sum",
        bindings: &[("dof_forces", "current_state_dof_forces"), ("dof_vel", "current_state_dof_vel")],
        today_fn: "protomotions.envs.rewards.regularization.compute_pow_rew",
        params: &[("use_torque_squared", "use_torque_squared")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.regularization.contact_mismatch_sum",
        bindings: &[("sim_contacts", "current_state_rigid_body_contacts"), ("ref_contacts", "ref_state_rigid_body_contacts")],
        today_fn: "protomotions.envs.rewards.regularization.compute_contact_match_rew",
        params: &[],
        note: "v3.1's indices_subset (body-name groups) must name exactly the robot's contact_bodies, which today's contact_body_ids index",
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Termination,
        old_fn: "protomotions.envs.terminations.tracking.max_joint_err",
        bindings: &[("current_rigid_body_pos", "current_state_rigid_body_pos"), ("ref_rigid_body_pos", "ref_state_rigid_body_pos")],
        today_fn: "protomotions.envs.terminations.tracking.compute_tracking_error",
        params: &[("threshold", "threshold")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: "protomotions.envs.obs.humanoid.compute_humanoid_max_coords_observations",
        bindings: &[
            ("body_pos", "current_state_rigid_body_pos"),
            ("body_rot", "current_state_rigid_body_rot"),
            ("body_vel", "current_state_rigid_body_vel"),
            ("body_ang_vel", "current_state_rigid_body_ang_vel"),
            ("ground_height", "ground_heights_beneath_root"),
            ("body_contacts", "body_contacts"),
        ],
        today_fn: "protomotions.envs.obs.humanoid.compute_humanoid_max_coords_observations",
        params: &[
            ("local_obs", "local_obs"),
            ("root_height_obs", "root_height_obs"),
            ("observe_contacts", "observe_contacts"),
            ("w_last", "w_last"),
        ],
        note: ROOT_FRAME_NOTE,
        root_frame: true,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: "protomotions.envs.obs.general.passthrough",
        bindings: &[("tensor", "previous_actions")],
        today_fn: "protomotions.envs.obs.humanoid_historical.compute_historical_actions_from_state",
        params: &[],
        note: "today's reads the last action from the state history buffer (history_steps 1; env.num_state_history_steps kept at least 1)",
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: "protomotions.envs.obs.target_poses.build_max_coords_target_poses",
        bindings: &[
            ("current_state_body_pos", "current_state_rigid_body_pos"),
            ("current_state_body_rot", "current_state_rigid_body_rot"),
            ("current_state_body_vel", "current_state_rigid_body_vel"),
            ("current_state_body_ang_vel", "current_state_rigid_body_ang_vel"),
            ("mimic_ref_pos", "mimic_ref_pos"),
            ("mimic_ref_rot", "mimic_ref_rot"),
            ("mimic_ref_vel", "mimic_ref_vel"),
            ("mimic_ref_ang_vel", "mimic_ref_ang_vel"),
        ],
        today_fn: "protomotions.envs.obs.target_poses.build_max_coords_target_poses",
        params: &[("with_velocities", "with_velocities"), ("with_relative", "with_relative"), ("w_last", "w_last")],
        require: &[("num_future_steps", "null")],
        note: "the number of future steps comes from env.control_components.mimic (future_steps), as in v3.1 when \
               num_future_steps is unset; in the root's frame, as v3.1 computes it",
        root_frame: true,
        ..NO_EXTRAS
    },
    // --- the G1 tracker's BeyondMimic-style terms (v3.1 rewards/tracking.py
    // and terminations/tracking.py against today's). Today's functions take
    // the reference anchor as the reference body at `mimic.anchor_idx`; v3.1
    // binds `ref_state_anchor_*`, the reference body at the robot's
    // anchor_body_name: the same body. Only without v3.1's density weights
    // (see DENSITY_WHY): today's functions average over bodies unweighted.
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.tracking.global_position_error_exp",
        bindings: &[("x", "current_state_anchor_pos"), ("ref_x", "ref_state_anchor_pos")],
        today_fn: "protomotions.envs.rewards.tracking.compute_global_anchor_pos_rew",
        params: &[("sigma", "sigma")],
        note: ANCHOR_NOTE,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.tracking.global_orientation_error_exp",
        bindings: &[("q", "current_state_anchor_rot"), ("ref_q", "ref_state_anchor_rot")],
        today_fn: "protomotions.envs.rewards.tracking.compute_global_anchor_ori_rew",
        params: &[("sigma", "sigma")],
        note: ANCHOR_NOTE,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.tracking.relative_body_position_error_exp",
        bindings: &[
            ("body_pos", "current_state_rigid_body_pos"),
            ("ref_body_pos", "ref_state_rigid_body_pos"),
            ("anchor_pos", "current_state_anchor_pos"),
            ("ref_anchor_pos", "ref_state_anchor_pos"),
            ("anchor_rot", "current_state_anchor_rot"),
            ("ref_anchor_rot", "ref_state_anchor_rot"),
        ],
        today_fn: "protomotions.envs.rewards.tracking.compute_relative_body_pos_rew",
        params: &[("sigma", "sigma")],
        note: ANCHOR_NOTE,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.tracking.relative_body_orientation_error_exp",
        bindings: &[
            ("body_rot", "current_state_rigid_body_rot"),
            ("ref_body_rot", "ref_state_rigid_body_rot"),
            ("anchor_rot", "current_state_anchor_rot"),
            ("ref_anchor_rot", "ref_state_anchor_rot"),
        ],
        today_fn: "protomotions.envs.rewards.tracking.compute_relative_body_ori_rew",
        params: &[("sigma", "sigma")],
        note: ANCHOR_NOTE,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.tracking.global_velocity_error_exp",
        bindings: &[("x", "current_state_rigid_body_vel"), ("ref_x", "ref_state_rigid_body_vel")],
        today_fn: "protomotions.envs.rewards.tracking.compute_global_body_lin_vel_rew",
        params: &[("sigma", "sigma")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.tracking.global_velocity_error_exp",
        bindings: &[("x", "current_state_rigid_body_ang_vel"), ("ref_x", "ref_state_rigid_body_ang_vel")],
        today_fn: "protomotions.envs.rewards.tracking.compute_global_body_ang_vel_rew",
        params: &[("sigma", "sigma")],
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Termination,
        old_fn: "protomotions.envs.terminations.tracking.anchor_pos_error",
        bindings: &[("anchor_pos", "current_state_anchor_pos"), ("ref_anchor_pos", "ref_state_anchor_pos")],
        today_fn: "protomotions.envs.terminations.tracking.compute_anchor_pos_error_term",
        params: &[("threshold", "threshold")],
        note: ANCHOR_NOTE,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Termination,
        old_fn: "protomotions.envs.terminations.tracking.anchor_ori_error",
        bindings: &[("anchor_rot", "current_state_anchor_rot"), ("ref_anchor_rot", "ref_state_anchor_rot")],
        today_fn: "protomotions.envs.terminations.tracking.compute_anchor_ori_error_term",
        params: &[("threshold", "threshold")],
        note: ANCHOR_NOTE,
        ..NO_EXTRAS
    },
    // --- the G1 tracker's reduced-coords actor observations: today's
    // function with today's G1 template's bindings computes v3.1's values
    // on v3.1's recorded inputs (record_migrate.py g1-observations). v3.1's
    // noisy bindings (training) are today's component on today's noisy
    // context, its clean ones (v3.1's inference override) today's on current.
    ComponentMap {
        kind: Kind::Observation,
        old_fn: REDUCED_COORDS,
        bindings: &[
            ("dof_pos", "noisy_current_state_dof_pos"),
            ("dof_vel", "noisy_current_state_dof_vel"),
            ("root_local_ang_vel", "noisy_current_state_root_local_ang_vel"),
            ("anchor_rot", "noisy_current_state_anchor_rot"),
        ],
        today_fn: REDUCED_COORDS,
        params: REDUCED_COORDS_PARAMS,
        note: "today's reads its noisy context (today's observation noise model, not v3.1's)",
        today_noisy: Some(true),
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: REDUCED_COORDS,
        bindings: &[
            ("dof_pos", "current_state_dof_pos"),
            ("dof_vel", "current_state_dof_vel"),
            ("root_local_ang_vel", "current_state_root_local_ang_vel"),
            ("anchor_rot", "current_state_anchor_rot"),
        ],
        today_fn: REDUCED_COORDS,
        params: REDUCED_COORDS_PARAMS,
        today_noisy: Some(false),
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: REDUCED_TARGETS,
        bindings: &[
            ("current_state_anchor_rot", "noisy_current_state_anchor_rot"),
            ("mimic_ref_anchor_rot", "mimic_ref_anchor_rot"),
            ("mimic_ref_dof_vel", "mimic_ref_dof_vel"),
            ("mimic_ref_dof_pos", "mimic_ref_dof_pos"),
        ],
        today_fn: REDUCED_TARGETS,
        params: REDUCED_TARGETS_PARAMS,
        require: &[("num_future_steps", "null")],
        note: REDUCED_TARGETS_NOTE,
        today_noisy: Some(true),
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: REDUCED_TARGETS,
        bindings: &[
            ("current_state_anchor_rot", "current_state_anchor_rot"),
            ("mimic_ref_anchor_rot", "mimic_ref_anchor_rot"),
            ("mimic_ref_dof_vel", "mimic_ref_dof_vel"),
            ("mimic_ref_dof_pos", "mimic_ref_dof_pos"),
        ],
        today_fn: REDUCED_TARGETS,
        params: REDUCED_TARGETS_PARAMS,
        require: &[("num_future_steps", "null")],
        note: REDUCED_TARGETS_NOTE,
        today_noisy: Some(false),
        ..NO_EXTRAS
    },
    // --- the G1 tracker's history observations (v3.1's
    // obs/humanoid_obs_functions.py against today's obs/humanoid_historical.py):
    // today's functions compute v3.1's values on v3.1's recorded context
    // (record_migrate.py g1-observations); the G1 template holds today's
    // factories' components binding today's state history
    // (record_migrate.py g1_for_v31). `num_steps` None (every step of
    // env.num_state_history_steps) is today's `history_steps` None.
    ComponentMap {
        kind: Kind::Observation,
        old_fn: V31_HIST_REDUCED,
        bindings: &[
            ("historical_dof_pos", "noisy_historical_dof_pos"),
            ("historical_dof_vel", "noisy_historical_dof_vel"),
            ("historical_root_rot", "noisy_historical_root_rot"),
            ("historical_root_local_ang_vel", "noisy_historical_root_local_ang_vel"),
            ("historical_anchor_rot", "noisy_historical_anchor_rot"),
        ],
        today_fn: HIST_REDUCED,
        params: HIST_REDUCED_PARAMS,
        note: "today's reads its noisy state history (today's observation noise model, not v3.1's)",
        today_noisy: Some(true),
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: V31_HIST_REDUCED,
        bindings: &[
            ("historical_dof_pos", "historical_dof_pos"),
            ("historical_dof_vel", "historical_dof_vel"),
            ("historical_root_rot", "historical_root_rot"),
            ("historical_root_local_ang_vel", "historical_root_local_ang_vel"),
            ("historical_anchor_rot", "historical_anchor_rot"),
        ],
        today_fn: HIST_REDUCED,
        params: HIST_REDUCED_PARAMS,
        today_noisy: Some(false),
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: "protomotions.envs.obs.humanoid_obs_functions.compute_historical_max_coords_from_state",
        bindings: &[
            ("historical_rigid_body_pos", "historical_rigid_body_pos"),
            ("historical_rigid_body_rot", "historical_rigid_body_rot"),
            ("historical_rigid_body_vel", "historical_rigid_body_vel"),
            ("historical_rigid_body_ang_vel", "historical_rigid_body_ang_vel"),
            ("historical_ground_heights", "historical_ground_heights"),
            ("historical_body_contacts", "historical_body_contacts"),
        ],
        today_fn: "protomotions.envs.obs.humanoid_historical.compute_historical_max_coords_from_state",
        params: &[
            ("local_obs", "local_obs"),
            ("root_height_obs", "root_height_obs"),
            ("observe_contacts", "observe_contacts"),
            ("w_last", "w_last"),
            ("num_steps", "history_steps"),
        ],
        note: ROOT_FRAME_NOTE,
        today_noisy: Some(false),
        root_frame: true,
        ..NO_EXTRAS
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: "protomotions.envs.obs.humanoid_obs_functions.compute_historical_actions_from_state",
        bindings: &[("historical_actions", "historical_actions")],
        today_fn: "protomotions.envs.obs.humanoid_historical.compute_historical_actions_from_state",
        params: &[("num_steps", "history_steps")],
        note: "today's history holds the policy's actions as sampled, v3.1's as its env clamped them \
               (clamp_actions): the same for evaluation (the mean action of a tanh actor is within the \
               clamp), different for sampled actions beyond the clamp while training",
        today_binds: &[("historical_actions", "historical.actions")],
        ..NO_EXTRAS
    },
];

const V31_HIST_REDUCED: &str =
    "protomotions.envs.obs.humanoid_obs_functions.compute_historical_reduced_coords_from_state";
const HIST_REDUCED: &str = "protomotions.envs.obs.humanoid_historical.compute_historical_reduced_coords_from_state";
const HIST_REDUCED_PARAMS: &[(&str, &str)] = &[("w_last", "w_last"), ("num_steps", "history_steps")];

/// The note of the max-coords observations v3.1 takes in the root's frame.
const ROOT_FRAME_NOTE: &str = "in the root's frame, as v3.1 computes it: today's binds the anchor body index \
    only where the robot's anchor is the root; the ground height is today's, sampled under the anchor \
    (v3.1's under the root: the same on flat terrain)";

const REDUCED_COORDS: &str = "protomotions.envs.obs.humanoid.compute_humanoid_reduced_coords_observations";
const REDUCED_COORDS_PARAMS: &[(&str, &str)] =
    &[("w_last", "w_last"), ("root_height_obs", "root_height_obs"), ("root_vel_obs", "root_vel_obs")];
const REDUCED_TARGETS: &str = "protomotions.envs.obs.target_poses.build_reduced_coords_target_poses";
const REDUCED_TARGETS_PARAMS: &[(&str, &str)] = &[("w_last", "w_last"), ("include_xy_offset", "include_xy_offset")];
const REDUCED_TARGETS_NOTE: &str = "the number of future steps comes from env.control_components.mimic \
    (future_steps), as in v3.1 when num_future_steps is unset";

/// The note of the anchor-relative G1 terms.
const ANCHOR_NOTE: &str = "today's takes the reference anchor as the reference body at mimic.anchor_idx \
    (the robot's anchor_body_name, the body v3.1's ref_state_anchor_* is read from)";

/// Why a v3.1 reward with `use_density_weights = True` has no counterpart:
/// v3.1's reward manager passes per-body weights into the kernel, today's
/// functions take no weights.
pub(crate) const DENSITY_WHY: &str = "use_density_weights = True: v3.1 averages the per-body error weighted by \
    compute_body_density_weights (kinematic-chain distances); today's function averages over bodies unweighted \
    and today's MdpComponent has no per-body weights";

/// Why a component whose today's counterpart the template does not hold is
/// refused: its context bindings (`dynamic_vars`) are taken from the
/// template, never made up.
pub(crate) const NOT_IN_TEMPLATE_WHY: &str = "today's template has no component computing it to take its \
    context bindings (dynamic_vars) from; migrate does not synthesize bindings";

/// Why a root-frame observation is refused where today's template binds
/// the anchor body and the robot's anchor is not the root.
pub(crate) const ANCHOR_FRAME_WHY: &str = "v3.1 computes it in the root's frame (body 0); today's template \
    component binds the robot's anchor body as its frame, another body";

/// A v3.1 component known to have no same-math counterpart today.
pub(crate) struct NoCounterpart {
    /// v3.1's function, `module.name`.
    pub old_fn: &'static str,
    /// The context bindings that select it.
    pub bindings: &'static [(&'static str, &'static str)],
    /// Why today's code has no equivalent (so the refusal says more than "not in the table").
    pub why: &'static str,
}

/// v3.1 components known to have no same-math counterpart today.
/// An empty `bindings` matches the function with any bindings.
pub(crate) const V31_NO_COUNTERPART: &[NoCounterpart] = &[
    NoCounterpart {
        old_fn: "protomotions.envs.rewards.base.norm",
        bindings: &[("x", "current_actions - previous_actions")],
        why: "v3.1 penalizes the norm of the policy's action change; today's compute_action_smoothness reads processed \
              actions (PD targets: the change scaled per joint by pd_action_scale) and today's context has no current raw action",
    },
    NoCounterpart {
        old_fn: "protomotions.envs.rewards.regularization.physical_action_rate",
        bindings: &[("action_delta", "current_actions - previous_actions"), ("pd_action_scale", "pd_action_scale")],
        why: "v3.1 takes the norm of (simulator's current action - state history's previous action) times the \
              simulator's pd_action_scale; today's compute_action_smoothness takes the norm of the change of the \
              env's processed actions (PD targets), offset + scale * action for each: a difference of two \
              products, not the product of the difference, so not bit for bit v3.1's, and not checked \
              (neither release's action inputs are generated by the kernels check)",
    },
    NoCounterpart {
        old_fn: "protomotions.envs.rewards.regularization.soft_pos_limit_reward",
        bindings: &[
            ("dof_pos", "current_state_dof_pos"),
            ("dof_limits_lower", "soft_dof_limits_lower"),
            ("dof_limits_upper", "soft_dof_limits_upper"),
        ],
        why: "v3.1 binds its context's soft joint limits (the hard limits narrowed by the robot's soft_pos_limit); \
              today's compute_soft_pos_limit_rew takes the limits as static_params, which today's G1 experiment \
              sets to the hard limits; migrate does not compute v3.1's soft limits",
    },
    NoCounterpart {
        old_fn: "protomotions.envs.terminations.tracking.relative_body_pos_error",
        bindings: &[],
        why: "today's compute_relative_body_pos_error_term has not been matched to v3.1's math",
    },
];

/// A model input both releases' envs compute in code, not as an
/// observation component.
pub(crate) struct CodeInput {
    /// The observation key the model reads.
    pub key: &'static str,
    /// The terrain class (old and template) it is computed the same on.
    pub terrain_class: &'static str,
    /// What computes it in both releases.
    pub computed_by: &'static str,
    /// How that was established.
    pub note: &'static str,
}

/// Inputs computed in code that today's env computes as v3.1's from the
/// carried config: the `terrain` height map (`TerrainObs`: the same code in
/// both releases; `Terrain` built from v3.1's `ComplexTerrainConfig` values
/// gives v3.1's height samples and height maps bit for bit,
/// record_migrate.py terrain --v31).
pub(crate) const CODE_INPUTS: &[CodeInput] = &[CodeInput {
    key: "terrain",
    terrain_class: super::templates::COMPLEX,
    computed_by: "protomotions.envs.obs.terrain_obs.TerrainObs",
    note: "computed in code by both releases' env (TerrainObs over Terrain.get_height_maps) from the terrain \
           config, carried over: v3.1's height samples and maps reproduced bit for bit (record_migrate.py terrain)",
}];

/// Fields of today's classes that hold a v3.1 field under another name:
/// (today's class, today's field, v3.1's field).
pub(crate) const V31_FIELD_RENAMES: &[(&str, &str, &str)] =
    &[("protomotions.envs.control.mimic_control.MimicControlConfig", "future_steps", "num_future_steps")];

/// Today's keys the generic overlay leaves alone: the component tables
/// (mapped by [`V31_COMPONENTS`]) and values set by a rule.
pub(crate) const V31_RULE_KEYS: &[&str] = &[
    "env.reward_components",
    "env.termination_components",
    "env.observation_components",
    "env.num_state_history_steps",
    "env.action_config",
];

/// Why v3.0's trackers are refused: their observations are computed in code
/// from `env.humanoid_obs` / `env.mimic_obs` (v3.0's `MimicEnvConfig`), not
/// from components; today's components compute other values for the same
/// keys (v3.0's `historical_previous_actions` is 2 steps x 10 of v3.0's own
/// layout), so the model would get other inputs than it was trained on.
pub(crate) const V30_WHY: &str = "v3.0 computes its observations in code from env.humanoid_obs/env.mimic_obs \
    (MimicEnvConfig); today's observation components compute other values under these keys, so a migrated env \
    would feed the model inputs it was not trained on";

/// Why v2.3's trackers are refused: as v3.0's, its Mimic env computes the
/// observations in code (`env.config.humanoid_obs`, the mimic target
/// poses of `envs/mimic/components`), from Hydra's `config.yaml`.
pub(crate) const V23_WHY: &str = "v2.3's Mimic env computes its observations in code from env.config \
    (humanoid_obs, mimic target poses), configured by Hydra's config.yaml; today's observation components \
    compute other values under these keys, so a migrated env would feed the model inputs it was not trained on";

/// Today's `_target_`s of what is migrated (a PPO motion tracker).
pub(crate) const PPO_AGENT: &str = "protomotions.agents.ppo.agent.PPO";
/// Today's and the old releases' PPO model `_target_`.
pub(crate) const PPO_MODEL: &str = "protomotions.agents.ppo.model.PPOModel";
