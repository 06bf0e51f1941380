//! `pmstate_policy::migrate` on the recorded v3.1 smpl and G1 trackers
//! (testdata/policy/v31_tracker, v31_g1_tracker): the migrated files must be
//! byte for byte the ones testdata/migrate/record_migrate.py verified with
//! today's ProtoMotions (testdata/migrate/<case>, verified.json: same model
//! outputs as v3.1 for evaluation and after a resume's load, the mapped
//! components' math, the G1's observations and PD targets), and the report
//! the one recorded there; so any change to migrate forces re-verification.
//! Then the refusals, each naming what it refuses.

use std::path::{Path, PathBuf};

use pmstate_ckpt::{save_torch, Checkpoint, Node, UnsafeGlobals, WriteOptions};
use pmstate_policy::migrate::{migrate, plan, Action, MigrateError, MigrateOptions, OUTPUT_FILES};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

const DROP: MigrateOptions = MigrateOptions { force: false, drop_unmatched_terms: true };

fn verified() -> serde_json::Value {
    let text = std::fs::read_to_string(repo("testdata/migrate/verified.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Migrates the recorded case `name` (testdata/policy/NAME) and requires
/// the files and report record_migrate.py verified, and that every mapped
/// component it checked computed v3.1's values.
fn migrates_to_the_verified_files(name: &str) -> pmstate_policy::migrate::Report {
    let v = verified();
    let case = v["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).expect("the case in verified.json");
    assert_eq!(case["verified"], true, "the recording says today's ProtoMotions did not reproduce v3.1");
    assert_eq!(case["resume_state_verified"], true);
    for check in case["checks"].as_object().unwrap().values() {
        assert_eq!(check["unresolvable_bindings"], serde_json::json!([]), "{name}: {check}");
    }
    // the mapped components' math, where v3.1's inputs were generated
    let kernels = case["kernels_vs_v31"].as_object().expect("kernels_vs_v31");
    let compared: Vec<_> = kernels.iter().filter(|(_, r)| r.is_object()).collect();
    assert!(compared.len() >= 7, "{name}: {} components compared", compared.len());
    for (k, r) in compared {
        assert_eq!(r["bit_identical"], true, "{name}: {k}: {r}");
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("migrated");
    let report = migrate(&repo(&format!("testdata/policy/{name}/last.ckpt")), &dir, &DROP).unwrap();
    for f in &OUTPUT_FILES[..3] {
        let got = std::fs::read(dir.join(f)).unwrap();
        let want = std::fs::read(repo("testdata/migrate").join(name).join(f)).unwrap();
        assert!(got == want, "{name}: {f} differs from the verified recording: rerun record_migrate.py verify");
    }
    // the report, as recorded by the verified run (its paths aside)
    let mut got = serde_json::to_value(&report).unwrap();
    let mut want = case["report"][0].clone();
    for r in [&mut got, &mut want] {
        for k in ["old_checkpoint", "old_configs"] {
            r.as_object_mut().unwrap().remove(k);
        }
    }
    assert_eq!(got, want, "{name}: the report differs from the verified recording");
    assert!(dir.join("migrate_report.json").is_file());
    report
}

#[test]
fn v31_tracker_migrates_to_the_verified_files() {
    let report = migrates_to_the_verified_files("v31_tracker");
    assert_eq!(report.release, "v3.1");
    assert!(report
        .entries
        .iter()
        .any(|e| e.action == Action::Dropped && e.key == "env.reward_components.action_smoothness"));
    assert!(report.caveats.iter().any(|c| c.contains("WITHOUT env.reward_components.action_smoothness")));
}

/// The v3.1 G1 tracker: its history and root-frame critic observations
/// mapped onto the G1 template's components (today's factories), its
/// actions through today's generic PD action function with v3.1's clamp;
/// the density-weighted rewards, physical action rate, soft joint-limit
/// reward and relative-body termination dropped.
#[test]
fn v31_g1_tracker_migrates_to_the_verified_files() {
    let report = migrates_to_the_verified_files("v31_g1_tracker");
    assert_eq!((report.release, report.template), ("v3.1", "g1_tracker"));
    let action = |key: &str| report.entries.iter().find(|e| e.key == key).map(|e| e.action);
    for obs in [
        "noisy_reduced_coords_obs",
        "noisy_historical_reduced_coords_obs",
        "noisy_mimic_reduced_coords_target_poses",
        "max_coords_obs",
        "historical_max_coords_obs",
        "mimic_max_coords_target_poses",
        "historical_previous_actions",
    ] {
        assert_eq!(action(&format!("env.observation_components.{obs}")), Some(Action::Mapped), "{obs}");
    }
    for term in [
        "reward_components.relative_body_pos",
        "reward_components.relative_body_ori",
        "reward_components.body_lin_vel",
        "reward_components.body_ang_vel",
        "reward_components.action_rate",
        "reward_components.limits_dof_pos",
        "termination_components.bad_motion_body_pos",
    ] {
        assert_eq!(action(&format!("env.{term}")), Some(Action::Dropped), "{term}");
    }
    for term in ["reward_components.global_anchor_pos", "termination_components.bad_ref_pos"] {
        assert_eq!(action(&format!("env.{term}")), Some(Action::Mapped), "{term}");
    }
    let m = plan(&repo("testdata/policy/v31_g1_tracker/last.ckpt"), &DROP).unwrap();
    let t = &m.training;
    let ac = "env.action_config";
    let global = |k: &str| match t.get(k) {
        Some(Node::Global { name, .. }) => name.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(global(&format!("{ac}.fn")), "normalized_pd_fixed_gains_action");
    assert_eq!(t.get(&format!("{ac}.action_transform")).and_then(Node::as_str), Some("clamp"));
    assert_eq!(t.get("agent.model.actor.learnable_std"), Some(&Node::Bool(false)));
    assert_eq!(t.get("agent.l2c2.enabled"), Some(&Node::Bool(false)));
    // the critic's max coords in the root's frame: no anchor binding
    for obs in ["max_coords_obs", "historical_max_coords_obs", "mimic_max_coords_target_poses"] {
        let key = format!("env.observation_components.{obs}.dynamic_vars");
        let vars = t.get(&key).and_then(Node::as_dict).unwrap_or_else(|| panic!("{key}"));
        assert!(vars.get("anchor_body_index").is_none(), "{obs} binds the anchor");
    }
    // the policy's own actions in the history, every step of it
    let hist = "env.observation_components.historical_previous_actions";
    assert_eq!(t.get(&format!("{hist}.static_params.history_steps")), Some(&Node::None));
    assert_eq!(t.get("env.num_state_history_steps"), Some(&Node::Int(3)));
}

#[test]
fn the_migrated_configs_carry_todays_classes_and_v31_values() {
    let m = plan(&repo("testdata/policy/v31_tracker/last.ckpt"), &DROP).unwrap();
    let t = &m.training;
    let class = |k: &str| match t.get(k) {
        Some(Node::Object(o)) => o.class_name().unwrap(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(class("env.observation_components.max_coords_obs"), "protomotions.envs.mdp_component.MdpComponent");
    assert_eq!(class("env.reward_components.gt_rew"), "protomotions.envs.mdp_component.MdpComponent");
    // v3.1's values, not the template's: the coefficient (-100; today's experiment -25) and widths
    assert_eq!(t.get("env.reward_components.gt_rew.static_params.coefficient"), Some(&Node::Float(-100.0)));
    assert_eq!(t.get("env.control_components.mimic.future_steps"), Some(&Node::Int(1)));
    assert_eq!(t.get("agent.model.actor.mu_model.layers.0.units"), Some(&Node::Int(16)));
    assert_eq!(t.get("agent.model.actor.mu_model.output_activation").and_then(Node::as_str), Some("tanh"));
    assert_eq!(t.get("agent.model.actor.mu_model.norm_ema_decay"), Some(&Node::None));
    assert_eq!(t.get("env.action_config.action_transform").and_then(Node::as_str), Some("clamp"));
    assert!(t.get("env.reward_components.action_smoothness").is_none());
    // the inference file: today's inference overrides on top
    assert!(m.inference.get("env.termination_components.tracking_error").is_none());
    assert!(t.get("env.termination_components.tracking_error").is_some());
}

#[test]
fn a_term_without_counterpart_is_refused_by_default_naming_it() {
    let e = plan(&repo("testdata/policy/v31_tracker/last.ckpt"), &MigrateOptions::default()).err().unwrap();
    match &e {
        MigrateError::NoCounterpart { key, function, why, .. } => {
            assert_eq!(key, "env.reward_components.action_smoothness");
            assert_eq!(function, "protomotions.envs.rewards.base.norm");
            assert!(why.contains("processed actions"), "{why}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn v30_is_refused_naming_why() {
    let e = plan(&repo("testdata/policy/v30_tracker/last.ckpt"), &DROP).err().unwrap();
    assert!(matches!(&e, MigrateError::NotMigratable { release: "v3.0", key, .. } if key == "env"), "{e}");
    assert!(e.to_string().contains("MimicEnvConfig"), "{e}");
}

/// A v2.3 run has no resolved configs: its Hydra config.yaml is found as
/// v2.3's eval finds it, and the refusal names it and its env class.
#[test]
fn v23_is_refused_naming_its_config_yaml_and_env() {
    for dir in ["v23_tracker", "v23_masked_mimic"] {
        let e = plan(&repo(&format!("testdata/policy/{dir}/last.ckpt")), &DROP).err().unwrap();
        match &e {
            MigrateError::NotMigratable { release: "v2.3", key, class, file, why } => {
                assert_eq!((key.as_str(), class.as_str()), ("env._target_", "protomotions.envs.mimic.env.Mimic"));
                assert!(file.ends_with(&format!("{dir}/config.yaml")), "{file}");
                assert!(why.contains("computes its observations in code"), "{why}");
            }
            other => panic!("{dir}: {other}"),
        }
    }
    // no configs of either kind
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("last.ckpt");
    std::fs::copy(repo("testdata/policy/v23_tracker/last.ckpt"), &ckpt).unwrap();
    let e = plan(&ckpt, &DROP).err().unwrap();
    assert!(matches!(e, MigrateError::ConfigNotFound { .. }), "{e}");
}

#[test]
fn non_trackers_todays_files_and_robots_without_a_template_are_refused() {
    let e = plan(&repo("testdata/policy/v31_masked_mimic/last.ckpt"), &DROP).err().unwrap();
    assert!(matches!(&e, MigrateError::NotATracker { key, .. } if key == "agent._target_"), "{e}");
    let e = plan(&repo("testdata/policy/smpl_tracker/last.ckpt"), &DROP).err().unwrap();
    assert!(matches!(e, MigrateError::AlreadyCurrent { .. }), "{e}");
    let tmp = tempfile::tempdir().unwrap();
    let e =
        plan(&with_robot_class(tmp.path(), "protomotions.robot_configs.h1_2", "H1_2RobotConfig"), &DROP).err().unwrap();
    assert!(matches!(&e, MigrateError::NoTemplate { class, .. } if class.ends_with("H1_2RobotConfig")), "{e}");
    assert!(e.to_string().contains("G1RobotConfig"), "the recorded templates are named: {e}");
    let e = plan(&repo("testdata/checkpoints/ppo_full.ckpt"), &DROP).err().unwrap();
    assert!(matches!(e, MigrateError::ConfigNotFound { .. }), "{e}");
}

/// A copy of the v3.1 tracker whose robot config is of another class.
fn with_robot_class(dir: &Path, module: &str, name: &str) -> PathBuf {
    edited(dir, "v31_tracker", |d| {
        let Some(Node::Object(robot)) = d.get_mut("robot") else { panic!("robot") };
        robot.callable = Node::Global { module: module.into(), name: name.into() };
    })
}

/// The G1 tracker's BeyondMimic-style table entries, which no migrated case
/// exercises yet, were checked by `record_migrate.py g1-kernels`: today's
/// function against v3.1's, bit for bit.
#[test]
fn the_g1_table_entries_were_checked_against_v31() {
    let v = verified();
    let k = v["g1_table_kernels_vs_v31"].as_object().expect("g1_table_kernels_vs_v31 in verified.json");
    for name in [
        "global_anchor_pos",
        "global_anchor_ori",
        "relative_body_pos",
        "relative_body_ori",
        "body_lin_vel",
        "body_ang_vel",
        "bad_ref_pos",
        "bad_ref_ori",
    ] {
        assert_eq!(k[name]["bit_identical"], true, "{name}: {}", k[name]);
    }
}

/// The G1 tracker's actor observations through the migrated configs'
/// components (both files) on v3.1's recorded inputs against v3.1's values
/// (`record_migrate.py g1-observations`).
#[test]
fn the_migrated_g1_observations_computed_v31s_values() {
    let v = verified();
    let k = v["g1_observations_vs_v31"].as_object().expect("g1_observations_vs_v31 in verified.json");
    for file in ["resolved_configs.pt", "resolved_configs_inference.pt"] {
        for name in [
            "noisy_reduced_coords_obs",
            "noisy_mimic_reduced_coords_target_poses",
            "noisy_historical_reduced_coords_obs",
            "historical_previous_actions",
        ] {
            let r = &k[&format!("{file}:{name}")];
            assert_eq!(r["bit_identical"], true, "{file}:{name}: {r}");
            assert_eq!(r["runs"], 2, "{file}:{name}: {r}");
        }
    }
}

/// The migrated G1 action config gives v3.1's PD targets and gains
/// (`record_migrate.py g1-actions`), within and past the clamp.
#[test]
fn the_migrated_g1_action_config_gives_v31s_pd_targets() {
    let v = verified();
    let k = v["g1_actions_vs_v31"].as_object().expect("g1_actions_vs_v31 in verified.json");
    assert_eq!(k["v31_recorded_pd_targets_reproduced"], true);
    for file in ["resolved_configs.pt", "resolved_configs_inference.pt"] {
        for what in ["mean_actions", "past_the_clamp", "stiffness", "damping"] {
            let r = &k[&format!("{file}:{what}")];
            assert_eq!(r["bit_identical"], true, "{file}:{what}: {r}");
        }
    }
}

/// Only an inference file next to the checkpoint (as the deploy recording
/// has): migrated, and the caveats say resuming would train with the old
/// release's inference overrides.
#[test]
fn an_inference_only_run_migrates_with_a_caveat_for_training() {
    let m = plan(&repo("testdata/deploy/v31_g1_tracker/last.ckpt"), &DROP).unwrap();
    assert!(m.report.old_configs.ends_with("resolved_configs_inference.pt"), "{}", m.report.old_configs);
    assert!(
        m.report.caveats.iter().any(|c| c.contains("no resolved_configs.pt") && c.contains("inference overrides")),
        "{:?}",
        m.report.caveats
    );
    let full = plan(&repo("testdata/policy/v31_g1_tracker/last.ckpt"), &DROP).unwrap();
    assert!(!full.report.caveats.iter().any(|c| c.contains("no resolved_configs.pt")), "{:?}", full.report.caveats);
}

/// v3.1's smpl-terrains tracker: onto today's complex-terrain template, its
/// terrain config carried over and its `terrain` input computed by both
/// releases' same code (height samples and maps bit for bit, recorded by
/// record_migrate.py terrain); its contact reward dropped (its robot names
/// no contact bodies).
#[test]
fn v31_terrains_tracker_migrates_to_the_verified_files() {
    let report = migrates_to_the_verified_files("v31_terrains_tracker");
    assert_eq!(report.template, "smpl_terrains_tracker");
    let entry = |key: &str| report.entries.iter().find(|e| e.key == key).map(|e| e.action);
    assert_eq!(entry("agent.model.in_keys.terrain"), Some(Action::Mapped));
    assert_eq!(entry("env.reward_components.contact_match_rew"), Some(Action::Dropped));
    let v = verified();
    let case = v["cases"].as_array().unwrap().iter().find(|c| c["name"] == "v31_terrains_tracker").unwrap();
    for file in ["resolved_configs.pt", "resolved_configs_inference.pt"] {
        let t = &case["terrain_vs_v31"][file];
        assert_eq!(t["class"], "ComplexTerrainConfig", "{file}: {t}");
        assert_eq!(t["height_samples_bit_identical"], true, "{file}: {t}");
        assert_eq!(t["height_maps_bit_identical"], true, "{file}: {t}");
    }
    let m = plan(&repo("testdata/policy/v31_terrains_tracker/last.ckpt"), &DROP).unwrap();
    match m.training.get("terrain") {
        Some(Node::Object(o)) => {
            assert_eq!(o.class_name().as_deref(), Some("protomotions.components.terrains.config.ComplexTerrainConfig"));
        }
        other => panic!("terrain: {other:?}"),
    }
    // v3.1's terrain values, not the template's (7 levels; today's experiment 10)
    assert_eq!(m.training.get("terrain.num_levels"), Some(&Node::Int(7)));
}

/// A robot on a terrain no template of it holds is refused naming both.
#[test]
fn a_robot_on_a_terrain_without_a_template_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let g1_on_terrain = edited(tmp.path(), "v31_g1_tracker", |d| {
        let Some(Node::Object(t)) = d.get_mut("terrain") else { panic!("terrain") };
        t.callable = Node::Global {
            module: "protomotions.components.terrains.config".into(),
            name: "ComplexTerrainConfig".into(),
        };
    });
    let e = plan(&g1_on_terrain, &DROP).err().unwrap();
    match &e {
        MigrateError::NoTemplate { class, known, .. } => {
            assert!(
                class.ends_with("G1RobotConfig on protomotions.components.terrains.config.ComplexTerrainConfig"),
                "{class}"
            );
            assert!(known.contains("SmplRobotConfig on ComplexTerrainConfig"), "{known}");
        }
        other => panic!("{other}"),
    }
}

/// Without --drop-unmatched-terms the G1 tracker is refused at its first
/// reward without a same-math counterpart (v3.1's density weights).
#[test]
fn v31_g1_tracker_without_dropping_is_refused_naming_the_density_weights() {
    let e = plan(&repo("testdata/policy/v31_g1_tracker/last.ckpt"), &MigrateOptions::default()).err().unwrap();
    match &e {
        MigrateError::NoCounterpart { key, function, why, .. } => {
            assert_eq!(key, "env.reward_components.relative_body_pos");
            assert_eq!(function, "protomotions.envs.rewards.tracking.relative_body_position_error_exp");
            assert!(why.contains("use_density_weights"), "{why}");
        }
        other => panic!("{other}"),
    }
}

/// A copy of a recorded case's configs with `edit` applied to its root.
fn edited(dir: &Path, case: &str, edit: impl FnOnce(&mut pmstate_ckpt::Dict)) -> PathBuf {
    let src = Checkpoint::open(repo(&format!("testdata/policy/{case}/resolved_configs.pt"))).unwrap();
    let (root, storages) = src.into_parts();
    let Node::Dict(mut d) = root else { panic!("root") };
    edit(&mut d);
    let ckpt = Checkpoint::from_parts(Node::Dict(d), storages).unwrap();
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..WriteOptions::default() };
    save_torch(&ckpt, dir.join("resolved_configs.pt"), &opts).unwrap();
    std::fs::copy(repo(&format!("testdata/policy/{case}/last.ckpt")), dir.join("last.ckpt")).unwrap();
    dir.join("last.ckpt")
}

/// The fields of the object at `path` (dotted) under `d`, mutably.
fn fields_at<'a>(d: &'a mut pmstate_ckpt::Dict, path: &str) -> &'a mut pmstate_ckpt::Dict {
    let mut parts = path.split('.');
    let mut node = d.get_mut(parts.next().unwrap()).unwrap();
    for p in parts {
        node = match node {
            Node::Object(o) => o.state.as_mut().and_then(Node::as_dict_mut).unwrap().get_mut(p).unwrap(),
            Node::Dict(d) => d.get_mut(p).unwrap(),
            other => panic!("{p}: {other:?}"),
        };
    }
    match node {
        Node::Object(o) => o.state.as_mut().and_then(Node::as_dict_mut).unwrap(),
        Node::Dict(d) => d,
        other => panic!("{path}: {other:?}"),
    }
}

/// Today's action config was computed from the template robot: an old robot
/// with another action scale or other gains would get other PD targets.
#[test]
fn a_robot_whose_action_source_differs_from_the_template_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let scaled = edited(tmp.path(), "v31_g1_tracker", |d| {
        fields_at(d, "robot.control").insert("action_scale", Node::Float(0.5));
    });
    let e = plan(&scaled, &DROP).err().unwrap();
    assert!(
        matches!(&e, MigrateError::RobotDiffers { key, template: "g1_tracker", .. } if key == "robot.control.action_scale"),
        "{e}"
    );
    assert_eq!(e.kind(), "robot_differs");
    let tmp = tempfile::tempdir().unwrap();
    let stiffer = edited(tmp.path(), "v31_g1_tracker", |d| {
        fields_at(d, "robot.control.control_info.waist_yaw_joint").insert("stiffness", Node::Float(41.0));
    });
    let e = plan(&stiffer, &DROP).err().unwrap();
    assert!(
        matches!(&e, MigrateError::RobotDiffers { key, .. } if key == "robot.control.control_info.waist_yaw_joint.stiffness"),
        "{e}"
    );
    assert!(e.to_string().contains("other PD targets"), "{e}");
    // other joint limits: the lower limits replaced by the upper ones
    let tmp = tempfile::tempdir().unwrap();
    let narrowed = edited(tmp.path(), "v31_g1_tracker", |d| {
        let k = fields_at(d, "robot.kinematic_info");
        let upper = k.get("dof_limits_upper").unwrap().clone();
        k.insert("dof_limits_lower", upper);
    });
    let e = plan(&narrowed, &DROP).err().unwrap();
    assert!(
        matches!(&e, MigrateError::RobotDiffers { key, .. } if key == "robot.kinematic_info.dof_limits_lower"),
        "{e}"
    );
}

/// A model input no observation component computes is refused naming it,
/// unless today's env computes it in the same code from a config carried
/// over: the `terrain` height map on a complex terrain (v3.1's
/// smpl-terrains, below), not on the smpl tracker's flat one.
#[test]
fn an_input_computed_in_code_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let terrains = edited(tmp.path(), "v31_tracker", |d| {
        let Node::List(keys) = fields_at(d, "agent.model").get_mut("in_keys").unwrap() else { panic!("in_keys") };
        keys.insert(1, Node::Str("terrain".into()));
    });
    let e = plan(&terrains, &DROP).err().unwrap();
    match &e {
        MigrateError::NotMigratable { key, class, why, .. } => {
            assert_eq!((key.as_str(), class.as_str()), ("agent.model.in_keys", "terrain"));
            assert!(why.contains("no observation component"), "{why}");
        }
        other => panic!("{other}"),
    }
}

/// A reward whose function is matched but whose parameters are not (here
/// contact matching on a robot that names no contact bodies, as v3.1's
/// smpl-terrains does) is refused, or dropped on request like any term
/// without a counterpart.
#[test]
fn a_term_whose_parameters_do_not_map_is_refused_or_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let no_contacts = edited(tmp.path(), "v31_tracker", |d| {
        fields_at(d, "robot").insert("contact_bodies", Node::None);
    });
    let strict = MigrateOptions::default();
    let e = plan(&no_contacts, &strict).err().unwrap();
    assert!(
        matches!(&e, MigrateError::NoCounterpart { key, .. } if key == "env.reward_components.action_smoothness"),
        "{e}"
    );
    // the first term dropped, the contact reward is the next refusal without --drop-unmatched-terms
    let m = plan(&no_contacts, &DROP).unwrap();
    let contact = m.report.entries.iter().find(|e| e.key == "env.reward_components.contact_match_rew").unwrap();
    assert_eq!(contact.action, Action::Dropped);
    let note = serde_json::to_value(contact).unwrap()["note"].as_str().unwrap_or_default().to_owned();
    assert!(note.contains("names no contact_bodies"), "{note}");
}

/// v3.1 takes max coords in the root's frame; a template component bound
/// to the robot's anchor computes them in another body's unless the anchor
/// is the root: refused naming the anchor.
#[test]
fn a_root_frame_observation_bound_to_another_anchor_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let moved = edited(tmp.path(), "v31_tracker", |d| {
        fields_at(d, "robot").insert("anchor_body_index", Node::Int(3));
    });
    let e = plan(&moved, &DROP).err().unwrap();
    match &e {
        MigrateError::NoCounterpart { key, why, .. } => {
            assert_eq!(key, "env.observation_components.max_coords_obs");
            assert!(why.contains("root's frame") && why.contains("anchor_body_index 3"), "{why}");
        }
        other => panic!("{other}"),
    }
}

/// A copy of the v3.1 tracker whose env is of a class no release has.
fn unknown_release(dir: &Path) -> PathBuf {
    let src = Checkpoint::open(repo("testdata/policy/v31_tracker/resolved_configs.pt")).unwrap();
    let (root, storages) = src.into_parts();
    let Node::Dict(mut d) = root else { panic!("root") };
    let Some(Node::Object(env)) = d.get_mut("env") else { panic!("env") };
    env.callable = Node::Global { module: "someone.else.config".into(), name: "EnvConfig".into() };
    let ckpt = Checkpoint::from_parts(Node::Dict(d), storages).unwrap();
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..WriteOptions::default() };
    save_torch(&ckpt, dir.join("resolved_configs.pt"), &opts).unwrap();
    std::fs::copy(repo("testdata/policy/v31_tracker/last.ckpt"), dir.join("last.ckpt")).unwrap();
    dir.join("last.ckpt")
}

#[test]
fn an_unknown_release_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let e = plan(&unknown_release(tmp.path()), &DROP).err().unwrap();
    assert!(
        matches!(&e, MigrateError::UnknownRelease { why, .. } if why.contains("someone.else.config.EnvConfig")),
        "{e}"
    );
}

#[test]
fn an_existing_out_dir_is_never_overwritten_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let old = repo("testdata/policy/v31_tracker/last.ckpt");
    // a folder holding someone's file: refused, with or without --force
    std::fs::write(tmp.path().join("notes.txt"), b"mine").unwrap();
    for force in [false, true] {
        let e = migrate(&old, tmp.path(), &MigrateOptions { force, ..DROP }).err().unwrap();
        assert!(matches!(&e, MigrateError::OutDirNotEmpty { first, .. } if first == "notes.txt"), "{e}");
    }
    assert_eq!(std::fs::read(tmp.path().join("notes.txt")).unwrap(), b"mine");
    assert!(!tmp.path().join("last.ckpt").exists());
    // migrate's own files: refused, then replaced with --force
    let out = tmp.path().join("out");
    migrate(&old, &out, &DROP).unwrap();
    std::fs::write(out.join("resolved_configs.pt"), b"edited").unwrap();
    let e = migrate(&old, &out, &DROP).err().unwrap();
    assert!(matches!(e, MigrateError::OutDirNotEmpty { .. }), "{e}");
    assert_eq!(std::fs::read(out.join("resolved_configs.pt")).unwrap(), b"edited");
    migrate(&old, &out, &MigrateOptions { force: true, ..DROP }).unwrap();
    assert_eq!(
        std::fs::read(out.join("resolved_configs.pt")).unwrap(),
        std::fs::read(repo("testdata/migrate/v31_tracker/resolved_configs.pt")).unwrap()
    );
    // no temporary file is left behind
    for e in std::fs::read_dir(&out).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(OUTPUT_FILES.contains(&name.as_str()), "left behind: {name}");
    }
}

/// Today's ProtoMotions loads the migrated files and reproduces v3.1's
/// outputs (record_migrate.py verify --no-write). Needs PMSTATE_PYTHON (a
/// python with torch, lightning, tensordict and ProtoMotions' dependencies)
/// and PMSTATE_PROTOMOTIONS (a checkout at 607ca7a0); skips otherwise.
#[test]
fn todays_protomotions_reproduces_v31_on_the_migrated_files() {
    let (Some(python), Some(pm)) = (std::env::var_os("PMSTATE_PYTHON"), std::env::var_os("PMSTATE_PROTOMOTIONS"))
    else {
        eprintln!("SKIPPED: set PMSTATE_PYTHON and PMSTATE_PROTOMOTIONS to check the migrated files with today's ProtoMotions");
        return;
    };
    let bin = repo("target/debug/pmstate");
    if !bin.is_file() {
        eprintln!("SKIPPED: {} not built (cargo build -p pmstate-cli)", bin.display());
        return;
    }
    let out = std::process::Command::new(python)
        .arg(repo("testdata/migrate/record_migrate.py"))
        .args(["verify", "--no-write", "--protomotions"])
        .arg(pm)
        .arg("--pmstate")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
