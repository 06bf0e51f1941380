//! The FSQ tracker (testdata/policy/soma_fsq_tracker, recorded from the
//! shipped soma_bones_fsq experiment with ProtoMotions' own classes):
//! `describe` names the quantizer and the encoder's and decoder's modules,
//! the latent is not an observation, and every FSQ config value this crate
//! does not implement is refused with an error naming the field.
//! (Parity with torch: tests/parity.rs.)

use std::path::{Path, PathBuf};

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node};
use pmstate_policy::{FieldProblem, FsqKeyRole, ModelConfig, Policy, PolicyError};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

fn configs() -> Checkpoint {
    Checkpoint::open(data("soma_fsq_tracker/resolved_configs.pt")).unwrap()
}

fn model() -> Node {
    configs().get("agent.model").unwrap().clone()
}

fn fsq_fields(node: &mut Node) -> &mut pmstate_ckpt::Dict {
    let mut cur = node;
    for part in ["actor", "mu_model"] {
        cur = match cur {
            Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap().get_mut(part).unwrap(),
            other => panic!("{part}: {}", other.kind()),
        };
    }
    match cur {
        Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap(),
        other => panic!("{}", other.kind()),
    }
}

fn refused(edit: impl FnOnce(&mut pmstate_ckpt::Dict)) -> PolicyError {
    let mut m = model();
    edit(fsq_fields(&mut m));
    match ModelConfig::from_node(&m, "agent.model") {
        Err(e) => e,
        Ok(cfg) => {
            let ckpt = Checkpoint::open(data("soma_fsq_tracker/last.ckpt")).unwrap();
            Policy::from_parts(cfg, &ckpt, &Device::Cpu).expect_err("refused at load")
        }
    }
}

fn field_of(e: &PolicyError) -> (&str, &str, &FieldProblem) {
    match e {
        PolicyError::BadField { path, field, problem } => (path, field, problem),
        other => panic!("not a BadField: {other}"),
    }
}

#[test]
fn describe_names_the_quantizer_and_both_halves() {
    let p = Policy::load(data("soma_fsq_tracker/last.ckpt"), None, &Device::Cpu).unwrap();
    let d = p.describe().unwrap();
    let actor = &d.networks[0];
    assert_eq!(actor.role, "actor");
    assert_eq!(actor.path, "agent.model.actor.mu_model");
    assert_eq!(actor.out_key, "mu");
    // the latent is written by the encoder: not an input of the actor
    assert_eq!(actor.in_keys, ["mimic_target_poses", "max_coords_obs"]);
    let paths: Vec<&str> = actor.modules.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["agent.model.actor.mu_model.encoder", "agent.model.actor.mu_model.decoder"]);
    assert_eq!(actor.modules[0].layers.last().unwrap(), "8->40");
    assert_eq!(actor.modules[1].in_keys, ["max_coords_obs", "latent"]);
    let [q] = actor.quantizers.as_slice() else { panic!("one quantizer: {:?}", actor.quantizers) };
    assert_eq!((q.levels, q.scalars, q.half_width), (9, 40, 4.0));
    assert_eq!(q.latent_key, "latent");
    // the observation widths: as record_policy.py computed them from the env's components
    let width = |k: &str| d.in_keys.iter().find(|w| w.key == k).and_then(|w| w.width);
    assert_eq!(width("mimic_target_poses"), Some(3864));
    assert_eq!(width("max_coords_obs"), Some(343));
    assert!(d.in_keys.iter().all(|k| k.key != "latent"));
    let text = d.to_string();
    assert!(
        text.contains(
            "FSQ quantizer agent.model.actor.mu_model: 40 scalars x 9 levels, latent = round_half_even(tanh(latent) * 4.49955), codes in [-4, 4]"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["networks"][0]["quantizers"][0]["levels"], 9);
    // networks without one say nothing of quantizers
    assert!(json["networks"][1].get("quantizers").is_none());
}

