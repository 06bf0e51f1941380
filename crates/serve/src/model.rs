//! The served model: a policy, what clients may send it and get back
//! ([`Interface`]), and where it came from ([`Provenance`]). A reload
//! builds a new one and swaps it in only when its interface is the same.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use candle_core::Device;
use pmstate_deploy::{Contract, PipelineModel};
use pmstate_policy::served::{self, Model, ModelOptions};
use pmstate_policy::{Policy, PolicyModel};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Abandon, LoadError};
use crate::options::FileLimits;

pub use pmstate_deploy::PIPELINE_MODEL;
pub use pmstate_policy::gpc::served::PRIOR_TOKENS_OUTPUT;
pub use pmstate_policy::served::{Datatype, InputSpec, ModelDescription, OutputSpec, Source, MAX_LOGITS_PER_FORWARD};

/// What clients send and get: the model's [`pmstate_policy::Signature`],
/// the same for every model a server swaps in.
pub type Interface = pmstate_policy::Signature;

/// Where a served model came from, for `/v2/models/<name>/config`.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// The checkpoint (or the label of an in-process policy).
    pub checkpoint: String,
    /// The resolved configs file.
    pub config: Option<String>,
    /// sha256 of the checkpoint's bytes (None for an in-process policy).
    pub sha256: Option<String>,
    /// Its size in bytes.
    pub bytes: Option<u64>,
    /// When it was loaded, seconds since the Unix epoch.
    pub loaded_at_unix: f64,
    /// How long loading took.
    pub load_seconds: f64,
    /// `cpu` or `cuda:0`.
    pub device: String,
}

/// A model ready to serve: any family, behind [`Model`].
pub struct LoadedModel {
    /// The model.
    pub model: Arc<dyn Model>,
    /// 1 for the first model, +1 per reload (the protocol's model version).
    pub version: u64,
    /// What clients send and get (the model's signature).
    pub interface: Interface,
    /// Where it came from.
    pub provenance: Provenance,
    /// Layers, normalizers (settings and counts) and more.
    pub description: ModelDescription,
}

/// What a checkpoint is served as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelKind {
    /// A policy: observations in, actions (and values, discriminator outputs) out.
    #[default]
    Policy,
    /// A deployment pipeline: sensors and reference motion in, PD targets out.
    Pipeline,
}

/// What identifies one state of a file on disk: a change of any part is a new file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    changed_ns: i64,
}

impl FileStamp {
    /// The stamp of `path` now.
    pub fn of(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::from_meta(&std::fs::metadata(path)?))
    }

    /// The stamp of a file's status (an open descriptor's, from `fstat`).
    pub fn from_meta(m: &std::fs::Metadata) -> FileStamp {
        #[cfg(unix)]
        let (inode, changed_ns) = {
            use std::os::unix::fs::MetadataExt;
            (m.ino(), m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (inode, changed_ns) = (0, 0);
        FileStamp { len: m.len(), modified: m.modified().ok(), inode, changed_ns }
    }
}

fn device_name(d: &Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda:0".into(),
        Device::Metal(_) => "metal".into(),
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// When a load in progress must give up: past a deadline, or when the
/// server stops. Checked between the phases of a load and between the
/// chunks of its hash (parsing itself is bounded by the readers' limits).
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    /// Give up after this instant, and the deadline's length for the message.
    pub deadline: Option<(Instant, Duration)>,
    /// Give up once this is set.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Cancel {
    /// Never gives up (start-up: a signal ends the whole process).
    pub fn never() -> Cancel {
        Cancel::default()
    }

    /// `Err` when the load must stop now.
    fn check(&self, path: &Path) -> Result<(), LoadError> {
        let abandoned = |why| Err(LoadError::Abandoned { path: path.display().to_string(), why });
        if self.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            return abandoned(Abandon::ShuttingDown);
        }
        match self.deadline {
            Some((at, len)) if Instant::now() >= at => abandoned(Abandon::Deadline { seconds: len.as_secs_f64() }),
            _ => Ok(()),
        }
    }
}

/// Opens `path` without blocking and checks the open descriptor: a regular
/// file of at most `max` bytes. Nothing has been read when this returns.
fn open_checked(path: &Path, max: u64) -> Result<(std::fs::File, std::fs::Metadata), LoadError> {
    let (file, meta) = pmstate_ckpt::open_regular(path).map_err(|e| LoadError::Policy(e.into()))?;
    if meta.len() > max {
        return Err(LoadError::TooLarge { path: path.display().to_string(), bytes: meta.len(), max });
    }
    Ok((file, meta))
}

