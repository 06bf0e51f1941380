//! The pipeline against ProtoMotions' own exported pipeline, recorded by
//! testdata/deploy/record_deploy.py: every observation and every output,
//! against torch (the module the exporter exports) and onnxruntime (the
//! exported graph).

use pmstate_deploy::actions::{ActionFunction, Transform};
use pmstate_deploy::observations::Function;
use pmstate_deploy::Pipeline;

#[path = "common/data.rs"]
mod data;
use data::{flat, load, root};

#[path = "common/heading.rs"]
mod heading;
use heading::{heading_error, HEADING_TOL};

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

/// How far (in ulps of `tanh(a)`) the PD targets of the tanh action
/// function may be from torch's and onnxruntime's, given their actions.
/// This crate evaluates tanh in float64 and rounds (the correctly rounded
/// float32 in all but rare double-rounding cases, within 0.5 ulp); torch's
/// CPU kernel (SLEEF `tanhf_u10`) is within 1 ulp and onnxruntime's (MLAS,
/// a rational approximation) within a few. Measured on the recordings:
/// torch 0 or 1, onnxruntime up to 2 (see the test's output).
const TANH_ULPS: u32 = 3;

/// The largest difference between `ours` and `theirs` (both
/// `offset + scale * tanh(a)`) in ulps of `tanh(a)`: the difference divided
/// by `|scale|`, less the rounding of the products and sums (one ulp of the
/// target each side), over the ulp of our tanh.
fn tanh_target_ulps(f: &ActionFunction, actions: &[f32], ours: &[f32], theirs: &[f32]) -> u32 {
    let nd = f.scale.len();
    let mut most = 0f64;
    for (i, ((a, o), t)) in actions.iter().zip(ours).zip(theirs).enumerate() {
        let s = f64::from(f.scale[i % nd].abs());
        let tanh = a.tanh().abs();
        let ulp_tanh = f64::from(f32::from_bits(tanh.to_bits() + 1) - tanh);
        let ulp_target = f64::from(f32::from_bits(o.abs().to_bits() + 1) - o.abs());
        let d = ((f64::from(*o) - f64::from(*t)).abs() - 2.0 * ulp_target).max(0.0);
        if s > 0.0 {
            most = most.max(d / s / ulp_tanh);
        }
    }
    most.ceil() as u32
}

