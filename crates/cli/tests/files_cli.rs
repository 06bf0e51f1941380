//! Files behave like files: outputs get the permissions `cp` gives under
//! any umask, SIGINT/SIGTERM leave no temporary file and no output, a stale
//! one from a killed run is named and can be cleaned, an input rewritten
//! under a convert, an inspect or a diff is an error, notes go to stderr,
//! and `diff` compares integers exactly.
//!
//! Signals and rewrites land at a fixed point of the command's work through
//! the test-only `PMSTATE_TEST_PAUSE_FILE` hook (`crates/cli/src/test_pause.rs`):
//! the command creates the file there and waits until the test removes it.

#![cfg(unix)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use pmstate_ckpt::{Bytes, Checkpoint, DType, Dict, DictKind, Node, Storage, TensorRef};

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn hostile(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/hostile").join(name).display().to_string()
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/checkpoints").join(name).display().to_string()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// A checkpoint of one int64 tensor of `values`, and one f32 tensor of `n` elements.
fn checkpoint(values: &[i64], n: usize) -> Checkpoint {
    let ints: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let floats: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let storages: HashMap<String, Storage> = [
        ("i".to_owned(), Storage { typed: true, dtype: DType::I64, location: "cpu".into(), data: Bytes::owned(ints) }),
        (
            "f".to_owned(),
            Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data: Bytes::owned(floats) },
        ),
    ]
    .into();
    let t = |s: &str, d, len| Node::Tensor(Box::new(TensorRef::contiguous(s.into(), d, vec![len])));
    let root = Dict::from_entries(
        DictKind::Plain,
        vec![
            (Node::Str("ints".into()), t("i", DType::I64, values.len())),
            (Node::Str("big".into()), t("f", DType::F32, n)),
        ],
    )
    .unwrap();
    Checkpoint::from_parts(Node::Dict(root), storages).unwrap()
}

/// `pmstate ARGS` run by `sh` under `umask MASK`.
fn under_umask(mask: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("umask {mask}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_pmstate"))
        .args(args)
        .output()
        .expect("run pmstate under sh")
}

/// A new output gets `0666 & ~umask` (as `cp` and `torch.save` give), not
/// the temporary file's private mode; replacing a file keeps its mode
/// whatever the umask.
#[test]
fn outputs_get_the_permissions_cp_would_give() {
    let dir = tempfile::tempdir().unwrap();
    for (mask, want) in [("077", 0o600), ("002", 0o664), ("022", 0o644)] {
        for ext in ["safetensors", "pt"] {
            let out = dir.path().join(format!("new_{mask}.{ext}"));
            let o = under_umask(mask, &["convert", &fixture("inference.ckpt"), out.to_str().unwrap()]);
            assert!(o.status.success(), "{}", text(&o));
            assert_eq!(mode(&out), want, "umask {mask}: .{ext} mode {:o}", mode(&out));
        }
    }
    let replaced = dir.path().join("shared.pt");
    std::fs::write(&replaced, b"old").unwrap();
    std::fs::set_permissions(&replaced, std::fs::Permissions::from_mode(0o644)).unwrap();
    for mask in ["077", "002"] {
        let o = under_umask(mask, &["convert", &fixture("inference.ckpt"), replaced.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(mode(&replaced), 0o644, "umask {mask}: replacing a file keeps its mode");
    }
    assert_ne!(std::fs::read(&replaced).unwrap(), b"old");
}

#[test]
fn integers_are_compared_exactly_by_diff() {
    let dir = tempfile::tempdir().unwrap();
    let big = 1i64 << 60;
    let a = dir.path().join("a.pt");
    let b = dir.path().join("b.pt");
    checkpoint(&[big, 5], 3).save(&a).unwrap();
    checkpoint(&[big + 1, 5], 3).save(&b).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for extra in [&[][..], &["--atol", "0"][..]] {
        let o = pmstate(&[&["diff", "--json"][..], extra, &[a, b][..]].concat());
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["differences"][0]["key"], "ints", "{j}");
        assert_eq!(j["differences"][0]["mismatched"], 1, "{j}");
        assert_eq!(j["differences"][0]["first_index"], 0, "{j}");
    }
    assert_eq!(pmstate(&["diff", "--atol", "1", a, b]).status.code(), Some(0));
}

/// Writes through pmstate's atomic writer directly, then rewrites the
/// input in place (as a training job saving over `last.ckpt` does): the
/// write is refused as "input changed while reading" and nothing is left.
#[test]
fn an_input_rewritten_while_it_is_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("last.ckpt");
    checkpoint(&[1, 2], 1 << 20).save(&src).unwrap();
    let ckpt = Checkpoint::open(&src).unwrap();
    // Truncated under us.
    std::fs::OpenOptions::new().write(true).open(&src).unwrap().set_len(1000).unwrap();
    let out = dir.path().join("out.safetensors");
    let err = ckpt.save(&out).unwrap_err();
    assert!(matches!(err, pmstate_ckpt::CkptError::InputChanged { .. }), "{err}");
    assert!(err.to_string().contains("input changed while reading"), "{err}");
    // Rewritten in place with the same size (same inode, new content and times).
    checkpoint(&[1, 2], 1 << 20).save(&src).unwrap();
    let ckpt = Checkpoint::open(&src).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&src, &bytes).unwrap();
    let err = ckpt.save(&out).unwrap_err();
    assert!(matches!(err, pmstate_ckpt::CkptError::InputChanged { .. }), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["last.ckpt"], "nothing written, no temporary file");
}

