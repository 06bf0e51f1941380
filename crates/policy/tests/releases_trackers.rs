//! The PPO motion trackers of ProtoMotions v3.0 and v3.1
//! (testdata/policy/v30_tracker, v31_tracker, and v3.1's G1 and
//! complex-terrain ones, v31_g1_tracker and v31_terrains_tracker, recorded
//! by record_releases.py from each release's own `PPOModel`, built from that
//! release's published motion_tracker/smpl (g1-amass, smpl-terrains)
//! resolved configs at shrunk widths, trained 60 steps by its
//! agent's optimizers, saved by its `agent.save`): their classes are today's, so `Policy` reads them as
//! they are; the mean action and value within the derived float32 bound of
//! the float64 reference (torch's within twice it, as tests/parity.rs
//! checks today's), the neglogp of torch's own action as torch computes it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pmstate_policy::bound::{within, Bounded};
use pmstate_policy::Policy;

fn dir(v: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(v)
}

fn load(p: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(p, &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn assert_within(what: &str, v: &str, got: &Tensor, reference: &Bounded, factor: f64) {
    let g = flat(got);
    assert_eq!(g.len(), reference.value.len(), "{v}: {what}: size");
    if let Some((i, d, b)) = within(&g, reference, factor) {
        panic!("{v}: {what}[{i}] = {} is {d:e} from the reference {}, bound {b:e}", g[i], reference.value[i]);
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    flat(a).iter().zip(flat(b)).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn release_trackers_match_torch_within_the_derived_bound() {
    let cases: [(&str, &[&str], usize); 4] = [
        ("v30_tracker", &["historical_previous_actions", "max_coords_obs", "mimic_target_poses"], 69),
        ("v31_tracker", &["max_coords_obs", "mimic_target_poses", "previous_actions"], 69),
        // on complex terrain: the terrain height map as a fourth input
        ("v31_terrains_tracker", &["max_coords_obs", "mimic_target_poses", "previous_actions", "terrain"], 69),
        // the G1's actor reads its own keys, not the critic's
        (
            "v31_g1_tracker",
            &[
                "historical_previous_actions",
                "noisy_historical_reduced_coords_obs",
                "noisy_mimic_reduced_coords_target_poses",
                "noisy_reduced_coords_obs",
            ],
            29,
        ),
    ];
    for (v, keys, action_size) in cases {
        let d = dir(v);
        let policy = Policy::load(d.join("last.ckpt"), None, &Device::Cpu).unwrap_or_else(|e| panic!("{v}: {e}"));
        let mut got_keys = policy.actor_keys();
        got_keys.sort();
        assert_eq!(got_keys, keys, "{v}");
        assert_eq!(policy.action_size(), action_size, "{v}");
        let obs = load(&d.join("obs.safetensors"));
        let exp = load(&d.join("expected.safetensors"));
        let out = policy.forward(&obs).unwrap_or_else(|e| panic!("{v}: {e}"));
        let reference = policy.reference(&obs).unwrap();
        let mu = &reference.values[&policy.actor().mu_key];
        assert_within("mean_action (torch)", v, &exp["mean_action"], mu, 2.0);
        assert_within("mean_action", v, &out.mean_action, mu, 1.0);
        let val = &reference.values[policy.critic().out_key()];
        assert_within("value (torch)", v, &exp["value"], val, 2.0);
        assert_within("value", v, &out.value, val, 1.0);
        // neglogp of torch's own action under torch's mean
        let nlp = flat(&policy.neglogp(&exp["mean_action"], &exp["action"]).unwrap());
        for (i, (a, b)) in nlp.iter().zip(flat(&exp["neglogp"])).enumerate() {
            let tol = 1e-5 * (1.0 + b.abs());
            assert!((a - b).abs() <= tol, "{v}: neglogp[{i}] {a} vs torch {b}");
        }
        eprintln!(
            "{v}: max |ours - torch| mean_action {:e}, value {:e}",
            max_abs_diff(&out.mean_action, &exp["mean_action"]),
            max_abs_diff(&out.value, &exp["value"])
        );
    }
}

/// v3.0's configs declare no observation components (its Mimic env
/// computes them in code): a width the checkpoint leaves open says so.
#[test]
fn v30_open_widths_say_the_release_computes_observations_in_code() {
    let p = Policy::load(dir("v30_tracker").join("last.ckpt"), None, &Device::Cpu).unwrap();
    let d = p.describe().unwrap();
    let open: Vec<String> = d.in_keys.iter().filter_map(|k| k.open_because.as_ref().map(|o| o.to_string())).collect();
    assert!(!open.is_empty());
    assert!(open.iter().all(|o| o.contains("v3.0 and earlier compute their observations in code")), "{open:?}");
}
