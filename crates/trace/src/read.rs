//! Reading and validating pm-trace v1 files.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::doc::{Document, Names, Probe, StateDoc, StepDoc};
use crate::error::{Dims, FieldProblem, Result, TraceError, TraceLimit};
use crate::model::*;

/// The largest world size a trace may declare. Each rank needs its own
/// names in every update step, so a larger world is also a larger file;
/// replaying in one process has its own, smaller bound
/// ([`crate::MAX_INPROC_WORLD_SIZE`]).
pub const MAX_WORLD_SIZE: usize = 4096;

/// Reads and validates a trace file. Only regular files are read (a FIFO
/// or device would never end), and no more than the size the file system
/// reports for them.
pub fn read_file(path: &Path) -> Result<Trace> {
    let shown = || path.display().to_string();
    let io = |source| TraceError::Io { path: shown(), source };
    // Opened without blocking (a FIFO returns at once) and checked on the
    // open descriptor, not the path: a FIFO renamed over the path between a
    // check and the open is caught. pmstate-ckpt's `open_regular` does the
    // same; the crates do not depend on each other.
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(TraceError::NotAFile { path: shown(), kind: file_kind(&meta) });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(meta.len()).read_to_end(&mut bytes).map_err(io)?;
    read_bytes(&bytes)
}

/// What a non-regular file is, in words.
///
/// The same words as `pmstate-ckpt`'s `io::source::file_kind`: the two crates do not
/// depend on each other, and `pmstate-norm`, the one crate below both,
/// knows nothing of files, so each keeps its copy.
pub(crate) fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Reads and validates a trace from the bytes of a safetensors file.
///
/// Every structural problem is a [`TraceError`] naming the step and field;
/// no input makes it panic. A tensor named by many fields is loaded once.
pub fn read_bytes(bytes: &[u8]) -> Result<Trace> {
    refuse_duplicate_keys(bytes)?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(TraceError::Container)?;
    let st = SafeTensors::deserialize(bytes).map_err(TraceError::Container)?;
    let md = meta.metadata().as_ref().ok_or(TraceError::NotATrace("no __metadata__"))?;
    if md.get("format").map(String::as_str) != Some("pm-trace") {
        return Err(TraceError::NotATrace("__metadata__ has no \"format\": \"pm-trace\""));
    }
    let text = md.get("trace").ok_or(TraceError::NotATrace("__metadata__ has no \"trace\" document"))?;
    let probe: Probe = serde_json::from_str(text).map_err(TraceError::Json)?;
    if probe.format.as_deref() != Some("pm-trace") {
        return Err(header("format", FieldProblem::NotPmTrace));
    }
    match probe.version {
        Some(1) => {}
        Some(v) => return Err(TraceError::Version(v)),
        None => return Err(header("version", FieldProblem::Missing)),
    }
    let doc: Document<Value> = serde_json::from_str(text).map_err(TraceError::Json)?;
    let module = module_spec(&doc, bytes.len())?;
    let world = usize::try_from(doc.world_size).unwrap_or(usize::MAX);
    if world == 0 || world > MAX_WORLD_SIZE {
        let problem = FieldProblem::OutOfRange { value: doc.world_size, min: 1, max: MAX_WORLD_SIZE as u64 };
        return Err(header("world_size", problem));
    }
    let tensors = Tensors { st: &st, loaded: RefCell::new(HashMap::new()) };
    let mut steps = Vec::with_capacity(doc.steps.len());
    for (i, raw) in doc.steps.into_iter().enumerate() {
        steps.push(parse_step(i, raw, &tensors, world)?);
    }
    let r = doc.reference;
    Ok(Trace {
        description: doc.description,
        reference: Reference {
            implementation: r.implementation,
            source: r.source,
            torch: r.torch,
            device: r.device,
            dist_backend: r.dist_backend,
        },
        module,
        world_size: world,
        steps,
    })
}

/// A name given twice in a safetensors header.
enum Duplicate {
    Tensor(String),
    Metadata(String),
}

/// The first name a safetensors header gives twice, at its top level (a
/// tensor) or in its `__metadata__` object; the values are skipped unread.
struct HeaderKeys(Option<Duplicate>);

/// The first key given twice in one JSON object, values skipped.
struct ObjectKeys(Option<String>);

