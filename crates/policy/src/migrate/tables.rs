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
}

const MSE_EXP: &str = "protomotions.envs.rewards.base.mean_squared_error_exp";
const ROT_EXP: &str = "protomotions.envs.rewards.base.rotation_error_exp";

/// v3.1's components with a same-math counterpart today.
pub(crate) const V31_COMPONENTS: &[ComponentMap] = &[
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_rigid_body_pos"), ("ref_x", "ref_state_rigid_body_pos")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gt_rew",
        params: &[("coefficient", "coefficient")],
        require: &[],
        note: "",
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: ROT_EXP,
        bindings: &[("q", "current_state_rigid_body_rot"), ("ref_q", "ref_state_rigid_body_rot")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gr_rew",
        params: &[("coefficient", "coefficient")],
        require: &[],
        note: "",
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_rigid_body_vel"), ("ref_x", "ref_state_rigid_body_vel")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gv_rew",
        params: &[("coefficient", "coefficient")],
        require: &[],
        note: "",
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_rigid_body_ang_vel"), ("ref_x", "ref_state_rigid_body_ang_vel")],
        today_fn: "protomotions.envs.rewards.tracking.compute_gav_rew",
        params: &[("coefficient", "coefficient")],
        require: &[],
        note: "",
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: MSE_EXP,
        bindings: &[("x", "current_state_root_height"), ("ref_x", "ref_state_root_height")],
        today_fn: "protomotions.envs.rewards.tracking.compute_rh_rew",
        params: &[("coefficient", "coefficient")],
        require: &[],
        note: "today's takes the reference root height as the z of the reference's body 0 (the root)",
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.base.power_consumption_sum",
        bindings: &[("dof_forces", "current_state_dof_forces"), ("dof_vel", "current_state_dof_vel")],
        today_fn: "protomotions.envs.rewards.regularization.compute_pow_rew",
        params: &[("use_torque_squared", "use_torque_squared")],
        require: &[],
        note: "",
    },
    ComponentMap {
        kind: Kind::Reward,
        old_fn: "protomotions.envs.rewards.regularization.contact_mismatch_sum",
        bindings: &[("sim_contacts", "current_state_rigid_body_contacts"), ("ref_contacts", "ref_state_rigid_body_contacts")],
        today_fn: "protomotions.envs.rewards.regularization.compute_contact_match_rew",
        params: &[],
        require: &[],
        note: "v3.1's indices_subset (body-name groups) must name exactly the robot's contact_bodies, which today's contact_body_ids index",
    },
    ComponentMap {
        kind: Kind::Termination,
        old_fn: "protomotions.envs.terminations.tracking.max_joint_err",
        bindings: &[("current_rigid_body_pos", "current_state_rigid_body_pos"), ("ref_rigid_body_pos", "ref_state_rigid_body_pos")],
        today_fn: "protomotions.envs.terminations.tracking.compute_tracking_error",
        params: &[("threshold", "threshold")],
        require: &[],
        note: "",
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
        require: &[],
        note: "today's also binds the anchor body index (the robot's anchor_body_name; the root when unset, as v3.1 computes it)",
    },
    ComponentMap {
        kind: Kind::Observation,
        old_fn: "protomotions.envs.obs.general.passthrough",
        bindings: &[("tensor", "previous_actions")],
        today_fn: "protomotions.envs.obs.humanoid_historical.compute_historical_actions_from_state",
        params: &[],
        require: &[],
        note: "today's reads the last action from the state history buffer (history_steps 1; env.num_state_history_steps kept at least 1)",
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
        note: "the number of future steps comes from env.control_components.mimic (future_steps), as in v3.1 when num_future_steps is unset",
    },
];

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
pub(crate) const V31_NO_COUNTERPART: &[NoCounterpart] = &[NoCounterpart {
    old_fn: "protomotions.envs.rewards.base.norm",
    bindings: &[("x", "current_actions - previous_actions")],
    why: "v3.1 penalizes the norm of the policy's action change; today's compute_action_smoothness reads processed \
          actions (PD targets: the change scaled per joint by pd_action_scale) and today's context has no current raw action",
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

/// Today's `_target_`s of what is migrated (a PPO motion tracker).
pub(crate) const PPO_AGENT: &str = "protomotions.agents.ppo.agent.PPO";
/// Today's and the old releases' PPO model `_target_`.
pub(crate) const PPO_MODEL: &str = "protomotions.agents.ppo.model.PPOModel";
