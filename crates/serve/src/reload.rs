//! Hot reload: a thread that follows the checkpoint file (when watching)
//! and reloads on request (SIGHUP). A candidate is loaded beside the
//! served model, checked to have the same interface (in_keys, widths,
//! action size, outputs), and swapped in between two batches; a
//! half-written, corrupt or incompatible file is reported and the served
//! model stays.
//!
//! Polling the file's stamp (size, modification and change times, inode)
//! instead of an OS notification API: it needs no extra dependency, sees
//! both ways ProtoMotions rewrites `last.ckpt` (a temporary file renamed
//! over it changes the inode; an in-place write changes size and times),
//! and a stamp must stay unchanged for one interval before a load is tried,
//! which skips most of a write in progress. A load that still catches a
//! writer fails (unreadable zip) or sees the stamp move ([`LoadError::Changed`]),
//! and the next change is tried again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Device;

use crate::error::LoadError;
use crate::events::{Event, EventSink};
use crate::metrics::{Metrics, ReloadOutcome};
use crate::model::{Cancel, FileStamp, LoadedModel, ModelKind};
use crate::options::{FileLimits, Watch};
use crate::protocol::ReloadCounts;
use crate::slot::ModelSlot;

/// Successful and failed reloads so far.
#[derive(Debug, Default)]
pub struct ReloadStats {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl ReloadStats {
    /// The counts now.
    pub fn counts(&self) -> ReloadCounts {
        ReloadCounts { ok: self.ok.load(Ordering::Relaxed), failed: self.failed.load(Ordering::Relaxed) }
    }
}

enum Msg {
    Now,
    Stop,
}

/// What a reload needs to know.
pub struct ReloadConfig {
    /// The checkpoint followed.
    pub path: PathBuf,
    /// Its configs file, if given.
    pub config: Option<PathBuf>,
    /// Where models run.
    pub device: Device,
    /// `--widths` pins.
    pub pins: Vec<(String, usize)>,
    /// Polling, or reload on request only.
    pub watch: Watch,
    /// Size limit, deadline and globals of each load.
    pub files: FileLimits,
    /// A policy or a pipeline.
    pub kind: ModelKind,
    /// Keep the version number across reloads (a repository's version is
    /// its directory's number); false: each reload counts one up.
    pub keep_version: bool,
}

/// The reload thread.
pub struct Reloader {
    tx: Sender<Msg>,
    /// Set on stop: a load in progress gives up at its next check.
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long [`Reloader::stop`] waits for a load in progress to notice the
/// stop. A load stuck past its checks (the parser on a huge valid file) is
/// left to finish on its own: shutdown never waits on it longer.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl Reloader {
    /// Starts following `cfg.path`; `loaded` is the stamp of the file the served model came from.
    pub fn start(
        cfg: ReloadConfig,
        loaded: Option<FileStamp>,
        slot: Arc<ModelSlot>,
        metrics: Arc<Metrics>,
        stats: Arc<ReloadStats>,
        events: EventSink,
    ) -> std::io::Result<Reloader> {
        let (tx, rx) = channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new().name("pmstate-reload".into()).spawn(move || {
            let mut w = Watcher { cfg, slot, metrics, stats, events, loaded, failed: None, pending: None, stop };
            loop {
                let msg = match w.cfg.watch {
                    Watch::Poll { interval } => match rx.recv_timeout(interval) {
                        Ok(m) => Some(m),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
                    },
                    Watch::Off => match rx.recv() {
                        Ok(m) => Some(m),
                        Err(_) => return,
                    },
                };
                match msg {
                    Some(Msg::Stop) => return,
                    Some(Msg::Now) => w.reload_now(),
                    None => w.poll(),
                }
            }
        })?;
        Ok(Reloader { tx, stopping, thread: Some(thread) })
    }

    /// Asks for a reload now, whatever the file's stamp.
    pub fn trigger(&self) {
        let _ = self.tx.send(Msg::Now);
    }

