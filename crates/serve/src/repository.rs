//! A model repository in Triton's layout, and the name -> model table
//! both transports route through.
//!
//! ```text
//! DIR/
//!   smpl_tracker/
//!     config.json          (optional: see ModelConfig)
//!     1/last.ckpt          (with resolved_configs*.pt, or a v2.3 config.yaml)
//!     2/last.ckpt
//!   masked_mimic/
//!     1/last.ckpt
//! ```
//!
//! Every numeric version directory of a model is served, each with its own
//! slot, batcher, reload thread and metrics ([`Served`]); requests that
//! name no version go to the highest. A model one of whose versions fails
//! to load is not served at all and is listed UNAVAILABLE with the reason;
//! the other models serve on. Triton's repository extension (index, load,
//! unload) is answered by [`Repository`], over HTTP and gRPC alike.
//!
//! Bounds: a repository request reads at most [`MAX_DIR_ENTRIES`] entries
//! of a directory and serves at most [`MAX_VERSIONS`] versions of a model;
//! loads run one at a time (a second waits for the first), off the async
//! workers; a model's `config.json` is read only up to [`MAX_CONFIG_BYTES`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use candle_core::Device;
use serde::Serialize;

use crate::batcher::{Batcher, Placement};
use crate::error::{RepositoryError, RequestError};
use crate::events::{Event, EventSink};
use crate::metrics::Metrics;
use crate::model::{Cancel, FileStamp, LoadedModel, ModelKind};
use crate::options::{Batching, FileLimits, Watch};
use crate::reload::{ReloadConfig, ReloadStats, Reloader};
use crate::slot::ModelSlot;
use crate::state::Served;

/// Most entries of one directory a repository request reads.
pub const MAX_DIR_ENTRIES: usize = 4096;
/// Most versions of one model served.
pub const MAX_VERSIONS: usize = 16;
/// Largest `config.json` read.
pub const MAX_CONFIG_BYTES: u64 = 64 << 10;
/// The checkpoint file names looked for in a version directory, in order.
pub const CHECKPOINT_NAMES: [&str; 2] = ["last.ckpt", "inference_last.ckpt"];
/// The per-model configuration file.
pub const CONFIG_FILE: &str = "config.json";

/// Which models are loaded, and whether clients may load and unload them
/// (Triton's `--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelControl {
    /// Every model of the repository is loaded at start; load and unload
    /// requests are refused.
    #[default]
    None,
    /// Only the models named in [`RepositoryOptions::load`] are loaded at
    /// start; clients load and unload models by the repository API.
    Explicit,
}

/// A model repository to serve ([`crate::ModelSource::Repository`]).
#[derive(Debug, Clone)]
pub struct RepositoryOptions {
    /// The repository directory.
    pub dir: PathBuf,
    /// The control mode.
    pub control: ModelControl,
    /// Models loaded at start in [`ModelControl::Explicit`] (`--load-model`).
    pub load: Vec<String>,
}

/// Whether `name` can be a model directory: `[A-Za-z0-9._-]+`, not `.`
/// or `..` (so no path separator, no way out of the repository).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name != "."
        && name != ".."
}

/// A model's state in the table.
enum Entry {
    /// Its versions, lowest first.
    Ready(Vec<Arc<Served>>),
    /// Not served, and why (a failed load, or unloaded).
    Unavailable(String),
}

/// The models served, by name: the routing table of both transports.
#[derive(Default)]
pub struct Models {
    map: RwLock<BTreeMap<String, Entry>>,
}

