//! Strict reading of configs and observations: unknown fields, classes and
//! activations, missing or mistyped fields, and observations of the wrong
//! key, dtype, rank, width or batch are refused with typed errors that name
//! them; neutral unknown fields pass. Also which configs file `Policy::load`
//! picks and the logstd rule.

use std::path::{Path, PathBuf};

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node};
use pmstate_policy::actor::LogstdSource;
use pmstate_policy::{ExprProblem, FieldProblem, GraphProblem, ModelConfig, Policy, PolicyError};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

fn configs(v: &str) -> Checkpoint {
    Checkpoint::open(data(&format!("{v}/resolved_configs.pt"))).unwrap()
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

/// Takes `key` out of a fields dict; whether it was there.
fn remove(d: &mut pmstate_ckpt::Dict, key: &str) -> bool {
    // (no Dict constructor: its ordering argument is changing; the dict's own is reused)
    let (ordered, entries, state) = d.clone().into_parts();
    let before = entries.len();
    let kept: Vec<(Node, Node)> = entries.into_iter().filter(|(k, _)| k.as_str() != Some(key)).collect();
    let removed = kept.len() < before;
    *d = pmstate_ckpt::Dict::from_entries(ordered, kept).unwrap().with_state(state);
    removed
}

/// An empty dict of the kind a config's fields dict is.
fn empty_dict() -> pmstate_ckpt::Dict {
    let mut m = model("smpl_tracker");
    let (ordered, _, _) = fields_mut(&mut m, "").clone().into_parts();
    pmstate_ckpt::Dict::from_entries(ordered, vec![]).unwrap()
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
        "soma_tracker",
    ] {
        ModelConfig::from_node(&model(v), "agent.model").unwrap_or_else(|e| panic!("{v}: {e}"));
    }
}

#[test]
fn unsupported_families_name_the_class_and_what_is_supported() {
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor.mu_model").insert(
        "_target_",
        Node::Str("protomotions.agents.common.autoregressive.DiscreteAutoregressiveTransformer".into()),
    );
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(
        matches!(&e, PolicyError::UnsupportedClass { class, .. } if class.ends_with("DiscreteAutoregressiveTransformer")),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("agent.model.actor.mu_model") && msg.contains("MLPWithConcat") && msg.contains("ModuleContainer"),
        "{msg}"
    );

    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "")
        .insert("_target_", Node::Str("protomotions.agents.masked_mimic.model.MaskedMimicModel".into()));
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(
        matches!(&e, PolicyError::UnsupportedClass { path, class, supported }
            if path == "agent.model" && class.ends_with("MaskedMimicModel")
                && supported == &[pmstate_policy::config::PPO_MODEL, pmstate_policy::config::AMP_MODEL]),
        "{e}"
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
    // the neutral values crates/policy/README.md lists pass on a dataclass ...
    for neutral in [
        Node::None,
        Node::Bool(false),
        Node::Str(String::new()),
        Node::List(vec![]),
        Node::Tuple(vec![]),
        Node::Set(vec![]),
        Node::Dict(empty_dict()),
    ] {
        let mut m = model("smpl_tracker");
        fields_mut(&mut m, "actor.mu_model.layers.0").insert("dropout", neutral.clone());
        ModelConfig::from_node(&m, "agent.model").unwrap_or_else(|e| panic!("{}: {e}", neutral.kind()));
    }
    // ... and nothing else, not even a falsy number or True
    for value in [Node::Int(0), Node::Float(0.0), Node::Bool(true), Node::Str("x".into())] {
        let mut m = model("smpl_tracker");
        fields_mut(&mut m, "actor.mu_model.layers.0").insert("dropout", value.clone());
        let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
        assert!(
            matches!(&e, PolicyError::UnsupportedField { field, .. } if field == "dropout"),
            "{}: {e}",
            value.kind()
        );
    }
    // an operation config's unknown field only as None (module_ops_ppo's first: a Reshape)
    for (value, ok) in [(Node::None, true), (Node::Bool(false), false)] {
        let mut m = model("module_ops_ppo");
        fields_mut(&mut m, "actor.mu_model.module_operations.0").insert("extra", value);
        let r = ModelConfig::from_node(&m, "agent.model");
        assert_eq!(r.is_ok(), ok, "{:?}", r.err().map(|e| e.to_string()));
        if let Err(e) = r {
            assert!(matches!(&e, PolicyError::UnsupportedField { field, .. } if field == "extra"), "{e}");
        }
    }
    // training-only fields hold anything
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "").insert("actor_optimizer", Node::Str("anything".into()));
    ModelConfig::from_node(&m, "agent.model").unwrap();
}

