//! The max-coords configs this crate refuses, each with the key at fault:
//! the soma tracker's recorded resolved configs with one value changed,
//! written next to a copy of its checkpoint.

use std::path::{Path, PathBuf};

use pmstate_ckpt::{Checkpoint, Node, UnsafeGlobals, WriteOptions};
use pmstate_deploy::{ConfigProblem, DeployError, Pipeline};

#[path = "common/configs.rs"]
mod configs;
use configs::at;

fn soma() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/soma_tracker")
}

/// Loads the soma pipeline with `edit` applied to its resolved configs.
fn load_edited(edit: impl FnOnce(&mut Node)) -> Result<Pipeline, Box<DeployError>> {
    let (mut root, storages) =
        Checkpoint::open(soma().join("resolved_configs_inference.pt")).expect("configs").into_parts();
    edit(&mut root);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(soma().join("last.ckpt"), dir.path().join("last.ckpt")).expect("copy");
    // the configs name their functions as pickled globals: written as they are
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..Default::default() };
    let edited = Checkpoint::from_parts(root, storages).expect("parts");
    pmstate_ckpt::save_torch(&edited, dir.path().join("resolved_configs_inference.pt"), &opts).expect("save");
    Pipeline::load(dir.path().join("last.ckpt"), None).map_err(Box::new)
}

#[test]
fn the_unedited_configs_load() {
    let p = load_edited(|_| {}).expect("load");
    assert_eq!(p.inputs().len(), 10);
}

#[test]
fn contact_observations_are_refused_by_name() {
    let err = load_edited(|root| {
        *at(root, "env.observation_components.max_coords_obs.static_params.observe_contacts") = Node::Bool(true);
    })
    .expect_err("observe_contacts");
    match &*err {
        DeployError::Config { key, problem: ConfigProblem::Unsupported { .. }, .. } => {
            assert_eq!(key, "env.observation_components.max_coords_obs.static_params.observe_contacts")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_missing_parameter_without_default_is_refused() {
    let err = load_edited(|root| {
        let params = at(root, "env.observation_components.mimic_target_poses.static_params");
        let d = params.as_dict_mut().expect("a dict");
        *d = pmstate_ckpt::Dict::from_entries(
            pmstate_ckpt::DictKind::Plain,
            d.entries().iter().filter(|(k, _)| k.as_str() != Some("with_velocities")).cloned().collect(),
        )
        .expect("dict");
    })
    .expect_err("with_velocities");
    match &*err {
        DeployError::Config { key, problem: ConfigProblem::Missing, .. } => {
            assert_eq!(key, "env.observation_components.mimic_target_poses.static_params.with_velocities")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn the_anchor_index_bound_to_a_tensor_is_refused() {
    let err = load_edited(|root| {
        *at(root, "env.observation_components.max_coords_obs.dynamic_vars.anchor_body_index") =
            Node::Str("current.rigid_body_pos".into());
    })
    .expect_err("anchor_body_index");
    match &*err {
        DeployError::Config { key, problem: ConfigProblem::Unsupported { value, .. }, .. } => {
            assert_eq!(key, "env.observation_components.max_coords_obs.dynamic_vars.anchor_body_index");
            assert_eq!(value, "current.rigid_body_pos");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("current.anchor_idx"), "{err}");
}

#[test]
fn an_anchor_constant_bound_to_a_tensor_argument_is_refused() {
    let err = load_edited(|root| {
        *at(root, "env.observation_components.max_coords_obs.dynamic_vars.body_pos") =
            Node::Str("current.anchor_idx".into());
    })
    .expect_err("body_pos");
    match &*err {
        DeployError::Config { key, problem: ConfigProblem::WrongType { found, .. }, .. } => {
            assert_eq!(key, "env.observation_components.max_coords_obs.dynamic_vars.body_pos");
            assert_eq!(found, "current.anchor_idx");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn an_anchor_index_outside_the_bodies_is_refused() {
    let err = load_edited(|root| {
        *at(root, "robot.anchor_body_index") = Node::Int(23);
    })
    .expect_err("anchor_body_index");
    match &*err {
        DeployError::Config { key, problem: ConfigProblem::Unsupported { value, .. }, .. } => {
            assert_eq!(key, "robot.anchor_body_index");
            assert_eq!(value, "23");
        }
        other => panic!("{other}"),
    }
}

/// A compute function (or action function) of ProtoMotions with no Rust
/// implementation is refused with its qualified name, the component and
/// the supported list (a foreign one is refused earlier, as a global).
#[test]
fn an_unknown_function_is_refused_with_the_supported_list() {
    let err = load_edited(|root| {
        *at(root, "env.observation_components.max_coords_obs.compute_func") = Node::Global {
            module: "protomotions.envs.obs.target_poses".into(),
            name: "build_sparse_target_poses".into(),
        };
    })
    .expect_err("unknown observation function");
    match &*err {
        DeployError::UnknownFunction { component, function, supported, .. } => {
            assert_eq!(component, "env.observation_components.max_coords_obs");
            assert_eq!(function, "protomotions.envs.obs.target_poses.build_sparse_target_poses");
            assert!(supported.iter().any(|s| s.ends_with("compute_humanoid_max_coords_observations")), "{supported:?}");
        }
        other => panic!("{other}"),
    }
    let err = load_edited(|root| {
        *at(root, "env.action_config.fn") = Node::Global {
            module: "protomotions.envs.action.action_functions".into(),
            name: "passthrough_pd_action".into(),
        };
    })
    .expect_err("unknown action function");
    match &*err {
        DeployError::UnknownFunction { component, function, supported, .. } => {
            assert_eq!(component, "env.action_config");
            assert_eq!(function, "protomotions.envs.action.action_functions.passthrough_pd_action");
            assert_eq!(supported.len(), 2);
        }
        other => panic!("{other}"),
    }
}