impl Models {
    /// A table serving `one` alone (a single-checkpoint server).
    pub(crate) fn single(one: Served) -> Models {
        let m = Models::default();
        m.write().insert(one.name.clone(), Entry::Ready(vec![Arc::new(one)]));
        m
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The model version a request names (no version: the highest served),
    /// and the model it serves now.
    pub fn find(&self, name: &str, version: Option<&str>) -> Result<(Arc<Served>, Arc<LoadedModel>), RequestError> {
        let map = self.read();
        let versions = match map.get(name) {
            Some(Entry::Ready(v)) => v,
            Some(Entry::Unavailable(reason)) => {
                return Err(RequestError::Unavailable { name: name.to_owned(), reason: reason.clone() })
            }
            None => {
                let served: Vec<&str> = map
                    .iter()
                    .filter(|(_, e)| matches!(e, Entry::Ready(_)))
                    .map(|(n, _)| n.as_str())
                    .take(16)
                    .collect();
                let served = if served.is_empty() { "no model".to_owned() } else { served.join(", ") };
                return Err(RequestError::UnknownModel { name: name.to_owned(), served });
            }
        };
        let Some(latest) = versions.last() else {
            return Err(RequestError::Unavailable { name: name.to_owned(), reason: "no version".into() });
        };
        let Some(v) = version else {
            return Ok((latest.clone(), latest.slot.current()));
        };
        for s in versions {
            let m = s.slot.current();
            if m.version.to_string() == v {
                return Ok((s.clone(), m));
            }
        }
        Err(RequestError::UnknownVersion {
            name: name.to_owned(),
            version: v.to_owned(),
            served: latest.slot.current().version,
        })
    }

    /// Every model version served.
    pub fn all(&self) -> Vec<Arc<Served>> {
        self.read()
            .values()
            .flat_map(|e| match e {
                Entry::Ready(v) => v.clone(),
                Entry::Unavailable(_) => Vec::new(),
            })
            .collect()
    }

    /// Serves `versions` as `name`; returns the versions they replace.
    fn set_ready(&self, name: &str, versions: Vec<Arc<Served>>) -> Vec<Arc<Served>> {
        match self.write().insert(name.to_owned(), Entry::Ready(versions)) {
            Some(Entry::Ready(old)) => old,
            _ => Vec::new(),
        }
    }

    /// Marks `name` unavailable for `reason`; returns the versions it served.
    fn set_unavailable(&self, name: &str, reason: String) -> Vec<Arc<Served>> {
        match self.write().insert(name.to_owned(), Entry::Unavailable(reason)) {
            Some(Entry::Ready(old)) => old,
            _ => Vec::new(),
        }
    }

    /// Whether `name` is being served.
    fn is_ready(&self, name: &str) -> bool {
        matches!(self.read().get(name), Some(Entry::Ready(_)))
    }
}

/// One line of the repository index (Triton's `RepositoryIndex`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IndexEntry {
    /// The model.
    pub name: String,
    /// The version (empty for a model not served; then left out of JSON).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// `READY` or `UNAVAILABLE`.
    pub state: String,
    /// Why it is unavailable (empty when ready; then left out of JSON).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The longest `spin_us` a `config.json` sets ([`Batching::MAX_SPIN`]).
const MAX_SPIN_US: u64 = Batching::MAX_SPIN.as_micros() as u64;

/// A model's `config.json`: every key optional.
///
/// ```json
/// {"checkpoint": "last.ckpt", "config": "resolved_configs.pt", "pipeline": false,
///  "max_batch": 256, "max_wait_us": 0, "queue": 1024, "spin_us": 150}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelConfig {
    /// The checkpoint's file name in each version directory.
    pub checkpoint: Option<String>,
    /// The configs' file name in each version directory (default: found
    /// next to the checkpoint, as `pmstate serve CKPT` finds them).
    pub config: Option<String>,
    /// Serve the deployment pipeline (`--pipeline`).
    pub pipeline: bool,
    /// `--max-batch`.
    pub max_batch: Option<usize>,
    /// `--max-wait-us`.
    pub max_wait_us: Option<u64>,
    /// `--queue`.
    pub queue: Option<usize>,
    /// `--spin-us`.
    pub spin_us: Option<u64>,
}