/// A field left out takes its dataclass's default at the reference commit
/// (protomotions/agents/common/config.py, ppo/config.py): the recorded
/// configs set every field, so each is removed here and the parsed value
/// compared with that default.
#[test]
fn absent_fields_take_the_reference_dataclass_defaults() {
    use pmstate_policy::activation::Activation;
    use pmstate_policy::config::{ModuleConfig, Number};
    use pmstate_policy::module_ops::ModuleOp;

    let mut m = model("smpl_tracker");
    // smpl's recorded values differ from the defaults where they can: normalize_obs true, clamp int 5
    for f in ["actor_logstd", "learnable_std"] {
        assert!(remove(fields_mut(&mut m, "actor"), f), "{f}");
    }
    for f in ["normalize_obs", "norm_clamp_value", "norm_ema_decay", "output_activation", "module_operations"] {
        assert!(remove(fields_mut(&mut m, "actor.mu_model"), f), "{f}");
    }
    for f in ["units", "activation", "use_layer_norm"] {
        assert!(remove(fields_mut(&mut m, "actor.mu_model.layers.0"), f), "{f}");
    }
    let cfg = ModelConfig::from_node(&m, "agent.model").unwrap();
    assert_eq!(cfg.actor.actor_logstd, -2.9);
    assert!(!cfg.actor.learnable_std);
    let ModuleConfig::Mlp(mlp) = &cfg.actor.mu_model else { panic!("smpl's mu_model is an MLPWithConcat") };
    assert!(!mlp.norm.normalize_obs);
    assert_eq!(mlp.norm.clamp, Some(Number::Float(5.0)));
    assert_eq!(mlp.norm.ema_decay, Some(0.999));
    assert_eq!(mlp.output_activation, None);
    assert_eq!(mlp.module_operations, [ModuleOp::Forward]);
    let l = mlp.layers[0];
    assert_eq!((l.units, l.activation, l.use_layer_norm), (512, Activation::Relu, false));

    // ObsProcessorConfig's module_operations default to an empty list (a passthrough)
    let mut m = model("container_obsprocessor");
    assert!(remove(fields_mut(&mut m, "actor.mu_model.models.0"), "module_operations"));
    let cfg = ModelConfig::from_node(&m, "agent.model").unwrap();
    let ModuleConfig::Container(c) = &cfg.actor.mu_model else { panic!("a container") };
    let ModuleConfig::ObsProcessor(o) = &c.models[0] else { panic!("models.0 is an ObsProcessor") };
    assert!(o.module_operations.is_empty());
}

#[test]
fn activations_and_ops_are_checked() {
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor.mu_model.layers.2").insert("activation", Node::Str("selu".into()));
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(
        matches!(&e, PolicyError::UnknownActivation { path, name }
            if path == "agent.model.actor.mu_model.layers.2.activation" && name == "selu"),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("agent.model.actor.mu_model.layers.2.activation: activation \"selu\" is not one"),
        "{e}"
    );

    let mut m = model("module_ops_ppo");
    fields_mut(&mut m, "actor.mu_model.module_operations.0")
        .insert("new_shape", Node::List(vec![Node::Str("batch_size / 2".into()), Node::Int(-1)]));
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(
        matches!(&e, PolicyError::BadField { path, field, problem: FieldProblem::BatchExpr { expr, problem: ExprProblem::FloatDivision } }
            if path == "agent.model.actor.mu_model.module_operations.0" && field == "new_shape"
                && expr == "batch_size / 2"),
        "{e}"
    );
}

