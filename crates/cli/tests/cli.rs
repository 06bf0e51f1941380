//! The `pmstate` binary end to end: output, JSON and exit codes.

use std::path::PathBuf;
use std::process::Command;

fn pmstate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pmstate"))
}

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

#[test]
fn replay_passes_every_committed_trace_in_both_modes() {
    for mode in ["pinned", "free"] {
        let out = pmstate().args(["replay", "--mode", mode]).arg(testdata().join("traces")).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.lines().filter(|l| l.starts_with("PASS ")).count() >= 18, "{stdout}");
        assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
        // every line says what its verdict rests on: exact, or the bound and the share of it used
        for l in stdout.lines().filter(|l| l.starts_with("PASS ")) {
            let judged = l.contains("every field exact") || (mode == "free" && l.contains("of its bound (bound up to"));
            assert!(judged, "{mode}: {l}");
        }
    }
}

#[test]
fn replay_json_is_one_object_per_trace_and_a_summary() {
    let out = pmstate().args(["replay", "--json"]).arg(testdata().join("traces")).output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (summary, traces) = lines.split_last().unwrap();
    assert_eq!(summary["summary"], true);
    assert_eq!(summary["passed"].as_u64().unwrap() as usize, traces.len());
    for t in traces {
        assert_eq!(t["pass"], true);
        assert!(t["steps"].as_u64().unwrap() > 0 && t["world_size"].as_u64().unwrap() >= 1);
        assert!(t["worst"]["max_ulps"].is_u64());
    }
}

#[test]
fn replay_exit_codes_tell_mismatch_from_unreadable() {
    let dir = std::env::temp_dir().join(format!("pmstate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A trace whose recorded count was changed: a mismatch, exit 1.
    let src = std::fs::read(testdata().join("traces/no_clamp.pmtrace.safetensors")).unwrap();
    let n = u64::from_le_bytes(src[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&src[8..8 + n]).unwrap();
    let off = header["s0000.state.count"]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut tampered = src.clone();
    tampered[8 + n + off] ^= 1;
    let bad = dir.join("tampered.pmtrace.safetensors");
    std::fs::write(&bad, &tampered).unwrap();
    let out = pmstate().args(["replay", "--json"]).arg(&bad).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap_or_default()).unwrap();
    assert_eq!((&line["pass"], &line["worst"]["pass"]), (&false.into(), &false.into()), "{line}");
    // The low bit of step 0's recorded count flipped: that count, off by one.
    let w = &line["worst"];
    assert_eq!(
        (w["step"].as_u64(), w["op"].as_str(), w["field"].as_str()),
        (Some(0), Some("record_moments"), Some("state.count"))
    );
    assert_eq!((w["max_abs"].as_f64(), w["first_mismatch"].as_u64()), (Some(1.0), Some(0)), "{line}");
    // The same for people: a FAIL line naming the field.
    let out = pmstate().arg("replay").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("FAIL ") && stdout.contains("state.count"), "{stdout}");
    // Not a trace at all: exit 2, with the reason.
    let junk = dir.join("junk.pmtrace.safetensors");
    std::fs::write(&junk, b"not a safetensors file").unwrap();
    let out = pmstate().arg("replay").arg(&junk).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ERROR"), "errors go to stderr");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ERROR"), "stdout holds only results");
    // A path that does not exist: a usage error, exit 2.
    let out = pmstate().args(["replay", "/no/such/trace"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_cuda_device_without_the_feature_says_how_to_build_it() {
    if cfg!(feature = "cuda") {
        eprintln!("skipped: this build has the cuda feature");
        return;
    }
    let t = testdata().join("policy/smpl_tracker");
    let out = tempfile::tempdir().unwrap();
    let o = pmstate()
        .args(["policy", "run"])
        .arg(t.join("last.ckpt"))
        .arg("--obs")
        .arg(t.join("obs.safetensors"))
        .arg("--out")
        .arg(out.path().join("out.safetensors"))
        .args(["--device", "cuda"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("built without the `cuda` feature") && err.contains("--features cuda"), "{err}");
    assert!(!out.path().join("out.safetensors").exists());
}

#[test]
fn bench_json_has_the_documented_fields() {
    let out =
        pmstate().args(["bench", "--json", "--threads", "1", "--min-time", "0", "--shape", "64x8"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["normalize", "record_moments", "record_moments_ema", "copy"]);
    for r in &rows {
        assert_eq!((r["rows"].as_u64(), r["cols"].as_u64(), r["threads"].as_u64()), (Some(64), Some(8), Some(1)));
        assert_eq!(r["device"], "cpu");
        assert!(["avx512", "avx2", "scalar"].contains(&r["isa"].as_str().unwrap()), "{r}");
        assert!(r["seconds"].as_f64().unwrap() > 0.0 && r["gbps"].as_f64().unwrap() > 0.0);
    }
    // --isa: the one asked for, or (never running what the CPU lacks) exit 2.
    for (isa, supported) in [
        ("scalar", true),
        ("avx2", cfg!(target_arch = "x86_64") && has_x86("avx2") && has_x86("fma")),
        (
            "avx512",
            cfg!(target_arch = "x86_64")
                && has_x86("avx2")
                && has_x86("fma")
                && has_x86("avx512f")
                && has_x86("avx512vl"),
        ),
    ] {
        let out = pmstate()
            .args(["bench", "--json", "--threads", "1", "--min-time", "0", "--shape", "9x5", "--isa", isa])
            .output()
            .unwrap();
        if supported {
            assert!(out.status.success(), "{isa}: {}", String::from_utf8_lossy(&out.stderr));
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                assert_eq!(serde_json::from_str::<serde_json::Value>(l).unwrap()["isa"], isa);
            }
        } else {
            assert_eq!(out.status.code(), Some(2), "{isa}");
            assert!(String::from_utf8_lossy(&out.stderr).contains("does not support"), "{isa}");
        }
    }
    let out = pmstate().args(["bench", "--threads", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The text table: a header over every column, each row one value per column.
#[test]
fn bench_text_has_a_header_for_every_column() {
    let out = pmstate().args(["bench", "--threads", "1", "--min-time", "0", "--shape", "64x8"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["op", "shape", "device", "thr", "isa", "median", "µs", "GB/s"], "{stdout}");
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for r in rows {
        assert_eq!(r.len(), header.len() - 1, "one value per column (`median µs` is one): {r:?}");
        assert_eq!((r[1], r[2], r[3]), ("64x8", "cpu", "1"), "{r:?}");
        assert!(["avx512", "avx2", "scalar"].contains(&r[4]), "the isa column: {r:?}");
    }
}

/// Whether this CPU has an x86 feature (false elsewhere).
fn has_x86(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            _ => unreachable!("{feature}"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}
