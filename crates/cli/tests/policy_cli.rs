//! `pmstate config`, `pmstate policy describe|run` end to end on the
//! recorded ProtoMotions policies (testdata/policy).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::{Device, Tensor};
use pmstate_policy::bound::within;
use pmstate_policy::Policy;
use serde_json::Value as J;

const VARIANTS: [&str; 8] = [
    "soma_tracker",
    "smpl_tracker",
    "g1_amp_deploy",
    "layernorm_activations",
    "welford_clamps",
    "container_obsprocessor",
    "module_ops_ppo",
    "module_ops_amp",
];

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn data(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel).display().to_string()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn manifest() -> J {
    serde_json::from_str(&std::fs::read_to_string(data("manifest.json")).unwrap()).unwrap()
}

/// Config path of a module from its state-dict path (`_actor.mu.models.0` -> `agent.model.actor.mu_model.models.0`).
fn config_path(module: &str) -> String {
    for (from, to) in [
        ("_actor.mu", "actor.mu_model"),
        ("_critic", "critic"),
        ("_discriminator", "discriminator"),
        ("_disc_critic", "disc_critic"),
        // the GPC prior's
        ("prior._context_encoder", "prior.context_encoder"),
        ("prior._token_encoder", "prior.token_encoder"),
        ("prior._output_head", "prior.output_head"),
        ("latent_decoder.decoder", "latent_decoder.module_config.decoder"),
        ("target_latent_encoder.encoder", "latent_decoder.module_config.encoder"),
    ] {
        if let Some(rest) = module.strip_prefix(from) {
            return format!("agent.model.{to}{rest}");
        }
    }
    panic!("module {module}")
}

