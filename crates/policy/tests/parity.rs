//! The recorded ProtoMotions policies (testdata/policy, written by
//! record_policy.py with the reference's own classes and `BaseAgent.save`)
//! against this crate: normalizer outputs within 1 ulp, every network
//! output within twice the derived float32 error bound (see `bound`), the
//! std, neglogp and the discriminator reward as torch computes them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pmstate_policy::bound::{within, Bounded};
use pmstate_policy::module_ops::ModuleOp;
use pmstate_policy::network::Leaf;
use pmstate_policy::{Part, Policy};

/// How far (in ulps) a normalizer output may be from torch's, given the same
/// input: torch's float32 std is one ulp off the correctly rounded one in
/// some columns, which moves a quotient by up to 2 ulps ([`sqrt_ulps`]).
const NORM_ULPS: u32 = 2;

const VARIANTS: [&str; 10] = [
    "smpl_tracker",
    "g1_amp_deploy",
    "layernorm_activations",
    "welford_clamps",
    "container_obsprocessor",
    "module_ops_ppo",
    "module_ops_amp",
    "soma_tracker",
    "soma_fsq_tracker",
    "soma_fsq_amp",
];

fn dir(v: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(v)
}

fn load(p: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(p, &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Distance in units in the last place (both finite f32).
fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            i32::MIN.wrapping_sub(i)
        } else {
            i
        }
    };
    key(a).wrapping_sub(key(b)).unsigned_abs()
}

fn max_ulps(a: &Tensor, b: &Tensor) -> u32 {
    assert_eq!(a.dims(), b.dims());
    flat(a).iter().zip(flat(b)).map(|(&x, y)| ulps(x, y)).max().unwrap_or(0)
}

fn assert_within(what: &str, v: &str, got: &Tensor, reference: &Bounded, factor: f64) {
    let g = flat(got);
    assert_eq!(g.len(), reference.value.len(), "{v}: {what}: size");
    if let Some((i, d, b)) = within(&g, reference, factor) {
        panic!("{v}: {what}[{i}] = {} is {d:e} from the reference {}, bound {b:e}", g[i], reference.value[i]);
    }
}

fn check_variant(v: &str, ckpt_name: &str) {
    let d = dir(v);
    let policy = Policy::load(d.join(ckpt_name), None, &Device::Cpu).unwrap_or_else(|e| panic!("{v}: {e}"));
    let obs = load(&d.join("obs.safetensors"));
    let exp = load(&d.join("expected.safetensors"));
    let out = policy.forward(&obs).unwrap_or_else(|e| panic!("{v}: {e}"));
    let reference = policy.reference(&obs).unwrap();
    check_act(v, &policy, &obs, &out);

    // normalizer outputs: bit for bit given torch's sqrt, within NORM_ULPS of torch's, all within the bound
    let norm_obs = out.norm_obs.as_ref().expect("actor normalizes");
    let u = max_ulps(norm_obs, &exp["norm_obs"]);
    assert!(u <= NORM_ULPS, "{v}: norm_obs {u} ulps from torch's");
    check_normalizers(v, &policy, &obs, &exp, &reference, &out.normalized);
    // network outputs within twice the bound of the reference (ours within once)
    let mu = &reference.values[&policy.actor().mu_key];
    assert_within("mean_action (torch)", v, &exp["mean_action"], mu, 2.0);
    assert_within("mean_action", v, &out.mean_action, mu, 1.0);
    {
        let (g, e) = (flat(&out.mean_action), flat(&exp["mean_action"]));
        let diff = g.iter().zip(&e).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
        let bmax = mu.bound.iter().cloned().fold(0.0, f64::max);
        let ratio = g.iter().zip(&e).zip(&mu.bound).map(|((a, b), bd)| (a - b).abs() as f64 / bd).fold(0.0, f64::max);
        let vmax = mu.value.iter().map(|v| v.abs()).fold(0.0, f64::max);
        eprintln!("{v}: mean_action max |torch - ours| {diff:.2e}, max bound {bmax:.2e}, max |value| {vmax:.2e}, worst diff/bound {ratio:.3}");
    }
    if exp.contains_key("latent_codes") {
        check_fsq(v, &policy, &out, &exp, &reference);
    } else {
        assert!(out.latent_codes.is_none(), "{v}: codes without an FSQ autoencoder");
    }
    let val = &reference.values[policy.critic().out_key()];
    assert_within("value (torch)", v, &exp["value"], val, 2.0);
    assert_within("value", v, &out.value, val, 1.0);

    // std: exp of the same float32 logstd, within 1 ulp of torch's exp
    assert_eq!(flat(&policy.actor().logstd), flat(&exp["logstd"]), "{v}: logstd");
    assert!(max_ulps(&out.std, &exp["std"]) <= 1, "{v}: std");

    // neglogp of torch's own action under torch's mean: float32 sums of A terms
    let nlp = flat(&policy.neglogp(&exp["mean_action"], &exp["action"]).unwrap());
    for (i, (a, b)) in nlp.iter().zip(flat(&exp["neglogp"])).enumerate() {
        let tol = 1e-5 * (1.0 + b.abs());
        assert!((a - b).abs() <= tol, "{v}: neglogp[{i}] {a} vs torch {b}");
    }

    if policy.amp().is_some() {
        let disc = policy.discriminate(&obs).unwrap();
        let l = &reference.values[policy.amp().unwrap().discriminator.out_key()];
        assert_within("disc_logits (torch)", v, &exp["disc_logits"], l, 2.0);
        assert_within("disc_logits", v, &disc.disc_logits, l, 1.0);
        let dv = &reference.values[policy.amp().unwrap().disc_critic.out_key()];
        assert_within("disc_value (torch)", v, &exp["disc_value"], dv, 2.0);
        assert_within("disc_value", v, &disc.disc_value, dv, 1.0);
        // the reward is 1-Lipschitz in the logits; plus a few ulps of its own
        for (i, ((a, b), e)) in flat(&disc.disc_reward).iter().zip(flat(&exp["disc_reward"])).zip(&l.bound).enumerate()
        {
            let tol = 2.0 * e + 8.0 * pmstate_policy::bound::U * (b.abs() as f64 + 1.0);
            assert!(((a - b).abs() as f64) <= tol, "{v}: disc_reward[{i}] {a} vs torch {b}");
        }
        check_normalizers(v, &policy, &obs, &exp, &reference, &disc.normalized);
    } else {
        assert!(policy.required_keys(Part::Discriminator).is_empty());
    }
}