/// sha256 of the first `len` bytes of `file` (its size when it was checked:
/// never more, whatever it grows to), giving up when `cancel` says so.
fn sha256_of(file: std::fs::File, len: u64, path: &Path, cancel: &Cancel) -> Result<(String, u64), LoadError> {
    let io = |source| LoadError::Io { path: path.display().to_string(), source };
    let mut f = file.take(len);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        cancel.check(path)?;
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, total))
}

/// The checks every load makes around `build` (which reads the checkpoint
/// with the resolved configs path, and returns that path as the model
/// records it, and the model): both files checked on their open
/// descriptors (regular, within [`FileLimits::max_file_bytes`]) before
/// anything is read, the checkpoint's bytes hashed after, the file checked
/// unchanged across all of it (else [`LoadError::Changed`]).
fn load_checked<T>(
    path: &Path,
    config: Option<&PathBuf>,
    device: &Device,
    files: &FileLimits,
    cancel: &Cancel,
    build: impl FnOnce(&Path) -> Result<(Option<String>, T), LoadError>,
) -> Result<(T, Provenance), LoadError> {
    let start = Instant::now();
    let changed = || LoadError::Changed { path: path.display().to_string() };
    let io = |source| LoadError::Io { path: path.display().to_string(), source };
    let (file, meta) = open_checked(path, files.max_file_bytes)?;
    let before = FileStamp::from_meta(&meta);
    let config_path = pmstate_policy::find_config(path, config.map(|c| c.as_path()))?;
    drop(open_checked(&config_path, files.max_file_bytes)?);
    cancel.check(path)?;
    let (config, model) = build(&config_path)?;
    cancel.check(path)?;
    let (sha256, bytes) = sha256_of(file, before.len, path, cancel)?;
    if FileStamp::of(path).map_err(io)? != before || bytes != before.len {
        return Err(changed());
    }
    let provenance = Provenance {
        checkpoint: path.display().to_string(),
        config,
        sha256: Some(sha256),
        bytes: Some(bytes),
        loaded_at_unix: unix_now(),
        load_seconds: start.elapsed().as_secs_f64(),
        device: device_name(device),
    };
    Ok((model, provenance))
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("model", &self.interface.model)
            .field("version", &self.version)
            .field("provenance", &self.provenance)
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Loads a checkpoint with [`FileLimits::default`] and no deadline; see
    /// [`LoadedModel::load_with`].
    pub fn load(
        path: &Path,
        config: Option<&PathBuf>,
        device: &Device,
        pins: &[(String, usize)],
        version: u64,
    ) -> Result<LoadedModel, LoadError> {
        Self::load_with(path, config, device, pins, version, &FileLimits::default(), &Cancel::never())
    }

    /// Loads a checkpoint, whatever its family ([`served::load`]): both
    /// files checked on their open descriptors (regular, within
    /// [`FileLimits::max_file_bytes`]) before anything is read, the model
    /// built (globals vetted as `files.globals` says), then the
    /// checkpoint's bytes hashed; the file checked unchanged across all of
    /// it (else [`LoadError::Changed`]).
    pub fn load_with(
        path: &Path,
        config: Option<&PathBuf>,
        device: &Device,
        pins: &[(String, usize)],
        version: u64,
        files: &FileLimits,
        cancel: &Cancel,
    ) -> Result<LoadedModel, LoadError> {
        let opts = ModelOptions { globals: files.globals, pins: pins.to_vec() };
        let (model, provenance) = load_checked(path, config, device, files, cancel, |config_path| {
            let model = served::load(path, Some(config_path), device, &opts)?;
            Ok((model.config_path().map(str::to_owned), model))
        })?;
        Ok(Self::of(Arc::from(model), provenance, version))
    }

    /// Loads a checkpoint as a deployment pipeline ([`PipelineModel::load`]),
    /// with the checks and provenance of [`LoadedModel::load_with`]. A
    /// pipeline runs on the CPU.
    pub fn load_pipeline_with(
        path: &Path,
        config: Option<&PathBuf>,
        version: u64,
        files: &FileLimits,
        cancel: &Cancel,
    ) -> Result<LoadedModel, LoadError> {
        let opts = pmstate_policy::LoadOptions { globals: files.globals };
        let (model, provenance) = load_checked(path, config, &Device::Cpu, files, cancel, |config_path| {
            let model = PipelineModel::load(path, Some(config_path), &opts)?;
            Ok((model.config_path().map(str::to_owned), model))
        })?;
        Ok(Self::of(Arc::new(model), provenance, version))
    }

    fn of(model: Arc<dyn Model>, provenance: Provenance, version: u64) -> LoadedModel {
        let interface = model.signature().clone();
        let description = model.description().clone();
        LoadedModel { model, version, interface, provenance, description }
    }

    /// The deployment contract, when a pipeline is served.
    pub fn contract(&self) -> Option<&Contract> {
        self.model.as_any().downcast_ref::<PipelineModel>().map(PipelineModel::contract)
    }

    /// The policy, when a PPO/AMP policy is served (tests compare against it).
    pub fn policy(&self) -> Option<&Policy> {
        self.model.as_any().downcast_ref::<PolicyModel>().map(PolicyModel::policy)
    }

    /// A policy built in process, with the widths `pins` fix.
    pub fn in_process(policy: Policy, label: &str, pins: &[(String, usize)]) -> Result<LoadedModel, LoadError> {
        let model = PolicyModel::new(policy, pins).map_err(LoadError::from)?;
        Ok(Self::of_model(Arc::new(model), label))
    }

    /// A model of any family built in process; `label` stands for its
    /// checkpoint in metadata.
    pub fn of_model(model: Arc<dyn Model>, label: &str) -> LoadedModel {
        let provenance = Provenance {
            checkpoint: label.to_owned(),
            config: None,
            sha256: None,
            bytes: None,
            loaded_at_unix: unix_now(),
            load_seconds: 0.0,
            device: device_name(model.device()),
        };
        Self::of(model, provenance, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PinProblem;
    use pmstate_policy::gpc::served::PriorModel;
    use pmstate_policy::MaskedMimicModel;

    fn policy(variant: &str) -> Policy {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(variant);
        Policy::load(dir.join("last.ckpt"), None, &Device::Cpu).unwrap()
    }

    fn pins(p: &[(&str, usize)]) -> Vec<(String, usize)> {
        p.iter().map(|&(k, w)| (k.to_owned(), w)).collect()
    }

    #[test]
    fn a_masked_mimic_model_takes_no_width_pins() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/masked_mimic");
        let e = LoadedModel::load(&dir.join("last.ckpt"), None, &Device::Cpu, &pins(&[("max_coords_obs", 24)]), 1)
            .err()
            .unwrap();
        assert!(
            matches!(&e, LoadError::Pin { key, problem: PinProblem::NotPinnable { .. } } if key == "max_coords_obs"),
            "{e}"
        );
        let ok = LoadedModel::load(&dir.join("last.ckpt"), None, &Device::Cpu, &[], 1).unwrap();
        assert!(ok.policy().is_none() && ok.model.as_any().downcast_ref::<MaskedMimicModel>().is_some());
        assert_eq!(ok.interface.input("vae_noise").map(|i| (i.optional, i.width)), Some((true, Some(8))));
    }

    /// A GPC prior: no pins; its forwards hold at most MAX_LOGITS_PER_FORWARD logits.
    #[test]
    fn a_gpc_prior_bounds_its_rows_by_its_logits() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/gpc_prior");
        let ckpt = dir.join("inference_last.ckpt");
        let e = LoadedModel::load(&ckpt, None, &Device::Cpu, &pins(&[("max_coords_obs", 343)]), 1).err().unwrap();
        assert!(matches!(&e, LoadError::Pin { problem: PinProblem::NotPinnable { .. }, .. }), "{e}");
        let m = LoadedModel::load(&ckpt, None, &Device::Cpu, &[], 1).unwrap();
        assert!(m.model.as_any().downcast_ref::<PriorModel>().is_some() && m.policy().is_none());
        let per_row = 20 * 81;
        assert_eq!(m.interface.logits_per_row, Some(per_row));
        assert_eq!(m.interface.max_rows(256), 256);
        assert_eq!(m.interface.max_rows(1 << 20), MAX_LOGITS_PER_FORWARD / per_row);
        let tokens = m.interface.input("prior_tokens").unwrap();
        assert_eq!(
            (tokens.datatype, tokens.optional, tokens.int_below, tokens.width),
            (Datatype::Int64, true, Some(81), Some(20))
        );
    }

    fn pin_problem(policy: &Policy, p: &[(&str, usize)]) -> (String, PinProblem) {
        match LoadedModel::in_process(policy.clone(), "test", &pins(p)) {
            Err(LoadError::Pin { key, problem }) => (key, problem),
            other => panic!("{p:?}: expected a pin error, got {other:?}"),
        }
    }

    /// The smpl tracker's checkpoint, loaded with `files` and `cancel`.
    fn load_tracker(files: &FileLimits, cancel: &Cancel) -> Result<LoadedModel, LoadError> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/smpl_tracker");
        LoadedModel::load_with(&dir.join("last.ckpt"), None, &Device::Cpu, &[], 1, files, cancel)
    }

    #[test]
    fn a_load_stops_at_the_size_limit_the_deadline_or_a_shutdown() {
        let ok = load_tracker(&FileLimits::default(), &Cancel::never()).unwrap();
        let bytes = ok.provenance.bytes.unwrap();
        assert_eq!(ok.provenance.sha256.as_ref().map(String::len), Some(64));

        let small = FileLimits { max_file_bytes: bytes - 1, ..FileLimits::default() };
        let e = load_tracker(&small, &Cancel::never()).err().unwrap();
        assert!(matches!(&e, LoadError::TooLarge { bytes: b, max, .. } if *b == bytes && *max == bytes - 1), "{e}");
        // exactly at the limit loads
        let exact = FileLimits { max_file_bytes: bytes, ..FileLimits::default() };
        assert_eq!(load_tracker(&exact, &Cancel::never()).unwrap().provenance.sha256, ok.provenance.sha256);

        let past = Cancel { deadline: Some((Instant::now(), Duration::from_secs(3))), stop: None };
        let e = load_tracker(&FileLimits::default(), &past).err().unwrap();
        assert!(
            matches!(&e, LoadError::Abandoned { why: Abandon::Deadline { seconds }, .. } if *seconds == 3.0),
            "{e}"
        );
        assert!(e.to_string().ends_with("still running after the reload deadline of 3 s"), "{e}");

        let stopping = Cancel { deadline: None, stop: Some(Arc::new(AtomicBool::new(true))) };
        let e = load_tracker(&FileLimits::default(), &stopping).err().unwrap();
        assert!(matches!(&e, LoadError::Abandoned { why: Abandon::ShuttingDown, .. }), "{e}");
    }

    #[test]
    fn pins_fill_the_open_widths_or_say_what_contradicts_them() {
        // smpl tracker: the three widths are open, their sum (1003) fixed by the actor's first Linear
        let smpl = policy("smpl_tracker");
        let m = LoadedModel::in_process(
            smpl.clone(),
            "test",
            &pins(&[("max_coords_obs", 358), ("mimic_target_poses", 576)]),
        )
        .unwrap();
        assert_eq!(m.interface.input("previous_actions").and_then(|i| i.width), Some(69));

        let (key, problem) = pin_problem(&smpl, &[("nope", 3)]);
        assert_eq!(key, "nope");
        assert!(matches!(&problem, PinProblem::NotAnInput { inputs } if inputs.len() == 3), "{problem}");

        let (key, problem) = pin_problem(&smpl, &[("max_coords_obs", 1002), ("mimic_target_poses", 1)]);
        assert_eq!(key, "max_coords_obs");
        assert!(
            matches!(&problem, PinProblem::NoColumnLeft { total: 1003, fixed: 1003, parts, .. }
                if parts == &[Some(1002), Some(1), None]),
            "{problem}"
        );
        assert!(problem.to_string().ends_with("the pins already take 1003 (1002 + 1 + ?)"), "{problem}");

        let (_, problem) =
            pin_problem(&smpl, &[("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 70)]);
        assert!(
            matches!(&problem, PinProblem::SumMismatch { parts, sum: 1004, total: 1003, .. } if parts == &[358, 576, 70]),
            "{problem}"
        );
        assert!(problem.to_string().contains("reads 358 + 576 + 70 = 1004 columns"), "{problem}");

        // container: obs_a's width is fixed by its own normalizer
        let container = policy("container_obsprocessor");
        let (key, problem) = pin_problem(&container, &[("obs_a", 7)]);
        assert_eq!(key, "obs_a");
        assert_eq!(problem, PinProblem::Contradicts { pinned: 7, fixed: 6 });
        assert_eq!(LoadError::Pin { key, problem }.to_string(), "--width obs_a: 7, but the checkpoint fixes 6");
    }
}
