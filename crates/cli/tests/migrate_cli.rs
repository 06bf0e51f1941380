//! `pmstate migrate` end to end: the v3.1 smpl tracker migrated into the
//! files testdata/migrate/record_migrate.py verified with today's
//! ProtoMotions (byte for byte), the report on stdout (`--json`: one
//! object), and the refusals (exit 1, a JSON error naming the kind, file
//! and key): a term without counterpart, v3.0, a non-tracker, an unknown
//! robot, an existing OUT_DIR.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn migrate_writes_the_verified_files_and_reports_them() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    let old = repo("testdata/policy/v31_tracker/last.ckpt");
    let out = pmstate(&["migrate", "--json", "--drop-unmatched-terms", s(&old), s(&out_dir)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 1, "{}", text(&out));
    let report: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(report["release"], "v3.1");
    assert_eq!(report["family"], "ppo_tracker");
    assert_eq!(report["written"].as_array().unwrap().len(), 4);
    let dropped: Vec<&str> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "dropped" && e["key"].as_str().unwrap().contains("_components."))
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(dropped, ["env.reward_components.action_smoothness"]);
    for f in ["last.ckpt", "resolved_configs.pt", "resolved_configs_inference.pt"] {
        assert!(
            std::fs::read(out_dir.join(f)).unwrap()
                == std::fs::read(repo("testdata/migrate/v31_tracker").join(f)).unwrap(),
            "{f} differs from the verified recording: rerun testdata/migrate/record_migrate.py verify"
        );
    }
    let on_disk: Value = serde_json::from_slice(&std::fs::read(out_dir.join("migrate_report.json")).unwrap()).unwrap();
    assert_eq!(on_disk, report);
    // the migrated configs read as today's classes
    let cfg = pmstate(&[
        "config",
        s(&out_dir.join("resolved_configs.pt")),
        "--get",
        "env.observation_components.max_coords_obs",
    ]);
    assert!(text(&cfg).starts_with("protomotions.envs.mdp_component.MdpComponent"), "{}", text(&cfg));
    // text mode: one line per decision and the caveats
    let out = pmstate(&["migrate", "--drop-unmatched-terms", s(&old), s(&tmp.path().join("text"))]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("renamed      configs env.control_components.mimic.future_steps"), "{t}");
    assert!(t.contains("note: resume: training continues WITHOUT env.reward_components.action_smoothness"), "{t}");
}

fn refusal(args: &[&str], kind: &str) -> Value {
    let out = pmstate(args);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    let e: Value = serde_json::from_slice(&out.stderr).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(e["kind"], kind, "{e}");
    e
}

#[test]
fn refusals_exit_1_naming_what_and_why() {
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("o");
    let o = s(&o);
    let v31 = repo("testdata/policy/v31_tracker/last.ckpt");
    let e = refusal(&["migrate", "--json", s(&v31), o], "migrate.no_counterpart");
    assert_eq!(e["key"], "env.reward_components.action_smoothness");
    let e =
        refusal(&["migrate", "--json", s(&repo("testdata/policy/v30_tracker/last.ckpt")), o], "migrate.not_migratable");
    assert_eq!(e["key"], "env");
    let v23 = repo("testdata/policy/v23_tracker/last.ckpt");
    let e = refusal(&["migrate", "--json", s(&v23), o], "migrate.not_migratable");
    assert_eq!(e["key"], "env._target_");
    assert!(e["file"].as_str().is_some_and(|f| f.ends_with("config.yaml")), "{e}");
    let e = refusal(
        &["migrate", "--json", s(&repo("testdata/policy/v31_masked_mimic/last.ckpt")), o],
        "migrate.not_a_tracker",
    );
    assert_eq!(e["key"], "agent._target_");
    // the v3.1 G1 tracker without dropping: its density-weighted rewards have no counterpart
    let g1 = repo("testdata/policy/v31_g1_tracker/last.ckpt");
    let e = refusal(&["migrate", "--json", s(&g1), o], "migrate.no_counterpart");
    assert_eq!(e["key"], "env.reward_components.relative_body_pos");
    refusal(&["migrate", "--json", s(&repo("testdata/policy/smpl_tracker/last.ckpt")), o], "migrate.already_current");
    assert!(!Path::new(o).exists(), "a refused migration creates nothing");
    // an existing OUT_DIR with a file of its own
    std::fs::create_dir(o).unwrap();
    std::fs::write(Path::new(o).join("keep.txt"), b"x").unwrap();
    for extra in [&[][..], &["--force"][..]] {
        let mut args = vec!["migrate", "--json", "--drop-unmatched-terms"];
        args.extend_from_slice(extra);
        args.extend([s(&v31), o]);
        let e = refusal(&args, "migrate.out_dir_not_empty");
        assert_eq!(e["file"], o);
    }
    assert_eq!(std::fs::read_dir(o).unwrap().count(), 1);
}

#[test]
fn an_unreadable_input_is_an_error_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let out = pmstate(&["migrate", "--json", "/nonexistent/last.ckpt", s(&tmp.path().join("o"))]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let e: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(e["kind"], "migrate.config_not_found");
}