impl<'de> serde::Deserialize<'de> for ObjectKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ObjectKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<ObjectKeys, A::Error> {
                let (mut seen, mut dup) = (std::collections::HashSet::new(), None);
                while let Some(k) = map.next_key::<String>()? {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    if !seen.insert(k.clone()) && dup.is_none() {
                        dup = Some(k);
                    }
                }
                Ok(ObjectKeys(dup))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> serde::Deserialize<'de> for HeaderKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = HeaderKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a safetensors header (a JSON object)")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<HeaderKeys, A::Error> {
                let (mut seen, mut dup) = (std::collections::HashSet::new(), None);
                while let Some(k) = map.next_key::<String>()? {
                    let inner = if k == "__metadata__" {
                        map.next_value::<ObjectKeys>()?.0.map(Duplicate::Metadata)
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        None
                    };
                    let again = (!seen.insert(k.clone())).then_some(Duplicate::Tensor(k));
                    dup = dup.or(again).or(inner);
                }
                Ok(HeaderKeys(dup))
            }
        }
        d.deserialize_map(V)
    }
}

/// The largest header the safetensors crate reads (larger ones it refuses itself).
const MAX_HEADER_BYTES: usize = 100_000_000;

/// Refuses a header that names a tensor, `__metadata__` or a
/// `__metadata__` key twice: the safetensors crate parses headers into hash
/// maps and keeps one of the two values, where another reader may keep the
/// other. A header that is not a JSON object is left to the crate to report.
fn refuse_duplicate_keys(bytes: &[u8]) -> Result<()> {
    let len = bytes.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let text = len
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= MAX_HEADER_BYTES)
        .and_then(|n| bytes.get(8..8 + n))
        .and_then(|h| std::str::from_utf8(h).ok());
    let Some(Ok(keys)) = text.map(serde_json::from_str::<HeaderKeys>) else { return Ok(()) };
    let what = match keys.0 {
        None => return Ok(()),
        Some(Duplicate::Tensor(k)) if k == "__metadata__" => k,
        Some(Duplicate::Tensor(k)) => format!("tensor '{k}'"),
        Some(Duplicate::Metadata(k)) => format!("__metadata__ key '{k}'"),
    };
    Err(header("safetensors header", FieldProblem::DuplicateKey(what)))
}

fn header(field: &'static str, problem: FieldProblem) -> TraceError {
    TraceError::Header { field, problem }
}

/// The module's constructor arguments; its buffers may not be larger than
/// the file that records them (a lazy shape is bounded by the first input).
fn module_spec(doc: &Document<Value>, file_len: usize) -> Result<ModuleSpec> {
    let m = &doc.module;
    let class = m.class;
    if class == ModuleClass::RewardRunningMeanStd && m.gamma.is_none() {
        return Err(header("module.gamma", FieldProblem::RequiredFor("RewardRunningMeanStd")));
    }
    let shape = match &m.shape {
        None => None,
        Some(dims) => {
            let dims: Vec<usize> = dims.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
            let elems = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
            // f64 mean and var: 16 bytes per element, which the file itself must be able to hold.
            let max = (file_len / 16).max(1 << 16);
            match elems {
                Some(n) if n <= max => {}
                _ => {
                    return Err(TraceError::Limit {
                        limit: TraceLimit::ModuleShape { shape: dims },
                        max: max as u64,
                        needed: elems.map_or(u64::MAX, |n| n as u64),
                    })
                }
            }
            Some(dims)
        }
    };
    Ok(ModuleSpec {
        class,
        shape,
        epsilon: m.epsilon,
        clamp_value: m.clamp_value,
        ema_decay: m.ema_decay,
        gamma: m.gamma,
    })
}

/// The file's tensors, each loaded at most once however many fields name it.
struct Tensors<'a, 'b> {
    st: &'a SafeTensors<'b>,
    loaded: RefCell<HashMap<String, Tensor>>,
}

impl Tensors<'_, '_> {
    fn get(&self, name: &str) -> std::result::Result<Tensor, FieldProblem> {
        if let Some(t) = self.loaded.borrow().get(name) {
            return Ok(t.clone());
        }
        let v = self.st.tensor(name).map_err(|_| FieldProblem::NoSuchTensor(name.to_owned()))?;
        let dtype = match v.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F64 => DType::F64,
            Dtype::I64 => DType::I64,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            Dtype::U8 | Dtype::BOOL => DType::U8,
            Dtype::I32 => DType::I32,
            other => {
                return Err(FieldProblem::WrongTensor {
                    found: format!("dtype {other}"),
                    expected: "a dtype traces use (F32, F64, F16, BF16, I64, I32, U8, BOOL)",
                })
            }
        };
        let t = Tensor::from_raw_buffer(v.data(), dtype, v.shape(), &Device::Cpu)
            .map_err(|e| FieldProblem::BadTensor { name: name.to_owned(), source: Box::new(e) })?;
        self.loaded.borrow_mut().insert(name.to_owned(), t.clone());
        Ok(t)
    }
}

