//! Strict config reading: unknown fields, classes and activations are
//! refused with errors that name them; neutral unknown fields pass.

use std::path::Path;

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node};
use pmstate_policy::{ModelConfig, Policy, PolicyError};

fn configs(v: &str) -> Checkpoint {
    Checkpoint::open(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(v).join("resolved_configs.pt"),
    )
    .unwrap()
}

fn model(v: &str) -> Node {
    configs(v).get("agent.model").unwrap().clone()
}

/// The fields dict of the object at dotted `path` under `node`.
fn fields_mut<'a>(node: &'a mut Node, path: &str) -> &'a mut pmstate_ckpt::Dict {
    let mut cur = node;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        cur = match cur {
            Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap().get_mut(part).unwrap(),
            Node::List(xs) => &mut xs[part.parse::<usize>().unwrap()],
            other => panic!("{part}: {}", other.kind()),
        };
    }
    match cur {
        Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap(),
        other => panic!("{}", other.kind()),
    }
}

#[test]
fn the_recorded_configs_parse() {
    for v in [
        "smpl_tracker",
        "g1_amp_deploy",
        "layernorm_activations",
        "welford_clamps",
        "container_obsprocessor",
        "module_ops_ppo",
        "module_ops_amp",
    ] {
        ModelConfig::from_node(&model(v), "agent.model").unwrap_or_else(|e| panic!("{v}: {e}"));
    }
}

#[test]
fn unsupported_families_name_the_class_and_what_is_supported() {
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor.mu_model")
        .insert("_target_", Node::Str("protomotions.agents.common.transformer.Transformer".into()));
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(matches!(&e, PolicyError::UnsupportedClass { class, .. } if class.ends_with("Transformer")), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("agent.model.actor.mu_model") && msg.contains("MLPWithConcat") && msg.contains("ModuleContainer"),
        "{msg}"
    );

    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "")
        .insert("_target_", Node::Str("protomotions.agents.masked_mimic.model.MaskedMimicModel".into()));
    let msg = ModelConfig::from_node(&m, "agent.model").unwrap_err().to_string();
    assert!(
        msg.contains("MaskedMimicModel is not supported") && msg.contains("PPOModel") && msg.contains("AMPModel"),
        "{msg}"
    );
}

#[test]
fn unknown_fields_must_be_absent_or_neutral() {
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor.mu_model").insert("dropout", Node::Float(0.1));
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(
        matches!(&e, PolicyError::UnsupportedField { class, field, .. } if class.ends_with("MLPWithConcatConfig") && field == "dropout"),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "agent.model.actor.mu_model: protomotions.agents.common.config.MLPWithConcatConfig.dropout = 0.1 is not supported (only its default, or leaving it out)"
    );
    for neutral in [Node::None, Node::Bool(false), Node::List(vec![])] {
        let mut m = model("smpl_tracker");
        fields_mut(&mut m, "actor.mu_model.layers.0").insert("dropout", neutral);
        ModelConfig::from_node(&m, "agent.model").unwrap();
    }
    // training-only fields hold anything
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "").insert("actor_optimizer", Node::Str("anything".into()));
    ModelConfig::from_node(&m, "agent.model").unwrap();
}

#[test]
fn activations_and_ops_are_checked() {
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor.mu_model.layers.2").insert("activation", Node::Str("selu".into()));
    let msg = ModelConfig::from_node(&m, "agent.model").unwrap_err().to_string();
    assert!(msg.contains("agent.model.actor.mu_model.layers.2.activation") && msg.contains("\"selu\""), "{msg}");

    let mut m = model("module_ops_ppo");
    fields_mut(&mut m, "actor.mu_model.module_operations.0")
        .insert("new_shape", Node::List(vec![Node::Str("batch_size / 2".into()), Node::Int(-1)]));
    let msg = ModelConfig::from_node(&m, "agent.model").unwrap_err().to_string();
    assert!(msg.contains("module_operations.0") && msg.contains("float"), "{msg}");
}

#[test]
fn a_checkpoint_that_does_not_fit_the_config_is_refused() {
    let cfg = ModelConfig::from_node(&model("smpl_tracker"), "agent.model").unwrap();
    let ckpt =
        Checkpoint::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/welford_clamps/last.ckpt"))
            .unwrap();
    let e = Policy::from_parts(cfg, &ckpt, &Device::Cpu).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("welford_clamps/last.ckpt") && msg.contains("running_obs_norm") || msg.contains("mlp."),
        "{msg}"
    );
}
