//! Writing pm-trace v1 files, deterministically and atomically.

use std::io::Write;
use std::path::Path;

use candle_core::{DType, Tensor};
use serde_json::{json, Map, Value};

use crate::error::{Result, TraceError};
use crate::model::*;

/// Tensors named as the recorder names them (`s0007.x.r1`), collected in
/// write order.
struct Names {
    tensors: Vec<(String, Tensor, bool)>,
}

impl Names {
    fn add(&mut self, name: String, t: &Tensor) -> Value {
        self.tensors.push((name.clone(), t.clone(), false));
        Value::String(name)
    }
    fn add_mask(&mut self, name: String, t: &Tensor) -> Value {
        self.tensors.push((name.clone(), t.clone(), t.dtype() == DType::U8));
        Value::String(name)
    }
    fn per_rank(&mut self, step: usize, field: &str, ts: &[Tensor]) -> Value {
        Value::Array(ts.iter().enumerate().map(|(r, t)| self.add(format!("s{step:04}.{field}.r{r}"), t)).collect())
    }
    fn count(&mut self, name: String, c: i64) -> Value {
        let t = Tensor::new(c, &candle_core::Device::Cpu).expect("a CPU scalar");
        self.add(name, &t)
    }
    fn state(&mut self, step: usize, s: &State) -> Value {
        json!({
            "mean": self.add(format!("s{step:04}.state.mean"), &s.mean),
            "var": self.add(format!("s{step:04}.state.var"), &s.var),
            "count": self.count(format!("s{step:04}.state.count"), s.count),
        })
    }
    fn update(&mut self, step: usize, o: &mut Map<String, Value>, u: &UpdateResult) {
        let means: Vec<Tensor> = u.batch.iter().map(|m| m.mean.clone()).collect();
        let vars: Vec<Tensor> = u.batch.iter().map(|m| m.var.clone()).collect();
        o.insert("batch_mean".into(), self.per_rank(step, "batch_mean", &means));
        o.insert("batch_var".into(), self.per_rank(step, "batch_var", &vars));
        let counts: Vec<Value> = u
            .batch
            .iter()
            .enumerate()
            .map(|(r, m)| self.count(format!("s{step:04}.batch_count.r{r}"), m.count))
            .collect();
        o.insert("batch_count".into(), Value::Array(counts));
        if let Some(c) = &u.combined {
            o.insert("combined_mean".into(), self.add(format!("s{step:04}.combined_mean"), &c.mean));
            o.insert("combined_var".into(), self.add(format!("s{step:04}.combined_var"), &c.var));
            o.insert("combined_count".into(), self.count(format!("s{step:04}.combined_count"), c.count));
        }
        o.insert("state".into(), self.state(step, &u.state));
    }
}

fn num(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |x| json!(x))
}