/// The actor alone (`Policy::act`, what the server runs for requests that
/// do not ask for the value), given the actor's keys alone: `forward`'s
/// actor outputs bit for bit.
fn check_act(v: &str, policy: &Policy, obs: &HashMap<String, Tensor>, out: &pmstate_policy::Outputs) {
    let bits = |t: &Tensor| flat(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let actor_obs: HashMap<String, Tensor> =
        policy.actor_keys().into_iter().filter_map(|k| obs.get(&k).map(|t| (k, t.clone()))).collect();
    let act = policy.act(&actor_obs).unwrap_or_else(|e| panic!("{v}: act: {e}"));
    assert_eq!(bits(&act.mean_action), bits(&out.mean_action), "{v}: act's mean_action");
    assert_eq!(bits(&act.std), bits(&out.std), "{v}: act's std");
    assert_eq!(act.norm_obs.as_ref().map(bits), out.norm_obs.as_ref().map(bits), "{v}: act's norm_obs");
    assert_eq!(act.latent_codes.as_ref().map(bits), out.latent_codes.as_ref().map(bits), "{v}: act's latent_codes");
}

/// The FSQ actor: the recomputed `half_L` is torch's buffer bit for bit;
/// our rounding of torch's own bounded latent gives torch's codes bit for
/// bit (round half to even); the bounded latents (ours and torch's) lie
/// within the bound of the reference; every code whose bounded latent lies
/// farther than its bound from a rounding boundary is exact, ours and
/// torch's, and the others (none in the recorded batch, asserted) within
/// their bound. Prints the smallest distance to a boundary and the margin.
fn check_fsq(
    v: &str,
    policy: &Policy,
    out: &pmstate_policy::Outputs,
    exp: &HashMap<String, Tensor>,
    reference: &pmstate_policy::bound::Reference,
) {
    let fsq = policy.actor().mu.fsq_modules();
    let [f] = fsq.as_slice() else { panic!("{v}: {} FSQ autoencoders in the actor, one expected", fsq.len()) };
    let stage = reference.fsq.first().unwrap_or_else(|| panic!("{v}: no FSQ stage in the reference"));
    let p = &stage.module_path;
    assert_eq!(p, &f.module_path);
    // the non-persistent buffer, recomputed
    let torch_half_l = flat(&exp[&format!("fsq.{p}.half_L")]);
    let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&f.quantizer.half_l), bits(&torch_half_l), "{v}: half_L differs from torch's buffer");
    // our straight-through rounding of torch's bounded latent is torch's, bit for bit (-0 included)
    let torch_bounded = &exp[&format!("fsq.{p}.bounded")];
    let torch_codes = flat(&exp["latent_codes"]);
    let rounded = flat(&pmstate_policy::fsq::round_ste(torch_bounded).unwrap());
    assert_eq!(bits(&rounded), bits(&torch_codes), "{v}: round_ste(torch's bounded latent) != torch's codes");
    // the bounded latents within the bound
    assert_within("bounded latent (torch)", v, torch_bounded, &stage.bounded, 2.0);
    let ours_bounded = f.quantizer.bound(&exp[&format!("fsq.{p}.encoder_out")]).unwrap();
    let e_ours = flat(&ours_bounded);
    let e_torch = flat(torch_bounded);
    // codes: exact where the rounding is certain
    let ours = flat(out.latent_codes.as_ref().unwrap_or_else(|| panic!("{v}: no latent_codes")));
    assert_eq!(ours.len(), torch_codes.len(), "{v}: latent_codes size");
    let mut uncertain = 0;
    for (i, ((&a, &b), (&c, &bd))) in
        ours.iter().zip(&torch_codes).zip(stage.codes.value.iter().zip(&stage.codes.bound)).enumerate()
    {
        if bd == 0.0 {
            assert_eq!(a.to_bits(), b.to_bits(), "{v}: code {i}: ours {a}, torch's {b}");
            assert_eq!(a as f64, c, "{v}: code {i}: ours {a}, reference {c}");
            assert_eq!(b as f64, c, "{v}: code {i}: torch's {b}, reference {c}");
        } else {
            uncertain += 1;
            assert!(((a - b).abs() as f64) <= 2.0 * bd, "{v}: code {i}: ours {a}, torch's {b}, bound {bd}");
        }
    }
    assert_eq!(uncertain, stage.uncertain());
    let agree = ours.iter().zip(&torch_codes).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
    let dev = e_ours.iter().zip(&e_torch).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    eprintln!(
        "{v}: FSQ {p}: {} codes, {} certain (exact, asserted), {uncertain} within their bound of a rounding \
         boundary (equal to torch's anyway: {}); bounded latent max |torch - ours| {dev:.2e} (ours from torch's \
         encoder output)",
        ours.len(),
        ours.len() - uncertain,
        agree == ours.len()
    );
    let w = f.quantizer.scalars;
    for r in 0..ours.len() / w {
        let rows = r * w..(r + 1) * w;
        let dmin = stage.boundary_distance[rows.clone()].iter().cloned().fold(f64::INFINITY, f64::min);
        let bmax = stage.bounded.bound[rows.clone()].iter().cloned().fold(0.0, f64::max);
        let flips = stage.codes.bound[rows].iter().filter(|b| **b > 0.0).count();
        eprintln!(
            "{v}:   row {r}: nearest rounding boundary {dmin:.3e} away, largest bound on the bounded latent {bmax:.3e}, \
             {flips} codes uncertain"
        );
        // rows drawn from the training distribution (0..4) keep every code certain:
        // the bound is not vacuous where the policy runs
        if r < 4 {
            assert_eq!(flips, 0, "{v}: row {r}: {flips} codes uncertain");
        }
    }
}