#[test]
fn policy_outputs_carry_the_codes() {
    let p = Policy::load(data("soma_fsq_tracker/last.ckpt"), None, &Device::Cpu).unwrap();
    let obs = candle_core::safetensors::load(data("soma_fsq_tracker/obs.safetensors"), &Device::Cpu).unwrap();
    let out = p.forward(&obs).unwrap();
    let codes = out.latent_codes.expect("an FSQ actor has codes");
    assert_eq!(codes.dims(), [8, 40]);
    let v = codes.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(v.iter().all(|c| c.fract() == 0.0 && c.abs() <= 4.0), "{v:?}");
    // the deployment path (actor only) gives the same mean
    let m = p.mean_action(&obs).unwrap();
    let bits = |t: &candle_core::Tensor| {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect::<Vec<_>>()
    };
    assert_eq!(bits(&m), bits(&out.mean_action));
    // a policy without FSQ has none
    let p = Policy::load(data("soma_tracker/last.ckpt"), None, &Device::Cpu).unwrap();
    let obs = candle_core::safetensors::load(data("soma_tracker/obs.safetensors"), &Device::Cpu).unwrap();
    assert!(p.forward(&obs).unwrap().latent_codes.is_none());
}

#[test]
fn fsq_settings_not_implemented_are_refused_naming_the_field() {
    // even levels: the module itself raises
    let e = refused(|f| f.insert("num_fsq_levels", Node::Int(8)));
    let (path, field, problem) = field_of(&e);
    assert_eq!((path, field), ("agent.model.actor.mu_model", "num_fsq_levels"));
    assert_eq!(problem, &FieldProblem::FsqLevels { levels: 8 });
    assert!(e.to_string().contains("num_fsq_levels"), "{e}");
    // one level: 0/0 in the module's scale
    let e = refused(|f| f.insert("num_fsq_levels", Node::Int(1)));
    assert_eq!(field_of(&e).1, "num_fsq_levels");
    // a latent key other than the encoder's output
    let e = refused(|f| f.insert("latent_key", Node::Str("z".into())));
    let (_, field, problem) = field_of(&e);
    assert_eq!(field, "latent_key");
    assert!(matches!(problem, FieldProblem::FsqKey { key, role: FsqKeyRole::Latent } if key == "z"));
    // an encoder_out_keys the encoder does not write
    let e = refused(|f| f.insert("encoder_out_keys", Node::List(vec![Node::Str("other".into())])));
    assert_eq!(field_of(&e).1, "encoder_out_keys");
    let e = refused(|f| f.insert("decoder_out_keys", Node::List(vec![Node::Str("other".into())])));
    assert_eq!(field_of(&e).1, "decoder_out_keys");
    // num_fsq_scalars that the encoder's weights contradict
    let e = refused(|f| f.insert("num_fsq_scalars", Node::Int(39)));
    let (_, field, problem) = field_of(&e);
    assert_eq!(field, "num_fsq_scalars");
    assert_eq!(problem, &FieldProblem::FsqScalars { encoder: 40, scalars: 39 });
    assert!(e.to_string().contains("encoder output dim (40) must match num_fsq_scalars (39)"), "{e}");
    // an unknown field with a value (a newer FSQ option)
    let e = refused(|f| f.insert("fsq_eps", Node::Float(1e-3)));
    assert!(
        matches!(&e, PolicyError::UnsupportedField { field, path, .. } if field == "fsq_eps" && path == "agent.model.actor.mu_model"),
        "{e}"
    );
}

#[test]
fn the_amp_fsq_tracker_has_its_discriminator_and_surface_input() {
    let p = Policy::load(data("soma_fsq_amp/last.ckpt"), None, &Device::Cpu).unwrap();
    let d = p.describe().unwrap();
    let roles: Vec<&str> = d.networks.iter().map(|n| n.role).collect();
    assert_eq!(roles, ["actor", "critic", "discriminator", "disc_critic"]);
    assert_eq!(d.networks[0].in_keys, ["mimic_target_poses", "max_coords_obs", "nearest_surface"]);
    assert_eq!(d.networks[0].quantizers.len(), 1);
    assert!(d.networks[2].quantizers.is_empty());
    // the decoder reads two observations beside the codes: only their sum is fixed
    let g = d.width_groups.iter().find(|g| g.module == "agent.model.actor.mu_model.decoder").unwrap();
    assert_eq!(g.keys, ["max_coords_obs", "nearest_surface", "latent"]);
    assert_eq!(g.total, 401);
    let obs = candle_core::safetensors::load(data("soma_fsq_amp/obs.safetensors"), &Device::Cpu).unwrap();
    let w = |k: &str| obs[k].dims()[1];
    assert_eq!(w("max_coords_obs") + w("nearest_surface") + 40, 401);
    // the discriminator runs on its own keys; the actor's codes do not depend on it
    let disc = p.discriminate(&obs).unwrap();
    assert_eq!(disc.disc_logits.dims(), [8, 1]);
    assert!(p.forward(&obs).unwrap().latent_codes.is_some());
}
