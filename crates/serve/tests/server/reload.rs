//! Hot reload under load: a new checkpoint renamed over the watched file is
//! swapped in between batches (no request fails, each client's answers
//! switch from the old model to the new one at one point, each answer is
//! bitwise one model's); a half-written, corrupt or incompatible file is
//! refused and the served model stays; a reload on request (SIGHUP) loads
//! whatever is there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use candle_core::{Device, Tensor};
use pmstate_policy::Policy;
use pmstate_serve::model::LoadedModel;
use pmstate_serve::{Difference, Event, Watch};
use serde_json::json;

fn mean_rows(policy: &Policy, o: &std::collections::HashMap<String, Tensor>) -> Vec<Vec<u32>> {
    (0..8).map(|i| bits(&host(&policy.forward(&tensors(&rows(o, &[i]))).unwrap().mean_action))).collect()
}

fn failures(ev: &Events) -> Vec<String> {
    ev.all()
        .into_iter()
        .filter_map(|e| match e {
            Event::ReloadFailed { reason, serving, .. } => Some(format!("{serving}: {reason}")),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_under_load_switches_once_and_refuses_bad_files() {
    let (_dir, ckpt) = tracker_dir(0.0);
    let o = Arc::new(obs("smpl_tracker"));
    let a = mean_rows(&Policy::load(&ckpt, None, &Device::Cpu).unwrap(), &o);
    let b_tensors = tracker_tensors(0.25);
    let b_path = ckpt.with_file_name("b.safetensors");
    candle_core::safetensors::save(&b_tensors, &b_path).unwrap();
    let b = mean_rows(&Policy::load(&b_path, None, &Device::Cpu).unwrap(), &o);
    assert_ne!(a, b);

    let mut opts = options(ckpt.clone());
    opts.watch = Watch::Poll { interval: Duration::from_millis(20) };
    let s = start(opts).await;
    let handle = s.server.handle();

    // 4 clients, one row each, as fast as they can
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<std::sync::atomic::AtomicUsize>> = Arc::new((0..4).map(|_| Default::default()).collect());
    let mut clients = vec![];
    for c in 0..4usize {
        let (cl, o, stop, counts) = (s.client.clone(), o.clone(), stop.clone(), counts.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = vec![];
            let mut i = c;
            while !stop.load(Ordering::Relaxed) {
                let (body, _) = row_request(&o, &[i % 8], json!({}));
                let r = infer(&cl, body).await;
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let version: u64 = r.json()["model_version"].as_str().unwrap().parse().unwrap();
                seen.push((i % 8, version, bits(&outputs(&r)["mean_action"].1)));
                counts[c].fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            seen
        }));
    }
    let each_at_least = |n: usize| counts.iter().all(|c| c.load(Ordering::Relaxed) >= n);
    until("load on the old model", || each_at_least(20)).await;
    let before: Vec<usize> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    write_by_rename(&b_tensors, &ckpt);
    until("the new model", || handle.version() == 2).await;
    until("load on the new model", || counts.iter().zip(&before).all(|(c, b)| c.load(Ordering::Relaxed) >= b + 40))
        .await;

    // a half-written file in place (a writer still at work), then garbage: refused, version 2 stays
    let bytes = std::fs::read(&b_path).unwrap();
    // (a poll may also catch the file truncated to 0 bytes: that is one more refusal)
    std::fs::write(&ckpt, &bytes[..bytes.len() / 2]).unwrap();
    until("the half-written file refused", || !failures(&s.events).is_empty()).await;
    let n = failures(&s.events).len();
    std::fs::write(&ckpt, b"PK\x03\x04 not a checkpoint at all").unwrap();
    until("the corrupt file refused", || failures(&s.events).len() > n).await;
    let n = failures(&s.events).len();
    // an incompatible one: first layers that take 1000 columns instead of 1003
    let mut narrow = b_tensors.clone();
    for (k, t) in narrow.iter_mut() {
        if k.ends_with("mlp.0.weight") {
            *t = t.narrow(1, 0, 1000).unwrap();
        } else if k.ends_with("running_obs_norm.mean") || k.ends_with("running_obs_norm.var") {
            *t = t.narrow(0, 0, 1000).unwrap();
        }
    }
    write_by_rename(&narrow, &ckpt);
    until("the incompatible file refused", || failures(&s.events).len() > n).await;
    let n = failures(&s.events).len();
    // SIGHUP (a reload on request) tries it again, whatever its stamp
    handle.reload();
    until("the reload on request refused", || failures(&s.events).len() > n).await;
    let refused = n + 1;
    stop.store(true, Ordering::Relaxed);

    let f = failures(&s.events);
    assert!(f.iter().all(|m| m.starts_with("2: ")), "{f:?}");
    // (the configs give max_coords_obs 358 and previous_actions 69: the sum 1000 leaves 573 for mimic_target_poses)
    let incompatible =
        f.iter().filter(|m| m.contains("not compatible") && m.contains("mimic_target_poses was 576, is 573"));
    assert_eq!(incompatible.count(), 2, "{f:?}");
    assert_eq!(handle.version(), 2);

    // every answer is bitwise the old or the new model, by its version; each client switched once
    for cl in clients {
        let seen = cl.await.unwrap();
        let versions: Vec<u64> = seen.iter().map(|s| s.1).collect();
        assert!(versions.windows(2).all(|w| w[0] <= w[1]), "went back: {versions:?}");
        assert!(versions.contains(&1) && versions.contains(&2));
        for (row, v, mean) in seen {
            let want = if v == 1 { &a[row] } else { &b[row] };
            assert_eq!(&mean, want, "row {row} version {v}");
        }
    }

    // a good checkpoint after the refusals: served again
    write_by_rename(&tracker_tensors(-0.5), &ckpt);
    until("version 3", || handle.version() == 3).await;
    let text = handle.metrics_text();
    assert_eq!(metric(&text, "pmstate_model_reloads_total{result=\"ok\"}"), 2.0);
    assert_eq!(metric(&text, "pmstate_model_reloads_total{result=\"failed\"}"), refused as f64);
    assert_eq!(metric(&text, "pmstate_model_version"), 3.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"internal\"}"), 0.0);
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    assert_eq!(cfg["pmstate"]["version"], "3");
    assert_eq!(cfg["pmstate"]["reloads"], json!({"ok": 2, "failed": refused}));
    handle.shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_only_a_reload_on_request_loads() {
    let (_dir, ckpt) = tracker_dir(0.0);
    let s = start(options(ckpt.clone())).await;
    let handle = s.server.handle();
    write_by_rename(&tracker_tensors(1.0), &ckpt);
    // nothing follows the file: still version 1 after a request round trip
    assert_eq!(s.client.get("/v2/models/policy").await.unwrap().json()["versions"], json!(["1"]));
    handle.reload();
    until("version 2", || handle.version() == 2).await;
    assert_eq!(s.client.get("/v2/models/policy").await.unwrap().json()["versions"], json!(["2"]));
    assert!(s.events.all().iter().any(|e| matches!(e, Event::Reloaded { version: 2, .. })));
    handle.shutdown();
    s.server.wait().await.unwrap();
}

/// Mean actions of the 8 recorded rows as the server answers them, and the version that answered.
async fn served_rows(s: &Running, o: &std::collections::HashMap<String, Tensor>) -> (Vec<Vec<u32>>, Vec<String>) {
    let mut means = vec![];
    let mut versions = vec![];
    for i in 0..8 {
        let (body, _) = row_request(o, &[i], json!({}));
        let r = infer(&s.client, body).await;
        versions.push(r.json()["model_version"].as_str().unwrap().to_owned());
        means.push(bits(&outputs(&r)["mean_action"].1));
    }
    (means, versions)
}

#[cfg(unix)]
fn inode(p: &std::path::Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap())
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_rewritten_in_place_is_swapped_in() {
    let (_dir, ckpt) = tracker_dir(0.0);
    let o = obs("smpl_tracker");
    let b_path = ckpt.with_file_name("b.safetensors");
    candle_core::safetensors::save(&tracker_tensors(0.25), &b_path).unwrap();
    let b = mean_rows(&Policy::load(&b_path, None, &Device::Cpu).unwrap(), &o);
    let mut opts = options(ckpt.clone());
    opts.watch = Watch::Poll { interval: Duration::from_millis(20) };
    let s = start(opts).await;
    let handle = s.server.handle();
    let (before, _) = served_rows(&s, &o).await;
    assert_ne!(before, b);

    // the same file (same inode), truncated and written again, as torch.save to an open path does
    let ino = inode(&ckpt);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&ckpt).unwrap();
        f.write_all(&std::fs::read(&b_path).unwrap()).unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(inode(&ckpt), ino);
    until("the rewritten file served", || handle.version() >= 2).await;
    let (after, versions) = served_rows(&s, &o).await;
    assert_eq!(after, b, "answers switched to the new weights");
    let v = handle.version().to_string();
    assert!(versions.iter().all(|x| *x == v), "{versions:?}");
    assert!(s.events.all().iter().any(|e| matches!(e, Event::Reloaded { .. })));
    handle.shutdown();
    s.server.wait().await.unwrap();
}

/// The smpl tracker's `last.ckpt` (ProtoMotions' own torch zip) with the
/// actor's last bias shifted by `shift`, written as a torch zip to `path`.
fn write_shifted_ckpt(shift: f32, path: &std::path::Path) {
    let ck = pmstate_ckpt::Checkpoint::open(testdata("smpl_tracker").join("last.ckpt")).unwrap();
    let t = ck.tensor("model._actor.mu.mlp.12.bias").unwrap().clone();
    assert_eq!((t.dtype, t.stride.as_slice()), (pmstate_ckpt::DType::F32, &[1][..]));
    let (root, mut storages) = ck.into_parts();
    let st = storages.get_mut(&t.storage).unwrap();
    let mut data = st.data.read().unwrap().into_owned();
    for i in t.offset..t.offset + t.numel() {
        let at = &mut data[i * 4..i * 4 + 4];
        let v = f32::from_le_bytes([at[0], at[1], at[2], at[3]]) + shift;
        at.copy_from_slice(&v.to_le_bytes());
    }
    st.data = pmstate_ckpt::Bytes::owned(data);
    // the checkpoint keeps what ProtoMotions pickled (its optimizer and config objects)
    let opts = pmstate_ckpt::WriteOptions { unsafe_globals: pmstate_ckpt::UnsafeGlobals::Allow, ..Default::default() };
    pmstate_ckpt::Checkpoint::from_parts(root, storages).unwrap().save_with(path, &opts).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_torch_ckpt_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("last.ckpt");
    std::fs::copy(testdata("smpl_tracker").join("last.ckpt"), &ckpt).unwrap();
    std::fs::copy(testdata("smpl_tracker").join("resolved_configs.pt"), dir.path().join("resolved_configs.pt"))
        .unwrap();
    let o = obs("smpl_tracker");
    let a = mean_rows(&Policy::load(&ckpt, None, &Device::Cpu).unwrap(), &o);
    let staged = dir.path().join("staged").join("last.ckpt");
    std::fs::create_dir(staged.parent().unwrap()).unwrap();
    std::fs::copy(dir.path().join("resolved_configs.pt"), staged.with_file_name("resolved_configs.pt")).unwrap();
    write_shifted_ckpt(-0.125, &staged);
    let b = mean_rows(&Policy::load(&staged, None, &Device::Cpu).unwrap(), &o);
    assert_ne!(a, b);

    let mut opts = options(ckpt.clone());
    opts.watch = Watch::Poll { interval: Duration::from_millis(20) };
    let s = start(opts).await;
    let handle = s.server.handle();
    assert_eq!(served_rows(&s, &o).await.0, a);
    // a new torch zip renamed over the watched last.ckpt
    std::fs::rename(&staged, &ckpt).unwrap();
    until("the new last.ckpt served", || handle.version() == 2).await;
    let (after, versions) = served_rows(&s, &o).await;
    assert_eq!(after, b);
    assert!(versions.iter().all(|v| v == "2"));
    assert!(failures(&s.events).is_empty(), "{:?}", failures(&s.events));
    handle.shutdown();
    s.server.wait().await.unwrap();
}

/// A folder holding a copy of `variant`'s `last.ckpt` and resolved configs.
fn variant_dir(variant: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for f in ["last.ckpt", "resolved_configs.pt"] {
        std::fs::copy(testdata(variant).join(f), dir.path().join(f)).unwrap();
    }
    let ckpt = dir.path().join("last.ckpt");
    (dir, ckpt)
}

/// Another run's configs copied next to `ckpt`, then its checkpoint renamed over it.
fn swap_in(variant: &str, ckpt: &std::path::Path) {
    std::fs::copy(testdata(variant).join("resolved_configs.pt"), ckpt.with_file_name("resolved_configs.pt")).unwrap();
    let staged = ckpt.with_file_name("staged.ckpt");
    std::fs::copy(testdata(variant).join("last.ckpt"), &staged).unwrap();
    std::fs::rename(&staged, ckpt).unwrap();
}

/// Serving `served` (watched), the checkpoint of `candidate` swapped in
/// is refused: the interface differs as `want` says, and the old model
/// keeps serving (same version, same metadata, the same answers).
async fn refused_swap(served: &str, candidate: &str, want: impl Fn(&Difference) -> bool) -> String {
    let (_dir, ckpt) = variant_dir(served);
    let old = LoadedModel::load(&ckpt, None, &Device::Cpu, &[], 1).unwrap();
    let new = LoadedModel::load(&testdata(candidate).join("last.ckpt"), None, &Device::Cpu, &[], 2).unwrap();
    let d = old.interface.difference(&new.interface);
    assert!(d.as_ref().is_some_and(|(what, _, _)| want(what)), "{served} -> {candidate}: {d:?}");
    let r = rows(&obs(served), &[0, 1, 2]);
    let answer = bits(&host(&old.policy().unwrap().forward(&tensors(&r)).unwrap().mean_action));

    let mut opts = options(ckpt.clone());
    opts.watch = Watch::Poll { interval: Duration::from_millis(20) };
    let s = start(opts).await;
    let handle = s.server.handle();
    let meta = s.client.get("/v2/models/policy").await.unwrap().json();
    swap_in(candidate, &ckpt);
    until("the refusal", || !failures(&s.events).is_empty()).await;
    assert_eq!(handle.version(), 1);
    assert_eq!(s.client.get("/v2/models/policy").await.unwrap().json(), meta, "the served interface stays");
    let got = outputs(&infer(&s.client, json_request(&r, json!({}))).await);
    assert_eq!(bits(&got["mean_action"].1), answer, "still the old model's answers");
    let f = failures(&s.events);
    assert!(f.iter().all(|m| m.starts_with("1: ")), "{f:?}");
    assert_eq!(metric(&handle.metrics_text(), "pmstate_model_reloads_total{result=\"ok\"}"), 0.0);
    handle.shutdown();
    s.server.wait().await.unwrap();
    f[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_action_size_is_refused_and_the_old_model_keeps_serving() {
    // the same in_keys and widths (obs_a 7, obs_b 5, obs_c 6); 6 actions, then 10
    let reason = refused_swap("layernorm_activations", "module_ops_ppo", |d| matches!(d, Difference::ActionSize)).await;
    assert!(reason.contains("not compatible") && reason.contains("action size was 6, is 10"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_in_keys_are_refused_and_the_old_model_keeps_serving() {
    // obs_a, obs_b, obs_c, then obs_a, obs_b
    let reason = refused_swap("layernorm_activations", "welford_clamps", |d| matches!(d, Difference::InKeys)).await;
    assert!(reason.contains("in_keys was obs_a, obs_b, obs_c, is obs_a, obs_b"), "{reason}");
}