    /// A function that asks for a reload now, whatever the file's stamp.
    pub fn trigger_fn(&self) -> impl Fn() + Send + Sync + 'static {
        let tx = std::sync::Mutex::new(self.tx.clone());
        move || {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Msg::Now);
            }
        }
    }

    /// Stops the thread: a load in progress gives up at its next check;
    /// waits for it at most 5 s (`STOP_WAIT`), then leaves it behind.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let start = Instant::now();
            while !t.is_finished() && start.elapsed() < STOP_WAIT {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

struct Watcher {
    cfg: ReloadConfig,
    slot: Arc<ModelSlot>,
    metrics: Arc<Metrics>,
    stats: Arc<ReloadStats>,
    events: EventSink,
    /// The stamp of the served file.
    loaded: Option<FileStamp>,
    /// The stamp of the last file refused (not retried until it changes).
    failed: Option<FileStamp>,
    /// A new stamp seen once, loaded if it is still there next time.
    pending: Option<FileStamp>,
    /// Set when the server stops.
    stop: Arc<AtomicBool>,
}

impl Watcher {
    /// The version a reload serves.
    fn next_version(&self, current: u64) -> u64 {
        if self.cfg.keep_version {
            current
        } else {
            current + 1
        }
    }

    fn poll(&mut self) {
        // a missing file is a rename in progress: look again next time
        let Ok(stamp) = FileStamp::of(&self.cfg.path) else { return };
        if Some(&stamp) == self.loaded.as_ref() || Some(&stamp) == self.failed.as_ref() {
            self.pending = None;
            return;
        }
        if self.pending.as_ref() == Some(&stamp) {
            self.pending = None;
            self.try_load(Some(stamp));
        } else {
            self.pending = Some(stamp);
        }
    }

    fn reload_now(&mut self) {
        let stamp = FileStamp::of(&self.cfg.path).ok();
        self.try_load(stamp);
    }

    fn try_load(&mut self, stamp: Option<FileStamp>) {
        let start = Instant::now();
        let current = self.slot.current();
        let deadline = self.cfg.files.reload_deadline;
        let cancel = Cancel { deadline: Some((start + deadline, deadline)), stop: Some(self.stop.clone()) };
        let (path, config, version, files) =
            (&self.cfg.path, self.cfg.config.as_ref(), self.next_version(current.version), &self.cfg.files);
        let loaded = match self.cfg.kind {
            ModelKind::Policy => {
                LoadedModel::load_with(path, config, &self.cfg.device, &self.cfg.pins, version, files, &cancel)
            }
            ModelKind::Pipeline => LoadedModel::load_pipeline_with(path, config, version, files, &cancel),
        };
        let result = loaded.and_then(|m| match current.interface.difference(&m.interface) {
            None => Ok(m),
            Some((what, old, new)) => {
                Err(LoadError::Incompatible { path: self.cfg.path.display().to_string(), what, old, new })
            }
        });
        let checkpoint = self.cfg.path.display().to_string();
        match result {
            Ok(m) => {
                crate::events::report_allowed_globals(&m, &self.events);
                let (version, sha256) = (m.version, m.provenance.sha256.clone());
                self.slot.swap(m);
                self.loaded = stamp;
                self.failed = None;
                self.stats.ok.fetch_add(1, Ordering::Relaxed);
                self.metrics.reload(ReloadOutcome::Ok);
                self.metrics.model_version.set(version as i64);
                let seconds = start.elapsed().as_secs_f64();
                (self.events)(&Event::Reloaded { version, checkpoint, sha256, seconds });
            }
            Err(e) => {
                // a file caught mid-write is tried again once it changes;
                // others are not retried until they change either
                if !matches!(e, LoadError::Changed { .. }) {
                    self.failed = stamp;
                }
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                self.metrics.reload(ReloadOutcome::Failed);
                (self.events)(&Event::ReloadFailed { checkpoint, reason: e.to_string(), serving: current.version });
            }
        }
    }
}

/// How often `--watch` looks at the checkpoint by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);
