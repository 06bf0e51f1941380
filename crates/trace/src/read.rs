//! Reading and validating pm-trace v1 files.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::error::{Result, TraceError};
use crate::model::*;

/// Reads and validates a trace file.
pub fn read_file(path: &Path) -> Result<Trace> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
    read_bytes(&bytes)
}

/// Reads and validates a trace from the bytes of a safetensors file.
///
/// Every structural problem is a [`TraceError`] naming the step and field;
/// no input makes it panic.
pub fn read_bytes(bytes: &[u8]) -> Result<Trace> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| TraceError::Container(e.to_string()))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| TraceError::Container(e.to_string()))?;
    let md = meta.metadata().as_ref().ok_or_else(|| TraceError::Metadata("missing (no __metadata__)".into()))?;
    match md.get("format").map(String::as_str) {
        Some("pm-trace") => {}
        other => return Err(TraceError::Metadata(format!("format is {other:?}, expected \"pm-trace\""))),
    }
    let text = md.get("trace").ok_or_else(|| TraceError::Metadata("no \"trace\" key".into()))?;
    let doc: Value = serde_json::from_str(text).map_err(|e| TraceError::Json(e.to_string()))?;
    let tensors = Tensors { st: &st };
    parse_doc(&doc, &tensors)
}

struct Tensors<'a, 'b> {
    st: &'a SafeTensors<'b>,
}

impl Tensors<'_, '_> {
    fn get(&self, name: &str) -> std::result::Result<Tensor, String> {
        let v = self.st.tensor(name).map_err(|_| format!("tensor {name:?} is not in the file"))?;
        let dtype = match v.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F64 => DType::F64,
            Dtype::I64 => DType::I64,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            Dtype::U8 | Dtype::BOOL => DType::U8,
            Dtype::I32 => DType::I32,
            other => return Err(format!("tensor {name:?} has dtype {other:?}, which traces do not use")),
        };
        Tensor::from_raw_buffer(v.data(), dtype, v.shape(), &Device::Cpu).map_err(|e| format!("tensor {name:?}: {e}"))
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

struct Ctx<'a, 'b, 'c> {
    step: usize,
    op: String,
    v: &'a Value,
    t: &'a Tensors<'b, 'c>,
    world: usize,
}

impl Ctx<'_, '_, '_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> TraceError {
        TraceError::Field { step: self.step, op: self.op.clone(), field: field.into(), reason: reason.into() }
    }

    fn has(&self, field: &str) -> bool {
        self.v.get(field).is_some_and(|f| !f.is_null())
    }

    fn check(&self, field: &str, t: Tensor, kind: Kind) -> Result<Tensor> {
        let ok = match kind {
            Kind::Float => t.dtype().is_float(),
            Kind::F32 => t.dtype() == DType::F32,
            Kind::F64 => t.dtype() == DType::F64,
            Kind::Count => t.dtype() == DType::I64 && t.rank() == 0,
            Kind::Mask => t.dtype() == DType::U8 || t.dtype().is_float(),
        };
        if !ok {
            let want = match kind {
                Kind::Float => "a float tensor",
                Kind::F32 => "an F32 tensor",
                Kind::F64 => "an F64 tensor",
                Kind::Count => "an I64 tensor of shape []",
                Kind::Mask => "a BOOL, U8 or float tensor",
            };
            return Err(self.err(field, format!("{:?} of shape {:?}; expected {want}", t.dtype(), t.dims())));
        }
        Ok(t)
    }

    fn name_of<'v>(&self, field: &str, v: Option<&'v Value>) -> Result<&'v str> {
        v.and_then(Value::as_str).ok_or_else(|| self.err(field, "missing, or not a tensor name (string)"))
    }

    fn raw(&self, field: &str) -> Result<Tensor> {
        let name = self.name_of(field, self.v.get(field))?;
        self.t.get(name).map_err(|e| self.err(field, e))
    }

    fn tensor(&self, field: &str, kind: Kind) -> Result<Tensor> {
        let t = self.raw(field)?;
        self.check(field, t, kind)
    }

    /// A list of tensor names, each checked as `kind`.
    fn list(&self, field: &str, kind: Kind) -> Result<Vec<Tensor>> {
        let list = self
            .v
            .get(field)
            .and_then(Value::as_array)
            .ok_or_else(|| self.err(field, "missing, or not a list of tensor names"))?;
        list.iter()
            .enumerate()
            .map(|(i, n)| {
                let f = format!("{field}[{i}]");
                let name = self.name_of(&f, Some(n))?;
                let t = self.t.get(name).map_err(|e| self.err(&f, e))?;
                self.check(&f, t, kind)
            })
            .collect()
    }

    /// A per-rank list: one name per rank, index = rank.
    fn per_rank(&self, field: &str, kind: Kind) -> Result<Vec<Tensor>> {
        let n = self.v.get(field).and_then(Value::as_array).map_or(0, Vec::len);
        if n != self.world {
            return Err(self.err(field, format!("{n} names for world size {}: need one per rank", self.world)));
        }
        self.list(field, kind)
    }

    fn count(&self, field: &str, t: &Tensor) -> Result<i64> {
        t.to_scalar::<i64>().map_err(|e| self.err(field, e.to_string()))
    }

    fn state(&self) -> Result<State> {
        let s = self.v.get("state").ok_or_else(|| self.err("state", "missing"))?;
        let sub = Ctx { step: self.step, op: self.op.clone(), v: s, t: self.t, world: self.world };
        let mean = sub.tensor("mean", Kind::F64).map_err(|e| rename(e, "state."))?;
        let var = sub.tensor("var", Kind::F64).map_err(|e| rename(e, "state."))?;
        let count_t = sub.tensor("count", Kind::Count).map_err(|e| rename(e, "state."))?;
        if mean.dims() != var.dims() {
            return Err(
                self.err("state.var", format!("shape {:?} differs from state.mean's {:?}", var.dims(), mean.dims()))
            );
        }
        let count = self.count("state.count", &count_t)?;
        Ok(State { mean, var, count })
    }

    fn moments(&self) -> Result<Vec<RecordedMoments>> {
        let means = self.per_rank("batch_mean", Kind::Float)?;
        let vars = self.per_rank("batch_var", Kind::Float)?;
        let counts = self.per_rank("batch_count", Kind::Count)?;
        means
            .into_iter()
            .zip(vars)
            .zip(counts)
            .enumerate()
            .map(|(r, ((mean, var), c))| {
                if mean.dims() != var.dims() {
                    return Err(self.err(
                        &format!("batch_var[{r}]"),
                        format!("shape {:?} differs from batch_mean's {:?}", var.dims(), mean.dims()),
                    ));
                }
                Ok(RecordedMoments { mean, var, count: self.count(&format!("batch_count[{r}]"), &c)? })
            })
            .collect()
    }

    fn combined(&self) -> Result<Option<RecordedMoments>> {
        if self.world == 1 {
            return Ok(None);
        }
        let mean = self.tensor("combined_mean", Kind::Float)?;
        let var = self.tensor("combined_var", Kind::Float)?;
        let c = self.tensor("combined_count", Kind::Count)?;
        Ok(Some(RecordedMoments { mean, var, count: self.count("combined_count", &c)? }))
    }

    fn update(&self) -> Result<UpdateResult> {
        Ok(UpdateResult { batch: self.moments()?, combined: self.combined()?, state: self.state()? })
    }
}