/// Every normalizer output (`normalized`: the actor's and critic's, or the
/// discriminator's and its critic's) against torch's recorded one. Where
/// the normalizer sees torch's own input (observations, only reshaped), it
/// is bit for bit torch's given torch's std, and element by element as far
/// from torch's as [`sqrt_ulps`] derives (at most [`NORM_ULPS`]); where
/// module operations compute its input (a sphere projection before
/// Forward) that input already differs by rounding, and the bound covers it.
fn check_normalizers(
    v: &str,
    policy: &Policy,
    obs: &HashMap<String, Tensor>,
    exp: &HashMap<String, Tensor>,
    reference: &pmstate_policy::bound::Reference,
    normalized: &[(String, Tensor)],
) {
    assert!(!normalized.is_empty(), "{v}: no normalizer output");
    for (path, t) in normalized {
        let want = &exp[&format!("norm.{path}.norm.out")];
        let r = &reference.normalized.iter().find(|(p, _)| p == path).unwrap().1;
        assert_within(&format!("normalizer {path} (torch)"), v, want, r, 2.0);
        assert_within(&format!("normalizer {path}"), v, t, r, 1.0);
        let leaf = leaf(policy, path);
        if !sees_torchs_input(leaf, obs) {
            eprintln!("{v}: normalizer {path}: its input is computed (sphere projection, FSQ codes): within the bound");
            continue;
        }
        let torch_std = exact_given_torch_sqrt(v, leaf, obs, exp);
        let (ours, theirs) = (flat(t), flat(want));
        let w = torch_std.len();
        let std = flat(leaf.norm.as_ref().unwrap().rms.std_f32().unwrap());
        let (mut worst, mut moved) = (0, 0);
        for (i, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
            let j = i % w;
            let allowed = sqrt_ulps(a, std[j], torch_std[j]);
            let u = ulps(a, b);
            assert!(u <= allowed, "{v}: normalizer {path}[{i}] {a} vs torch {b}: {u} ulps, {allowed} derived");
            worst = worst.max(u);
        }
        for j in 0..w {
            moved += (std[j] != torch_std[j]) as usize;
        }
        assert!(worst <= NORM_ULPS, "{v}: normalizer {path} {worst} ulps from torch's");
        eprintln!(
            "{v}: normalizer {path}: max {worst} ulps from torch's; bit for bit given torch's std, \
             which is one ulp from the correctly rounded one in {moved} of {w} columns"
        );
    }
}

