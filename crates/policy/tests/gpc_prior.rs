//! The GPC prior (testdata/policy/gpc_prior, recorded by record_policy.py
//! from ProtoMotions' own DiscreteAutoregressiveLatentPriorModel over the
//! frozen soma_fsq_tracker decoder, small widths, 20 tokens of vocabulary 81).
//!
//! The bound is derived (`LatentPrior::teacher_forced_reference`, the rules
//! of `pmstate_policy::bound` and `bound::attention`): at every float stage
//! torch's and this crate's float32 values lie within it of the float64
//! reference, within twice it of each other, and torch's float64 forward
//! (record_policy.py ran a double copy of the model) lies within it too.
//! Integer stages (FSQ indices, codes) and the token embedding (a table
//! row, which is the one-hot product exactly) are compared bit for bit.
//!
//! Sampling: the top-p keep mask is compared with torch's exactly, and the
//! sampler's draws over many seeds against the filtered probabilities with
//! a chi-square test (a 1e-6 upper-tail quantile).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::f32s;
use pmstate_ckpt::{Checkpoint, Node};
use pmstate_policy::bound::{within, Bounded};
use pmstate_policy::gpc::config::PriorModelConfig;
use pmstate_policy::gpc::problem::PriorProblem;
use pmstate_policy::gpc::{top_p, LatentPrior, RowDraw};
use pmstate_policy::{LoadOptions, PolicyError};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/gpc_prior").join(rel)
}

fn load() -> LatentPrior {
    LatentPrior::load_with(data("inference_last.ckpt"), None, &Device::Cpu, &LoadOptions::default()).unwrap()
}

fn expected() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(data("expected.safetensors"), &Device::Cpu).unwrap()
}

