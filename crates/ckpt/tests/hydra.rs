//! The Hydra config reader against OmegaConf: every `testdata/hydra/*.yaml`
//! resolves to exactly what `testdata/hydra/record_hydra.py` recorded from
//! OmegaConf 2.3 with ProtoMotions v2.3's resolvers (ints stay ints, floats
//! floats, key order kept), refusals and failures name their key, and, when
//! a v2.3 checkout is at hand, its published `config.yaml` files resolve as
//! OmegaConf resolves them.

use std::path::{Path, PathBuf};

use pmstate_ckpt::hydra::{resolve_yaml, HydraError, Problem};
use serde_json::Value;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/hydra")
}

/// OmegaConf writes list positions as `a[0]`; this reader as `a.0`.
fn omegaconf_key(key: &str) -> String {
    key.replace('[', ".").replace(']', "")
}

/// Checks every `*.yaml` in `dir` against the recorder's answer next to it.
/// Returns how many files were compared.
fn check_against_recordings(dir: &Path) -> usize {
    let mut yamls: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the recordings' folder")
        .map(|e| e.expect("folder entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    yamls.sort();
    for yaml in &yamls {
        let text = std::fs::read_to_string(yaml).expect("read yaml");
        let name = yaml.display().to_string();
        let ours = resolve_yaml(&text, &name);
        let resolved = yaml.with_extension("resolved.json");
        let error = yaml.with_extension("error.json");
        if resolved.exists() {
            let want: Value =
                serde_json::from_str(&std::fs::read_to_string(&resolved).expect("read json")).expect("json");
            let got = ours.unwrap_or_else(|e| panic!("{name}: OmegaConf resolves it, we fail: {e}"));
            if got != want {
                let g = serde_json::to_string_pretty(&got).unwrap_or_default();
                let w = serde_json::to_string_pretty(&want).unwrap_or_default();
                let first = g.lines().zip(w.lines()).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "{name}: differs from OmegaConf near line {first}:\n ours: {:?}\n want: {:?}",
                    g.lines().nth(first),
                    w.lines().nth(first)
                );
            }
            assert_eq!(
                serde_json::to_string(&got).expect("ser"),
                serde_json::to_string(&want).expect("ser"),
                "{name}: same values, different key order"
            );
        } else {
            let want: Value =
                serde_json::from_str(&std::fs::read_to_string(&error).expect("a recording")).expect("json");
            let err = match ours {
                Ok(_) => panic!("{name}: OmegaConf raises {want}, we resolve it"),
                Err(e) => e,
            };
            // OmegaConf names no key for a YAML error or for a float JSON
            // cannot carry (json.dumps raises); otherwise the keys agree.
            if let Some(want_key) = want["full_key"].as_str().map(omegaconf_key) {
                assert_eq!(err.key(), Some(want_key.as_str()), "{name}: {err} vs OmegaConf's {want}");
            }
            eprintln!("{name}: both fail: ours `{err}`, OmegaConf {}", want["error"]);
        }
    }
    yamls.len()
}

#[test]
fn our_test_configs_resolve_exactly_as_omegaconf_recorded() {
    let n = check_against_recordings(&testdata());
    assert!(n >= 3, "expected the bundled test configs, found {n}");
}

fn problem(text: &str) -> (String, Problem, String) {
    match resolve_yaml(text, "case.yaml") {
        Ok(v) => panic!("resolved to {v} but should fail"),
        Err(e @ HydraError::Key { .. }) => {
            let shown = e.to_string();
            assert!(shown.starts_with("case.yaml: key `"), "{shown}");
            (e.key().unwrap_or_default().to_string(), e.problem().cloned().expect("a problem"), shown)
        }
        Err(e) => panic!("not a key error: {e}"),
    }
}

#[test]
fn a_cycle_is_named_with_its_keys() {
    let (key, p, _) = problem("a:\n  x: ${b.y}\nb:\n  y: ${a.x}\n");
    assert_eq!(key, "a.x");
    assert_eq!(p, Problem::Cycle { keys: vec!["a.x".into(), "b.y".into(), "a.x".into()] });
    // A value that is its own subtree's parent.
    let (key, p, _) = problem("a:\n  b: ${a}\n");
    assert_eq!(key, "a.b");
    assert!(matches!(p, Problem::Cycle { .. }), "{p:?}");
}

#[test]
fn a_missing_key_is_named() {
    let (key, p, shown) = problem("model:\n  width: ${robot.num_bodies}\nrobot: {}\n");
    assert_eq!(key, "model.width");
    assert_eq!(p, Problem::NotFound { target: "robot.num_bodies".into() });
    assert!(shown.contains("robot.num_bodies"), "{shown}");
    // Above the root.
    let (key, _, _) = problem("a: ${..b}\n");
    assert_eq!(key, "a");
}

#[test]
fn eval_refuses_calls_attributes_and_names() {
    for expr in [r#""__import__('os')""#, r#""abs(-3)""#, r#""(1).real""#, "x+1", r#""'a'*3""#, r#""[1][0]""#] {
        let (key, p, shown) = problem(&format!("n:\n  v: ${{eval:{expr}}}\n"));
        assert_eq!(key, "n.v", "{expr}");
        assert!(matches!(p, Problem::EvalRefused { .. }), "{expr}: {p:?}");
        assert!(shown.contains("refused"), "{shown}");
    }
}

#[test]
fn python_failures_are_failures_not_numbers() {
    for (expr, what) in [
        ("1//0", "division"),
        ("1%0", "modulo"),
        ("1/0", "division"),
        ("1.0/0", "division"),
        ("2**64", "64 bits"),
        ("9223372036854775807+1", "64 bits"),
    ] {
        let (key, p, shown) = problem(&format!("v: ${{eval:{expr}}}\n"));
        assert_eq!(key, "v");
        assert!(matches!(p, Problem::EvalFailed { .. }), "{expr}: {p:?}");
        assert!(shown.contains(what), "{shown}");
    }
    // eval of a number (OmegaConf hands eval an int here): Python's TypeError.
    let (_, p, _) = problem("v: ${eval:5}\n");
    assert!(matches!(p, Problem::Resolver { ref name, .. } if name == "eval"), "{p:?}");
    let (_, p, _) = problem("v: ${eq:a,${t}}\nt: true\n");
    assert!(matches!(p, Problem::Resolver { ref name, .. } if name == "eq"), "{p:?}");
}

#[test]
fn a_reference_to_a_mandatory_value_is_named_and_an_unreferenced_one_kept() {
    let (key, p, _) = problem("motion_file: ???\nlib:\n  file: ${motion_file}\n");
    assert_eq!(key, "lib.file");
    assert_eq!(p, Problem::MissingValue { target: "motion_file".into() });
    let tree = resolve_yaml("motion_file: ???\n", "case.yaml").expect("resolves");
    assert_eq!(tree["motion_file"], "???");
}

#[test]
fn unknown_resolvers_and_grammar_errors_are_named() {
    let (key, p, _) = problem("home: ${oc.env:HOME}\n");
    assert_eq!(key, "home");
    assert_eq!(p, Problem::UnknownResolver { name: "oc.env".into() });
    // OmegaConf's lexer has no token for `(` in an unquoted argument.
    let (_, p, _) = problem("v: ${eval:(1+2)*3}\n");
    assert!(matches!(p, Problem::Grammar { .. }), "{p:?}");
    let (_, p, _) = problem("v: ${a\n");
    assert!(matches!(p, Problem::Grammar { .. }), "{p:?}");
}

#[test]
fn limits_hold_on_hostile_input() {
    // A chain of references longer than the depth cap, each waiting on
    // the next.
    let mut text = String::new();
    for i in 0..200 {
        text.push_str(&format!("k{i}: ${{k{}}}\n", i + 1));
    }
    text.push_str("k200: 1\n");
    let (_, p, _) = problem(&text);
    assert!(matches!(p, Problem::Limit(_)), "{p:?}");
    // Deeply nested evals.
    let nested = format!("v: {}1{}\n", "${eval:".repeat(100), "}".repeat(100));
    let (_, p, _) = problem(&nested);
    assert!(matches!(p, Problem::Limit(_)), "{p:?}");
    // JSON has no inf: named, not written as null.
    let (key, p, _) = problem("lr:\n  max: .inf\n");
    assert_eq!(key, "lr.max");
    assert!(matches!(p, Problem::Unrepresentable(_)), "{p:?}");
    // A YAML error names the file.
    let e = resolve_yaml("a: [1, 2\n", "bad.yaml").expect_err("not yaml");
    assert!(matches!(e, HydraError::Yaml { .. }), "{e}");
    assert!(e.to_string().starts_with("bad.yaml: "), "{e}");
    let e = resolve_yaml("a: 1\na: 2\n", "dup.yaml").expect_err("duplicate");
    assert!(e.to_string().contains("duplicate key `a`"), "{e}");
}

/// ProtoMotions v2.3's published configs: needs PMSTATE_PROTOMOTIONS_V23 (a
/// checkout or `git archive` of tag v2.3 holding
/// `data/pretrained_models/{motion_tracker,masked_mimic}/smpl/config.yaml`
/// and `protomotions/utils/config_utils.py`) and PMSTATE_PYTHON (a python
/// with omegaconf); skips, saying so, without them. OmegaConf itself fails
/// on masked_mimic's file (`motion_file: ???` is referenced), so that file is
/// also checked with the value filled in.
#[test]
fn protomotions_v23_published_configs_resolve_as_omegaconf_does() {
    let (Some(pm), Some(python)) = (std::env::var_os("PMSTATE_PROTOMOTIONS_V23"), std::env::var_os("PMSTATE_PYTHON"))
    else {
        eprintln!(
            "SKIPPED: set PMSTATE_PROTOMOTIONS_V23 and PMSTATE_PYTHON to check v2.3's published config.yaml files"
        );
        return;
    };
    let pm = PathBuf::from(pm);
    let dir = tempfile::tempdir().expect("tempdir");
    for model in ["motion_tracker", "masked_mimic"] {
        let text = std::fs::read_to_string(pm.join(format!("data/pretrained_models/{model}/smpl/config.yaml")))
            .expect("the published config.yaml");
        std::fs::write(dir.path().join(format!("{model}.yaml")), &text).expect("copy");
        if text.contains("motion_file: ???") {
            let filled = text.replace("motion_file: ???", "motion_file: data/motions/example.npy");
            std::fs::write(dir.path().join(format!("{model}_filled.yaml")), filled).expect("copy");
        }
    }
    let rec = std::process::Command::new(python)
        .arg(testdata().join("record_hydra.py"))
        .arg(&pm)
        .arg(dir.path())
        .output()
        .expect("run record_hydra.py");
    assert!(rec.status.success(), "record_hydra.py: {}", String::from_utf8_lossy(&rec.stderr));
    let n = check_against_recordings(dir.path());
    assert_eq!(n, 3);
    eprintln!("v2.3 published configs: {n} files agree with OmegaConf");
}

/// One subtree resolved alone, lazily as OmegaConf resolves a node: a
/// mandatory value elsewhere that the subtree does not reference is no
/// error (v2.3's MaskedMimic leaves `motion_file` for its eval); one it
/// references is; a key naming no node is named.
#[test]
fn a_subtree_resolves_alone() {
    use pmstate_ckpt::hydra::resolve_yaml_at;
    let text = "motion_file: ???\nrobot:\n  n: 4\nagent:\n  model:\n    num_out: ${robot.n}\n    w: ${eval:${.num_out}*2}\n  data: ${motion_file}\n";
    let t = resolve_yaml_at(text, "c.yaml", "agent.model").unwrap();
    assert_eq!(t, serde_json::json!({"num_out": 4, "w": 8}));
    assert_eq!(resolve_yaml_at(text, "c.yaml", "agent.model.w").unwrap(), 8);
    let e = resolve_yaml_at(text, "c.yaml", "agent").unwrap_err();
    assert!(matches!(e.problem(), Some(Problem::MissingValue { target }) if target == "motion_file"), "{e}");
    assert_eq!(e.key(), Some("agent.data"));
    let e = resolve_yaml_at(text, "c.yaml", "agent.critic").unwrap_err();
    assert!(matches!(e.problem(), Some(Problem::NotFound { .. })), "{e}");
    // the whole file, as resolve_yaml does
    assert!(resolve_yaml_at(text, "c.yaml", "").is_err());
}