/// How many ulps `z = (x - m) / s` may move when `s` is replaced by `s2`, one
/// ulp away: `|z - z2| = |z| |s - s2| / s2 = (sig(z) / sig(s2)) ulp(z)` in one
/// binade (sig: the significand in [1, 2)), less than 2 ulps of z; two
/// reals less than k ulps apart round to floats at most k apart. So 0 when
/// `s == s2`, else 1 where `sig(z) < sig(s2)` and 2 otherwise (the smpl
/// tracker: z = -1.7386 with s = 1.0040 moves 2 ulps).
fn sqrt_ulps(z: f32, s: f32, s2: f32) -> u32 {
    if s == s2 {
        return 0;
    }
    assert_eq!(ulps(s, s2), 1, "torch's std is one ulp from ours, no more");
    let sig = |x: f32| f64::from(x.abs()) / 2f64.powi(x.abs().log2().floor() as i32);
    if z == 0.0 || sig(z) < sig(s.min(s2)) {
        1
    } else {
        2
    }
}

/// The leaf whose state-dict module path is `path`, in any network.
fn leaf<'a>(policy: &'a Policy, path: &str) -> &'a Leaf {
    let mut nets = vec![&policy.actor().mu, policy.critic()];
    if let Some(a) = policy.amp() {
        nets.extend([&a.discriminator, &a.disc_critic]);
    }
    nets.into_iter().flat_map(|n| n.leaves()).find(|l| l.module_path == path).unwrap()
}

/// Whether the leaf's normalizer gets torch's input bits: observations,
/// concatenated, through shape operations only.
fn sees_torchs_input(leaf: &Leaf, obs: &HashMap<String, Tensor>) -> bool {
    leaf.in_keys.iter().all(|k| obs.contains_key(k))
        && leaf.ops.iter().take_while(|o| **o != ModuleOp::Forward).all(|o| *o != ModuleOp::SphereProjection)
}

/// The leaf's normalizer reproduces torch's output bit for bit once each
/// column's std may be torch's: torch's float32 sqrt is off by one ulp for
/// some inputs, ours is correctly rounded. Returns, per column, the std
/// torch used.
fn exact_given_torch_sqrt(
    v: &str,
    leaf: &Leaf,
    obs: &HashMap<String, Tensor>,
    exp: &HashMap<String, Tensor>,
) -> Vec<f32> {
    let path = &leaf.module_path;
    let n = leaf.norm.as_ref().unwrap();
    // the normalizer's input: recorded where module operations reshape before Forward
    let x = match exp.get(&format!("norm.{path}.norm.in")) {
        Some(x) => x.clone(),
        None => Tensor::cat(&leaf.in_keys.iter().map(|k| &obs[k]).collect::<Vec<_>>(), 1).unwrap(),
    };
    let w = x.dims()[1];
    let x = flat(&x);
    let want = flat(&exp[&format!("norm.{path}.norm.out")]);
    let mean = flat(&n.rms.state().unwrap().mean.to_dtype(candle_core::DType::F32).unwrap());
    let std = flat(n.rms.std_f32().unwrap());
    let clamp = n.rms.config().clamp_value.map(|c| c as f32);
    (0..w)
        .map(|j| {
            let ok = |s: f32| {
                (0..x.len() / w).all(|r| {
                    let z = (x[r * w + j] - mean[j]) / s;
                    let z = clamp.map_or(z, |c| z.clamp(-c, c));
                    z.to_bits() == want[r * w + j].to_bits()
                })
            };
            let s = std[j];
            let candidates = [s, f32::from_bits(s.to_bits() - 1), f32::from_bits(s.to_bits() + 1)];
            let c = candidates.into_iter().find(|&c| ok(c));
            c.unwrap_or_else(|| {
                panic!("{v}: column {j} of {path}'s normalizer output differs from torch's beyond its sqrt")
            })
        })
        .collect()
}

#[test]
fn every_recorded_variant_matches_torch() {
    for v in VARIANTS {
        check_variant(v, "last.ckpt");
    }
}

#[test]
fn inference_checkpoint_matches_too() {
    check_variant("welford_clamps", "inference_last.ckpt");
    check_variant("soma_fsq_tracker", "inference_last.ckpt");
}