fn obs() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(data("obs.safetensors"), &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// Checks ours (`got`) and torch's float32 `torch` against the derived
/// bound of the float64 reference `r`, and torch's float64 forward
/// (`torch_f64`, when recorded) too; returns the stage's looseness (the
/// largest bound over the largest observed float32 error).
fn derived(name: &str, got: &Tensor, torch: &Tensor, torch_f64: Option<&Tensor>, r: &Bounded) -> f64 {
    assert_eq!(got.dims(), torch.dims(), "{name}");
    assert_eq!(r.shape, torch.dims(), "{name}: reference shape");
    let (g, t) = (f32s(got), f32s(torch));
    if let Some(f) = torch_f64 {
        let f: Vec<f32> = flat(f).iter().map(|v| *v as f32).collect();
        // torch's float64 forward, rounded to float32 (one more rounding: u |v|)
        let widened = Bounded {
            shape: r.shape.clone(),
            value: r.value.clone(),
            bound: r.bound.iter().zip(&r.value).map(|(b, v)| b + v.abs() / (1u64 << 24) as f64).collect(),
        };
        assert_eq!(within(&f, &widened, 1.0), None, "{name}: torch's float64 forward outside the bound");
    }
    common::float32_within_bound(name, &g, &t, r, "observed: 0.24 percent at most")
}

#[test]
fn teacher_forced_matches_torch_stage_by_stage_within_the_derived_bound() {
    let p = load();
    let e = expected();
    let o = obs();
    assert_eq!(p.obs_keys(), ["max_coords_obs"]);
    assert_eq!(p.token_key(), "prior_tokens");
    let t = p.tokenization();
    assert_eq!((t.levels, t.scalars, t.per_token, t.tokens, t.vocab), (9, 40, 2, 20, 81));
    let s = p.teacher_forced_stages(&o).unwrap();
    let r = p.teacher_forced_reference(&o).unwrap();
    let mut loose = Vec::new();
    let norm_key = "prior._context_encoder.models.0";
    let (_, norm_r) = r.normalized.iter().find(|(k, _)| k.ends_with("_context_encoder.models.0")).unwrap();
    loose.push((
        "context normalizer",
        derived(norm_key, s.outputs.norm_obs.as_ref().unwrap(), &e[&format!("norm.{norm_key}.norm.out")], None, norm_r),
    ));
    loose.push((
        "context_embedding",
        derived(
            "context_embedding",
            &s.context_embedding,
            &e["stage.context_embedding"],
            Some(&e["f64.context_embedding"]),
            &r.context_embedding,
        ),
    ));
    // the token embedding: W[:, token] + b is the one-hot product exactly
    assert_eq!(flat(&s.token_embedding), flat(&e["stage.token_embedding"]), "token embedding");
    loose.push((
        "token_embedding",
        derived("token_embedding", &s.token_embedding, &e["stage.token_embedding"], None, &r.token_embedding),
    ));
    loose.push(("sequence", derived("sequence", &s.sequence, &e["stage.sequence"], None, &r.sequence)));
    assert_eq!(s.layers.len(), r.layers.len());
    for (i, (l, rl)) in s.layers.iter().zip(&r.layers).enumerate() {
        let name = format!("layer {i}");
        let f = &e[&format!("f64.layer.{i}")];
        loose.push(("layer", derived(&name, l, &e[&format!("stage.layer.{i}")], Some(f), rl)));
    }
    loose.push(("logits", derived("logits", &s.outputs.logits, &e["logits"], Some(&e["f64.logits"]), &r.logits)));
    // tokens -> indices -> codes: integers, exact
    assert_eq!(
        s.fsq_indices.to_vec2::<i64>().unwrap(),
        e["stage.fsq_indices"].to_vec2::<i64>().unwrap(),
        "fsq indices"
    );
    assert_eq!(flat(&s.outputs.latent_codes), flat(&e["stage.fsq_codes"]), "fsq codes");
    assert_eq!(r.latent_codes.value, flat(&e["stage.fsq_codes"]), "reference codes");
    assert!(r.latent_codes.bound.iter().all(|b| *b == 0.0));
    loose.push((
        "mean_action",
        derived("mean_action", &s.outputs.mean_action, &e["mean_action"], Some(&e["f64.mean_action"]), &r.mean_action),
    ));
    // the mask: generate_causal_mask(20, 1)
    let mask = pmstate_policy::gpc::causal_mask(20, &Device::Cpu).unwrap();
    assert_eq!(flat(&mask), flat(&e["stage.causal_mask"]));
    eprintln!("gpc_prior: max bound / max observed error per stage: {loose:?}");
}

#[test]
fn next_token_logits_match_torchs_generation_given_its_draws() {
    let p = load();
    let e = expected();
    let mut o = obs();
    o.remove("prior_tokens");
    let gen = e["generate.tokens"].to_vec2::<i64>().unwrap();
    let logits = e["generate.logits"].to_dtype(DType::F64).unwrap();
    // torch's generation logits at step k are the teacher-forced logits of
    // its drawn tokens at position k (the causal mask hides the rest), so
    // the teacher-forced reference of those tokens bounds both float32 forwards
    let mut forced = obs();
    forced.insert("prior_tokens".into(), e["generate.tokens"].clone());
    let r = p.teacher_forced_reference(&forced).unwrap();
    let vocab = 81;
    let (b, n) = (gen.len(), gen[0].len());
    for k in [0usize, 1, 7, 19] {
        let prefix: Vec<Vec<i64>> = gen.iter().map(|r| r[..k].to_vec()).collect();
        let got: Vec<f32> = f32s(&p.next_logits(&o, &prefix).unwrap());
        let want: Vec<f32> =
            flat(&logits.narrow(1, k, 1).unwrap().squeeze(1).unwrap()).iter().map(|v| *v as f32).collect();
        let idx: Vec<usize> = (0..b).flat_map(|row| (0..vocab).map(move |v| (row * n + k) * vocab + v)).collect();
        let step = Bounded {
            shape: vec![b, vocab],
            value: idx.iter().map(|&i| r.logits.value[i]).collect(),
            bound: idx.iter().map(|&i| r.logits.bound[i]).collect(),
        };
        assert_eq!(within(&got, &step, 1.0), None, "step {k}: ours outside the derived bound");
        assert_eq!(within(&want, &step, 1.0), None, "step {k}: torch's generation outside the derived bound");
    }
    // a prefix token outside the vocabulary is refused, naming it
    let bad: Vec<Vec<i64>> = gen.iter().map(|r| vec![r[0], -1]).collect();
    let (_, pr) = prior_problem(p.next_logits(&o, &bad).unwrap_err());
    assert_eq!(pr, PriorProblem::TokenRange { row: 0, index: 1, value: -1, vocab: 81 });
    // and torch's generated tokens decode to its generated action
    let mut tf = obs();
    tf.insert("prior_tokens".into(), e["generate.tokens"].clone());
    let out = p.teacher_forced(&tf).unwrap();
    let (ours, theirs) = (f32s(&out.mean_action), f32s(&e["generate.mean_action"]));
    assert_eq!(within(&ours, &r.mean_action, 1.0), None, "ours: the generated tokens' action");
    assert_eq!(within(&theirs, &r.mean_action, 1.0), None, "torch's generated action");
}

#[test]
fn keep_masks_are_torchs_exactly() {
    let p = load();
    let e = expected();
    for (tag, top, temp) in [("p0.9_t0.8", 0.9, 0.8), ("p0.5_t1.0", 0.5, 1.0), ("p0.99_t1.3", 0.99, 1.3)] {
        let probs_t = e[&format!("sampling.{tag}.probs")].flatten_to(1).unwrap().to_vec2::<f32>().unwrap();
        let keep_t = e[&format!("sampling.{tag}.keep")].flatten_to(1).unwrap().to_vec2::<u8>().unwrap();
        // on torch's probabilities: the same mask, bit for bit
        for (r, (pr, k)) in probs_t.iter().zip(&keep_t).enumerate() {
            let ours: Vec<u8> = top_p::keep_mask(pr, top).into_iter().map(u8::from).collect();
            assert_eq!(&ours, k, "{tag} row {r}");
        }
        // on ours, from the recorded logits: the same mask too
        let probs = p.probabilities(&e["logits"], temp).unwrap().flatten_to(1).unwrap().to_vec2::<f32>().unwrap();
        for (r, (pr, k)) in probs.iter().zip(&keep_t).enumerate() {
            let ours: Vec<u8> = top_p::keep_mask(pr, top).into_iter().map(u8::from).collect();
            assert_eq!(&ours, k, "{tag} row {r} (our softmax)");
        }
        // sampling_log_probs: exp of torch's is the filtered distribution
        let logp = e[&format!("sampling.{tag}.logp")].flatten_to(1).unwrap().to_vec2::<f32>().unwrap();
        for (pr, lp) in probs_t.iter().zip(&logp).take(16) {
            let f = top_p::filtered_probs(pr, top);
            for (a, b) in f.iter().zip(lp) {
                assert!((a - (*b as f64).exp()).abs() <= 1e-6, "{tag}: {a} vs exp({b})");
            }
        }
    }
}

/// The upper `1e-6` quantile of chi-square with `k` degrees of freedom
/// (Wilson-Hilferty; z = 4.753).
fn chi2_quantile(k: f64) -> f64 {
    let z = 4.753;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn draws_over_many_seeds_follow_the_filtered_distribution() {
    let e = expected();
    let probs = e["sampling.p0.9_t0.8.probs"].flatten_to(1).unwrap().to_vec2::<f32>().unwrap();
    const N: usize = 100_000;
    for row in [0usize, 37, 101] {
        let pr = &probs[row];
        let f = top_p::filtered_probs(pr, 0.9);
        let mut counts = vec![0usize; pr.len()];
        for seed in 0..N as u64 {
            // the first draw of each seed's stream
            let u = top_p::Uniform::new(seed).next_f64();
            counts[top_p::sample(pr, 0.9, u)] += 1;
        }
        let kept: Vec<usize> = (0..pr.len()).filter(|&i| f[i] > 0.0).collect();
        assert!(counts.iter().enumerate().all(|(i, &c)| c == 0 || f[i] > 0.0), "a draw outside the nucleus");
        let chi2: f64 = kept
            .iter()
            .map(|&i| {
                let want = f[i] * N as f64;
                (counts[i] as f64 - want).powi(2) / want
            })
            .sum();
        let q = chi2_quantile((kept.len() - 1) as f64);
        assert!(chi2 <= q, "row {row}: chi2 {chi2:.1} > {q:.1} over {} kept tokens", kept.len());
    }
}

#[test]
fn generation_is_seeded_stays_in_the_nucleus_and_decodes_its_tokens() {
    let p = load();
    let mut o = obs();
    o.remove("prior_tokens");
    let a = p.generate(&o, p.sampling(5)).unwrap();
    let b = p.generate(&o, p.sampling(5)).unwrap();
    let c = p.generate(&o, p.sampling(6)).unwrap();
    let ta = a.tokens.to_vec2::<i64>().unwrap();
    assert_eq!(ta, b.tokens.to_vec2::<i64>().unwrap());
    assert_ne!(ta, c.tokens.to_vec2::<i64>().unwrap());
    assert_eq!(a.tokens.dims(), [8, 20]);
    assert_eq!(a.logits.dims(), [8, 20, 81]);
    // each token lies in the nucleus of its step's logits
    let probs = p.probabilities(&a.logits, p.config().temperature).unwrap().to_dtype(DType::F32).unwrap();
    let probs = probs.flatten_to(1).unwrap().to_vec2::<f32>().unwrap();
    for (i, pr) in probs.iter().enumerate() {
        let keep = top_p::keep_mask(pr, p.config().top_p);
        assert!(keep[ta[i / 20][i % 20] as usize], "row {} step {}", i / 20, i % 20);
    }
    // a row's draws depend on its index, not on the other rows: rows 2..5
    // alone, and first in a batch with the others after them
    let part: HashMap<String, Tensor> = o.iter().map(|(k, v)| (k.clone(), v.narrow(0, 2, 3).unwrap())).collect();
    let alone = p.generate(&part, p.sampling(5)).unwrap().tokens.to_vec2::<i64>().unwrap();
    let idx = Tensor::new(&[2u32, 3, 4, 0, 1, 5, 6, 7], &Device::Cpu).unwrap();
    let reordered: HashMap<String, Tensor> =
        o.iter().map(|(k, v)| (k.clone(), v.index_select(&idx, 0).unwrap())).collect();
    let batched = p.generate(&reordered, p.sampling(5)).unwrap().tokens.to_vec2::<i64>().unwrap();
    assert_eq!(alone, batched[..3].to_vec());
    // teacher forcing the drawn tokens gives the same action
    let mut tf = obs();
    tf.insert("prior_tokens".into(), a.tokens.clone());
    let out = p.teacher_forced(&tf).unwrap();
    assert_eq!(flat(&out.mean_action), flat(&a.mean_action));
}

/// Generation runs position by position (a key/value cache on the CPU); its
/// logits at step k are bitwise the teacher-forced logits at position k of
/// the tokens it drew, also past one chunk of rows (64).
#[test]
fn generation_logits_are_the_teacher_forced_logits_of_its_tokens_bitwise() {
    let p = load();
    let mut o = obs();
    o.remove("prior_tokens");
    // 72 rows: the 8 recorded ones 9 times (each row draws by its index)
    let o: HashMap<String, Tensor> =
        o.iter().map(|(k, v)| (k.clone(), Tensor::cat(&vec![v.clone(); 9], 0).unwrap())).collect();
    let g = p.generate(&o, p.sampling(11)).unwrap();
    assert_eq!(g.logits.dims(), [72, 20, 81]);
    let mut tf = o.clone();
    tf.insert("prior_tokens".into(), g.tokens.clone());
    let t = p.teacher_forced(&tf).unwrap();
    let bits = |t: &Tensor| f32s(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&g.logits), bits(&t.logits));
    assert_eq!(bits(&g.mean_action), bits(&t.mean_action));
    // the second chunk's rows draw as their own indices (60..72 alone,
    // drawing as rows 60..72, give the batch's tokens there)
    let tail: HashMap<String, Tensor> = o.iter().map(|(k, v)| (k.clone(), v.narrow(0, 60, 12).unwrap())).collect();
    let draws: Vec<RowDraw> = (60..72).map(|row| RowDraw { seed: 11, row }).collect();
    let alone = p.generate_rows(&tail, p.sampling(11), &draws).unwrap().tokens.to_vec2::<i64>().unwrap();
    assert_eq!(alone, g.tokens.to_vec2::<i64>().unwrap()[60..].to_vec());
}

fn prior_problem(e: PolicyError) -> (String, PriorProblem) {
    match e {
        PolicyError::Prior { path, problem } => (path, problem),
        other => panic!("not a Prior error: {other}"),
    }
}

#[test]
fn bad_tokens_are_refused_naming_the_key() {
    let p = load();
    let mut o = obs();
    let t = o["prior_tokens"].clone();
    o.insert("prior_tokens".into(), t.to_dtype(DType::F32).unwrap());
    let (path, pr) = prior_problem(p.teacher_forced(&o).unwrap_err());
    assert_eq!(path, "prior_tokens");
    assert!(matches!(pr, PriorProblem::TokensDtype { .. }), "{pr}");
    o.insert("prior_tokens".into(), t.narrow(1, 0, 19).unwrap());
    assert!(matches!(prior_problem(p.teacher_forced(&o).unwrap_err()).1, PriorProblem::TokensShape { .. }));
    let mut rows = t.to_vec2::<i64>().unwrap();
    rows[3][5] = 81;
    o.insert("prior_tokens".into(), Tensor::new(rows, &Device::Cpu).unwrap());
    let (_, pr) = prior_problem(p.teacher_forced(&o).unwrap_err());
    assert_eq!(pr, PriorProblem::TokenRange { row: 3, index: 5, value: 81, vocab: 81 });
    let (_, pr_ref) = prior_problem(p.teacher_forced_reference(&o).unwrap_err());
    assert_eq!(pr_ref, pr, "the bounded reference refuses the same tokens");
    assert!(pr.to_string().contains("row 3, token 5: 81"), "{pr}");
    // missing tokens in teacher forcing; tokens given to generation
    o.remove("prior_tokens");
    let (path, pr) = prior_problem(p.teacher_forced(&o).unwrap_err());
    assert_eq!((path.as_str(), pr), ("prior_tokens", PriorProblem::NoTokens { tokens: 20 }));
    let with = obs();
    assert!(
        matches!(p.generate(&with, p.sampling(0)).unwrap_err(), PolicyError::ExtraObs { ref key, .. } if key == "prior_tokens")
    );
}

fn model_node() -> Node {
    Checkpoint::open(data("resolved_configs_inference.pt")).unwrap().get("agent.model").unwrap().clone()
}

fn fields(node: &mut Node) -> &mut pmstate_ckpt::Dict {
    match node {
        Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap(),
        other => panic!("{}", other.kind()),
    }
}

fn refused(edit: impl FnOnce(&mut pmstate_ckpt::Dict)) -> PolicyError {
    let mut m = model_node();
    edit(fields(&mut m));
    PriorModelConfig::from_node(&m, "agent.model").expect_err("refused")
}

#[test]
fn configs_it_cannot_run_are_refused_naming_the_field() {
    // the saved config parses (output head num_out 0, resolved to the vocabulary)
    let cfg = PriorModelConfig::from_node(&model_node(), "agent.model").unwrap();
    assert_eq!(cfg.prior.max_seq_len, 21);
    let (path, pr) = prior_problem(refused(|d| d.insert("fsq_scalars_per_prior_token", Node::Int(3))));
    assert_eq!(path, "agent.model.fsq_scalars_per_prior_token");
    assert_eq!(pr, PriorProblem::ScalarsPerToken { per_token: 3, scalars: 40 });
    let (path, pr) = prior_problem(refused(|d| d.insert("temperature", Node::Float(0.0))));
    assert_eq!((path.as_str(), pr), ("agent.model.temperature", PriorProblem::Temperature { value: 0.0 }));
    let (path, pr) =
        prior_problem(refused(|d| fields(d.get_mut("latent_decoder").unwrap()).insert("module_config", Node::None)));
    assert_eq!(path, "agent.model.latent_decoder.module_config");
    assert!(matches!(pr, PriorProblem::NoDecoderConfig { .. }));
    let (path, pr) = prior_problem(refused(|d| {
        fields(d.get_mut("latent_decoder").unwrap()).insert("checkpoint_path", Node::Str("/x/last.ckpt".into()))
    }));
    assert_eq!(path, "agent.model.latent_decoder.checkpoint_path");
    assert!(matches!(pr, PriorProblem::DecoderCheckpoint { .. }));
    // a field of the transformer config this crate does not know
    match refused(|d| fields(d.get_mut("prior").unwrap()).insert("rotary", Node::Bool(true))) {
        PolicyError::UnsupportedField { path, field, .. } => {
            assert_eq!((path.as_str(), field.as_str()), ("agent.model.prior", "rotary"))
        }
        other => panic!("{other}"),
    }
    let (path, pr) =
        prior_problem(refused(|d| fields(d.get_mut("prior").unwrap()).insert("hidden_key", Node::Str("h".into()))));
    assert_eq!(path, "agent.model.prior");
    assert!(matches!(pr, PriorProblem::KeyMismatch { field: "hidden_key", .. }), "{pr}");
    // another model class
    match refused(|d| d.insert("_target_", Node::Str("x.Y".into()))) {
        PolicyError::UnsupportedClass { path, class, .. } => {
            assert_eq!((path.as_str(), class.as_str()), ("agent.model", "x.Y"))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_batch_whose_logits_pass_the_limit_is_refused_before_any_work() {
    // 8 rows x 20 tokens x 81 = 12960 logits
    let p = load().with_max_logits(12_959);
    let (path, pr) = prior_problem(p.teacher_forced(&obs()).unwrap_err());
    assert_eq!(path, "prior_tokens");
    assert_eq!(pr, PriorProblem::TooManyLogits { batch: 8, per_row: 1620, limit: 12_959 });
    let mut o = obs();
    o.remove("prior_tokens");
    assert!(matches!(prior_problem(p.generate(&o, p.sampling(1)).unwrap_err()).1, PriorProblem::TooManyLogits { .. }));
    let p = p.with_max_logits(12_960);
    assert_eq!(p.teacher_forced(&obs()).unwrap().logits.dims(), [8, 20, 81]);
    // the published sizes: 568 rows fit
    assert_eq!(pmstate_policy::gpc::MAX_LOGITS_ELEMENTS / (8 * 59049), 568);
}