/// `config --get MODULE.FIELD FILE` for every recorded module with a
/// normalizer, against the recorded values, in each variant's `file` (a
/// variant without that file is skipped); returns how many were checked.
fn check_normalizer_settings_in(file: &str) -> usize {
    let mut checked = 0;
    for v in manifest()["variants"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let cfg = data(&format!("{name}/{file}"));
        if !std::path::Path::new(&cfg).exists() {
            continue;
        }
        // MaskedMimic's entry records no module list (its test: masked_mimic_runs_and_describes...)
        if v["model_target"] == pmstate_policy::config::MASKED_MIMIC_MODEL {
            continue;
        }
        for m in v["modules"].as_array().unwrap() {
            if m.get("normalize_obs").is_none() {
                continue;
            }
            let path = config_path(m["path"].as_str().unwrap());
            for field in ["norm_clamp_value", "norm_ema_decay", "normalize_obs"] {
                let out = pmstate(&["config", "--get", &format!("{path}.{field}"), &cfg]);
                assert!(out.status.success(), "{}", text(&out));
                let got = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                // the recorded value as JSON keeps int/float apart: 5 vs 5.0
                let want = match (&m[field], m.get("norm_clamp_value_type").and_then(J::as_str)) {
                    (J::Number(n), Some("float")) if field == "norm_clamp_value" => {
                        format!("{:?}", n.as_f64().unwrap())
                    }
                    (other, _) => other.to_string(),
                };
                assert_eq!(got, want, "{name}: {path}.{field} in {cfg}");
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn config_get_returns_the_recorded_normalizer_settings() {
    let checked = check_normalizer_settings_in("resolved_configs.pt");
    assert!(checked >= 40, "{checked}");
    // the example, and the float clamp of g1's critic
    let out = pmstate(&[
        "config",
        "--get",
        "agent.model.actor.mu_model.norm_clamp_value",
        &data("smpl_tracker/resolved_configs.pt"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5\n");
    let out = pmstate(&[
        "config",
        "--get",
        "agent.model.critic.norm_clamp_value",
        &data("g1_amp_deploy/resolved_configs.pt"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5.0\n");
}

#[test]
fn config_json_tree_names_classes_and_enum_values() {
    let out = pmstate(&["config", "--json", &data("smpl_tracker/resolved_configs_inference.pt")]);
    assert!(out.status.success(), "{}", text(&out));
    let j: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["agent"]["__class__"], "protomotions.agents.ppo.config.PPOAgentConfig");
    assert_eq!(j["agent"]["model"]["actor"]["mu_model"]["layers"][0]["units"], 16);
    let mode = &j["motion_lib"]["motion_file_switch_mode"];
    assert_eq!(mode["__class__"], "protomotions.components.motion_lib.MotionFileSwitchMode");
    assert!(mode.get("__value__").is_some(), "{mode}");
    let t = &j["robot"]["default_dof_pos"]["__tensor__"];
    assert_eq!(t["dtype"], "float32");
    assert_eq!(t["shape"], serde_json::json!([69]));
    assert!(t.get("values").is_none(), "69 elements: more than SMALL_TENSOR, no values");
    let missing = pmstate(&["config", "--get", "agent.model.nope", &data("smpl_tracker/resolved_configs.pt")]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing).contains("no key agent.model.nope"), "{}", text(&missing));
}

fn load(p: &str) -> HashMap<String, Tensor> {
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

/// norm_obs within this many ulps of torch's: crates/policy/tests/parity.rs
/// derives it (torch's float32 sqrt, one ulp off for some columns' std).
const NORM_ULPS: u32 = 2;

/// `pmstate policy run` of `v`'s checkpoint `ckpt_name` (with `--config` when
/// given) against torch's recorded outputs; returns what it wrote.
fn check_cli_run(v: &str, ckpt_name: &str, config: Option<&str>, dir: &std::path::Path) -> HashMap<String, Tensor> {
    let ckpt = data(&format!("{v}/{ckpt_name}"));
    let obs_path = data(&format!("{v}/obs.safetensors"));
    let tag = config.map_or("default", |_| "config");
    let out_path = dir.join(format!("{v}.{ckpt_name}.{tag}.safetensors")).display().to_string();
    let cfg = config.map(|c| data(&format!("{v}/{c}")));
    let policy = Policy::load(&ckpt, cfg.as_deref().map(std::path::Path::new), &Device::Cpu).unwrap();
    let mut args = vec!["policy", "run", &ckpt, "--obs", &obs_path, "--out", &out_path];
    if let Some(c) = &cfg {
        args.extend(["--config", c]);
    }
    if policy.amp().is_some() {
        args.push("--discriminator");
    }
    let out = pmstate(&args);
    assert!(out.status.success(), "{v}: {}", text(&out));
    let got = load(&out_path);
    let exp = load(&data(&format!("{v}/expected.safetensors")));
    let obs = load(&obs_path);
    let r = policy.reference(&obs).unwrap();
    let mut keys =
        vec![("mean_action", policy.actor().mu_key.clone()), ("value", policy.critic().out_key().to_owned())];
    if let Some(a) = policy.amp() {
        keys.push(("disc_logits", a.discriminator.out_key().to_owned()));
        keys.push(("disc_value", a.disc_critic.out_key().to_owned()));
    }
    for (name, key) in keys {
        assert_eq!(got[name].dims(), exp[name].dims(), "{v}: {name}");
        // |ours - torch| <= |ours - ref| + |torch - ref| <= 2 bound
        let (g, e) = (flat(&got[name]), flat(&exp[name]));
        for (i, ((a, b), bound)) in g.iter().zip(&e).zip(&r.values[&key].bound).enumerate() {
            assert!(((a - b).abs() as f64) <= 2.0 * bound, "{v}: {name}[{i}] {a} vs torch {b}, bound {bound:e}");
        }
        assert!(within(&flat(&got[name]), &r.values[&key], 1.0).is_none(), "{v}: {name}");
    }
    // the normalizer output element by element, the std within 1 ulp of torch's exp
    let u = max_ulps(&got["norm_obs"], &exp["norm_obs"]);
    assert!(u <= NORM_ULPS, "{v}: norm_obs {u} ulps from torch's");
    let lib = policy.forward(&obs).unwrap();
    assert_eq!(
        flat(&got["norm_obs"]),
        flat(lib.norm_obs.as_ref().unwrap()),
        "{v}: the CLI's norm_obs is the library's"
    );
    assert!(max_ulps(&got["std"], &exp["std"]) <= 1, "{v}: std");
    if let Some(a) = policy.amp() {
        // the reward is 1-Lipschitz in the logits, plus a few ulps of its own
        let bound = &r.values[a.discriminator.out_key()].bound;
        let (g, e) = (flat(&got["disc_reward"]), flat(&exp["disc_reward"]));
        assert_eq!(g.len(), e.len(), "{v}: disc_reward");
        for (i, ((a, b), bd)) in g.iter().zip(&e).zip(bound).enumerate() {
            let tol = 2.0 * bd + 8.0 * pmstate_policy::bound::U * (b.abs() as f64 + 1.0);
            assert!(((a - b).abs() as f64) <= tol, "{v}: disc_reward[{i}] {a} vs torch {b}");
        }
    } else {
        assert!(!got.contains_key("disc_reward"), "{v}");
    }
    assert!(!got.contains_key("action"), "{v}: deterministic unless --sample");
    got
}

#[test]
fn policy_run_matches_torch_on_every_variant() {
    let tmp = tempfile::tempdir().unwrap();
    for v in VARIANTS {
        let last = check_cli_run(v, "last.ckpt", None, tmp.path());
        // the inference checkpoint (weights only), found by its folder's configs and given them
        if std::path::Path::new(&data(&format!("{v}/inference_last.ckpt"))).exists() {
            for config in [None, Some("resolved_configs.pt")] {
                let inf = check_cli_run(v, "inference_last.ckpt", config, tmp.path());
                let mut names: Vec<&String> = last.keys().collect();
                names.sort();
                assert_eq!(
                    names,
                    {
                        let mut n: Vec<&String> = inf.keys().collect();
                        n.sort();
                        n
                    },
                    "{v}"
                );
                for k in names {
                    assert_eq!(flat(&last[k]), flat(&inf[k]), "{v}: {k} from inference_last.ckpt");
                }
            }
        }
    }
}

#[test]
fn bench_policy_json_records_have_their_fields() {
    let out = pmstate(&["bench-policy", "--json", "--batch", "2", "--min-time", "0", "--threads", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let records: Vec<J> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 2, "{records:?}");
    // 6x1024 actor and 4x1024 critic over 1003 inputs, float32: the weights bench_config() builds
    let weights = 4 * ((1003 * 1024 + 1024) + 5 * (1024 * 1024 + 1024) + (1024 * 69 + 69))
        + 4 * ((1003 * 1024 + 1024) + 3 * (1024 * 1024 + 1024) + (1024 + 1));
    for (r, (op, batch)) in records.iter().zip([("stream", 0), ("forward", 2)]) {
        let fields: std::collections::BTreeSet<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        let want: std::collections::BTreeSet<&str> =
            ["op", "batch", "threads", "seconds", "min_seconds", "cpu_seconds", "rows_per_s", "weight_bytes"].into();
        assert_eq!(fields, want, "{r}");
        assert_eq!(r["op"], op);
        assert_eq!(r["batch"], batch);
        assert_eq!(r["threads"], 1);
        assert_eq!(r["weight_bytes"], weights);
        let (median, min) = (r["seconds"].as_f64().unwrap(), r["min_seconds"].as_f64().unwrap());
        assert!(min > 0.0 && min <= median, "{r}");
        let rows = r["rows_per_s"].as_f64().unwrap();
        if batch == 0 {
            assert_eq!(rows, 0.0);
        } else {
            assert!((rows - batch as f64 / median).abs() <= 1e-9 * rows, "{r}");
        }
        assert!(r["cpu_seconds"].is_null() || r["cpu_seconds"].as_f64().unwrap() >= 0.0, "{r}");
    }
}

#[test]
fn bench_serve_answers_json_and_binary_clients_and_splits_the_cpu_time() {
    // two clients per encoding, batching on and off: every request answered
    // 200 (errors count the others), the clients' and the forward's CPU
    // time parts of the process's
    let args = ["bench-serve", "--json", "--clients", "2", "--seconds", "0.2", "--max-batch", "2", "--threads", "1"];
    let out = pmstate(&args);
    assert!(out.status.success(), "{}", text(&out));
    let records: Vec<J> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let loads: Vec<&J> = records.iter().filter(|r| r["record"] == "load").collect();
    let seen: Vec<(String, bool)> =
        loads.iter().map(|r| (r["encoding"].as_str().unwrap().to_owned(), r["batching"].as_bool().unwrap())).collect();
    let want = [("json", true), ("json", false), ("binary", true), ("binary", false)];
    assert_eq!(seen, want.map(|(e, b)| (e.to_owned(), b)), "{records:?}");
    for r in &loads {
        assert_eq!(r["clients"], 2, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
        if let Some(all) = r["cpu_seconds_per_row"].as_f64() {
            let (client, fwd) =
                (r["client_cpu_seconds_per_row"].as_f64().unwrap(), r["forward_cpu_seconds_per_row"].as_f64().unwrap());
            assert!(client > 0.0 && fwd > 0.0 && client + fwd <= all, "{r}");
        }
    }
    for e in ["json", "binary"] {
        let goals = records.iter().filter(|r| r["record"] == "goal" && r["encoding"] == e).count();
        assert_eq!(goals, 2, "{e}: {records:?}");
    }
    // the clients ask for mean_action alone, and the in-process forward does the actor's work alone
    let forwards: Vec<&J> = records.iter().filter(|r| r["record"] == "forward").collect();
    assert!(!forwards.is_empty() && forwards.iter().all(|r| r["ask"] == "action"), "{forwards:?}");
}

#[test]
fn bench_policy_times_masked_mimic_at_the_published_sizes() {
    let tmp = tempfile::tempdir().unwrap();
    let w = tmp.path().join("mm.safetensors").display().to_string();
    let out = pmstate(&[
        "bench-policy",
        "--family",
        "masked-mimic",
        "--json",
        "--batch",
        "2",
        "--min-time",
        "0",
        "--threads",
        "1",
        "--write-weights",
        &w,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let records: Vec<J> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!((records[0]["op"].as_str(), records[0]["batch"].as_u64()), (Some("forward"), Some(2)));
    // the weights carry ProtoMotions' names at the published sizes: 4 layers of d = 512, ff 1024
    let weights = load(&w);
    for i in 0..4 {
        let k = format!("_prior.models.7.seqTransEncoder.layers.{i}.self_attn.in_proj_weight");
        assert_eq!(weights[&k].dims(), [1536, 512], "{k}");
        let k = format!("_prior.models.7.seqTransEncoder.layers.{i}.linear1.weight");
        assert_eq!(weights[&k].dims(), [1024, 512], "{k}");
    }
    assert!(!weights.keys().any(|k| k.contains("layers.4")));
    assert_eq!(weights["_trunk.models.2.mlp.6.weight"].dims(), [69, 1024]);
    // the speed gate is the tracker's only
    let out = pmstate(&["bench-policy", "--family", "masked-mimic", "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn every_cpu_instruction_set_gives_the_same_outputs_bit_for_bit() {
    // PMSTATE_CPU_ISA forces the kernels' instruction set (the normalizer
    // kernels' selection): the portable path, AVX2 and AVX-512 give the
    // same bits, where this CPU has them; an unknown name is an error.
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let run = |isa: &str| {
        let out_path = tmp.path().join(format!("{isa}.safetensors")).display().to_string();
        let out = Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(["policy", "run", &ckpt, "--obs", &obs, "--out", &out_path])
            .env("PMSTATE_CPU_ISA", isa)
            .output()
            .expect("run pmstate");
        (out, out_path)
    };
    let (out, scalar) = run("scalar");
    assert!(out.status.success(), "{}", text(&out));
    let want = load(&scalar);
    for isa in ["avx2", "avx512"] {
        let (out, path) = run(isa);
        if !out.status.success() {
            assert!(text(&out).contains("does not support"), "{isa}: {}", text(&out));
            eprintln!("skipped {isa}: this CPU lacks it");
            continue;
        }
        let got = load(&path);
        for key in ["mean_action", "value"] {
            let bits = |t: &Tensor| flat(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(&got[key]), bits(&want[key]), "{isa}: {key}");
        }
    }
    let (out, _) = run("sse9");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("PMSTATE_CPU_ISA=sse9"), "{}", text(&out));
}

#[test]
fn policy_run_samples_reproducibly() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("layernorm_activations/last.ckpt");
    let obs = data("layernorm_activations/obs.safetensors");
    let a = tmp.path().join("a.safetensors").display().to_string();
    let b = tmp.path().join("b.safetensors").display().to_string();
    for p in [&a, &b] {
        let out = pmstate(&["policy", "run", &ckpt, "--obs", &obs, "--out", p, "--sample", "--seed", "7"]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let (a, b) = (load(&a), load(&b));
    assert_eq!(flat(&a["action"]), flat(&b["action"]));
    assert_eq!(a["neglogp"].dims(), [8]);
    assert_ne!(flat(&a["action"]), flat(&a["mean_action"]));
}

/// `--chunk-rows`: a file run a few rows per forward writes the same bytes
/// as one forward over every row (8 rows as 3 + 3 + 2), for a PPO tracker,
/// an FSQ tracker, an AMP tracker with its discriminator and a drawn action,
/// and a MaskedMimic model; zero rows per forward is refused.
#[test]
fn policy_run_in_chunks_writes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 4] = [
        ("smpl_tracker", &[]),
        ("soma_fsq_tracker", &[]),
        ("g1_amp_deploy", &["--discriminator", "--sample", "--seed", "5"]),
        ("masked_mimic", &[]),
    ];
    for (variant, extra) in cases {
        let (ckpt, obs) = (data(&format!("{variant}/last.ckpt")), data(&format!("{variant}/obs.safetensors")));
        let mut written = Vec::new();
        for chunk in ["1024", "3"] {
            let out = tmp.path().join(format!("{variant}_{chunk}.safetensors")).display().to_string();
            let mut args = vec!["policy", "run", &ckpt, "--obs", &obs, "--out", &out, "--chunk-rows", chunk];
            args.extend_from_slice(extra);
            let o = pmstate(&args);
            assert!(o.status.success(), "{variant}: {}", text(&o));
            written.push(std::fs::read(&out).unwrap());
        }
        assert_eq!(
            load(&tmp.path().join(format!("{variant}_3.safetensors")).display().to_string())["mean_action"].dims()[0],
            8
        );
        assert!(written[0] == written[1], "{variant}: chunks of 3 rows wrote other bytes");
    }
    let (ckpt, obs) = (data("smpl_tracker/last.ckpt"), data("smpl_tracker/obs.safetensors"));
    let out = tmp.path().join("zero.safetensors").display().to_string();
    let o = pmstate(&["policy", "run", &ckpt, "--obs", &obs, "--out", &out, "--chunk-rows", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A robot's observations (the g1 AMP tracker's actor keys, without the
/// privileged ones its critic reads): the actor's outputs, the same bits
/// as with every key, no value, and a note naming what the critic lacked.
#[test]
fn policy_run_on_the_actors_keys_alone_runs_the_actor() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("g1_amp_deploy/last.ckpt");
    let all = load(&data("g1_amp_deploy/obs.safetensors"));
    let actor_keys = [
        "noisy_reduced_coords_obs",
        "noisy_mimic_reduced_coords_target_poses",
        "historical_previous_processed_actions",
    ];
    let actor: HashMap<String, Tensor> = actor_keys.iter().map(|k| (k.to_string(), all[*k].clone())).collect();
    let actor_obs = tmp.path().join("actor.safetensors");
    candle_core::safetensors::save(&actor, &actor_obs).unwrap();
    let (whole, alone) = (tmp.path().join("whole.safetensors"), tmp.path().join("alone.safetensors"));
    let run = |obs: &str, out: &std::path::Path| {
        let out = pmstate(&[
            "policy",
            "run",
            &ckpt,
            "--obs",
            obs,
            "--out",
            &out.display().to_string(),
            "--sample",
            "--seed",
            "3",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        out
    };
    run(&data("g1_amp_deploy/obs.safetensors"), &whole);
    let out = run(&actor_obs.display().to_string(), &alone);
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("no value") && note.contains("max_coords_obs"), "{note}");
    let (whole, alone) = (load(&whole.display().to_string()), load(&alone.display().to_string()));
    assert!(whole.contains_key("value") && !alone.contains_key("value"));
    for k in ["mean_action", "std", "norm_obs", "action", "neglogp"] {
        let bits = |t: &Tensor| flat(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(&alone[k]), bits(&whole[k]), "{k}");
    }
    // one actor key missing too: the whole forward's error, naming it
    let mut short = actor.clone();
    short.remove(actor_keys[0]);
    let short_obs = tmp.path().join("short.safetensors");
    candle_core::safetensors::save(&short, &short_obs).unwrap();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", &short_obs.display().to_string(), "--out", "/dev/null"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(actor_keys[0]), "{}", text(&out));
}

#[test]
fn bad_observations_exit_2_naming_the_key_and_width() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("container_obsprocessor/last.ckpt");
    let obs = load(&data("container_obsprocessor/obs.safetensors"));
    let run = |m: &HashMap<String, Tensor>| {
        let p = tmp.path().join("obs.safetensors");
        candle_core::safetensors::save(m, &p).unwrap();
        let o = tmp.path().join("out.safetensors").display().to_string();
        pmstate(&["policy", "run", &ckpt, "--obs", &p.display().to_string(), "--out", &o])
    };
    // a checkpoint given as --obs: the flag, the file and what was expected are named
    let o = tmp.path().join("out.safetensors").display().to_string();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", &ckpt, "--out", &o]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out);
    assert!(err.contains(&format!("--obs {ckpt}: not a safetensors observation file")), "{err}");
    assert!(err.contains("one f32 [B, D] tensor per in_key"), "{err}");

    let mut missing = obs.clone();
    missing.remove("obs_b");
    let out = run(&missing);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("missing observation obs_b (width 3)"), "{}", text(&out));

    let mut extra = obs.clone();
    extra.insert("obs_z".into(), Tensor::zeros((8, 2), candle_core::DType::F32, &Device::Cpu).unwrap());
    let out = run(&extra);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("unexpected observation obs_z"), "{}", text(&out));

    let mut wide = obs.clone();
    wide.insert("obs_c".into(), Tensor::zeros((8, 6), candle_core::DType::F32, &Device::Cpu).unwrap());
    let out = run(&wide);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("observation obs_c: width 6, expected 5"), "{}", text(&out));

    // smpl: only the sum of the widths is fixed by the checkpoint
    let ckpt = data("smpl_tracker/last.ckpt");
    let mut obs = load(&data("smpl_tracker/obs.safetensors"));
    obs.insert("previous_actions".into(), Tensor::zeros((8, 70), candle_core::DType::F32, &Device::Cpu).unwrap());
    let p = tmp.path().join("obs2.safetensors");
    candle_core::safetensors::save(&obs, &p).unwrap();
    let o = tmp.path().join("out.safetensors").display().to_string();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", &p.display().to_string(), "--out", &o]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains(
            "max_coords_obs 358 + mimic_target_poses 576 + previous_actions 70 = 1004 columns, expected 1003"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn describe_reports_keys_layers_and_normalizers() {
    let out = pmstate(&[
        "policy",
        "describe",
        "--json",
        &data("welford_clamps/inference_last.ckpt"),
        "--config",
        &data("welford_clamps/resolved_configs.pt"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let j: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["action_size"], 5);
    assert_eq!(j["in_keys"][0]["key"], "obs_a");
    let actor = &j["networks"][0]["modules"][0];
    assert_eq!(actor["layers"], serde_json::json!(["13->16 relu", "16->16 relu", "16->5"]));
    assert_eq!(actor["normalizer"]["clamp"], 2.5);
    assert_eq!(actor["normalizer"]["ema"], false);
    assert!(actor["normalizer"]["count"].as_i64().unwrap() > 1000);
    let critic = &j["networks"][1]["modules"][0];
    assert_eq!(critic["normalizer"]["clamp"], J::Null);
    let out = pmstate(&["policy", "describe", &data("smpl_tracker/last.ckpt")]);
    let t = text(&out);
    assert!(t.contains("clamp 5, EMA 0.999"), "{t}");
    assert!(t.contains("width sum: max_coords_obs + mimic_target_poses + previous_actions = 1003"), "{t}");
}

/// `describe` gives every bundled policy's input widths where the checkpoint
/// or the resolved configs determine them (the widths record_policy.py
/// recorded the observations with), and says why where neither does.
#[test]
fn describe_gives_every_input_width_or_says_why_it_is_open() {
    let m = manifest();
    let mut derived_from_configs = 0;
    for v in m["variants"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        if name == "gpc_prior" || v["model_target"] == pmstate_policy::config::MASKED_MIMIC_MODEL {
            // their own descriptions: gpc_prior_run_and_describe; widths chosen by the
            // recording, not the env's (masked_mimic_runs_and_describes...)
            continue;
        }
        let recorded = &v["obs_widths"];
        let ckpt = data(&format!("{name}/last.ckpt"));
        let j = stdout_json(&pmstate(&["policy", "describe", "--json", &ckpt]));
        let t = text(&pmstate(&["policy", "describe", &ckpt]));
        let line = |key: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(&format!("{key} ")))
                .unwrap_or_else(|| panic!("{name} {key}: {t}"))
        };
        let read_by_networks = |k: &J| !k["read_by"].as_array().unwrap().is_empty();
        for k in j["in_keys"].as_array().unwrap() {
            let key = k["key"].as_str().unwrap();
            match k["width"].as_u64() {
                Some(w) => {
                    assert_eq!(Some(w), recorded[key].as_u64(), "{name} {key}");
                    let from = k["width_source"]["from"].as_str().unwrap();
                    derived_from_configs += usize::from(from == "config");
                    assert!(line(key).contains(&format!(" {w}  (")), "{name}: {}", line(key));
                }
                None => {
                    // only keys no observation component of the configs names: the synthetic policies'
                    // (obs_a, ...), and g1's keys that no network reads (only its training configs list them)
                    let why = k["open_because"].as_str().unwrap();
                    assert!(why.contains("env.observation_components has no component of this name"), "{why}");
                    if read_by_networks(k) {
                        assert!(key.starts_with("obs_"), "{name} {key} is open: {why}");
                        assert!(why.contains("fixes only a sum"), "{why}");
                    }
                    assert!(line(key).contains("?") && line(key).contains(why), "{name}: {}", line(key));
                }
            }
        }
    }
    // smpl: all three; g1: its actor's two reduced-coords keys and the previous actions
    assert!(derived_from_configs >= 6, "{derived_from_configs}");
    // g1's critic input was cut to 48 columns when recorded: the configs' 3168 does not fit the
    // checkpoint's sum (118), which gives it
    let j = stdout_json(&pmstate(&["policy", "describe", "--json", &data("g1_amp_deploy/last.ckpt")]));
    let k = j["in_keys"].as_array().unwrap().iter().find(|k| k["key"] == "mimic_max_coords_target_poses").unwrap();
    assert_eq!(k["width_source"], serde_json::json!({"from": "checkpoint_sum", "module": "agent.model.critic"}));

    // with the training configs, the g1 keys no network reads get their widths too
    let j = stdout_json(&pmstate(&[
        "policy",
        "describe",
        "--json",
        &data("g1_amp_deploy/last.ckpt"),
        "--config",
        &data("g1_amp_deploy/resolved_configs.pt"),
    ]));
    let recorded =
        &m["variants"].as_array().unwrap().iter().find(|v| v["name"] == "g1_amp_deploy").unwrap()["obs_widths"];
    for k in j["in_keys"].as_array().unwrap() {
        assert_eq!(k["width"], recorded[k["key"].as_str().unwrap()], "{k}");
    }
}

/// The configs files of the recorded runs (both kinds where a run has both).
const CONFIG_FILES: [&str; 4] = [
    "smpl_tracker/resolved_configs.pt",
    "smpl_tracker/resolved_configs_inference.pt",
    "g1_amp_deploy/resolved_configs.pt",
    "g1_amp_deploy/resolved_configs_inference.pt",
];

fn stdout_json(out: &Output) -> J {
    assert!(out.status.success(), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// Each tensor of a file: key -> (dtype, shape, bytes), read through the library.
fn tensor_table(path: &str) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let c = pmstate_ckpt::Checkpoint::open(path).unwrap();
    c.tensors()
        .into_iter()
        .map(|(k, t)| {
            let bytes = c.tensor_bytes(t).unwrap().into_owned();
            (k, (t.dtype.torch_name().to_owned(), t.shape.clone(), bytes))
        })
        .collect()
}

/// The number of times each `__class__` / `__global__` name occurs in a config JSON tree.
fn class_uses(v: &J, out: &mut HashMap<String, usize>) {
    match v {
        J::Object(m) => {
            for tag in ["__class__", "__global__"] {
                if let Some(J::String(c)) = m.get(tag) {
                    *out.entry(c.clone()).or_default() += 1;
                }
            }
            m.values().for_each(|x| class_uses(x, out));
        }
        J::Array(xs) => xs.iter().for_each(|x| class_uses(x, out)),
        _ => {}
    }
}

#[test]
fn configs_files_convert_to_safetensors_and_back_keeping_tensors_and_tree() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, f) in CONFIG_FILES.iter().enumerate() {
        let src = data(f);
        let st = tmp.path().join(format!("c{i}.safetensors")).display().to_string();
        let back = tmp.path().join(format!("c{i}.pt")).display().to_string();
        // its dataclasses are unsafe globals: refused without the flag, nothing written
        let refused = pmstate(&["convert", &src, &st]);
        assert_eq!(refused.status.code(), Some(1), "{f}: {}", text(&refused));
        assert!(!std::path::Path::new(&st).exists(), "{f}");
        let to_st = stdout_json(&pmstate(&["convert", "--json", "--allow-unsafe-globals", &src, &st]));
        assert_eq!(to_st["skipped_non_tensors"], serde_json::json!([]), "{f}: {to_st}");
        let to_pt = stdout_json(&pmstate(&["convert", "--json", "--allow-unsafe-globals", &st, &back]));
        assert_eq!(to_pt["ok"], true, "{f}");

        // diff: no differences at zero tolerance, exit 0
        let d = pmstate(&["diff", &src, &back]);
        assert_eq!(d.status.code(), Some(0), "{f}: {}", text(&d));
        assert!(String::from_utf8_lossy(&d.stdout).starts_with("no differences"), "{f}: {}", text(&d));
        assert_eq!(stdout_json(&pmstate(&["diff", "--json", &src, &st]))["equal"], true, "{f}");

        // every tensor keeps key, dtype, shape and bytes, through both files
        let (a, b, c) = (tensor_table(&src), tensor_table(&st), tensor_table(&back));
        assert!(!a.is_empty(), "{f}: no tensors");
        assert_eq!(a.len(), b.len(), "{f}: tensors in the safetensors copy");
        assert_eq!(a, b, "{f}: safetensors copy");
        assert_eq!(a, c, "{f}: round trip");
        // tensors that share a storage (g1's dof limits, referenced by robot and env) still do,
        // and the safetensors file holds one entry per storage
        let sharing = |p: &str| {
            let j = stdout_json(&pmstate(&["inspect", "--json", p]));
            let mut groups: HashMap<String, Vec<String>> = HashMap::new();
            for t in j["tensors"].as_array().unwrap() {
                let (k, s) = (t["key"].as_str().unwrap(), t["storage"].as_str().unwrap());
                groups.entry(s.to_owned()).or_default().push(k.to_owned());
            }
            let mut g: Vec<Vec<String>> = groups.into_values().collect();
            g.sort();
            (g, j["storages"].as_u64().unwrap())
        };
        let (groups, storages) = sharing(&src);
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), a.len(), "{f}");
        assert_eq!(sharing(&st), (groups.clone(), storages), "{f}: safetensors copy");
        assert_eq!(sharing(&back), (groups, storages), "{f}: round trip");
        assert_eq!(to_st["tensors"].as_u64(), Some(storages), "{f}: {to_st}");

        // the config tree is the same before, in between and after
        let tree = |p: &str| stdout_json(&pmstate(&["config", "--json", p]));
        let before = tree(&src);
        assert_eq!(before, tree(&st), "{f}: safetensors copy");
        assert_eq!(before, tree(&back), "{f}: round trip");
    }
}

#[test]
fn inspect_lists_each_unsafe_global_of_a_configs_file_once_with_its_uses() {
    for f in CONFIG_FILES {
        let j = stdout_json(&pmstate(&["inspect", "--json", &data(f)]));
        let uses = j["unsafe_globals"].as_array().unwrap();
        let distinct = j["unsafe_globals_distinct"].as_array().unwrap();
        assert!(!distinct.is_empty(), "{f}");
        let names: Vec<&str> = distinct.iter().map(|d| d["global"].as_str().unwrap()).collect();
        let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "{f}: a global listed twice: {names:?}");
        let total: u64 = distinct.iter().map(|d| d["uses"].as_u64().unwrap()).sum();
        assert_eq!(total as usize, uses.len(), "{f}: the counts sum to the uses");
        // each count is the number of its uses, and the first key is the first use's
        for d in distinct {
            let g = d["global"].as_str().unwrap();
            let mine: Vec<&J> = uses.iter().filter(|u| u["global"] == g).collect();
            assert_eq!(d["uses"].as_u64(), Some(mine.len() as u64), "{f}: {g}");
            assert_eq!(d["first_key"], mine[0]["key"], "{f}: {g}");
        }
        // against the config tree: every dataclass as often as it occurs there
        let mut in_tree = HashMap::new();
        class_uses(&stdout_json(&pmstate(&["config", "--json", &data(f)])), &mut in_tree);
        for layer in [
            "protomotions.agents.common.config.MLPLayerConfig",
            "protomotions.agents.common.config.MLPWithConcatConfig",
        ] {
            let d = distinct.iter().find(|d| d["global"] == layer).unwrap_or_else(|| panic!("{f}: {layer}"));
            let n = d["uses"].as_u64().unwrap();
            assert!(n > 1, "{f}: {layer} used {n} times");
            assert_eq!(n as usize, in_tree[layer], "{f}: {layer} in the tree");
        }

        // text: one UNSAFE GLOBAL line per global, with its count
        let out = pmstate(&["inspect", &data(f)]);
        assert!(out.status.success(), "{}", text(&out));
        let t = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("UNSAFE GLOBAL ")).collect();
        assert_eq!(lines.len(), distinct.len(), "{f}");
        for d in distinct {
            let n = d["uses"].as_u64().unwrap();
            let uses = if n == 1 { "1 use".to_string() } else { format!("{n} uses") };
            let want = format!(
                "UNSAFE GLOBAL {} ({uses}, first at {};",
                d["global"].as_str().unwrap(),
                d["first_key"].as_str().unwrap()
            );
            assert_eq!(lines.iter().filter(|l| l.starts_with(&want)).count(), 1, "{f}: {want}");
        }
    }
}

#[test]
fn config_get_reads_the_inference_configs_too() {
    let checked = check_normalizer_settings_in("resolved_configs_inference.pt");
    // smpl_tracker (actor, critic) and g1_amp_deploy (actor, critic, discriminator, disc_critic)
    assert!(checked >= 18, "{checked}");
}

#[test]
fn config_json_carries_small_tensors_values_and_text_is_an_indented_tree() {
    let cfg = data("g1_amp_deploy/resolved_configs.pt");
    let j = stdout_json(&pmstate(&["config", "--json", &cfg]));
    // every tensor of the tree: values exactly when small, and then as many as its shape holds
    let mut small = 0;
    let mut stack = vec![&j];
    while let Some(v) = stack.pop() {
        match v {
            J::Object(m) => {
                if let Some(t) = m.get("__tensor__") {
                    let n: u64 = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product();
                    match t.get("values") {
                        Some(J::Array(vals)) => {
                            assert!(n <= 64, "{t}");
                            assert_eq!(vals.len() as u64, n, "{t}");
                            small += 1;
                        }
                        _ => assert!(n > 64, "{t}: small but no values"),
                    }
                }
                stack.extend(m.values());
            }
            J::Array(xs) => stack.extend(xs),
            _ => {}
        }
    }
    assert!(small > 0, "no small tensor in {cfg}");
    // one real small tensor, value for value against the checkpoint reader
    let c = pmstate_ckpt::Checkpoint::open(&cfg).unwrap();
    let (key, t) = c.tensors().into_iter().find(|(_, t)| t.numel() <= 64 && t.dtype.torch_name() == "float32").unwrap();
    let want: Vec<f64> = c
        .tensor_bytes(t)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect();
    let got = stdout_json(&pmstate(&["config", "--json", "--get", &key, &cfg]));
    let vals: Vec<f64> = got["__tensor__"]["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(vals, want, "{key}");
    assert_eq!(got["__tensor__"]["dtype"], "float32");

    // text: an indented tree of fields, no Debug formatting
    let out = pmstate(&["config", &data("smpl_tracker/resolved_configs.pt")]);
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines.contains(&"agent: protomotions.agents.ppo.config.PPOAgentConfig"), "{t}");
    let model = lines.iter().position(|l| *l == "  model: protomotions.agents.ppo.config.PPOModelConfig").unwrap();
    assert!(lines[model..].contains(&"      norm_clamp_value: 5"), "{t}");
    assert!(lines[model..].contains(&"      normalize_obs: true"), "{t}");
    assert!(lines[model..].iter().any(|l| l.starts_with("      layers: (") && l.ends_with(" items)")), "{t}");
    assert!(lines[model..].contains(&"          activation: \"relu\""), "{t}");
    for debug in ["Int(", "Float(", "Str(", "Object {", "Some(", "Node::"] {
        assert!(!t.contains(debug), "Debug formatting {debug} in\n{t}");
    }
}

/// `diff` descends into dataclasses: a changed field is named by its dotted
/// key, everything else (tensors inside objects included) compares equal.
#[test]
fn diff_names_a_changed_field_inside_a_dataclass() {
    let src = data("g1_amp_deploy/resolved_configs.pt");
    let (mut root, storages) = pmstate_ckpt::Checkpoint::open(&src).unwrap().into_parts();
    let mut cur = &mut root;
    for part in ["agent", "model", "actor", "actor_logstd"] {
        cur = match cur {
            pmstate_ckpt::Node::Dict(d) => d.get_mut(part).unwrap(),
            pmstate_ckpt::Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap().get_mut(part).unwrap(),
            other => panic!("{part}: {}", other.kind()),
        };
    }
    assert_eq!(*cur, pmstate_ckpt::Node::Float(-2.9));
    *cur = pmstate_ckpt::Node::Float(-1.5);
    let changed = pmstate_ckpt::Checkpoint::from_parts(root, storages).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("changed.pt");
    let opts = pmstate_ckpt::WriteOptions {
        unsafe_globals: pmstate_ckpt::UnsafeGlobals::Allow,
        ..pmstate_ckpt::WriteOptions::default()
    };
    pmstate_ckpt::save_torch(&changed, &out, &opts).unwrap();
    let d = pmstate(&["diff", &src, &out.display().to_string()]);
    assert_eq!(d.status.code(), Some(1), "{}", text(&d));
    assert_eq!(
        String::from_utf8_lossy(&d.stdout),
        "agent.model.actor.actor_logstd: -2.9 in A, -1.5 in B\n1 difference(s)\n"
    );
}

/// With `--json` an error is one JSON object on stderr (kind, message, and
/// the file and key it names), stdout stays empty, the exit code is the
/// text mode's, and the message is the text mode's.
#[test]
fn json_errors_are_one_object_on_stderr_naming_kind_file_and_key() {
    let smpl = data("smpl_tracker/last.ckpt");
    let configs = data("smpl_tracker/resolved_configs.pt");
    let missing = data("smpl_tracker/no_such.ckpt");
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("out.safetensors").display().to_string();
    // (arguments, kind, file, key)
    type Case<'a> = (Vec<&'a str>, &'a str, Option<&'a str>, Option<&'a str>);
    let cases: Vec<Case> = vec![
        // a missing file
        (vec!["inspect", &missing], "ckpt.io", Some(&missing), None),
        // a key the file does not have
        (vec!["config", &configs, "--get", "agent.model.nope"], "no_key", Some(&configs), Some("agent.model.nope")),
        // a checkpoint given as the observations file
        (vec!["policy", "run", &smpl, "--obs", &smpl, "--out", &out_file], "obs.header_too_large", Some(&smpl), None),
        // bad arguments (clap's)
        (vec!["inspect", &smpl, "--no-such-flag"], "usage", None, None),
    ];
    for (args, kind, file, key) in cases {
        let text_mode = pmstate(&args);
        let mut json_args = args.clone();
        json_args.push("--json");
        let out = pmstate(&json_args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert_eq!(out.status.code(), text_mode.status.code());
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8(out.stderr.clone()).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        let j: J = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{args:?}: {e}: {stderr}"));
        assert_eq!(j["kind"], kind, "{args:?}: {j}");
        assert_eq!(j["file"].as_str(), file, "{args:?}: {j}");
        assert_eq!(j["key"].as_str(), key, "{args:?}: {j}");
        let message = j["message"].as_str().unwrap();
        let plain = String::from_utf8_lossy(&text_mode.stderr);
        if kind == "usage" {
            assert!(plain.contains(message), "{args:?}: {message} not in {plain}");
        } else {
            assert_eq!(plain.trim_end(), format!("pmstate: error: {message}"), "{args:?}");
        }
    }
}

#[test]
fn policy_run_on_the_fsq_trackers_writes_torchs_codes() {
    // mean_action, value, norm_obs (and for AMP the discriminator's outputs) within
    // their bounds of torch's (check_cli_run), and latent_codes: the codes the decoder
    // consumed, the library's, and torch's where the rounding is certain
    // (tests/parity.rs in pmstate-policy derives which)
    let tmp = tempfile::tempdir().unwrap();
    for v in ["soma_fsq_tracker", "soma_fsq_amp"] {
        let got = check_cli_run(v, "last.ckpt", None, tmp.path());
        let exp = load(&data(&format!("{v}/expected.safetensors")));
        let obs = load(&data(&format!("{v}/obs.safetensors")));
        let policy = Policy::load(data(&format!("{v}/last.ckpt")), None, &Device::Cpu).unwrap();
        let lib = policy.forward(&obs).unwrap();
        let bits = |t: &Tensor| flat(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(got["latent_codes"].dims(), [8, 40], "{v}");
        assert_eq!(bits(&got["latent_codes"]), bits(lib.latent_codes.as_ref().unwrap()), "{v}");
        let stage = &policy.reference(&obs).unwrap().fsq[0];
        let mut certain = 0;
        for (i, ((a, b), bound)) in
            flat(&got["latent_codes"]).iter().zip(flat(&exp["latent_codes"])).zip(&stage.codes.bound).enumerate()
        {
            if *bound == 0.0 {
                assert_eq!(a.to_bits(), b.to_bits(), "{v}: latent_codes[{i}] {a} vs torch {b}");
                certain += 1;
            }
        }
        assert!(certain >= 160, "{v}: {certain} certain codes");
        let out = pmstate(&["policy", "describe", &data(&format!("{v}/last.ckpt"))]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("FSQ quantizer agent.model.actor.mu_model: 40 scalars x 9 levels"),
            "{}",
            text(&out)
        );
    }
}

/// The GPC prior through the CLI: `run` writes what the library computes,
/// bit for bit (teacher forced on the file's tokens; `--sample` generates
/// with the seed), and `describe` gives its inputs and token structure.
#[test]
fn gpc_prior_run_and_describe() {
    use pmstate_policy::gpc::LatentPrior;
    let ckpt = data("gpc_prior/inference_last.ckpt");
    let obs_path = data("gpc_prior/obs.safetensors");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let r = pmstate(&["policy", "run", &ckpt, "--obs", &obs_path, "--out", out.to_str().unwrap()]);
    assert!(r.status.success(), "{}", text(&r));
    let got = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    let prior = LatentPrior::load_with(&ckpt, None, &Device::Cpu, &Default::default()).unwrap();
    let obs = candle_core::safetensors::load(&obs_path, &Device::Cpu).unwrap();
    let lib = prior.teacher_forced(&obs).unwrap();
    let bits =
        |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got["mean_action"]), bits(&lib.mean_action));
    assert_eq!(bits(&got["logits"]), bits(&lib.logits));
    assert_eq!(bits(&got["latent_codes"]), bits(&lib.latent_codes));
    assert!(!got.contains_key("prior_tokens"));

    // generation: the file's tokens are refused, then drawn with the seed
    let r = pmstate(&["policy", "run", &ckpt, "--obs", &obs_path, "--out", out.to_str().unwrap(), "--sample"]);
    assert!(!r.status.success());
    assert!(text(&r).contains("prior_tokens"), "{}", text(&r));
    let mut ctx: HashMap<String, Tensor> = obs.clone();
    ctx.remove("prior_tokens");
    let ctx_path = dir.path().join("ctx.safetensors");
    candle_core::safetensors::save(&ctx, &ctx_path).unwrap();
    let r = pmstate(&[
        "policy",
        "run",
        &ckpt,
        "--obs",
        ctx_path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--sample",
        "--seed",
        "9",
    ]);
    assert!(r.status.success(), "{}", text(&r));
    let got = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    let lib = prior.generate(&ctx, prior.sampling(9)).unwrap();
    assert_eq!(got["prior_tokens"].to_vec2::<i64>().unwrap(), lib.tokens.to_vec2::<i64>().unwrap());
    assert_eq!(bits(&got["mean_action"]), bits(&lib.mean_action));

    // float tokens are refused naming the key
    let mut bad = obs.clone();
    bad.insert("prior_tokens".into(), obs["prior_tokens"].to_dtype(candle_core::DType::F32).unwrap());
    candle_core::safetensors::save(&bad, &ctx_path).unwrap();
    let r = pmstate(&["policy", "run", &ckpt, "--obs", ctx_path.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(!r.status.success());
    assert!(text(&r).contains("prior_tokens: prior tokens must be int64 [B, 20], got f32"), "{}", text(&r));

    // int64 tokens whose offsets hold only 4 bytes per element: refused before reading
    let obs_bytes = 343 * 4;
    let header = format!(
        "{{\"max_coords_obs\":{{\"dtype\":\"F32\",\"shape\":[1,343],\"data_offsets\":[0,{obs_bytes}]}},\
         \"prior_tokens\":{{\"dtype\":\"I64\",\"shape\":[1,20],\"data_offsets\":[{obs_bytes},{}]}}}}",
        obs_bytes + 80
    );
    let mut raw = (header.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(header.as_bytes());
    raw.resize(raw.len() + obs_bytes + 80, 0);
    std::fs::write(&ctx_path, raw).unwrap();
    let r = pmstate(&["policy", "run", &ckpt, "--obs", ctx_path.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    assert!(text(&r).contains("tensor prior_tokens: data offsets"), "{}", text(&r));
    assert!(text(&r).contains("do not hold its 160 bytes"), "{}", text(&r));

    let j = stdout_json(&pmstate(&["policy", "describe", "--json", &ckpt]));
    assert_eq!(j["class"], "protomotions.agents.supervised.latent_prior_model.DiscreteAutoregressiveLatentPriorModel");
    assert_eq!(j["in_keys"][0]["key"], "max_coords_obs");
    assert_eq!(j["in_keys"][0]["width"], 343);
    assert_eq!((j["tokens"].as_u64(), j["vocab"].as_u64()), (Some(20), Some(81)));
    assert_eq!(j["action_size"], 66);
    let t = text(&pmstate(&["policy", "describe", &ckpt]));
    assert!(t.contains("vocabulary 81 = 9^2 (40 FSQ scalars of 9 levels)"), "{t}");
}

/// A GPC prior's tokens through the one observations schema: left out
/// without --sample, refused naming the width teacher forcing reads; in
/// an element type that is neither int64 nor float32, refused naming
/// int64 before anything is read (`--json` kind `obs.not_int64`).
#[test]
fn gpc_prior_tokens_are_required_without_sample_and_int64() {
    let ckpt = data("gpc_prior/inference_last.ckpt");
    let obs = candle_core::safetensors::load(data("gpc_prior/obs.safetensors"), &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (path, out) = (dir.path().join("obs.safetensors"), dir.path().join("out.safetensors"));
    let (path_s, out_s) = (path.to_str().unwrap(), out.to_str().unwrap());

    let mut ctx = obs.clone();
    ctx.remove("prior_tokens");
    candle_core::safetensors::save(&ctx, &path).unwrap();
    let r = pmstate(&["policy", "run", &ckpt, "--obs", path_s, "--out", out_s]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    assert!(text(&r).contains("missing observation prior_tokens (width 20)"), "{}", text(&r));
    assert!(!out.exists());

    let mut half = obs.clone();
    half.insert("prior_tokens".into(), obs["prior_tokens"].to_dtype(candle_core::DType::F16).unwrap());
    candle_core::safetensors::save(&half, &path).unwrap();
    let r = pmstate(&["policy", "run", "--json", &ckpt, "--obs", path_s, "--out", out_s]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    let e: serde_json::Value = serde_json::from_slice(&r.stderr).unwrap();
    assert_eq!(e["kind"], "obs.not_int64", "{e}");
    assert_eq!(e["key"], "prior_tokens", "{e}");
    assert!(e["message"].as_str().unwrap().contains("tensor prior_tokens: dtype f16, expected int64 [B, 20]"), "{e}");
}

#[test]
fn masked_mimic_runs_and_describes_with_its_optional_noise() {
    use pmstate_policy::MaskedMimic;
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("masked_mimic/last.ckpt");
    let obs_path = data("masked_mimic/obs.safetensors");
    let model = MaskedMimic::load(&ckpt, None, &Device::Cpu).unwrap();
    let mut obs = load(&obs_path);
    // with the recorded vae_noise: bit for bit the library's
    let out_path = tmp.path().join("mm.safetensors").display().to_string();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", &obs_path, "--out", &out_path]);
    assert!(out.status.success(), "{}", text(&out));
    let got = load(&out_path);
    let lib = model.forward(&obs).unwrap();
    for (k, t) in [
        ("mean_action", &lib.mean_action),
        ("latent_mu", &lib.latent_mu),
        ("latent_logvar", &lib.latent_logvar),
        ("latent", &lib.latent),
    ] {
        assert_eq!(flat(&got[k]), flat(t), "{k}");
    }
    let mut names: Vec<&String> = got.keys().collect();
    names.sort();
    assert_eq!(names, ["latent", "latent_logvar", "latent_mu", "mean_action"]);
    // without it: the prior mean
    obs.remove("vae_noise");
    let quiet_obs = tmp.path().join("quiet.safetensors");
    candle_core::safetensors::save(&obs, &quiet_obs).unwrap();
    let quiet_out = tmp.path().join("quiet_out.safetensors").display().to_string();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", quiet_obs.to_str().unwrap(), "--out", &quiet_out]);
    assert!(out.status.success(), "{}", text(&out));
    let quiet = load(&quiet_out);
    assert_eq!(flat(&quiet["latent"]), flat(&quiet["latent_mu"]));
    assert_eq!(flat(&quiet["mean_action"]), flat(&model.forward(&obs).unwrap().mean_action));
    // --sample has no meaning here: refused, exit 2, naming the flag
    let out = pmstate(&["policy", "run", &ckpt, "--obs", &obs_path, "--out", &out_path, "--sample"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--sample"), "{}", text(&out));
    // a noise of the wrong width is refused naming the key and the width
    let mut bad = load(&obs_path);
    bad.insert("vae_noise".into(), Tensor::zeros((8, 3), candle_core::DType::F32, &Device::Cpu).unwrap());
    let bad_path = tmp.path().join("bad.safetensors");
    candle_core::safetensors::save(&bad, &bad_path).unwrap();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", bad_path.to_str().unwrap(), "--out", &out_path]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("vae_noise") && text(&out).contains('8'), "{}", text(&out));
    // describe: the transformer, the optional input, JSON too
    let out = pmstate(&["policy", "describe", &ckpt]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("Transformer agent.model.prior.models.7") && t.contains("4 heads") && t.contains("2 layers"),
        "{t}"
    );
    assert!(t.contains("vae_noise") && t.contains("(optional)"), "{t}");
    let out = pmstate(&["policy", "describe", "--json", &ckpt]);
    assert!(out.status.success(), "{}", text(&out));
    let j = stdout_json(&out);
    assert_eq!(j["action_size"], 69);
    assert_eq!(j["latent_dim"], 8);
    assert_eq!(j["transformers"][0]["d_model"], 32);
    assert_eq!(j["transformers"][0]["masks"][0][1], "masked_mimic_target_poses_masks");
}
