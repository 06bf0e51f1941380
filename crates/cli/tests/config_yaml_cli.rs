//! `pmstate config` on a Hydra `config.yaml`: the tree OmegaConf resolves
//! (recorded in `testdata/hydra/*.resolved.json` by
//! `testdata/hydra/record_hydra.py`), printed by the same paths as a
//! resolved_configs.pt, `--get` included; a config that cannot resolve is
//! exit 2 naming the file and the key.

use std::path::PathBuf;
use std::process::{Command, Output};

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn hydra(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/hydra").join(name)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn json_is_what_omegaconf_resolves() {
    for name in ["resolvers", "interpolations", "types"] {
        let yaml = hydra(&format!("{name}.yaml")).display().to_string();
        let o = pmstate(&["config", "--json", &yaml]);
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let got: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON line");
        let want: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(hydra(&format!("{name}.resolved.json"))).expect("the recording"),
        )
        .expect("json");
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn get_prints_one_value_with_its_type() {
    let yaml = hydra("resolvers.yaml").display().to_string();
    for (key, want) in [
        ("agent.max_epochs", "38146"),
        ("powers.1", "0.5"),
        ("sqrts.0", "4.0"),
        ("strings.size_tag", "bodies_4"),
        ("pose.with_time", "true"),
    ] {
        let o = pmstate(&["config", &yaml, "--get", key]);
        assert!(o.status.success(), "{key}: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(stdout(&o).trim(), want, "{key}");
    }
    // A subtree prints as a tree.
    let o = pmstate(&["config", &yaml, "--get", "pose"]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(text.contains("base") && text.contains("433"), "{text}");
    // A key that is not there.
    let o = pmstate(&["config", &yaml, "--get", "pose.nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pose.nope"));
}

#[test]
fn an_unresolvable_config_is_exit_2_naming_file_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("config.yaml");
    std::fs::write(&yaml, "motion_file: ???\nmotion_lib:\n  motion_file: ${motion_file}\n").expect("write");
    let shown = yaml.display().to_string();
    for json in [false, true] {
        let mut args = vec!["config", shown.as_str()];
        if json {
            args.push("--json");
        }
        let o = pmstate(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
        assert!(all.contains("config.yaml") && all.contains("motion_lib.motion_file"), "{args:?}: {all}");
        assert!(all.contains("???"), "{args:?}: {all}");
        if json {
            let e: serde_json::Value = serde_json::from_slice(&o.stderr).expect("a JSON error");
            assert_eq!(e["kind"], "hydra.missing_value", "{e}");
            assert_eq!(e["key"], "motion_lib.motion_file", "{e}");
            assert_eq!(e["file"], shown, "{e}");
        }
    }
    // An eval that would run code is refused, not run.
    std::fs::write(&yaml, "v: ${eval:\"__import__('os').getcwd()\"}\n").expect("write");
    let o = pmstate(&["config", &shown]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("refused"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = pmstate(&["--json", "config", &shown]);
    let e: serde_json::Value = serde_json::from_slice(&o.stderr).expect("a JSON error");
    assert_eq!((e["kind"].as_str(), e["key"].as_str()), (Some("hydra.eval_refused"), Some("v")), "{e}");
}