fn rename(e: TraceError, prefix: &str) -> TraceError {
    match e {
        TraceError::Field { step, op, field, reason } => {
            TraceError::Field { step, op, field: format!("{prefix}{field}"), reason }
        }
        e => e,
    }
}

fn header_err(field: &str, reason: impl Into<String>) -> TraceError {
    TraceError::Header { field: field.into(), reason: reason.into() }
}

fn opt_f64(v: &Value, field: &str) -> Result<Option<f64>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| header_err(field, format!("{x} is not a number or null"))),
    }
}

fn string(v: &Value, field: &str) -> Result<String> {
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| header_err(field, "missing, or not a string"))
}

fn parse_doc(doc: &Value, t: &Tensors<'_, '_>) -> Result<Trace> {
    if doc.get("format").and_then(Value::as_str) != Some("pm-trace") {
        return Err(header_err("format", "missing, or not \"pm-trace\""));
    }
    let version = doc
        .get("version")
        .and_then(Value::as_u64)
        .ok_or_else(|| header_err("version", "missing, or not an integer"))?;
    if version != 1 {
        return Err(TraceError::Version(version));
    }
    let r = doc.get("reference").ok_or_else(|| header_err("reference", "missing"))?;
    let reference = Reference {
        implementation: string(r, "implementation").map_err(|e| rename_header(e, "reference."))?,
        source: string(r, "source").map_err(|e| rename_header(e, "reference."))?,
        torch: string(r, "torch").map_err(|e| rename_header(e, "reference."))?,
        device: string(r, "device").map_err(|e| rename_header(e, "reference."))?,
        dist_backend: r.get("dist_backend").and_then(Value::as_str).map(str::to_string),
    };
    let m = doc.get("module").ok_or_else(|| header_err("module", "missing"))?;
    let class = match m.get("class").and_then(Value::as_str) {
        Some("RunningMeanStd") => ModuleClass::RunningMeanStd,
        Some("RewardRunningMeanStd") => ModuleClass::RewardRunningMeanStd,
        other => {
            return Err(header_err(
                "module.class",
                format!("{other:?}: expected RunningMeanStd or RewardRunningMeanStd"),
            ))
        }
    };
    let shape = match m.get("shape") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|d| {
                    d.as_u64()
                        .map(|d| d as usize)
                        .ok_or_else(|| header_err("module.shape", format!("{d} is not a size")))
                })
                .collect::<Result<Vec<_>>>()?,
        ),
        Some(x) => return Err(header_err("module.shape", format!("{x} is not null or a list"))),
    };
    let epsilon = opt_f64(m, "epsilon")?.ok_or_else(|| header_err("module.epsilon", "missing"))?;
    let module = ModuleSpec {
        class,
        shape,
        epsilon,
        clamp_value: opt_f64(m, "clamp_value")?,
        ema_decay: opt_f64(m, "ema_decay")?,
        gamma: opt_f64(m, "gamma")?,
    };
    if class == ModuleClass::RewardRunningMeanStd && module.gamma.is_none() {
        return Err(header_err("module.gamma", "RewardRunningMeanStd needs a number"));
    }
    let world = doc
        .get("world_size")
        .and_then(Value::as_u64)
        .ok_or_else(|| header_err("world_size", "missing, or not an integer"))? as usize;
    if world == 0 || world > 4096 {
        return Err(header_err("world_size", format!("{world} is not in 1..=4096")));
    }
    let raw_steps =
        doc.get("steps").and_then(Value::as_array).ok_or_else(|| header_err("steps", "missing, or not a list"))?;
    let mut steps = Vec::with_capacity(raw_steps.len());
    for (i, s) in raw_steps.iter().enumerate() {
        steps.push(parse_step(i, s, t, world)?);
    }
    Ok(Trace {
        description: doc.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
        reference,
        module,
        world_size: world,
        steps,
    })
}