#[test]
fn a_checkpoint_that_does_not_fit_the_config_is_refused() {
    let cfg = ModelConfig::from_node(&model("smpl_tracker"), "agent.model").unwrap();
    let ckpt = Checkpoint::open(data("welford_clamps/last.ckpt")).unwrap();
    let e = Policy::from_parts(cfg, &ckpt, &Device::Cpu).unwrap_err();
    // the recorded smpl actor has three hidden layers of 16, welford_clamps' two: its
    // third Linear (mlp.4) is already the 16 -> 5 output
    assert!(
        matches!(&e, PolicyError::WeightShape { file, key, got, expected }
            if file.ends_with("welford_clamps/last.ckpt") && key == "model._actor.mu.mlp.4.weight"
                && got == &[5, 16] && expected.starts_with("[16, 16]")),
        "{e}"
    );
    assert!(
        e.to_string().ends_with(
            "model._actor.mu.mlp.4.weight has shape [5, 16], expected [16, 16] (from the config's layer widths)"
        ),
        "{e}"
    );
}

#[test]
fn modules_that_cannot_work_are_refused_with_the_problem() {
    // normalize_obs on a module whose operations never run Forward: the
    // reference raises KeyError 'norm_obs' at the first step
    let mut m = model("module_ops_ppo");
    let ops = fields_mut(&mut m, "actor.mu_model").get_mut("module_operations").unwrap();
    let Node::List(list) = ops else { panic!("module_operations is a list") };
    list.remove(1);
    let cfg = ModelConfig::from_node(&m, "agent.model").unwrap();
    let ckpt = Checkpoint::open(data("module_ops_ppo/last.ckpt")).unwrap();
    let e = Policy::from_parts(cfg, &ckpt, &Device::Cpu).unwrap_err();
    assert!(
        matches!(&e, PolicyError::Graph { path, problem: GraphProblem::NormalizeWithoutForward }
            if path == "agent.model.actor.mu_model"),
        "{e}"
    );
    assert!(e.to_string().contains("KeyError 'norm_obs'"), "{e}");

    // a clamp of 0 would clamp every normalized value to 0
    let mut m = model("module_ops_ppo");
    fields_mut(&mut m, "actor.mu_model").insert("norm_clamp_value", Node::Int(0));
    let cfg = ModelConfig::from_node(&m, "agent.model").unwrap();
    let e = Policy::from_parts(cfg, &ckpt, &Device::Cpu).unwrap_err();
    assert!(
        matches!(&e, PolicyError::BadField { path, field, problem: FieldProblem::ClampNotPositive { value } }
            if path == "agent.model.actor.mu_model" && field == "norm_clamp_value" && value == "0"),
        "{e}"
    );
}

/// `PPO._load_model_state_dict`: a fixed std follows the config's
/// `actor_logstd` when the checkpoint's differs beyond `allclose`; a
/// learnable one is always the checkpoint's.
#[test]
fn a_fixed_std_follows_the_configs_actor_logstd() {
    let ckpt = Checkpoint::open(data("smpl_tracker/last.ckpt")).unwrap();
    let saved = ckpt.to_candle(ckpt.tensor("model._actor.logstd").unwrap(), &Device::Cpu).unwrap();
    let saved: Vec<f32> = saved.to_vec1().unwrap();
    let with_logstd = |logstd: f64, learnable: bool| {
        let mut m = model("smpl_tracker");
        let actor = fields_mut(&mut m, "actor");
        actor.insert("actor_logstd", Node::Float(logstd));
        actor.insert("learnable_std", Node::Bool(learnable));
        Policy::from_parts(ModelConfig::from_node(&m, "agent.model").unwrap(), &ckpt, &Device::Cpu).unwrap()
    };
    let std_of = |p: &Policy| p.actor().std.to_vec1::<f32>().unwrap();

    // the recorded config: fixed, equal to the checkpoint's
    let p = with_logstd(-2.9, false);
    assert_eq!(p.actor().logstd_source, LogstdSource::Checkpoint);
    assert_eq!(p.actor().logstd.to_vec1::<f32>().unwrap(), saved);

    // a different fixed value wins over the checkpoint's
    let p = with_logstd(-1.0, false);
    assert_eq!(p.actor().logstd_source, LogstdSource::ConfigOverride);
    assert_eq!(p.actor().logstd.to_vec1::<f32>().unwrap(), vec![-1.0f32; 69]);
    assert_eq!(std_of(&p), vec![(-1.0f32).exp(); 69]);
    assert!(p.describe().unwrap().to_string().contains("overrides the checkpoint's"));

    // within torch.allclose(atol=1e-6, rtol=1e-5) of the saved one: the checkpoint's is kept
    let p = with_logstd(f64::from(saved[0]) + 5e-6, false);
    assert_eq!(p.actor().logstd_source, LogstdSource::Checkpoint);
    assert_eq!(p.actor().logstd.to_vec1::<f32>().unwrap(), saved);

    // learnable: the checkpoint's, whatever the config says
    let p = with_logstd(-1.0, true);
    assert_eq!(p.actor().logstd_source, LogstdSource::Checkpoint);
    assert_eq!(p.actor().logstd.to_vec1::<f32>().unwrap(), saved);
}