/// A pmstate command stopped at its test pause point (see the module doc).
struct Paused {
    child: Child,
    ready: PathBuf,
}

/// Starts `pmstate ARGS` and waits until it is paused (`control` holds
/// the pause file, apart from the command's own files), or has exited.
fn paused(args: &[&str], control: &Path) -> Paused {
    let ready = control.join("paused");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(args)
        .env("PMSTATE_TEST_PAUSE_FILE", &ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while !ready.exists() {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            panic!("{args:?} exited before its pause point: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Paused { child, ready }
}

impl Paused {
    /// Lets it go on, and waits for it.
    fn resume(self) -> Output {
        std::fs::remove_file(&self.ready).unwrap();
        self.child.wait_with_output().unwrap()
    }

    /// Sends it `signal` (`INT`, `TERM`), and waits for it.
    fn signal(self, signal: &str) -> Output {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
        self.child.wait_with_output().unwrap()
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn temporary_files_in(dir: &Path) -> Vec<String> {
    names_in(dir).into_iter().filter(|n| n.starts_with(".pmstate-") && n.ends_with(".tmp")).collect()
}

/// `policy run --out` writes as `convert` does: through a temporary file
/// that is renamed into place (none left behind), with the mode `cp` would
/// give; a folder that does not exist is an I/O error naming the output
/// (not a temporary file, not a usage error), and nothing appears.
#[test]
fn policy_run_outputs_are_written_like_checkpoints() {
    let p = |rel: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel).display().to_string()
    };
    let (ckpt, obs) = (p("smpl_tracker/last.ckpt"), p("smpl_tracker/obs.safetensors"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let o = under_umask("027", &["policy", "run", &ckpt, "--obs", &obs, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(mode(&out), 0o640);
    let back = candle_core::safetensors::load(&out, &candle_core::Device::Cpu).unwrap();
    assert!(back.contains_key("mean_action") && back.contains_key("value"), "{:?}", back.keys());
    assert_eq!(names_in(dir.path()), ["out.safetensors"]);

    let missing = dir.path().join("no_such_folder/out.safetensors");
    let o = pmstate(&["--json", "policy", "run", &ckpt, "--obs", &obs, "--out", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(e["kind"], "ckpt.io", "{e}");
    assert_eq!(e["file"], missing.display().to_string(), "{e}");
    assert_eq!(names_in(dir.path()), ["out.safetensors"]);
}

/// SIGINT or SIGTERM while a convert has its temporary file open and
/// partly written: the file is removed, the process exits as the signal
/// would (130, 143), and no output appears; a file it would have replaced
/// is untouched.
#[test]
fn sigint_and_sigterm_during_a_convert_leave_no_temporary_file_and_no_output() {
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        for (out_name, existing) in [("out.safetensors", None), ("out.pt", None), ("old.pt", Some(&b"old"[..]))] {
            let (dir, control) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let src = dir.path().join("in.pt");
            checkpoint(&[7], 1 << 20).save(&src).unwrap();
            let out = dir.path().join(out_name);
            if let Some(bytes) = existing {
                std::fs::write(&out, bytes).unwrap();
            }
            let what = format!("SIG{signal} -> {out_name}");
            let p = paused(&["convert", "--quiet", src.to_str().unwrap(), out.to_str().unwrap()], control.path());
            assert_eq!(temporary_files_in(dir.path()).len(), 1, "{what}: paused with its temporary file");
            let o = p.signal(signal);
            assert_eq!(o.status.code(), Some(code), "{what}: {}", text(&o));
            assert_eq!(temporary_files_in(dir.path()), Vec::<String>::new(), "{what}: a temporary file was left");
            match existing {
                Some(bytes) => assert_eq!(std::fs::read(&out).unwrap(), bytes, "{what}: the old file changed"),
                None => assert!(!out.exists(), "{what}: an interrupted convert wrote its output"),
            }
        }
    }
}

/// How a test changes the input under a paused command.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// Cut short (a writer that has begun rewriting it).
    Truncate,
    /// Rewritten in place, same size, same bytes, new times.
    Rewrite,
}

fn change(path: &Path, how: Change) {
    match how {
        Change::Truncate => std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(1000).unwrap(),
        Change::Rewrite => {
            // Past the file system's timestamp granularity, so the times surely change.
            std::thread::sleep(Duration::from_millis(20));
            let bytes = std::fs::read(path).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
    }
}

/// An input rewritten or truncated while `convert`, `inspect` or `diff`
/// reads it: exit 2, "input changed while reading", and no output.
#[test]
fn an_input_changed_under_a_command_is_an_error_and_nothing_is_written() {
    let cases: &[(&str, Option<&str>, Change)] = &[
        ("convert", Some("out.safetensors"), Change::Truncate),
        ("convert", Some("out.pt"), Change::Truncate),
        ("convert", Some("out.safetensors"), Change::Rewrite),
        ("convert", Some("out.pt"), Change::Rewrite),
        ("inspect", None, Change::Truncate),
        ("inspect", None, Change::Rewrite),
        ("diff", None, Change::Truncate),
        ("diff", None, Change::Rewrite),
    ];
    for &(cmd, out_name, how) in cases {
        let (dir, control) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let src = dir.path().join("last.ckpt");
        checkpoint(&[1, 2], 1 << 20).save(&src).unwrap();
        let other = control.path().join("other.pt");
        checkpoint(&[1, 2], 1 << 20).save(&other).unwrap();
        let (src_s, other_s) = (src.to_str().unwrap().to_owned(), other.to_str().unwrap().to_owned());
        let out = out_name.map(|n| dir.path().join(n).to_str().unwrap().to_owned());
        let args: Vec<&str> = match (cmd, &out) {
            ("convert", Some(out)) => vec!["convert", &src_s, out],
            ("diff", _) => vec!["diff", &src_s, &other_s],
            _ => vec![cmd, &src_s],
        };
        let what = format!("{cmd} {out_name:?} {how:?}");
        let p = paused(&args, control.path());
        change(&src, how);
        let o = p.resume();
        assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("last.ckpt: input changed while reading"), "{what}: {err}");
        assert!(o.stdout.is_empty(), "{what}: printed results of a changed input: {}", text(&o));
        assert_eq!(names_in(dir.path()), ["last.ckpt"], "{what}: an output or temporary file was left");
    }
}

/// Notes go to stderr: stdout holds only results (with `--json`, only JSON lines).
#[test]
fn notes_go_to_stderr_and_stdout_holds_only_results() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.pt");
    let w = Node::Tensor(Box::new(TensorRef::contiguous("w".into(), DType::F32, vec![2])));
    let model =
        Dict::from_entries(DictKind::Plain, vec![(Node::Str("w".into()), w), (Node::Str("step".into()), Node::Int(5))]);
    let root =
        Dict::from_entries(DictKind::Plain, vec![(Node::Str("model".into()), Node::Dict(model.unwrap()))]).unwrap();
    let storage = Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data: Bytes::owned(vec![0; 8]) };
    Checkpoint::from_parts(Node::Dict(root), [("w".to_owned(), storage)].into()).unwrap().save(&src).unwrap();
    let src = src.to_str().unwrap();
    let out = dir.path().join("m.safetensors");
    let out = out.to_str().unwrap();
    let o = pmstate(&["convert", "--select", "model", src, out]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with(&format!("wrote {out} (")), "{stdout}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("pmstate: note: skipped 1 non-tensor value(s) safetensors cannot hold: step"), "{stderr}");
    // --json: the note is a field of the one JSON line.
    let o = pmstate(&["--json", "convert", "--select", "model", src, out]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["skipped_non_tensors"], serde_json::json!(["step"]));
    assert!(o.stderr.is_empty(), "{}", text(&o));
    let o = pmstate(&["--json", "convert", &hostile("os_system.pt"), out]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let refusal: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(refusal["ok"], false);
    for args in [vec!["inspect", src], vec!["normalizers", src], vec!["diff", src, src]] {
        let o = pmstate(&[&["--json"][..], &args[..]].concat());
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        for line in String::from_utf8(o.stdout).unwrap().lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{args:?}: {e}: {line}"));
        }
    }
}

/// A temporary file left by a killed run is named by the next convert into
/// that folder and removed by `clean-tmp --delete`.
#[test]
fn stale_temporary_files_are_named_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join(format!(".pmstate-{}-deadbeef.tmp", u32::MAX - 7));
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    let out = dir.path().join("x.safetensors");
    let o = pmstate(&["convert", &fixture("inference.ckpt"), out.to_str().unwrap()]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("was left by a killed pmstate") && err.contains(".pmstate-"), "{err}");
    let d = dir.path().to_str().unwrap();
    let list = pmstate(&["clean-tmp", "--json", d]);
    let j: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(j["stale"].as_array().unwrap().len(), 1, "{j}");
    assert!(stale.exists(), "listing removes nothing");
    assert!(pmstate(&["clean-tmp", "--delete", d]).status.success());
    assert!(!stale.exists());
    assert!(out.exists(), "only pmstate's stale temporary files are removed");
}

/// A folder named like a temporary file is not pmstate's: never listed,
/// never removed. A file that cannot be removed is an error naming it.
#[test]
fn clean_tmp_leaves_folders_alone_and_names_a_file_it_cannot_remove() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join(format!(".pmstate-{}-cafe.tmp", u32::MAX - 7));
    std::fs::create_dir(&folder).unwrap();
    let d = dir.path().to_str().unwrap();
    let o = pmstate(&["clean-tmp", "--delete", d]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("no stale pmstate temporary files"), "{}", text(&o));
    assert!(folder.is_dir());

    // A stale file in a folder this process may not write to (skipped as
    // root, who may remove anything).
    use std::os::unix::fs::PermissionsExt;
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let stale = locked.join(format!(".pmstate-{}-beef.tmp", u32::MAX - 7));
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::File::create(locked.join("probe")).is_ok() {
        println!("SKIPPED (removal failure): this user may write to a 0555 folder (root)");
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        return;
    }
    let o = pmstate(&["clean-tmp", "--delete", locked.to_str().unwrap()]);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("removing ") && err.contains(".pmstate-") && !err.contains("writing output"), "{err}");
    assert!(stale.exists());
}

/// Outputs that are FIFOs or character devices (made in a temporary folder,
/// never the machine's own): safetensors outputs of `convert`, `deploy
/// replay` and its flight log (`--record`) are streamed into them and they
/// stay what they were; a `.pt` (written with seeks) is refused naming the
/// path, as is a flight log into a directory or into a FIFO nobody reads
/// (at once: the run is not held in open); nothing is unlinked, replaced,
/// or left beside them.
#[cfg(unix)]
#[test]
fn outputs_into_fifos_and_devices_are_streams_never_replacements() {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let regular = dir.path().join("regular.safetensors");
    let o = pmstate(&["convert", &fixture("inference.ckpt"), regular.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let fifo = dir.path().join("out.safetensors");
    if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        let p = fifo.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::fs::File::open(&p).unwrap().read_to_end(&mut got).unwrap();
            got
        });
        let o = pmstate(&["convert", &fixture("inference.ckpt"), fifo.to_str().unwrap()]);
        // a reader still waiting in open (convert failed first) is released: a failure, not a hang;
        // O_NONBLOCK (Linux's 0o4000): the open fails at once when no reader has the FIFO open
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(0o4000).open(&fifo);
        }
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(reader.join().unwrap(), std::fs::read(&regular).unwrap(), "the FIFO got other bytes");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    } else {
        eprintln!("SKIPPED the FIFO half: mkfifo is not available here");
    }
    let root = |rel: &str| format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"));
    let replay_args = |out: &Path, record: &Path| -> Vec<String> {
        vec![
            "deploy".into(),
            "replay".into(),
            root("testdata/policy/g1_amp_deploy/last.ckpt"),
            "--motion".into(),
            root("testdata/deploy/synthetic.motion"),
            "--sensors".into(),
            root("testdata/deploy/g1_amp_deploy/sensors.safetensors"),
            "--out".into(),
            out.display().to_string(),
            "--record".into(),
            record.display().to_string(),
        ]
    };
    let run = |args: &[String]| pmstate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // the flight log into a directory: refused, naming it
    let folder = dir.path().join("logs");
    std::fs::create_dir(&folder).unwrap();
    let o = run(&replay_args(&dir.path().join("r0.safetensors"), &folder));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(folder.to_str().unwrap()) && text(&o).contains("is a directory: a flight log goes to"),
        "{}",
        text(&o)
    );
    assert!(std::fs::metadata(&folder).unwrap().is_dir());
    // the flight log into a FIFO: streamed to its reader, the FIFO left a FIFO
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let log_fifo = dir.path().join("flight.fifo");
        if std::process::Command::new("mkfifo").arg(&log_fifo).status().is_ok_and(|s| s.success()) {
            // no reader: an error naming the FIFO at once, not a run held in open
            let o = run(&replay_args(&dir.path().join("r1.safetensors"), &log_fifo));
            assert_eq!(o.status.code(), Some(2), "{}", text(&o));
            assert!(
                text(&o).contains(log_fifo.to_str().unwrap()) && text(&o).contains("no process has open for reading"),
                "{}",
                text(&o)
            );
            // a reader present before the run (opened with O_NONBLOCK, Linux's
            // 0o4000, so it does not wait for a writer), and a thread reading
            // everything the run writes
            let holder = std::fs::OpenOptions::new().read(true).custom_flags(0o4000).open(&log_fifo).unwrap();
            let p = log_fifo.clone();
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                std::fs::File::open(&p).unwrap().read_to_end(&mut got).unwrap();
                got
            });
            let out = dir.path().join("r2.safetensors");
            let o = run(&replay_args(&out, &log_fifo));
            // the reading thread released if it reached open after the run closed the FIFO
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(0o4000).open(&log_fifo);
            drop(holder);
            assert!(o.status.success(), "{}", text(&o));
            let got = reader.join().unwrap();
            assert!(std::fs::metadata(&log_fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
            assert!(got.starts_with(b"PMFLIGHT"), "the reader got {} bytes, not a flight log", got.len());
            // what went through the FIFO is the whole log: it replays bit for bit
            let copy = dir.path().join("flight-copy.pmlog");
            std::fs::write(&copy, &got).unwrap();
            let o = pmstate(&[
                "deploy",
                "replay",
                &root("testdata/policy/g1_amp_deploy/last.ckpt"),
                "--motion",
                &root("testdata/deploy/synthetic.motion"),
                "--from-log",
                copy.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", text(&o));
            assert!(text(&o).contains("bit for bit"), "{}", text(&o));
        } else {
            eprintln!("SKIPPED the flight-log FIFO half: mkfifo is not available here");
        }
    }
    let mknod = |name: &str| {
        let p = dir.path().join(name);
        let made = std::process::Command::new("mknod").arg(&p).args(["c", "1", "3"]).output();
        made.is_ok_and(|o| o.status.success()).then_some(p)
    };
    let (Some(dev_st), Some(dev_pt), Some(dev_replay), Some(dev_log)) =
        (mknod("dev.safetensors"), mknod("dev.pt"), mknod("replay.safetensors"), mknod("flight.pmlog"))
    else {
        eprintln!("SKIPPED the device half: mknod is not permitted here (needs CAP_MKNOD)");
        return;
    };
    let o = pmstate(&["convert", &fixture("inference.ckpt"), dev_st.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = pmstate(&["convert", &fixture("inference.ckpt"), dev_pt.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("cannot be streamed"), "{}", text(&o));
    let o = pmstate(&[
        "deploy",
        "replay",
        &root("testdata/policy/g1_amp_deploy/last.ckpt"),
        "--motion",
        &root("testdata/deploy/synthetic.motion"),
        "--sensors",
        &root("testdata/deploy/g1_amp_deploy/sensors.safetensors"),
        "--out",
        dev_replay.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // the flight log into a character device: written into, left a device
    let o = run(&replay_args(&dir.path().join("r3.safetensors"), &dev_log));
    assert!(o.status.success(), "{}", text(&o));
    for d in [&dev_st, &dev_pt, &dev_replay, &dev_log] {
        assert!(std::fs::metadata(d).unwrap().file_type().is_char_device(), "{} was replaced", d.display());
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}