/// What a field's tensor must be.
#[derive(Clone, Copy)]
enum Kind {
    /// Any float dtype.
    Float,
    F32,
    F64,
    /// An I64 of shape [].
    Count,
    /// A mask: BOOL/U8 or any float.
    Mask,
}

impl Kind {
    fn accepts(self, t: &Tensor) -> bool {
        match self {
            Kind::Float => t.dtype().is_float(),
            Kind::F32 => t.dtype() == DType::F32,
            Kind::F64 => t.dtype() == DType::F64,
            Kind::Count => t.dtype() == DType::I64 && t.rank() == 0,
            Kind::Mask => t.dtype() == DType::U8 || t.dtype().is_float(),
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Kind::Float => "a float tensor",
            Kind::F32 => "an F32 tensor",
            Kind::F64 => "an F64 tensor",
            Kind::Count => "an I64 tensor of shape []",
            Kind::Mask => "a BOOL, U8 or float tensor",
        }
    }
}

/// One step being read: errors name it and the field.
struct Ctx<'a, 'b, 'c> {
    step: usize,
    op: &'static str,
    t: &'a Tensors<'b, 'c>,
    world: usize,
}

impl Ctx<'_, '_, '_> {
    fn err(&self, field: impl Into<String>, problem: FieldProblem) -> TraceError {
        TraceError::Field { step: self.step, op: self.op.to_owned(), field: field.into(), problem }
    }

    fn load(&self, field: &str, name: &str, kind: Kind) -> Result<Tensor> {
        let t = self.t.get(name).map_err(|p| self.err(field, p))?;
        if !kind.accepts(&t) {
            let found = format!("{} of shape {}", t.dtype().as_str(), Dims(t.dims()));
            return Err(self.err(field, FieldProblem::WrongTensor { found, expected: kind.expected() }));
        }
        Ok(t)
    }

    fn one(&self, field: &str, names: &Option<Names>, kind: Kind) -> Result<Tensor> {
        match names {
            Some(Names::One(n)) => self.load(field, n, kind),
            Some(Names::Many(_)) => Err(self.err(field, FieldProblem::ExpectedOneName)),
            None => Err(self.err(field, FieldProblem::Missing)),
        }
    }

    fn list(&self, field: &str, names: &Option<Names>, kind: Kind) -> Result<Vec<Tensor>> {
        match names {
            Some(Names::Many(ns)) => {
                ns.iter().enumerate().map(|(i, n)| self.load(&format!("{field}[{i}]"), n, kind)).collect()
            }
            Some(Names::One(_)) => Err(self.err(field, FieldProblem::ExpectedNameList)),
            None => Err(self.err(field, FieldProblem::Missing)),
        }
    }

    /// A per-rank list: one name per rank, index = rank.
    fn per_rank(&self, field: &str, names: &Option<Names>, kind: Kind) -> Result<Vec<Tensor>> {
        if let Some(Names::Many(ns)) = names {
            if ns.len() != self.world {
                return Err(self.err(field, FieldProblem::RankCount { found: ns.len(), world_size: self.world }));
            }
        }
        self.list(field, names, kind)
    }

    fn count(&self, field: &str, t: &Tensor) -> Result<i64> {
        t.to_scalar::<i64>().map_err(|e| self.err(field, FieldProblem::Candle(Box::new(e))))
    }

    fn same_shape(&self, field: &str, t: &Tensor, other: &'static str, o: &Tensor) -> Result<()> {
        if t.dims() == o.dims() {
            return Ok(());
        }
        let problem = FieldProblem::ShapeMismatch { found: t.dims().to_vec(), other, expected: o.dims().to_vec() };
        Err(self.err(field, problem))
    }

    fn state(&self, s: &Option<StateDoc>) -> Result<NormState> {
        let s = s.as_ref().ok_or_else(|| self.err("state", FieldProblem::Missing))?;
        let mean = self.load("state.mean", &s.mean, Kind::F64)?;
        let var = self.load("state.var", &s.var, Kind::F64)?;
        let count_t = self.load("state.count", &s.count, Kind::Count)?;
        self.same_shape("state.var", &var, "state.mean", &mean)?;
        Ok(NormState { mean, var, count: self.count("state.count", &count_t)? })
    }

    fn update(&self, d: &StepDoc) -> Result<UpdateResult> {
        let means = self.per_rank("batch_mean", &d.batch_mean, Kind::Float)?;
        let vars = self.per_rank("batch_var", &d.batch_var, Kind::Float)?;
        let counts = self.per_rank("batch_count", &d.batch_count, Kind::Count)?;
        let mut batch = Vec::with_capacity(means.len());
        for (r, ((mean, var), c)) in means.into_iter().zip(vars).zip(counts).enumerate() {
            self.same_shape(&format!("batch_var[{r}]"), &var, "batch_mean", &mean)?;
            batch.push(Moments { mean, var, count: self.count(&format!("batch_count[{r}]"), &c)? });
        }
        let combined = if self.world == 1 {
            None
        } else {
            let mean = self.one("combined_mean", &d.combined_mean, Kind::Float)?;
            let var = self.one("combined_var", &d.combined_var, Kind::Float)?;
            let c = self.one("combined_count", &d.combined_count, Kind::Count)?;
            Some(Moments { mean, var, count: self.count("combined_count", &c)? })
        };
        Ok(UpdateResult { batch, combined, state: self.state(&d.state)? })
    }
}