fn rename_header(e: TraceError, prefix: &str) -> TraceError {
    match e {
        TraceError::Header { field, reason } => TraceError::Header { field: format!("{prefix}{field}"), reason },
        e => e,
    }
}

fn parse_step(i: usize, s: &Value, t: &Tensors<'_, '_>, world: usize) -> Result<Step> {
    let op = s.get("op").and_then(Value::as_str).ok_or_else(|| TraceError::Field {
        step: i,
        op: "?".into(),
        field: "op".into(),
        reason: "missing, or not a string".into(),
    })?;
    let c = Ctx { step: i, op: op.to_string(), v: s, t, world };
    let error = match s.get("error") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => Some(e.clone()),
        Some(x) => return Err(c.err("error", format!("{x} is not a string"))),
    };
    let ok = error.is_none();
    let op = match op {
        "record_moments" => {
            let x = c.per_rank("x", Kind::Float)?;
            Op::RecordMoments { x, result: if ok { Some(c.update()?) } else { None } }
        }
        "record_reward" => {
            let reward = c.per_rank("reward", Kind::Float)?;
            let terminated = c.per_rank("terminated", Kind::Mask)?;
            let result = if ok { Some((c.per_rank("discounted_reward", Kind::Float)?, c.update()?)) } else { None };
            Op::RecordReward { reward, terminated, result }
        }
        "normalize" => {
            let x = c.tensor("x", Kind::Float)?;
            let un_norm =
                s.get("un_norm").and_then(Value::as_bool).ok_or_else(|| c.err("un_norm", "missing, or not a bool"))?;
            let result = if ok {
                let out = c.tensor("out", Kind::Float)?;
                let std = c.tensor("std", Kind::F32)?;
                let state = c.state()?;
                if std.dims() != state.mean.dims() {
                    return Err(
                        c.err("std", format!("shape {:?}; the module's is {:?}", std.dims(), state.mean.dims()))
                    );
                }
                Some(NormalizeResult { out, std, state })
            } else {
                None
            };
            Op::Normalize { x, un_norm, result }
        }
        "load_state_dict" => Op::LoadStateDict { state: c.state()? },
        "set_ema_decay" => {
            let ema_decay = match s.get("ema_decay") {
                None => return Err(c.err("ema_decay", "missing (null or a number)")),
                Some(Value::Null) => None,
                Some(v) => Some(v.as_f64().ok_or_else(|| c.err("ema_decay", format!("{v} is not a number")))?),
            };
            Op::SetEmaDecay { ema_decay, state: if c.has("state") { Some(c.state()?) } else { None } }
        }
        "combine_moments" => {
            let means = c.list("means", Kind::Float)?;
            let vars = c.list("vars", Kind::Float)?;
            if means.len() != vars.len() || means.is_empty() {
                return Err(c.err(
                    "vars",
                    format!("{} means and {} vars: need the same number, at least 1", means.len(), vars.len()),
                ));
            }
            let ct = c.raw("counts")?;
            if ct.dtype() != DType::I64 || ct.dims() != [means.len()] {
                return Err(c.err(
                    "counts",
                    format!("{:?} of shape {:?}; expected I64 of shape [{}]", ct.dtype(), ct.dims(), means.len()),
                ));
            }
            let counts = ct.to_vec1::<i64>().map_err(|e| c.err("counts", e.to_string()))?;
            let result = if ok {
                let mean = c.tensor("mean", Kind::Float)?;
                let var = c.tensor("var", Kind::Float)?;
                let ct = c.tensor("count", Kind::Count)?;
                Some(RecordedMoments { mean, var, count: c.count("count", &ct)? })
            } else {
                None
            };
            Op::CombineMoments { means, vars, counts, result }
        }
        other => return Err(c.err("op", format!("unknown op {other:?}"))),
    };
    Ok(Step { op, error })
}
