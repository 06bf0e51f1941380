//! The pipeline against ProtoMotions' own exported pipeline, recorded by
//! testdata/deploy/record_deploy.py: every observation and every output,
//! against torch (the module the exporter exports) and onnxruntime (the
//! exported graph).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pmstate_deploy::Pipeline;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(p: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(p, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32 tensor")
}

/// Largest |a - b| / (1 + |b|) and the largest difference in ulps.
fn worst(a: &[f32], b: &[f32]) -> (f64, u32) {
    assert_eq!(a.len(), b.len());
    let mut rel = 0f64;
    let mut ulps = 0u32;
    for (x, y) in a.iter().zip(b) {
        let d = (f64::from(*x) - f64::from(*y)).abs() / (1.0 + f64::from(y.abs()));
        rel = rel.max(d);
        let u = (x.to_bits() as i64 - y.to_bits() as i64).unsigned_abs() as u32;
        if x != y {
            ulps = ulps.max(u);
        }
    }
    (rel, ulps)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every observation equals torch's bit for bit; the mean action of this
/// crate, of torch and of onnxruntime each lies within the policy crate's
/// error bound of the float64 reference forward; the PD targets are the
/// action function of the actions to the bit (given torch's actions, this
/// crate's action function gives torch's targets); the gains are exact.
#[test]
fn observations_and_outputs_match_the_recorded_pipeline() {
    let dir = root().join("testdata/deploy/g1_amp_deploy");
    let p = Pipeline::load(root().join("testdata/policy/g1_amp_deploy/last.ckpt"), None).expect("load");
    for case in ["b1", "b16"] {
        let inputs = load(&dir.join(format!("inputs_{case}.safetensors")));
        let obs = p.compute_observations(&inputs).expect("observations");
        let want_obs = load(&dir.join(format!("obs_{case}.safetensors")));
        assert_eq!(want_obs.len(), p.observations().len(), "{case}: observation count");
        for (k, want) in &want_obs {
            let got = obs.get(k).unwrap_or_else(|| panic!("{case}: no observation {k}"));
            assert_eq!(got.dims(), want.dims(), "{case} {k}");
            assert_eq!(bits(&flat(got)), bits(&flat(want)), "{case} {k}: not torch's bits");
        }
        let reference = p.policy().actor_reference(&obs).expect("reference");
        let out = p.forward(&inputs).expect("forward");
        let ours = flat(&out.actions);
        assert!(pmstate_policy::bound::within(&ours, &reference, 1.0).is_none(), "{case}: our actions");
        for source in ["torch", "ort"] {
            let want = load(&dir.join(format!("{source}_{case}.safetensors")));
            for (name, got) in out.named() {
                assert_eq!(got.dims(), want[name].dims(), "{case} {source} {name}");
            }
            let their_actions = flat(&want["actions"]);
            let hit = pmstate_policy::bound::within(&their_actions, &reference, 1.0);
            assert!(hit.is_none(), "{case}: {source}'s actions outside the bound: {hit:?}");
            let (rel, ulps) = worst(&ours, &their_actions);
            eprintln!("{case}: actions vs {source}: max rel {rel:.3e}, max {ulps} ulps");
            let mut targets = vec![0f32; their_actions.len()];
            let nd = p.dims().num_dofs;
            for (a, t) in their_actions.chunks(nd).zip(targets.chunks_mut(nd)) {
                p.action().targets(a, t);
            }
            assert_eq!(bits(&targets), bits(&flat(&want["joint_pos_targets"])), "{case}: {source}'s targets");
            eprintln!(
                "{case}: targets vs {source}: max {} ulps",
                worst(&flat(&out.joint_pos_targets), &flat(&want["joint_pos_targets"])).1
            );
            assert_eq!(bits(&flat(&out.stiffness_targets)), bits(&flat(&want["stiffness_targets"])), "{case} {source}");
            assert_eq!(bits(&flat(&out.damping_targets)), bits(&flat(&want["damping_targets"])), "{case} {source}");
        }
    }
}

/// Maps with sorted keys, floats as f64: YAML documents compared by value.
fn normalize(y: &yaml_rust2::Yaml) -> serde_json::Value {
    use serde_json::Value as J;
    use yaml_rust2::Yaml;
    match y {
        Yaml::Real(r) => J::from(r.parse::<f64>().expect("a float")),
        Yaml::Integer(i) => J::from(*i),
        Yaml::String(s) => J::from(s.clone()),
        Yaml::Boolean(b) => J::from(*b),
        Yaml::Array(a) => J::Array(a.iter().map(normalize).collect()),
        Yaml::Hash(h) => {
            let mut m: Vec<(String, J)> = h
                .iter()
                .map(|(k, v)| (k.as_str().map(str::to_owned).unwrap_or_else(|| format!("{k:?}")), normalize(v)))
                .collect();
            m.sort_by(|a, b| a.0.cmp(&b.0));
            J::Object(m.into_iter().collect())
        }
        Yaml::Null => J::Null,
        other => panic!("unexpected YAML node {other:?}"),
    }
}

fn parse(text: &str) -> serde_json::Value {
    let docs = yaml_rust2::YamlLoader::load_from_str(text).expect("YAML");
    normalize(&docs[0])
}

/// `deploy contract`'s YAML has every field of the exporter's
/// `unified_pipeline.yaml` with the same value, plus the documented
/// additions, nothing else.
#[test]
fn contract_equals_the_exporters_yaml() {
    let recorded =
        std::fs::read_to_string(root().join("testdata/deploy/g1_amp_deploy/contract.yaml")).expect("contract.yaml");
    let mut want = parse(&recorded);
    let rel = "testdata/policy/g1_amp_deploy/last.ckpt";
    let p = Pipeline::load(root().join(rel), None).expect("load");
    let mut got = parse(&p.contract().to_yaml());
    assert_eq!(want["metadata"]["checkpoint"], rel);
    assert!(
        got["metadata"]["checkpoint"].as_str().is_some_and(|c| c.ends_with(rel)),
        "{}",
        got["metadata"]["checkpoint"]
    );
    for doc in [&mut want, &mut got] {
        doc["metadata"]["checkpoint"] = serde_json::Value::Null;
    }
    let control = got["control"].as_object_mut().expect("control");
    assert_eq!(control.remove("action_function"), Some("bm_pd_action".into()));
    assert_eq!(control.remove("action_transform"), Some("none".into()));
    assert_eq!(got, want);
}