fn parse_step(i: usize, raw: Value, t: &Tensors<'_, '_>, world: usize) -> Result<Step> {
    let shown_op = raw.get("op").and_then(Value::as_str).unwrap_or("?").to_owned();
    let field_err =
        |field: &str, problem| TraceError::Field { step: i, op: shown_op.clone(), field: field.into(), problem };
    let op: OpKind = match raw.get("op") {
        None | Some(Value::Null) => return Err(field_err("op", FieldProblem::Missing)),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|_| field_err("op", FieldProblem::UnknownOp(v.to_string())))?
        }
    };
    let d: StepDoc = serde_json::from_value(raw).map_err(|e| field_err("<step>", FieldProblem::Json(e)))?;
    let c = Ctx { step: i, op: op.name(), t, world };
    let ok = d.error.is_none();
    let op = match op {
        OpKind::RecordMoments => {
            let x = c.per_rank("x", &d.x, Kind::Float)?;
            Op::RecordMoments { x, result: if ok { Some(c.update(&d)?) } else { None } }
        }
        OpKind::RecordReward => {
            let reward = c.per_rank("reward", &d.reward, Kind::Float)?;
            let terminated = c.per_rank("terminated", &d.terminated, Kind::Mask)?;
            let result = if ok {
                Some((c.per_rank("discounted_reward", &d.discounted_reward, Kind::Float)?, c.update(&d)?))
            } else {
                None
            };
            Op::RecordReward { reward, terminated, result }
        }
        OpKind::Normalize => {
            let x = c.one("x", &d.x, Kind::Float)?;
            let direction = match d.un_norm {
                Some(false) => Direction::Normalize,
                Some(true) => Direction::UnNormalize,
                None => return Err(c.err("un_norm", FieldProblem::Missing)),
            };
            let result = if ok {
                let out = c.one("out", &d.out, Kind::Float)?;
                let std = c.one("std", &d.std, Kind::F32)?;
                let state = c.state(&d.state)?;
                c.same_shape("std", &std, "state.mean", &state.mean)?;
                Some(NormalizeResult { out, std, state })
            } else {
                None
            };
            Op::Normalize { x, direction, result }
        }
        OpKind::LoadStateDict => Op::LoadStateDict { state: c.state(&d.state)? },
        OpKind::SetEmaDecay => {
            let ema_decay = d.ema_decay.ok_or_else(|| c.err("ema_decay", FieldProblem::Missing))?;
            let state = if d.state.is_some() { Some(c.state(&d.state)?) } else { None };
            Op::SetEmaDecay { ema_decay, state }
        }
        OpKind::CombineMoments => {
            let means = c.list("means", &d.means, Kind::Float)?;
            let vars = c.list("vars", &d.vars, Kind::Float)?;
            if means.len() != vars.len() || means.is_empty() {
                return Err(c.err("vars", FieldProblem::PartCounts { means: means.len(), vars: vars.len() }));
            }
            let Some(Names::One(counts_name)) = &d.counts else {
                return Err(c.err("counts", FieldProblem::Missing));
            };
            let ct = c.t.get(counts_name).map_err(|p| c.err("counts", p))?;
            if ct.dtype() != DType::I64 || ct.dims() != [means.len()] {
                let found = format!("{} of shape {}", ct.dtype().as_str(), Dims(ct.dims()));
                return Err(c.err("counts", FieldProblem::WrongTensor { found, expected: "an I64 tensor [k]" }));
            }
            let counts = ct.to_vec1::<i64>().map_err(|e| c.err("counts", FieldProblem::Candle(Box::new(e))))?;
            let result = if ok {
                let mean = c.one("mean", &d.mean, Kind::Float)?;
                let var = c.one("var", &d.var, Kind::Float)?;
                let ct = c.one("count", &d.count, Kind::Count)?;
                Some(Moments { mean, var, count: c.count("count", &ct)? })
            } else {
                None
            };
            Op::CombineMoments { means, vars, counts, result }
        }
    };
    Ok(Step { op, error: d.error })
}