impl ModelConfig {
    /// Reads `path` (absent: the defaults); errors name the file and key.
    pub fn read(path: &Path) -> Result<ModelConfig, RepositoryError> {
        let file = path.display().to_string();
        let bad = |problem: String| RepositoryError::Config { file: file.clone(), problem };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ModelConfig::default()),
            Err(e) => return Err(bad(e.to_string())),
        };
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(bad(format!("{} bytes, at most {MAX_CONFIG_BYTES} are read", meta.len())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        Self::parse(&text).map_err(bad)
    }

    /// Parses the JSON text of a `config.json`; the error names the key.
    pub fn parse(text: &str) -> Result<ModelConfig, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let serde_json::Value::Object(map) = value else {
            return Err("expected a JSON object".into());
        };
        let mut c = ModelConfig::default();
        for (key, v) in &map {
            let expected = |what: &str| format!("key `{key}`: expected {what}");
            match key.as_str() {
                "checkpoint" | "config" => {
                    let s = v.as_str().ok_or_else(|| expected("a file name (a string)"))?;
                    if !valid_name(s) {
                        return Err(expected("a file name in the version directory (no path separator, not ..)"));
                    }
                    if key == "checkpoint" {
                        c.checkpoint = Some(s.to_owned());
                    } else {
                        c.config = Some(s.to_owned());
                    }
                }
                "pipeline" => c.pipeline = v.as_bool().ok_or_else(|| expected("true or false"))?,
                "max_batch" | "queue" => {
                    let n = v.as_u64().filter(|n| *n > 0).ok_or_else(|| expected("a positive integer"))?;
                    let n = usize::try_from(n).map_err(|_| expected("a positive integer"))?;
                    if key == "max_batch" {
                        c.max_batch = Some(n);
                    } else {
                        c.queue = Some(n);
                    }
                }
                "max_wait_us" => c.max_wait_us = Some(v.as_u64().ok_or_else(|| expected("an integer >= 0"))?),
                "spin_us" => {
                    let us = v.as_u64().filter(|us| *us <= MAX_SPIN_US);
                    c.spin_us = Some(us.ok_or_else(|| expected("an integer from 0 to 1000000"))?);
                }
                _ => {
                    return Err(format!(
                        "unknown key `{key}` (expected checkpoint, config, pipeline, max_batch, max_wait_us, queue, spin_us)"
                    ))
                }
            }
        }
        Ok(c)
    }

    /// The server's batching with this model's settings over it.
    pub fn batching(&self, base: Batching) -> Batching {
        Batching {
            max_batch: self.max_batch.unwrap_or(base.max_batch),
            max_wait: self.max_wait_us.map_or(base.max_wait, Duration::from_micros),
            queue: self.queue.unwrap_or(base.queue),
            spin: self.spin_us.map_or(base.spin, Duration::from_micros),
        }
    }
}

/// What loading a model needs from the server's options.
pub(crate) struct LoadBase {
    pub device: Device,
    pub files: FileLimits,
    pub watch: Watch,
    pub batching: Batching,
    pub pool: Arc<rayon::ThreadPool>,
    pub events: EventSink,
}

/// The repository being served and its control mode.
pub struct Repository {
    dir: PathBuf,
    control: ModelControl,
    base: LoadBase,
    /// Loads and unloads run one at a time.
    busy: tokio::sync::Mutex<()>,
    /// Set at shutdown: nothing more is loaded.
    closed: std::sync::atomic::AtomicBool,
}

/// A version loaded, not yet served.
struct Version {
    number: u64,
    model: LoadedModel,
    reload: ReloadConfig,
    stamp: Option<FileStamp>,
}

/// Lists the entries of `dir`, at most [`MAX_DIR_ENTRIES`] (later ones are ignored).
fn list(dir: &Path) -> Result<Vec<(String, bool)>, RepositoryError> {
    let read = |e: std::io::Error| RepositoryError::Read { path: dir.display().to_string(), reason: e.to_string() };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)?.take(MAX_DIR_ENTRIES) {
        let entry = entry.map_err(read)?;
        // names that are not UTF-8 cannot be asked for: skipped
        let Ok(name) = entry.file_name().into_string() else { continue };
        let is_dir = std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir());
        out.push((name, is_dir));
    }
    out.sort();
    Ok(out)
}

