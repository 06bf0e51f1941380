//! Writing pm-trace v1 files, deterministically and atomically.

use std::io::Write;
use std::path::Path;

use candle_core::{DType, Tensor};
use serde_json::{json, Map, Value};

use crate::doc::{self, Document, ModuleDoc, ReferenceDoc, StateDoc, StepDoc};
use crate::error::{FieldProblem, Result, TraceError};
use crate::model::*;

/// Tensors named as the recorder names them (`s0007.x.r1`), collected in
/// write order.
struct Names {
    tensors: Vec<(String, Tensor, bool)>,
}

impl Names {
    fn add(&mut self, name: String, t: &Tensor) -> String {
        self.tensors.push((name.clone(), t.clone(), false));
        name
    }
    fn one(&mut self, name: String, t: &Tensor) -> Option<doc::Names> {
        Some(doc::Names::One(self.add(name, t)))
    }
    fn mask(&mut self, name: String, t: &Tensor) -> String {
        self.tensors.push((name.clone(), t.clone(), t.dtype() == DType::U8));
        name
    }
    fn per_rank(&mut self, step: usize, field: &str, ts: &[Tensor]) -> Option<doc::Names> {
        let names = ts.iter().enumerate().map(|(r, t)| self.add(format!("s{step:04}.{field}.r{r}"), t)).collect();
        Some(doc::Names::Many(names))
    }
    fn count(&mut self, name: String, c: i64) -> String {
        let t = Tensor::new(c, &candle_core::Device::Cpu).expect("a CPU scalar");
        self.add(name, &t)
    }
    fn state(&mut self, step: usize, s: &NormState) -> Option<StateDoc> {
        Some(StateDoc {
            mean: self.add(format!("s{step:04}.state.mean"), &s.mean),
            var: self.add(format!("s{step:04}.state.var"), &s.var),
            count: self.count(format!("s{step:04}.state.count"), s.count),
        })
    }
    fn update(&mut self, step: usize, o: &mut StepDoc, u: &UpdateResult) {
        let means: Vec<Tensor> = u.batch.iter().map(|m| m.mean.clone()).collect();
        let vars: Vec<Tensor> = u.batch.iter().map(|m| m.var.clone()).collect();
        o.batch_mean = self.per_rank(step, "batch_mean", &means);
        o.batch_var = self.per_rank(step, "batch_var", &vars);
        let counts = u
            .batch
            .iter()
            .enumerate()
            .map(|(r, m)| self.count(format!("s{step:04}.batch_count.r{r}"), m.count))
            .collect();
        o.batch_count = Some(doc::Names::Many(counts));
        if let Some(c) = &u.combined {
            o.combined_mean = self.one(format!("s{step:04}.combined_mean"), &c.mean);
            o.combined_var = self.one(format!("s{step:04}.combined_var"), &c.var);
            o.combined_count = Some(doc::Names::One(self.count(format!("s{step:04}.combined_count"), c.count)));
        }
        o.state = self.state(step, &u.state);
    }
}

