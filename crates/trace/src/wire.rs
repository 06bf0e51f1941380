//! One rank's observations as bytes, so that a rank in another process (MPI)
//! can hand them to rank 0 for judging: a safetensors blob whose
//! `__metadata__` holds one JSON object per step and whose tensors keep
//! their exact bits.

use std::collections::HashMap;

use candle_core::safetensors::Load;
use candle_core::{Device, Tensor};
use pmstate_norm::{Moments, NormState};
use serde_json::{json, Value};

use crate::error::{Result, TraceError};
use crate::replay::Obs;

fn err(reason: impl Into<String>) -> TraceError {
    TraceError::Replay(format!("observations from a peer rank: {}", reason.into()))
}

/// Encodes a rank's observations.
pub(crate) fn encode(obs: &[Obs]) -> Result<Vec<u8>> {
    let mut tensors: Vec<(String, Tensor)> = vec![];
    let mut steps = vec![];
    let mut put = |name: String, t: &Tensor| tensors.push((name, t.clone()));
    for (i, o) in obs.iter().enumerate() {
        let state = |s: &NormState, put: &mut dyn FnMut(String, &Tensor)| {
            put(format!("{i}.state.mean"), &s.mean);
            put(format!("{i}.state.var"), &s.var);
            s.count
        };
        let step = match o {
            Obs::Failed(m) => json!({"k": "failed", "msg": m}),
            Obs::Skipped => json!({"k": "skipped"}),
            Obs::Update { batch, combined, discounted, state: s } => {
                put(format!("{i}.batch.mean"), &batch.mean);
                put(format!("{i}.batch.var"), &batch.var);
                if let Some(c) = combined {
                    put(format!("{i}.combined.mean"), &c.mean);
                    put(format!("{i}.combined.var"), &c.var);
                }
                if let Some(d) = discounted {
                    put(format!("{i}.discounted"), d);
                }
                json!({
                    "k": "update",
                    "batch_count": batch.count,
                    "combined_count": combined.as_ref().map(|c| c.count),
                    "discounted": discounted.is_some(),
                    "count": state(s, &mut put),
                })
            }
            Obs::Normalize { out, std, state: s } => {
                put(format!("{i}.out"), out);
                put(format!("{i}.std"), std);
                json!({"k": "normalize", "count": state(s, &mut put)})
            }
            Obs::State(s) => json!({"k": "state", "count": state(s, &mut put)}),
            Obs::Combine(m) => {
                put(format!("{i}.mean"), &m.mean);
                put(format!("{i}.var"), &m.var);
                json!({"k": "combine", "count": m.count})
            }
        };
        steps.push(step);
    }
    for (name, t) in &mut tensors {
        // safetensors wants contiguous CPU data; View::data panics on failure.
        *t = t.to_device(&Device::Cpu).and_then(|t| t.contiguous()).map_err(|e| err(format!("{name}: {e}")))?;
    }
    let meta = HashMap::from([("steps".to_string(), Value::Array(steps).to_string())]);
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta)).map_err(|e| err(e.to_string()))
}

/// Decodes what [`encode`] wrote, for a trace of `steps` steps.
pub(crate) fn decode(bytes: &[u8], steps: usize) -> Result<Vec<Obs>> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| err(e.to_string()))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| err(e.to_string()))?;
    let doc = meta.metadata().as_ref().and_then(|m| m.get("steps")).ok_or_else(|| err("no steps"))?;
    let doc: Vec<Value> = serde_json::from_str(doc).map_err(|e| err(e.to_string()))?;
    if doc.len() != steps {
        return Err(err(format!("{} steps, the trace has {steps}", doc.len())));
    }
    let tensor = |name: String| -> Result<Tensor> {
        let view = st.tensor(&name).map_err(|e| err(format!("{name}: {e}")))?;
        view.load(&Device::Cpu).map_err(|e| err(format!("{name}: {e}")))
    };
    let int = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).ok_or_else(|| err(format!("missing {f}")));
    let state = |i: usize, v: &Value| -> Result<NormState> {
        Ok(NormState {
            mean: tensor(format!("{i}.state.mean"))?,
            var: tensor(format!("{i}.state.var"))?,
            count: int(v, "count")?,
        })
    };
    doc.iter()
        .enumerate()
        .map(|(i, v)| {
            Ok(match v.get("k").and_then(Value::as_str) {
                Some("failed") => Obs::Failed(v.get("msg").and_then(Value::as_str).unwrap_or_default().to_string()),
                Some("skipped") => Obs::Skipped,
                Some("update") => Obs::Update {
                    batch: Moments {
                        mean: tensor(format!("{i}.batch.mean"))?,
                        var: tensor(format!("{i}.batch.var"))?,
                        count: int(v, "batch_count")?,
                    },
                    combined: match v.get("combined_count").and_then(Value::as_i64) {
                        Some(count) => Some(Moments {
                            mean: tensor(format!("{i}.combined.mean"))?,
                            var: tensor(format!("{i}.combined.var"))?,
                            count,
                        }),
                        None => None,
                    },
                    discounted: match v.get("discounted").and_then(Value::as_bool) {
                        Some(true) => Some(tensor(format!("{i}.discounted"))?),
                        _ => None,
                    },
                    state: state(i, v)?,
                },
                Some("normalize") => Obs::Normalize {
                    out: tensor(format!("{i}.out"))?,
                    std: tensor(format!("{i}.std"))?,
                    state: state(i, v)?,
                },
                Some("state") => Obs::State(state(i, v)?),
                Some("combine") => Obs::Combine(Moments {
                    mean: tensor(format!("{i}.mean"))?,
                    var: tensor(format!("{i}.var"))?,
                    count: int(v, "count")?,
                }),
                k => return Err(err(format!("step {i}: unknown kind {k:?}"))),
            })
        })
        .collect()
}