/// Starts serving `model`: its slot, batcher (its loop where `placement`
/// says), and (when it has a file) its reload thread.
pub(crate) fn start_served(
    name: String,
    model: LoadedModel,
    reload: Option<(ReloadConfig, Option<FileStamp>)>,
    batching: Batching,
    pool: Arc<rayon::ThreadPool>,
    placement: Placement,
    events: &EventSink,
) -> std::io::Result<Served> {
    let metrics = Arc::new(Metrics::new());
    metrics.model_version.set(model.version as i64);
    let slot = Arc::new(ModelSlot::new(model));
    let batcher = Batcher::start(slot.clone(), batching, pool, metrics.clone(), placement)?;
    let reloads = Arc::new(ReloadStats::default());
    let reloader = match reload {
        Some((cfg, stamp)) => {
            match Reloader::start(cfg, stamp, slot.clone(), metrics.clone(), reloads.clone(), events.clone()) {
                Ok(r) => Some(r),
                Err(e) => {
                    batcher.stop();
                    return Err(e);
                }
            }
        }
        None => None,
    };
    Ok(Served { name, slot, batcher, metrics, batching, reloads, reloader: Mutex::new(reloader) })
}

impl Repository {
    pub(crate) fn new(opts: &RepositoryOptions, base: LoadBase) -> Repository {
        Repository {
            dir: opts.dir.clone(),
            control: opts.control,
            base,
            busy: tokio::sync::Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The repository directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The control mode.
    pub fn control(&self) -> ModelControl {
        self.control
    }

    /// The model directories of the repository (hidden entries and plain
    /// files skipped), at most [`MAX_DIR_ENTRIES`] read.
    pub fn model_names(&self) -> Result<Vec<String>, RepositoryError> {
        Ok(list(&self.dir)?.into_iter().filter(|(n, d)| *d && !n.starts_with('.')).map(|(n, _)| n).collect())
    }

    /// Loads every version of `name` (blocking).
    fn load_versions(&self, name: &str) -> Result<(Batching, Vec<Version>), RepositoryError> {
        if !valid_name(name) {
            return Err(RepositoryError::BadName { name: name.to_owned() });
        }
        let mdir = self.dir.join(name);
        if !std::fs::metadata(&mdir).is_ok_and(|m| m.is_dir()) {
            return Err(RepositoryError::NoModel { name: name.to_owned(), repository: self.dir.display().to_string() });
        }
        let cfg = ModelConfig::read(&mdir.join(CONFIG_FILE))?;
        let mut numbers: Vec<u64> = list(&mdir)?
            .into_iter()
            .filter(|(n, d)| *d && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|(n, _)| n.parse::<u64>().ok())
            .collect();
        numbers.sort_unstable();
        numbers.dedup();
        if numbers.is_empty() {
            return Err(RepositoryError::NoVersion { name: name.to_owned(), path: mdir.display().to_string() });
        }
        if numbers.len() > MAX_VERSIONS {
            return Err(RepositoryError::TooMany {
                what: format!("versions of model {name}"),
                count: numbers.len(),
                max: MAX_VERSIONS,
            });
        }
        let mut out = Vec::with_capacity(numbers.len());
        for number in numbers {
            out.push(self.load_version(name, &mdir, number, &cfg)?);
        }
        Ok((cfg.batching(self.base.batching), out))
    }

    fn load_version(
        &self,
        name: &str,
        mdir: &Path,
        number: u64,
        cfg: &ModelConfig,
    ) -> Result<Version, RepositoryError> {
        let vdir = mdir.join(number.to_string());
        let path = match &cfg.checkpoint {
            Some(c) => vdir.join(c),
            None => match CHECKPOINT_NAMES.iter().map(|c| vdir.join(c)).find(|p| p.is_file()) {
                Some(p) => p,
                None => {
                    return Err(RepositoryError::NoCheckpoint {
                        name: name.to_owned(),
                        version: number,
                        path: vdir.display().to_string(),
                        expected: "last.ckpt, inference_last.ckpt",
                    })
                }
            },
        };
        let config = cfg.config.as_ref().map(|c| vdir.join(c));
        let b = &self.base;
        let (kind, device) =
            if cfg.pipeline { (ModelKind::Pipeline, Device::Cpu) } else { (ModelKind::Policy, b.device.clone()) };
        let cancel = Cancel::never();
        let loaded = match kind {
            ModelKind::Policy => {
                LoadedModel::load_with(&path, config.as_ref(), &device, &[], number, &b.files, &cancel)
            }
            ModelKind::Pipeline => LoadedModel::load_pipeline_with(&path, config.as_ref(), number, &b.files, &cancel),
        };
        let model = loaded.map_err(|e| RepositoryError::Load {
            name: name.to_owned(),
            version: number,
            reason: e.to_string(),
        })?;
        crate::events::report_allowed_globals(&model, &b.events);
        let stamp = FileStamp::of(&path).ok();
        let reload = ReloadConfig {
            path,
            config,
            device,
            pins: Vec::new(),
            watch: b.watch,
            files: b.files,
            kind,
            keep_version: true,
        };
        Ok(Version { number, model, reload, stamp })
    }

    /// Loads (or reloads) `name` and serves it; on failure a model not
    /// served is marked unavailable with the reason, one served keeps
    /// serving. The versions it replaces are stopped.
    pub(crate) async fn load(self: &Arc<Self>, models: &Models, name: &str) -> Result<(), RepositoryError> {
        if !valid_name(name) {
            return Err(RepositoryError::BadName { name: name.to_owned() });
        }
        let _one = self.busy.lock().await;
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(RepositoryError::ShuttingDown);
        }
        let me = self.clone();
        let n = name.to_owned();
        let loaded = tokio::task::spawn_blocking(move || me.load_versions(&n))
            .await
            .map_err(|e| RepositoryError::Load { name: name.to_owned(), version: 0, reason: e.to_string() })?;
        let (batching, versions) = match loaded {
            Ok(v) => v,
            Err(e) => {
                // a name that is no model of the repository leaves no entry behind
                let keep = matches!(e, RepositoryError::NoModel { .. } | RepositoryError::BadName { .. });
                if !keep && !models.is_ready(name) {
                    models.set_unavailable(name, e.to_string());
                }
                return Err(e);
            }
        };
        let mut served = Vec::with_capacity(versions.len());
        for v in versions {
            let (number, path) = (v.number, v.reload.path.display().to_string());
            let sha256 = v.model.provenance.sha256.clone();
            let s = start_served(
                name.to_owned(),
                v.model,
                Some((v.reload, v.stamp)),
                batching,
                self.base.pool.clone(),
                // the repository's models share one pool
                Placement::OwnThread,
                &self.base.events,
            );
            match s {
                Ok(s) => {
                    (self.base.events)(&Event::ModelLoaded {
                        model: name.to_owned(),
                        version: number,
                        checkpoint: path,
                        sha256,
                    });
                    served.push(Arc::new(s));
                }
                Err(e) => {
                    stop_all(served).await;
                    return Err(RepositoryError::Load {
                        name: name.to_owned(),
                        version: number,
                        reason: e.to_string(),
                    });
                }
            }
        }
        // a shutdown that began during the load stops what it started
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            stop_all(served).await;
            return Err(RepositoryError::ShuttingDown);
        }
        let old = models.set_ready(name, served);
        stop_all(old).await;
        Ok(())
    }

