//! `inspect`, `convert`, `normalizers`, `diff` end to end on the torch-written fixtures.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value as J;

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/checkpoints").join(name).display().to_string()
}

fn stdout_json(out: &Output) -> J {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

#[test]
fn inspect_shows_tree_normalizers_and_flags_unsafe_globals() {
    let out = pmstate(&["inspect", &fixture("ppo_full.ckpt")]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("_actor.mu.mlp.0.weight: Tensor float32 [32, 12]"), "{text}");
    assert!(text.contains("model._actor.mu.input_models.obs.running_obs_norm: shape [12] count"), "{text}");
    assert!(text.contains("model._actor.mu.input_models.future.running_obs_norm: lazy"), "{text}");
    assert!(!text.contains("UNSAFE"), "{text}");

    let j = stdout_json(&pmstate(&["inspect", "--json", &fixture("ppo_full.ckpt")]));
    let norms = j["normalizers"].as_array().unwrap();
    assert_eq!(norms.len(), 3);
    assert!(norms.iter().all(|g| g["count"].as_i64().unwrap() > 1 && g["std"]["min"].as_f64().unwrap() > 0.0));
    // As many tensors as torch itself saw in the file (manifest.json).
    let manifest: J = serde_json::from_str(&std::fs::read_to_string(fixture("manifest.json")).unwrap()).unwrap();
    let torch_tensors = manifest["fixtures"][0]["leaves"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["type"] == "Tensor" || l["type"] == "Parameter")
        .count();
    assert_eq!(manifest["fixtures"][0]["file"], "ppo_full.ckpt");
    assert_eq!(j["tensors"].as_array().unwrap().len(), torch_tensors);
    assert!(j["unsafe_globals"].as_array().unwrap().is_empty());

    let hostile = pmstate(&["inspect", "--json", &fixture("hostile_os_system.pt")]);
    assert!(hostile.status.success());
    let j = stdout_json(&hostile);
    assert!(j["unsafe_globals"].as_array().unwrap().iter().any(|g| g["global"] == "posix.system"), "{j}");
}

#[test]
fn convert_round_trips_and_refuses_unsafe_globals() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ppo.safetensors").display().to_string();
    let back = dir.path().join("back.ckpt").display().to_string();
    let out = pmstate(&["convert", "--json", &fixture("ppo_full.ckpt"), &st]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["ok"], true);
    assert!(pmstate(&["convert", &st, &back]).status.success());
    // diff says equal at zero tolerance, and exit 0.
    let d = pmstate(&["diff", "--json", &fixture("ppo_full.ckpt"), &back]);
    assert_eq!(d.status.code(), Some(0), "{}", String::from_utf8_lossy(&d.stdout));
    assert_eq!(stdout_json(&d)["equal"], true);

    // --select: the state dict as plain tensors under its own keys.
    let model = dir.path().join("model.safetensors").display().to_string();
    let out = pmstate(&["convert", "--json", "--select", "model", &fixture("ppo_full.ckpt"), &model]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j = stdout_json(&pmstate(&["inspect", "--json", &model]));
    let keys: Vec<&str> = j["tensors"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert!(keys.contains(&"_actor.mu.mlp.0.weight") && keys.contains(&"_critic.mlp.5.bias"), "{keys:?}");
    assert_eq!(j["format"], "safetensors");

    // --no-fsync writes the same bytes (both formats), and a refusal under it
    // still leaves nothing behind.
    // (Same file names in another folder: torch's archive folder is the file's stem.)
    std::fs::create_dir(dir.path().join("fast")).unwrap();
    let st_fast = dir.path().join("fast/ppo.safetensors").display().to_string();
    let back_fast = dir.path().join("fast/back.ckpt").display().to_string();
    assert!(pmstate(&["convert", "--no-fsync", &fixture("ppo_full.ckpt"), &st_fast]).status.success());
    assert!(pmstate(&["convert", "--no-fsync", &st_fast, &back_fast]).status.success());
    assert!(
        std::fs::read(&st_fast).unwrap() == std::fs::read(&st).unwrap(),
        "--no-fsync changed the safetensors bytes"
    );
    assert!(std::fs::read(&back_fast).unwrap() == std::fs::read(&back).unwrap(), "--no-fsync changed the .ckpt bytes");
    let evil_fast = dir.path().join("fast/evil.pt");
    let out = pmstate(&["convert", "--no-fsync", &fixture("hostile_os_system.pt"), &evil_fast.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!evil_fast.exists());

    // The hostile file: refused (exit 1), nothing written.
    let evil = dir.path().join("evil.pt");
    let out = pmstate(&["convert", &fixture("hostile_os_system.pt"), &evil.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("posix.system"));
    assert!(!evil.exists());

    // Errors: unknown output extension, unreadable input: exit 2.
    assert_eq!(pmstate(&["convert", &fixture("ppo_full.ckpt"), "x.txt"]).status.code(), Some(2));
    let junk = dir.path().join("junk.pt");
    std::fs::write(&junk, b"no checkpoint").unwrap();
    let out = pmstate(&["inspect", &junk.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("junk.pt"));
}

#[test]
fn diff_reports_value_changes_within_tolerances() {
    // The actor normalizer after one more update differs from the original in mean, var and count.
    let dir = tempfile::tempdir().unwrap();
    let mut ckpt = pmstate_ckpt::Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let name = ckpt.normalizers().unwrap().remove(0).name;
    let mut state = ckpt.normalizer_state(&name, &candle_core::Device::Cpu).unwrap();
    state.mean = (state.mean + 1e-3).unwrap();
    state.count += 1;
    ckpt.store_normalizer(&name, &state).unwrap();
    let changed = dir.path().join("changed.ckpt");
    ckpt.save(&changed).unwrap();
    let changed = changed.display().to_string();

    let d = pmstate(&["diff", "--json", &fixture("ppo_full.ckpt"), &changed]);
    assert_eq!(d.status.code(), Some(1));
    let j = stdout_json(&d);
    let keys: Vec<&str> = j["differences"].as_array().unwrap().iter().map(|x| x["key"].as_str().unwrap()).collect();
    assert_eq!(keys, [format!("{name}.mean"), format!("{name}.count")], "{j}");
    // Within atol 1e-2 only the count (an integer change of 1 > 1e-2) remains.
    let d = pmstate(&["diff", "--json", "--atol", "1e-2", &fixture("ppo_full.ckpt"), &changed]);
    let j = stdout_json(&d);
    let keys: Vec<&str> = j["differences"].as_array().unwrap().iter().map(|x| x["key"].as_str().unwrap()).collect();
    assert_eq!(keys, [format!("{name}.count")]);
    // Text output: one readable line per difference, then the count.
    let d = pmstate(&["diff", "--atol", "1e-2", &fixture("ppo_full.ckpt"), &changed]);
    let text = String::from_utf8_lossy(&d.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with(&format!("{name}.count: ")), "{text}");
    assert!(lines[0].contains("1 of 1 elements differ"), "{text}");
    assert_eq!(lines[1], "1 difference(s)");
    let d = pmstate(&["diff", "--atol", "2", &fixture("ppo_full.ckpt"), &changed]);
    assert_eq!(d.status.code(), Some(0), "{}", String::from_utf8_lossy(&d.stdout));
}

#[test]
fn normalizers_lists_groups_and_lazy_ones() {
    let j = stdout_json(&pmstate(&["normalizers", "--json", &fixture("ppo_full.ckpt")]));
    let names: Vec<&str> = j["normalizers"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "model._actor.mu.input_models.obs.running_obs_norm",
            "model._critic.input_models.obs.running_obs_norm",
            "running_reward_norm"
        ]
    );
    assert_eq!(j["lazy"], serde_json::json!(["model._actor.mu.input_models.future.running_obs_norm"]));
}

fn hostile(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/hostile").join(name).display().to_string()
}

/// A key holding `ESC [8m` (conceal) and a carriage return must not hide
/// the UNSAFE line on a terminal: text output escapes control characters.
#[test]
fn inspect_escapes_control_characters_in_text_output() {
    let out = pmstate(&["inspect", &hostile("unsafe_behind_escape.pt")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.bytes().any(|b| b == 0x1b || b == b'\r'), "{text:?}");
    assert!(text.contains("\\x1b[8m\\rmodel"), "{text}");
    assert!(text.contains("UNSAFE GLOBAL os.system (1 use, first at \\x1b[8m\\rmodel"), "{text}");
    // JSON carries the key exactly (serde escapes it as \u001b).
    let j = stdout_json(&pmstate(&["inspect", "--json", &hostile("unsafe_behind_escape.pt")]));
    assert_eq!(j["unsafe_globals"][0]["key"], "\u{1b}[8m\rmodel.<callable>");
    assert_eq!(j["unsafe_globals_distinct"][0]["uses"], 1);
}

/// Unsafe globals in dict keys, `_metadata`, NEWOBJ arguments, NEWOBJ_EX
/// keyword arguments, set members, SETITEMS and APPENDS applied to an
/// object (not a dict or list), and an opaque global as a key of a
/// safetensors tree are listed by inspect and refused by convert to either
/// format (exit 1, no output).
#[test]
fn unsafe_globals_outside_values_are_listed_and_refused() {
    for name in [
        "unsafe_in_dict_key.pt",
        "unsafe_in_metadata.pt",
        "unsafe_in_newobj_args.pt",
        "unsafe_in_newobj_ex_kwargs.pt",
        "unsafe_in_set.pt",
        "unsafe_in_setitems_on_object.pt",
        "unsafe_in_appends_on_object.pt",
        "st_opaque_global.safetensors",
    ] {
        let j = stdout_json(&pmstate(&["inspect", "--json", &hostile(name)]));
        let globals: Vec<&str> =
            j["unsafe_globals"].as_array().unwrap().iter().map(|g| g["global"].as_str().unwrap()).collect();
        assert_eq!(globals, ["os.system"], "{name}: {j}");
        let dir = tempfile::tempdir().unwrap();
        for out_name in ["x.pt", "x.safetensors"] {
            let out_path = dir.path().join(out_name).display().to_string();
            let out = pmstate(&["convert", &hostile(name), &out_path]);
            assert_eq!(out.status.code(), Some(1), "{name} -> {out_name}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(String::from_utf8_lossy(&out.stderr).contains("os.system"), "{name}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{name}: something was written");
    }
}

/// A safetensors file of one f32 tensor of `bytes` bytes of zeros (sparse: nothing written but the header).
fn large_zeros(path: &std::path::Path, bytes: u64) {
    let n = bytes / 4;
    let mut header = format!(r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#, n * 4).into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut data = (header.len() as u64).to_le_bytes().to_vec();
    data.extend_from_slice(&header);
    std::fs::write(path, &data).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(data.len() as u64 + n * 4).unwrap();
}

/// `diff` of large files draws a progress bar on a terminal's stderr, and
/// none into a pipe or under `--json` (stdout keeps only the result).
#[test]
fn diff_shows_progress_on_a_terminal_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.safetensors"), tmp.path().join("b.safetensors"));
    large_zeros(&a, 80 << 20);
    large_zeros(&b, 80 << 20);
    let (a, b) = (a.display().to_string(), b.display().to_string());
    // into pipes: the result, nothing on stderr, with and without --json
    for json in [false, true] {
        let mut args = vec!["diff", &a, &b];
        if json {
            args.push("--json");
        }
        let out = pmstate(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "json {json}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // on a terminal (script(1) gives it one): the bar, counting A's 80 MiB
    if !Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success()) {
        println!("skipped the terminal half: script(1) is not on PATH");
        return;
    }
    let line = format!("{} diff {a} {b}", env!("CARGO_BIN_EXE_pmstate"));
    let out = Command::new("script").args(["-qec", &line, "/dev/null"]).output().unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(tty.contains("comparing [") && tty.contains("80.00 MiB"), "{tty}");
    assert!(tty.contains("no differences"), "{tty}");
    let json_line = format!("{line} --json");
    let out = Command::new("script").args(["-qec", &json_line, "/dev/null"]).output().unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(!tty.contains("comparing"), "{tty}");
}

/// `inspect` of a large deflated archive (the one kind of file whose
/// opening reads it all: stored records are mapped) draws a bar while it
/// inflates, on a terminal only.
#[test]
fn inspect_shows_progress_inflating_a_large_deflated_archive() {
    if !Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success()) {
        println!("skipped: script(1) is not on PATH");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // 70 MiB of incompressible floats (a deflate stream as large as its data stays within the zip-bomb budget)
    let n: u64 = 70 << 18;
    let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#, n * 4);
    let mut header = header.into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(&header);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..n / 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        st.extend_from_slice(&x.to_le_bytes());
    }
    let src = tmp.path().join("big.safetensors");
    std::fs::write(&src, &st).unwrap();
    drop(st);
    let stored = tmp.path().join("big.pt");
    let out = pmstate(&["convert", &src.display().to_string(), &stored.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // the same archive with every record deflated
    let deflated = tmp.path().join("deflated.pt");
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&stored).unwrap()).unwrap();
    let mut z = zip::ZipWriter::new(std::fs::File::create(&deflated).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(1))
        .large_file(true);
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).unwrap();
        let name = entry.name().unwrap().into_owned();
        z.start_file(name, opts).unwrap();
        std::io::copy(&mut entry, &mut z).unwrap();
    }
    z.finish().unwrap();
    let path = deflated.display().to_string();
    // into a pipe: the tree, nothing on stderr
    let out = pmstate(&["inspect", &path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    // on a terminal: the bar over the 70 MiB inflated
    let line = format!("{} inspect {path}", env!("CARGO_BIN_EXE_pmstate"));
    let out = Command::new("script").args(["-qec", &line, "/dev/null"]).output().unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(tty.contains("reading deflated.pt [") && tty.contains("70.00 MiB"), "{tty}");
    assert!(tty.contains("1 tensors over 1 storages"), "{tty}");
}
