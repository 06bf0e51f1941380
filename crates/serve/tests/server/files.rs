//! Files that are not checkpoints, at start-up and over a watched
//! checkpoint: a FIFO, a link to /dev/zero and a 1 TiB sparse file are
//! refused on the open descriptor before a byte is read (the reload never
//! blocks, the old model keeps serving, a later good file still loads,
//! shutdown completes); a checkpoint or configs file carrying a global
//! such as `posix.system` is refused naming it, unless allowed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node, UnsafeGlobals, WriteOptions};
use pmstate_policy::Globals;
use pmstate_serve::model::LoadedModel;
use pmstate_serve::{Event, LoadError, Server, StartError, Watch};
use serde_json::json;

fn failures(ev: &Events) -> Vec<String> {
    ev.all()
        .into_iter()
        .filter_map(|e| match e {
            Event::ReloadFailed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

/// Makes a file at the path given.
type MakeFile = Box<dyn FnOnce(&Path)>;

/// `what` made at a staging path beside `ckpt`, then renamed over it.
fn rename_over(ckpt: &Path, make: impl FnOnce(&Path)) {
    let staged = ckpt.with_file_name("staged.ckpt");
    let _ = std::fs::remove_file(&staged);
    make(&staged);
    std::fs::rename(&staged, ckpt).unwrap();
}

/// The first row's mean action as the server answers it, and its model version.
async fn answer(s: &Running) -> (Vec<u32>, String) {
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));
    let r = infer(&s.client, body).await;
    (bits(&outputs(&r)["mean_action"].1), r.json()["model_version"].as_str().unwrap().to_owned())
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_a_device_and_a_sparse_terabyte_over_the_checkpoint_are_refused_then_a_good_file_loads() {
    let (_dir, ckpt) = tracker_dir(0.0);
    let mut opts = options(ckpt.clone());
    opts.watch = Watch::Poll { interval: Duration::from_millis(20) };
    let s = start(opts).await;
    let handle = s.server.handle();
    let before = answer(&s).await;
    assert_eq!(before.1, "1");

    let cases: [(&str, MakeFile); 3] = [
        (
            "not a regular file (a FIFO)",
            Box::new(|p| assert!(std::process::Command::new("mkfifo").arg(p).status().unwrap().success())),
        ),
        ("not a regular file (a device)", Box::new(|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap())),
        (
            "over the limit of 17179869184 (FileLimits::max_file_bytes)",
            Box::new(|p| std::fs::File::create(p).unwrap().set_len(1 << 40).unwrap()),
        ),
    ];
    for (n, (reason, make)) in cases.into_iter().enumerate() {
        rename_over(&ckpt, make);
        until(reason, || failures(&s.events).len() > n).await;
        let f = failures(&s.events);
        assert!(f[n].contains(reason), "expected {reason:?} in {f:?}");
        assert_eq!(answer(&s).await, before, "the old model keeps serving after: {reason}");
    }
    assert_eq!(handle.version(), 1);

    // a good checkpoint written later is still loaded
    write_by_rename(&tracker_tensors(0.25), &ckpt.with_file_name("good.safetensors"));
    std::fs::rename(ckpt.with_file_name("good.safetensors"), &ckpt).unwrap();
    until("the good checkpoint served", || handle.version() == 2).await;
    let after = answer(&s).await;
    assert_eq!(after.1, "2");
    assert_ne!(after.0, before.0, "the new weights answer");

    // and shutdown completes with a FIFO in place again (the watcher only ever stats it)
    rename_over(&ckpt, |p| assert!(std::process::Command::new("mkfifo").arg(p).status().unwrap().success()));
    until("the FIFO refused", || failures(&s.events).len() > 3).await;
    handle.shutdown();
    tokio::time::timeout(WATCHDOG, s.server.wait()).await.expect("shutdown hung").unwrap();
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_a_fifo_and_dev_zero_without_blocking() {
    let (dir, ckpt) = tracker_dir(0.0);
    let fifo = dir.path().join("fifo.safetensors");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let zero = dir.path().join("zero.safetensors");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for (path, kind) in [(fifo, "a FIFO"), (zero, "a device")] {
        let started =
            tokio::time::timeout(WATCHDOG, Server::start(options(path.clone()), pmstate_serve::ignore_events()))
                .await
                .expect("start-up hung");
        let Err(e) = started else { panic!("{} was served", path.display()) };
        assert!(matches!(e, StartError::Load(LoadError::Policy(_))), "{e}");
        assert!(e.to_string().contains(&format!("not a regular file ({kind})")), "{e}");
    }
    // a configs file given is checked the same way (one looked for next to
    // the checkpoint must be a regular file to be found at all)
    let configs = ckpt.with_file_name("configs.pt");
    assert!(std::process::Command::new("mkfifo").arg(&configs).status().unwrap().success());
    let e = LoadedModel::load(&ckpt, Some(&configs), &Device::Cpu, &[], 1).expect_err("a FIFO configs file refused");
    assert!(e.to_string().contains("not a regular file (a FIFO)"), "{e}");
}

/// The smpl tracker's torch checkpoint with `global` added at the root key
/// `evaluator`, in a folder with its configs.
fn tracker_with_global(module: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(testdata("smpl_tracker").join("resolved_configs.pt"), dir.path().join("resolved_configs.pt"))
        .unwrap();
    let path = dir.path().join("last.ckpt");
    write_tracker_with_global(module, name, &path);
    (dir, path)
}

fn write_tracker_with_global(module: &str, name: &str, path: &Path) {
    let ck = Checkpoint::open(testdata("smpl_tracker").join("last.ckpt")).unwrap();
    let (mut root, storages) = ck.into_parts();
    root.as_dict_mut().unwrap().insert("evaluator", Node::Global { module: module.into(), name: name.into() });
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..Default::default() };
    Checkpoint::from_parts(root, storages).unwrap().save_with(path, &opts).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_carrying_posix_system_is_refused_at_start_and_on_reload_unless_allowed() {
    let (_bad_dir, bad) = tracker_with_global("posix", "system");
    let Err(e) = Server::start(options(bad.clone()), pmstate_serve::ignore_events()).await else {
        panic!("a checkpoint carrying posix.system was served")
    };
    let text = e.to_string();
    assert!(text.contains("posix.system at evaluator") && text.contains("--allow-unsafe-globals"), "{text}");

    // allowed: served, and the global is reported before the model serves
    let mut opts = options(bad.clone());
    opts.files.globals = Globals::Allow;
    let s = start(opts).await;
    let allowed: Vec<Event> = s.events.all().into_iter().filter(|e| matches!(e, Event::GlobalAllowed { .. })).collect();
    assert!(
        matches!(allowed.as_slice(), [Event::GlobalAllowed { key, global, .. }] if key == "evaluator" && global == "posix.system"),
        "{allowed:?}"
    );
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();

    // a watched reload to the same file is refused, naming it; the old model stays
    let dir = tempfile::tempdir().unwrap();
    for f in ["last.ckpt", "resolved_configs.pt"] {
        std::fs::copy(testdata("smpl_tracker").join(f), dir.path().join(f)).unwrap();
    }
    let ckpt = dir.path().join("last.ckpt");
    let mut opts = options(ckpt.clone());
    opts.watch = Watch::Poll { interval: Duration::from_millis(20) };
    let s = start(opts).await;
    rename_over(&ckpt, |p| write_tracker_with_global("posix", "system", p));
    until("the refusal", || !failures(&s.events).is_empty()).await;
    let f = failures(&s.events);
    assert!(f[0].contains("unsafe global(s) (posix.system at evaluator)"), "{f:?}");
    assert_eq!(s.server.handle().version(), 1);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}