    /// Stops serving `name`: it is listed UNAVAILABLE ("unloaded"); its
    /// queued requests are answered first.
    pub(crate) async fn unload(&self, models: &Models, name: &str) -> Result<(), RepositoryError> {
        if !valid_name(name) {
            return Err(RepositoryError::BadName { name: name.to_owned() });
        }
        let _one = self.busy.lock().await;
        let known = models.read().contains_key(name) || self.model_names()?.iter().any(|n| n == name);
        if !known {
            return Err(RepositoryError::NoModel { name: name.to_owned(), repository: self.dir.display().to_string() });
        }
        let old = models.set_unavailable(name, "unloaded".into());
        if !old.is_empty() {
            (self.base.events)(&Event::ModelUnloaded { model: name.to_owned() });
        }
        stop_all(old).await;
        Ok(())
    }

    /// The index: every model directory and every model known to the
    /// table, one line per version served, one for a model not served.
    pub fn index(&self, models: &Models, ready_only: bool) -> Result<Vec<IndexEntry>, RepositoryError> {
        let mut names = self.model_names()?;
        let map = models.read();
        names.extend(map.keys().cloned());
        names.sort();
        names.dedup();
        let mut out = Vec::new();
        for name in names {
            match map.get(&name) {
                Some(Entry::Ready(versions)) => {
                    for s in versions {
                        out.push(IndexEntry {
                            name: name.clone(),
                            version: s.slot.current().version.to_string(),
                            state: "READY".into(),
                            reason: String::new(),
                        });
                    }
                }
                Some(Entry::Unavailable(reason)) if !ready_only => out.push(IndexEntry {
                    name: name.clone(),
                    version: String::new(),
                    state: "UNAVAILABLE".into(),
                    reason: reason.clone(),
                }),
                None if !ready_only => out.push(IndexEntry {
                    name: name.clone(),
                    version: String::new(),
                    state: "UNAVAILABLE".into(),
                    reason: "not loaded".into(),
                }),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Refused unless clients may load and unload.
    pub(crate) fn check_control(&self) -> Result<(), RepositoryError> {
        match self.control {
            ModelControl::Explicit => Ok(()),
            ModelControl::None => Err(RepositoryError::ControlMode),
        }
    }

    /// No more loads (shutdown).
    pub(crate) fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Stops `versions` off the async workers (each runs what it has queued).
async fn stop_all(versions: Vec<Arc<Served>>) {
    if versions.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || versions.iter().for_each(|s| s.stop())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that could leave the repository are refused.
    #[test]
    fn names_with_separators_or_dots_are_refused() {
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "a b", "é"] {
            assert!(!valid_name(bad), "{bad}");
        }
        for ok in ["smpl_tracker", "a.b", "v-1", "..a"] {
            assert!(valid_name(ok), "{ok}");
        }
    }

    /// Every key is typed; an unknown key or a bad value names the key.
    #[test]
    fn model_config_names_the_bad_key() {
        let c = ModelConfig::parse(r#"{"pipeline": true, "max_batch": 8, "checkpoint": "a.ckpt"}"#).unwrap();
        assert!(c.pipeline && c.max_batch == Some(8) && c.checkpoint.as_deref() == Some("a.ckpt"));
        let e = ModelConfig::parse(r#"{"max_batch": 0}"#).unwrap_err();
        assert!(e.contains("`max_batch`") && e.contains("positive"), "{e}");
        let e = ModelConfig::parse(r#"{"checkpoint": "../x.ckpt"}"#).unwrap_err();
        assert!(e.contains("`checkpoint`"), "{e}");
        let e = ModelConfig::parse(r#"{"pipline": true}"#).unwrap_err();
        assert!(e.contains("unknown key `pipline`"), "{e}");
        assert!(ModelConfig::parse("[1]").unwrap_err().contains("object"));
        let b = ModelConfig { max_wait_us: Some(5), ..Default::default() }.batching(Batching::default());
        assert_eq!(b.max_wait, Duration::from_micros(5));
        assert_eq!(b.max_batch, Batching::default().max_batch);
        assert_eq!(b.spin, Batching::DEFAULT_SPIN);
        let c = ModelConfig::parse(r#"{"spin_us": 0, "max_wait_us": 7}"#).unwrap();
        let b = c.batching(Batching::default());
        assert_eq!((b.spin, b.max_wait), (Duration::ZERO, Duration::from_micros(7)));
        for bad in ["-1", "1000001"] {
            let e = ModelConfig::parse(&format!(r#"{{"spin_us": {bad}}}"#)).unwrap_err();
            assert!(e.contains("`spin_us`") && e.contains("from 0 to 1000000"), "{e}");
        }
    }
}