/// The trace's JSON document and its tensors.
fn document(trace: &Trace) -> (Value, Names) {
    let mut n = Names { tensors: vec![] };
    let mut steps = vec![];
    for (i, step) in trace.steps.iter().enumerate() {
        let mut o = Map::new();
        o.insert("op".into(), json!(step.op.name()));
        match &step.op {
            Op::RecordMoments { x, result } => {
                o.insert("x".into(), n.per_rank(i, "x", x));
                if let Some(u) = result {
                    n.update(i, &mut o, u);
                }
            }
            Op::RecordReward { reward, terminated, result } => {
                o.insert("reward".into(), n.per_rank(i, "reward", reward));
                let t: Vec<Value> = terminated
                    .iter()
                    .enumerate()
                    .map(|(r, t)| n.add_mask(format!("s{i:04}.terminated.r{r}"), t))
                    .collect();
                o.insert("terminated".into(), Value::Array(t));
                if let Some((d, u)) = result {
                    o.insert("discounted_reward".into(), n.per_rank(i, "discounted_reward", d));
                    n.update(i, &mut o, u);
                }
            }
            Op::Normalize { x, un_norm, result } => {
                o.insert("x".into(), n.add(format!("s{i:04}.x"), x));
                o.insert("un_norm".into(), json!(un_norm));
                if let Some(r) = result {
                    o.insert("out".into(), n.add(format!("s{i:04}.out"), &r.out));
                    o.insert("std".into(), n.add(format!("s{i:04}.std"), &r.std));
                    o.insert("state".into(), n.state(i, &r.state));
                }
            }
            Op::LoadStateDict { state } => {
                o.insert("state".into(), n.state(i, state));
            }
            Op::SetEmaDecay { ema_decay, state } => {
                o.insert("ema_decay".into(), num(*ema_decay));
                if let Some(s) = state {
                    o.insert("state".into(), n.state(i, s));
                }
            }
            Op::CombineMoments { means, vars, counts, result } => {
                let m: Vec<Value> =
                    means.iter().enumerate().map(|(k, t)| n.add(format!("s{i:04}.means.{k}"), t)).collect();
                let v: Vec<Value> =
                    vars.iter().enumerate().map(|(k, t)| n.add(format!("s{i:04}.vars.{k}"), t)).collect();
                o.insert("means".into(), Value::Array(m));
                o.insert("vars".into(), Value::Array(v));
                let ct = Tensor::new(counts.as_slice(), &candle_core::Device::Cpu).expect("a CPU vector");
                o.insert("counts".into(), n.add(format!("s{i:04}.counts"), &ct));
                if let Some(r) = result {
                    o.insert("mean".into(), n.add(format!("s{i:04}.mean"), &r.mean));
                    o.insert("var".into(), n.add(format!("s{i:04}.var"), &r.var));
                    o.insert("count".into(), n.count(format!("s{i:04}.count"), r.count));
                }
            }
        }
        if let Some(e) = &step.error {
            o.insert("error".into(), json!(e));
        }
        steps.push(Value::Object(o));
    }
    let m = &trace.module;
    let doc = json!({
        "format": "pm-trace",
        "version": 1,
        "description": trace.description,
        "reference": {
            "implementation": trace.reference.implementation,
            "source": trace.reference.source,
            "torch": trace.reference.torch,
            "device": trace.reference.device,
            "dist_backend": trace.reference.dist_backend,
        },
        "module": {
            "class": m.class.name(),
            "shape": m.shape,
            "epsilon": m.epsilon,
            "clamp_value": num(m.clamp_value),
            "ema_decay": num(m.ema_decay),
            "gamma": num(m.gamma),
        },
        "world_size": trace.world_size,
        "steps": steps,
    });
    (doc, n)
}

fn raw(name: &str, t: &Tensor, mask: bool) -> Result<(&'static str, Vec<u8>)> {
    let t = t
        .flatten_all()
        .and_then(|t| t.to_device(&candle_core::Device::Cpu))
        .map_err(|e| TraceError::Write(format!("{name}: {e}")))?;
    let err = |e: candle_core::Error| TraceError::Write(format!("{name}: {e}"));
    Ok(match t.dtype() {
        DType::F32 => ("F32", t.to_vec1::<f32>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F64 => ("F64", t.to_vec1::<f64>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I64 => ("I64", t.to_vec1::<i64>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I32 => ("I32", t.to_vec1::<i32>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::U8 => (if mask { "BOOL" } else { "U8" }, t.to_vec1::<u8>().map_err(err)?),
        d => return Err(TraceError::Write(format!("{name}: dtype {d:?} is not written to traces"))),
    })
}

/// The bytes of a safetensors file holding `trace`: tensors sorted by
/// element size (largest first, so all are aligned) then name, and a header
/// whose key order is fixed (safetensors' own writer keeps `__metadata__`
/// in a hash map), so the same trace always gives the same bytes.
pub fn to_bytes(trace: &Trace) -> Result<Vec<u8>> {
    let (doc, names) = document(trace);
    let mut items = vec![];
    for (name, t, mask) in &names.tensors {
        let (dtype, data) = raw(name, t, *mask)?;
        items.push((t.dtype().size_in_bytes(), name.clone(), dtype, t.dims().to_vec(), data));
    }
    items.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pm-trace", "trace": doc.to_string()}));
    let mut offset = 0usize;
    for (_, name, dtype, shape, data) in &items {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    // serde_json's map keeps keys sorted, which fixes the order.
    let mut h = Value::Object(header).to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend((h.len() as u64).to_le_bytes());
    out.extend(h);
    for (_, _, _, _, data) in items {
        out.extend(data);
    }
    Ok(out)
}

/// Writes `trace` to `path` atomically: a temporary file beside it, synced,
/// then renamed over `path`; on failure `path` is untouched.
pub fn write_file(trace: &Trace, path: &Path) -> Result<()> {
    let bytes = to_bytes(trace)?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| TraceError::Write(format!("{}: not a file path", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let io = |source| TraceError::Io { path: tmp.display().to_string(), source };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
