//! A C program (tests/c/replay.c) links libpmstate_deploy_c and runs the
//! g1 tracker over the recorded sensor stream through the C ABI: its PD
//! targets are ProtoMotions' deployment loop's (within the closed-loop
//! tolerance of crates/deploy/tests/replay.rs), and its error paths answer
//! as the header documents. Needs a C compiler (`cc`); skips, saying so,
//! without one, unless PMSTATE_REQUIRE_CC is set (CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{Device, Tensor};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32")
}

/// The folder holding the libpmstate_deploy_c.so cargo built with this
/// test: target/<profile>/deps (`cargo test` builds it there and does not
/// always copy it up to target/<profile>, which can hold an older one).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

#[test]
fn a_c_program_runs_the_tracker() {
    if Command::new("cc").arg("--version").output().is_err() {
        // .ci/run installs one and sets PMSTATE_REQUIRE_CC: there it must run
        assert!(std::env::var_os("PMSTATE_REQUIRE_CC").is_none(), "no C compiler `cc` on PATH");
        eprintln!("SKIPPED: no C compiler `cc` on PATH (install gcc to run the C ABI test)");
        return;
    }
    let lib = lib_dir();
    let so = lib.join(format!("{}pmstate_deploy_c{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    assert!(so.exists(), "{} not built", so.display());
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("replay");
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(here.join("include"))
        .arg(here.join("tests/c/replay.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lpmstate_deploy_c")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));

    let data = root().join("testdata/deploy/g1_amp_deploy");
    let s = candle_core::safetensors::load(data.join("sensors.safetensors"), &Device::Cpu).expect("sensors");
    let steps = s["dof_pos"].dims()[0];
    let cols: Vec<Vec<f32>> =
        ["dof_pos", "dof_vel", "anchor_rot", "root_local_ang_vel", "anchor_pos"].iter().map(|k| flat(&s[*k])).collect();
    let mut raw = Vec::new();
    for k in 0..steps {
        for c in &cols {
            let w = c.len() / steps;
            for x in &c[k * w..(k + 1) * w] {
                raw.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    let sensors = dir.path().join("sensors.bin");
    std::fs::write(&sensors, raw).expect("write sensors");
    let out = dir.path().join("targets.bin");
    let log = dir.path().join("flight.pmlog");
    // cargo's LD_LIBRARY_PATH (which outranks the rpath) can name a folder
    // with an older copy of the library: this test's own comes first
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .arg(root().join("testdata/policy/g1_amp_deploy/last.ckpt"))
        .arg(root().join("testdata/deploy/synthetic.motion"))
        .arg(&sensors)
        .arg(steps.to_string())
        .arg(&out)
        .arg(&log)
        .output()
        .expect("run the C program");
    assert!(run.status.success(), "{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    let got: Vec<f32> = std::fs::read(&out)
        .expect("targets")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let rec = candle_core::safetensors::load(data.join("replay.safetensors"), &Device::Cpu).expect("replay");
    let want = flat(&rec["torch.joint_pos_targets"]);
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 2e-6, "element {i}: C program {a}, ProtoMotions' loop {b}");
    }
    replay_the_log(&log, steps);
}

/// The C program's flight log, stepped again in Rust with its options:
/// every step's outputs bit for bit, the refusal refused again.
fn replay_the_log(log: &Path, steps: usize) {
    use pmstate_deploy::{read_log, MotionClip, MotionPlayer, Pipeline, RecordKind, Tracker};
    let mut reader = read_log(log).expect("log");
    let p = Pipeline::load(root().join("testdata/policy/g1_amp_deploy/last.ckpt"), None).expect("pipeline");
    let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
    let player = MotionPlayer::new(&clip, p.contract().dt).expect("player");
    let mut t = Tracker::new(p, player, reader.options()).expect("tracker");
    let (mut n_steps, mut refused, mut stops) = (0, 0, 0);
    while let Some(rec) = reader.next_record().expect("record") {
        match rec.kind {
            RecordKind::Reset => t.reset(),
            RecordKind::Stop => {
                stops += 1;
                t.stop()
            }
            RecordKind::Refused => {
                refused += 1;
                let e = t.step(&rec.sensors.as_ref().expect("readings").sensors()).expect_err("refused again");
                assert!(e.is_refused_reading(), "{e}");
            }
            RecordKind::Step => {
                n_steps += 1;
                let out = t.step(&rec.sensors.as_ref().expect("readings").sensors()).expect("step");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out.joint_pos_targets), bits(&rec.out.joint_pos_targets), "record {}", rec.seq);
                assert_eq!(bits(&out.actions), bits(&rec.out.actions), "record {}", rec.seq);
            }
        }
    }
    // the loop, the step after the reset and the safe step; one refusal; one stop
    assert_eq!((n_steps, refused, stops), (steps + 2, 1, 1));
}