/// `Policy::load` without a configs file reads resolved_configs_inference.pt
/// when it exists next to the checkpoint, else resolved_configs.pt.
#[test]
fn load_picks_the_inference_configs_first() {
    let both = Policy::load(data("smpl_tracker/last.ckpt"), None, &Device::Cpu).unwrap();
    assert_eq!(both.config_path(), Some(data("smpl_tracker/resolved_configs_inference.pt").to_str().unwrap()));
    let only = Policy::load(data("welford_clamps/last.ckpt"), None, &Device::Cpu).unwrap();
    assert_eq!(only.config_path(), Some(data("welford_clamps/resolved_configs.pt").to_str().unwrap()));
    let given = data("smpl_tracker/resolved_configs.pt");
    let p = Policy::load(data("smpl_tracker/last.ckpt"), Some(&given), &Device::Cpu).unwrap();
    assert_eq!(p.config_path(), Some(given.to_str().unwrap()));

    // the same checkpoint in a folder with only resolved_configs.pt, then with none
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(data("smpl_tracker/last.ckpt"), tmp.path().join("last.ckpt")).unwrap();
    let e = Policy::load(tmp.path().join("last.ckpt"), None, &Device::Cpu).unwrap_err();
    assert!(matches!(&e, PolicyError::ConfigNotFound { checkpoint } if checkpoint.ends_with("last.ckpt")), "{e}");
    assert!(e.to_string().ends_with("pass the configs file with --config"), "names the flag: {e}");
    std::fs::copy(data("smpl_tracker/resolved_configs.pt"), tmp.path().join("resolved_configs.pt")).unwrap();
    let p = Policy::load(tmp.path().join("last.ckpt"), None, &Device::Cpu).unwrap();
    assert_eq!(p.config_path(), Some(tmp.path().join("resolved_configs.pt").to_str().unwrap()));
}

#[test]
fn field_errors_name_path_class_and_field() {
    // a required field missing: a Reshape operation relabelled a Permute has no new_order
    let mut m = model("module_ops_ppo");
    let ops = match fields_mut(&mut m, "actor.mu_model").get_mut("module_operations").unwrap() {
        Node::List(xs) => xs,
        other => panic!("{}", other.kind()),
    };
    let i = ops
        .iter()
        .position(|o| matches!(o, Node::Object(o) if o.class_name().is_some_and(|c| c.ends_with("ReshapeConfig"))))
        .unwrap();
    let Node::Object(op) = &mut ops[i] else { unreachable!() };
    let Node::Global { name, .. } = &mut op.callable else { panic!("callable") };
    *name = "ModuleOperationPermuteConfig".into();
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    let at = format!("agent.model.actor.mu_model.module_operations.{i}");
    assert!(
        matches!(&e, PolicyError::MissingField { path, class, field }
            if *path == at && class == "ModuleOperationPermuteConfig" && field == "new_order"),
        "{e}"
    );
    assert_eq!(e.to_string(), format!("{at}.new_order: missing (a ModuleOperationPermuteConfig needs it)"));

    // a field of the wrong type
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor.mu_model.layers.1").insert("units", Node::Str("512".into()));
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(
        matches!(&e, PolicyError::FieldType { path, field, expected, .. }
            if path == "agent.model.actor.mu_model.layers.1" && field == "units" && *expected == "a positive int"),
        "{e}"
    );
    let mut m = model("smpl_tracker");
    fields_mut(&mut m, "actor").insert("actor_logstd", Node::None);
    let e = ModelConfig::from_node(&m, "agent.model").unwrap_err();
    assert!(matches!(&e, PolicyError::FieldType { field, .. } if field == "actor_logstd"), "{e}");
}

