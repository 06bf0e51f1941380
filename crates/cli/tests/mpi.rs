//! `pmstate replay --collective mpi` under a real `mpirun` (feature `mpi`).
//! Skips with a printed reason when `mpirun` is not on PATH.

#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn traces(prefix: &str) -> Vec<String> {
    let dir = root().join("testdata/traces");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no {prefix}* traces");
    v
}

fn have_mpirun() -> bool {
    let ok = Command::new("mpirun").arg("--version").output().is_ok();
    if !ok {
        println!("SKIPPED: no `mpirun` on PATH (install openmpi-bin)");
    }
    ok
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    secs: f64,
}

/// `mpirun` with one or more `-np N ARGS...` groups of `pmstate` (MPMD:
/// ranks in order).
fn mpirun(groups: &[(usize, Vec<String>)]) -> Out {
    let programs: Vec<(usize, String, Vec<String>)> =
        groups.iter().map(|(np, args)| (*np, env!("CARGO_BIN_EXE_pmstate").to_string(), args.clone())).collect();
    mpirun_programs(&programs)
}

/// `mpirun` with `-np N PROGRAM ARGS...` groups (MPMD: ranks in order).
fn mpirun_programs(groups: &[(usize, String, Vec<String>)]) -> Out {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "10", "120", "mpirun", "--allow-run-as-root", "--oversubscribe"]);
    for (i, (np, program, args)) in groups.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", &np.to_string(), program]).args(args);
    }
    let t = Instant::now();
    let o = cmd.current_dir(root()).output().unwrap();
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
        secs: t.elapsed().as_secs_f64(),
    }
}

fn replay_args(extra: &[&str], paths: &[String]) -> Vec<String> {
    let mut v: Vec<String> = ["replay", "--collective", "mpi"].iter().map(|s| s.to_string()).collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(paths.iter().cloned());
    v
}

#[test]
fn every_multi_rank_trace_replays_over_mpi_bit_for_bit_and_in_free_mode() {
    if !have_mpirun() {
        return;
    }
    for w in [2usize, 3, 4] {
        let paths = traces(&format!("dist_w{w}_"));
        for mode in ["pinned", "free"] {
            let o = mpirun(&[(w, replay_args(&["--mode", mode], &paths))]);
            assert_eq!(o.code, Some(0), "-np {w} {mode}:\n{}\n{}", o.stdout, o.stderr);
            // Rank 0 alone prints: one line per trace and the summary.
            assert_eq!(o.stdout.lines().count(), paths.len() + 1, "{}", o.stdout);
            assert_eq!(o.stdout.matches("PASS").count(), paths.len(), "{}", o.stdout);
            assert!(o.stdout.contains(&format!("{} passed, 0 failed", paths.len())), "{}", o.stdout);
            if mode == "pinned" {
                // Bit for bit: no field off by any ulp.
                for l in o.stdout.lines().filter(|l| l.starts_with("PASS")) {
                    assert!(l.contains("max_ulps 0 "), "{l}");
                }
            }
        }
    }
}

#[test]
fn json_reports_come_from_rank_0_only() {
    if !have_mpirun() {
        return;
    }
    let paths = traces("dist_w3_welford");
    let o = mpirun(&[(3, replay_args(&["--json"], &paths))]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let lines: Vec<serde_json::Value> = o.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["pass"], true);
    assert_eq!(lines[0]["worst"]["max_ulps"], 0);
    assert_eq!(lines[1]["collective"], "mpi");
}

#[test]
fn a_world_size_other_than_the_traces_is_a_clear_error_exit_2() {
    if !have_mpirun() {
        return;
    }
    let o = mpirun(&[(2, replay_args(&[], &traces("dist_w3_welford")))]);
    assert_eq!(o.code, Some(2), "{}\n{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout.matches("recorded with world size 3, but this collective has 2 ranks").count(),
        1,
        "{}",
        o.stdout
    );
}