/// Every observation equals torch's bit for bit; the mean action of this
/// crate, of torch and of onnxruntime each lies within the policy crate's
/// error bound of the float64 reference forward; the PD targets are the
/// action function of the actions to the bit (given torch's actions, this
/// crate's action function gives torch's targets), or for the tanh
/// variant within [`TANH_ULPS`] of tanh; the gains are exact.
///
/// The max-coords tracker's (soma's) observations go through
/// `calc_heading_quat_inv` (`atan2`, `sin`, `cos`), where torch's kernels
/// may differ from libm's by an ulp: they are held to the heading bound of
/// tests/common/heading.rs instead (on these recordings, whose anchors are
/// the special rotations of record_deploy.py, they agree to the bit; the
/// random anchors of the crate's unit test do not).
fn check_recorded_pipeline(variant: &str) {
    let dir = root().join("testdata/deploy").join(variant);
    let p = Pipeline::load(root().join(format!("testdata/policy/{variant}/last.ckpt")), None).expect("load");
    for case in ["b1", "b16"] {
        let inputs = load(&dir.join(format!("inputs_{case}.safetensors")));
        let obs = p.compute_observations(&inputs).expect("observations");
        let want_obs = load(&dir.join(format!("obs_{case}.safetensors")));
        assert_eq!(want_obs.len(), p.observations().len(), "{case}: observation count");
        for o in p.observations() {
            let (k, want) = (&o.key, &want_obs[&o.key]);
            let got = obs.get(k).unwrap_or_else(|| panic!("{case}: no observation {k}"));
            assert_eq!(got.dims(), want.dims(), "{case} {k}");
            // observations in the anchor's heading frame: torch's
            // sin/cos/atan2 kernels may be an ulp off libm's (tests/common/heading.rs)
            let heading_offset = match &o.compute {
                Function::MaxCoords(m) if m.local => Some(1),
                Function::MaxCoordsTargetPoses(_) => Some(0),
                _ => None,
            };
            match heading_offset {
                Some(offset) => {
                    let err = heading_error(&flat(got), &flat(want), o.width, offset);
                    eprintln!("{variant} {case} {k}: {err:.3e} of the heading bound {HEADING_TOL:.0e}");
                    assert!(err <= HEADING_TOL, "{case} {k}: {err:.3e}");
                }
                None => assert_eq!(bits(&flat(got)), bits(&flat(want)), "{case} {k}: not torch's bits"),
            }
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
            eprintln!("{variant} {case}: actions vs {source}: max rel {rel:.3e}, max {ulps} ulps");
            let mut targets = vec![0f32; their_actions.len()];
            let nd = p.dims().num_dofs;
            for (a, t) in their_actions.chunks(nd).zip(targets.chunks_mut(nd)) {
                p.action().targets(a, t);
            }
            let their_targets = flat(&want["joint_pos_targets"]);
            if p.action().transform == Transform::Tanh {
                let ulps = tanh_target_ulps(p.action(), &their_actions, &targets, &their_targets);
                eprintln!("{variant} {case}: targets of {source}'s actions vs {source}'s: max {ulps} ulps of tanh");
                assert!(ulps <= TANH_ULPS, "{case}: {source}'s targets: {ulps} ulps of tanh");
            } else {
                assert_eq!(bits(&targets), bits(&their_targets), "{case}: {source}'s targets");
            }
            eprintln!(
                "{variant} {case}: targets vs {source}: max {} ulps",
                worst(&flat(&out.joint_pos_targets), &flat(&want["joint_pos_targets"])).1
            );
            assert_eq!(bits(&flat(&out.stiffness_targets)), bits(&flat(&want["stiffness_targets"])), "{case} {source}");
            assert_eq!(bits(&flat(&out.damping_targets)), bits(&flat(&want["damping_targets"])), "{case} {source}");
        }
    }
}

/// The g1 shape: reduced coordinates, anchor target poses, processed-action history, `bm_pd_action`.
#[test]
fn observations_and_outputs_match_the_recorded_pipeline() {
    check_recorded_pipeline("g1_amp_deploy");
}