#[test]
fn observations_are_checked_by_key_dtype_rank_width_and_batch() {
    use candle_core::{DType, Tensor};
    let policy = Policy::load(data("container_obsprocessor/last.ckpt"), None, &Device::Cpu).unwrap();
    let obs = candle_core::safetensors::load(data("container_obsprocessor/obs.safetensors"), &Device::Cpu).unwrap();
    let run = |edit: &dyn Fn(&mut std::collections::HashMap<String, Tensor>)| {
        let mut o = obs.clone();
        edit(&mut o);
        policy.forward(&o).unwrap_err()
    };
    let zeros = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, &Device::Cpu).unwrap();

    let e = run(&|o| {
        o.remove("obs_b");
    });
    assert!(matches!(&e, PolicyError::MissingObs { key, width: Some(3) } if key == "obs_b"), "{e}");
    let e = run(&|o| {
        o.insert("obs_z".into(), zeros(&[8, 2], DType::F32));
    });
    assert!(
        matches!(&e, PolicyError::ExtraObs { key, expected } if key == "obs_z" && expected.contains(&"obs_a".to_string())),
        "{e}"
    );
    let e = run(&|o| {
        o.insert("obs_c".into(), zeros(&[8, 6], DType::F32));
    });
    assert!(matches!(&e, PolicyError::ObsWidth { key, got: 6, expected: 5 } if key == "obs_c"), "{e}");
    let e = run(&|o| {
        o.insert("obs_c".into(), zeros(&[8, 5], DType::F64));
    });
    assert!(
        matches!(&e, PolicyError::ObsDtype { key, dtype, width: Some(5) } if key == "obs_c" && dtype == "f64"),
        "{e}"
    );
    assert_eq!(e.to_string(), "observation obs_c: dtype f64, expected float32 [B, 5]");
    let e = run(&|o| {
        o.insert("obs_c".into(), zeros(&[8, 5, 1], DType::F32));
    });
    assert!(matches!(&e, PolicyError::ObsRank { key, shape, .. } if key == "obs_c" && shape == &[8, 5, 1]), "{e}");
    assert_eq!(e.to_string(), "observation obs_c: shape [8, 5, 1], expected [B, 5]");
    let e = run(&|o| {
        let keys: Vec<String> = o.keys().cloned().collect();
        let last = keys.iter().max().unwrap();
        let w = o[last].dims()[1];
        o.insert(last.clone(), zeros(&[7, w], DType::F32));
    });
    assert!(matches!(&e, PolicyError::ObsBatch { got: 7, others: 8, .. }), "{e}");

    // the smpl tracker fixes only the sum of its three widths
    let smpl = Policy::load(data("smpl_tracker/last.ckpt"), None, &Device::Cpu).unwrap();
    let mut o = candle_core::safetensors::load(data("smpl_tracker/obs.safetensors"), &Device::Cpu).unwrap();
    o.insert("previous_actions".into(), zeros(&[8, 70], DType::F32));
    let e = smpl.forward(&o).unwrap_err();
    assert!(
        matches!(&e, PolicyError::ObsGroupWidth { module, parts, sum: 1004, total: 1003, .. }
            if module == "agent.model.actor.mu_model" && parts.iter().any(|(k, w)| k == "previous_actions" && *w == 70)),
        "{e}"
    );
}