/// The trace's JSON document and its tensors.
fn document(trace: &Trace) -> (Document<StepDoc>, Names) {
    let mut n = Names { tensors: vec![] };
    let mut steps = vec![];
    for (i, step) in trace.steps.iter().enumerate() {
        let mut o = StepDoc { op: Some(step.op.kind()), error: step.error.clone(), ..StepDoc::default() };
        match &step.op {
            Op::RecordMoments { x, result } => {
                o.x = n.per_rank(i, "x", x);
                if let Some(u) = result {
                    n.update(i, &mut o, u);
                }
            }
            Op::RecordReward { reward, terminated, result } => {
                o.reward = n.per_rank(i, "reward", reward);
                let t = terminated.iter().enumerate().map(|(r, t)| n.mask(format!("s{i:04}.terminated.r{r}"), t));
                o.terminated = Some(doc::Names::Many(t.collect()));
                if let Some((d, u)) = result {
                    o.discounted_reward = n.per_rank(i, "discounted_reward", d);
                    n.update(i, &mut o, u);
                }
            }
            Op::Normalize { x, direction, result } => {
                o.x = n.one(format!("s{i:04}.x"), x);
                o.un_norm = Some(*direction == Direction::UnNormalize);
                if let Some(r) = result {
                    o.out = n.one(format!("s{i:04}.out"), &r.out);
                    o.std = n.one(format!("s{i:04}.std"), &r.std);
                    o.state = n.state(i, &r.state);
                }
            }
            Op::LoadStateDict { state } => o.state = n.state(i, state),
            Op::SetEmaDecay { ema_decay, state } => {
                o.ema_decay = Some(*ema_decay);
                if let Some(s) = state {
                    o.state = n.state(i, s);
                }
            }
            Op::CombineMoments { means, vars, counts, result } => {
                let m = means.iter().enumerate().map(|(k, t)| n.add(format!("s{i:04}.means.{k}"), t)).collect();
                let v = vars.iter().enumerate().map(|(k, t)| n.add(format!("s{i:04}.vars.{k}"), t)).collect();
                o.means = Some(doc::Names::Many(m));
                o.vars = Some(doc::Names::Many(v));
                let ct = Tensor::new(counts.as_slice(), &candle_core::Device::Cpu).expect("a CPU vector");
                o.counts = n.one(format!("s{i:04}.counts"), &ct);
                if let Some(r) = result {
                    o.mean = n.one(format!("s{i:04}.mean"), &r.mean);
                    o.var = n.one(format!("s{i:04}.var"), &r.var);
                    o.count = Some(doc::Names::One(n.count(format!("s{i:04}.count"), r.count)));
                }
            }
        }
        steps.push(o);
    }
    let m = &trace.module;
    let r = &trace.reference;
    let doc = Document {
        format: "pm-trace".into(),
        version: 1,
        description: trace.description.clone(),
        reference: ReferenceDoc {
            implementation: r.implementation.clone(),
            source: r.source.clone(),
            torch: r.torch.clone(),
            device: r.device.clone(),
            dist_backend: r.dist_backend.clone(),
        },
        module: ModuleDoc {
            class: m.class,
            shape: m.shape.as_ref().map(|s| s.iter().map(|&d| d as u64).collect()),
            epsilon: m.epsilon,
            clamp_value: m.clamp_value,
            ema_decay: m.ema_decay,
            gamma: m.gamma,
        },
        world_size: trace.world_size as u64,
        steps,
    };
    (doc, n)
}

fn raw(name: &str, t: &Tensor, mask: bool) -> Result<(&'static str, Vec<u8>)> {
    let err = |e: candle_core::Error| TraceError::Write {
        tensor: name.to_owned(),
        problem: FieldProblem::Candle(Box::new(e)),
    };
    let t = t.flatten_all().and_then(|t| t.to_device(&candle_core::Device::Cpu)).map_err(err)?;
    Ok(match t.dtype() {
        DType::F32 => ("F32", t.to_vec1::<f32>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F64 => ("F64", t.to_vec1::<f64>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I64 => ("I64", t.to_vec1::<i64>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I32 => ("I32", t.to_vec1::<i32>().map_err(err)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::U8 => (if mask { "BOOL" } else { "U8" }, t.to_vec1::<u8>().map_err(err)?),
        d => {
            return Err(TraceError::Write {
                tensor: name.to_owned(),
                problem: FieldProblem::WrongTensor {
                    found: format!("dtype {}", d.as_str()),
                    expected: "F32, F64, I64, I32 or U8 (traces hold no other dtype)",
                },
            })
        }
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
    let doc = serde_json::to_string(&doc).map_err(TraceError::Json)?;
    header.insert("__metadata__".into(), json!({"format": "pm-trace", "trace": doc}));
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
/// then renamed over `path`; on failure `path` is untouched. A FIFO or a
/// character device is written into as a stream, never unlinked or
/// replaced; a directory, block device or socket is refused.
pub fn write_file(trace: &Trace, path: &Path) -> Result<()> {
    let bytes = to_bytes(trace)?;
    let refuse = |what: &str| TraceError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("not a regular file ({what})")),
    };
    if let Ok(meta) = std::fs::metadata(path) {
        let t = meta.file_type();
        if t.is_dir() {
            return Err(refuse("a directory"));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_fifo() || t.is_char_device() {
                let io = |source| TraceError::Io { path: path.display().to_string(), source };
                // opened as it is: no create, no truncation, no rename
                let mut f = std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
                return f.write_all(&bytes).map_err(io);
            }
            if t.is_block_device() || t.is_socket() {
                return Err(refuse(if t.is_socket() { "a socket" } else { "a block device" }));
            }
        }
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| TraceError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
    })?;
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    // errors name the file asked for, not the temporary one beside it
    let io = |source| TraceError::Io { path: path.display().to_string(), source };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
