//! `--collective` in a build without MPI: inproc is the default, mpi is a
//! clear usage error (exit 2).

#![cfg(not(feature = "mpi"))]

use std::process::Command;

fn pmstate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap()
}

#[test]
fn inproc_is_the_default_and_mpi_needs_the_feature() {
    let t = "testdata/traces/dist_w3_welford.pmtrace.safetensors";
    let o = pmstate(&["replay", "--collective", "inproc", t]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("replay (pinned, inproc): 1 passed, 0 failed"));
    let o = pmstate(&["replay", "--collective", "mpi", t]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("built without the `mpi` feature"));
}