#[test]
fn ranks_replaying_different_traces_all_fail_without_hanging() {
    if !have_mpirun() {
        return;
    }
    // Ranks 0-1 replay a trace of shape [3], rank 2 one of shape [2, 3]:
    // the header check turns the first gather into an error everywhere.
    let a = traces("dist_w3_welford");
    let b = traces("dist_w3_ema");
    let o = mpirun(&[(2, replay_args(&["--timeout", "5"], &a)), (1, replay_args(&["--timeout", "5"], &b))]);
    assert_ne!(o.code, Some(0), "{}", o.stdout);
    assert!(o.stdout.contains("ranks disagree") && o.stdout.contains("f32 [2, 3]"), "{}", o.stdout);
    assert!(o.secs < 30.0, "{} s", o.secs);
}

/// Set (to any value) only in the environment of the stalled rank that
/// [`a_stalled_rank_is_a_timeout_error_on_the_others_then_mpirun_ends_the_job`]
/// starts: this test binary itself, running [`stalled_rank`].
const STALL_ROLE: &str = "PMSTATE_TEST_MPI_STALLED_RANK";

/// Not a test of its own: the last rank of the stalled-rank scenario. It
/// joins MPI_COMM_WORLD (MPI_Init is a collective of every rank) and then
/// never calls a collective, as a rank stuck in I/O or a long computation
/// would; mpirun kills it when the others give up.
#[test]
#[ignore = "a helper process started by the stalled-rank test under mpirun"]
fn stalled_rank() {
    if std::env::var_os(STALL_ROLE).is_none() {
        println!("SKIPPED: only runs as a rank started by the stalled-rank test");
        return;
    }
    let _coll = pmstate_norm::MpiCollective::init(std::time::Duration::from_secs(600)).expect("MPI_Init");
    std::thread::sleep(std::time::Duration::from_secs(600));
}

#[test]
fn a_stalled_rank_is_a_timeout_error_on_the_others_then_mpirun_ends_the_job() {
    if !have_mpirun() {
        return;
    }
    let a = traces("dist_w3_welford");
    let me = std::env::current_exe().unwrap().display().to_string();
    // `env` execs this test binary with the role set, running only `stalled_rank`.
    let role = format!("{STALL_ROLE}=1");
    let stalled: Vec<String> =
        [role.as_str(), me.as_str(), "--ignored", "--exact", "stalled_rank"].iter().map(|s| s.to_string()).collect();
    let o = mpirun_programs(&[
        (2, env!("CARGO_BIN_EXE_pmstate").to_string(), replay_args(&["--timeout", "2"], &a)),
        (1, "env".to_string(), stalled),
    ]);
    assert_eq!(o.code, Some(2), "{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("timed out after 2 s waiting for peers"), "{}", o.stdout);
    assert!(o.stderr.contains("the MPI communicator is broken"), "{}", o.stderr);
    assert!(o.secs < 20.0, "{} s", o.secs);
}

#[test]
fn a_rank_that_exits_early_is_a_timeout_error_on_the_others() {
    if !have_mpirun() {
        return;
    }
    // Rank 2 is given a path that does not exist: it finalizes and exits
    // while the others wait for it in the first collective.
    let a = traces("dist_w3_welford");
    let o = mpirun(&[
        (2, replay_args(&["--timeout", "2"], &a)),
        (1, replay_args(&["--timeout", "2"], &["/nonexistent.pmtrace.safetensors".to_string()])),
    ]);
    // Usually 2; Open MPI 4.1.4's mpirun sometimes crashes in its own
    // teardown after a rank finalized early (139): any failure will do.
    assert!(o.code.is_some_and(|c| c != 0), "{:?}\n{}\n{}", o.code, o.stdout, o.stderr);
    assert!(o.stdout.contains("timed out after 2 s"), "{}", o.stdout);
    assert!(o.secs < 20.0, "{} s", o.secs);
}