/// The soma shape: max coordinates in the heading frame, full-body target
/// poses, raw-action history, `normalized_pd_fixed_gains_action` with tanh.
#[test]
fn max_coords_observations_and_outputs_match_the_recorded_pipeline() {
    let p = Pipeline::load(root().join("testdata/policy/soma_tracker/last.ckpt"), None).expect("load");
    let functions: Vec<&str> = p.observations().iter().map(|o| o.function.as_str()).collect();
    assert_eq!(
        functions,
        [
            pmstate_deploy::observations::MAX_COORDS,
            pmstate_deploy::observations::HISTORICAL_ACTIONS,
            pmstate_deploy::observations::MAX_COORDS_TARGET_POSES
        ]
    );
    assert_eq!(p.action().transform, Transform::Tanh);
    check_recorded_pipeline("soma_tracker");
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

/// The recorded contract of `variant` and ours, parsed, with the
/// checkpoint paths checked and blanked.
fn contracts(variant: &str) -> (Pipeline, serde_json::Value, serde_json::Value) {
    let recorded = std::fs::read_to_string(root().join(format!("testdata/deploy/{variant}/contract.yaml")))
        .expect("contract.yaml");
    let mut want = parse(&recorded);
    let rel = format!("testdata/policy/{variant}/last.ckpt");
    let p = Pipeline::load(root().join(&rel), None).expect("load");
    let mut got = parse(&p.contract().to_yaml());
    assert_eq!(want["metadata"]["checkpoint"], rel.as_str());
    assert!(
        got["metadata"]["checkpoint"].as_str().is_some_and(|c| c.ends_with(&rel)),
        "{}",
        got["metadata"]["checkpoint"]
    );
    for doc in [&mut want, &mut got] {
        doc["metadata"]["checkpoint"] = serde_json::Value::Null;
    }
    (p, want, got)
}

/// `deploy contract`'s YAML has every field of the exporter's
/// `unified_pipeline.yaml` with the same value, plus the documented
/// additions, nothing else.
#[test]
fn contract_equals_the_exporters_yaml() {
    let (_, want, mut got) = contracts("g1_amp_deploy");
    let control = got["control"].as_object_mut().expect("control");
    assert_eq!(control.remove("action_function"), Some("bm_pd_action".into()));
    assert_eq!(control.remove("action_transform"), Some("none".into()));
    assert_eq!(got, want);
}

/// The soma contract against the exporter's (run with the two run-time
/// patches record_deploy.py documents, so that it can write one at all):
/// equal but for the corrections listed in `contract::CORRECTIONS` that
/// apply to it, each checked here: the raw-action history fed back from
/// `actions`, the tanh variant's scale, the added action fields, and the
/// exporter's free-text `source` notes, which are not reproduced (and
/// which the recorder drops, listing where).
#[test]
fn max_coords_contract_equals_the_exporters_yaml_but_the_corrections() {
    use serde_json::Value as J;
    let (p, want, mut got) = contracts("soma_tracker");
    let control = got["control"].as_object_mut().expect("control");
    assert_eq!(control.remove("action_function"), Some("normalized_pd_fixed_gains_action".into()));
    assert_eq!(control.remove("action_transform"), Some("tanh".into()));
    // the exporter looks for `action_scale`; the tanh variant's is `pd_action_scale`
    assert_eq!(want["control"]["action_scale"], J::Null);
    let scale: Vec<J> = p.action().scale.iter().map(|s| J::from(f64::from(*s))).collect();
    assert_eq!(scale.len(), 66);
    assert_eq!(control.insert("action_scale".into(), J::Null), Some(J::Array(scale)));
    // the raw-action history is fed back from `actions`, not the PD targets
    let inputs = got["policy_inputs"].as_array_mut().expect("policy_inputs");
    let history = inputs.iter_mut().find(|i| i["key"] == "historical.actions").expect("historical.actions");
    assert_eq!(history["output_key"], "actions");
    history["output_key"] = "robot_action".into();
    // the exporter's `source` notes were dropped by the recorder (its
    // prose is not committed) and are not reproduced
    let manifest: J = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/deploy/manifest.json")).expect("manifest.json"),
    )
    .expect("manifest");
    let dropped = &manifest["variants"]["soma_tracker"]["contract_source_notes_removed"];
    assert_eq!(dropped, &serde_json::json!(["mimic.future_pos", "mimic.future_rot"]));
    for doc in [&want, &got] {
        let inputs = doc["policy_inputs"].as_array().expect("policy_inputs");
        assert!(inputs.iter().all(|i| i.get("source").is_none()));
    }
    // the body inputs the exporter cannot describe, with the kinds both sides use
    let kinds: Vec<(&str, &str)> = want["policy_inputs"]
        .as_array()
        .expect("policy_inputs")
        .iter()
        .filter_map(|i| Some((i["key"].as_str()?, i["kind"].as_str()?)))
        .filter(|(k, _)| k.starts_with("current.") || *k == "ground_heights")
        .collect();
    assert_eq!(
        kinds,
        [
            ("current.rigid_body_ang_vel", "body_ang_vel"),
            ("current.rigid_body_pos", "body_pos"),
            ("current.rigid_body_rot", "body_rot"),
            ("current.rigid_body_vel", "body_vel"),
            ("ground_heights", "ground_height"),
        ]
    );
    assert_eq!(want["robot"]["anchor_body_name"], J::Null);
    assert_eq!(got, want);
}
