//! One rank's observations as bytes, so that a rank in another process (MPI)
//! can hand them to rank 0 for judging: a safetensors blob whose
//! `__metadata__` holds one JSON object per step ([`WireStep`]) and whose
//! tensors keep their exact bits.

use std::collections::HashMap;

use candle_core::safetensors::Load;
use candle_core::{Device, Tensor};
use pmstate_norm::{Collective, Moments, NormState};
use serde::{Deserialize, Serialize};

use super::run::Obs;
use crate::error::{FieldProblem, Result, TraceError, WireProblem};

/// A step's observation without its tensors (they are named `{step}.{field}`).
#[derive(Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case", deny_unknown_fields)]
enum WireStep {
    Failed { msg: String },
    Skipped,
    Update { batch_count: i64, combined_count: Option<i64>, discounted: bool, count: i64 },
    Normalize { count: i64 },
    State { count: i64 },
    Combine { count: i64 },
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
            Obs::Failed(m) => WireStep::Failed { msg: m.clone() },
            Obs::Skipped => WireStep::Skipped,
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
                WireStep::Update {
                    batch_count: batch.count,
                    combined_count: combined.as_ref().map(|c| c.count),
                    discounted: discounted.is_some(),
                    count: state(s, &mut put),
                }
            }
            Obs::Normalize { out, std, state: s } => {
                put(format!("{i}.out"), out);
                put(format!("{i}.std"), std);
                WireStep::Normalize { count: state(s, &mut put) }
            }
            Obs::State(s) => WireStep::State { count: state(s, &mut put) },
            Obs::Combine(m) => {
                put(format!("{i}.mean"), &m.mean);
                put(format!("{i}.var"), &m.var);
                WireStep::Combine { count: m.count }
            }
        };
        steps.push(step);
    }
    let write_err = |tensor: &str, problem| TraceError::Write { tensor: tensor.to_owned(), problem };
    for (name, t) in &mut tensors {
        // safetensors wants contiguous CPU data; View::data panics on failure.
        *t = t
            .to_device(&Device::Cpu)
            .and_then(|t| t.contiguous())
            .map_err(|e| write_err(name, FieldProblem::Candle(Box::new(e))))?;
    }
    let steps = serde_json::to_string(&steps).map_err(TraceError::Json)?;
    let meta = HashMap::from([("steps".to_string(), steps)]);
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta))
        .map_err(|e| write_err("<observations>", FieldProblem::Safetensors(e)))
}

/// Decodes what [`encode`] wrote, for a trace of `steps` steps; the error
/// says what is wrong with the peer's bytes.
pub(crate) fn decode(bytes: &[u8], steps: usize) -> std::result::Result<Vec<Obs>, WireProblem> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(WireProblem::Container)?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(WireProblem::Container)?;
    let doc = meta.metadata().as_ref().and_then(|m| m.get("steps")).ok_or(WireProblem::NoSteps)?;
    let doc: Vec<WireStep> = serde_json::from_str(doc).map_err(WireProblem::Steps)?;
    if doc.len() != steps {
        return Err(WireProblem::StepCount { found: doc.len(), expected: steps });
    }
    let tensor = |name: String| -> std::result::Result<Tensor, WireProblem> {
        let view = match st.tensor(&name) {
            Ok(v) => v,
            Err(source) => return Err(WireProblem::Tensor { name, source }),
        };
        view.load(&Device::Cpu).map_err(|e| WireProblem::Load { name, source: Box::new(e) })
    };
    let state = |i: usize, count: i64| -> std::result::Result<NormState, WireProblem> {
        Ok(NormState { mean: tensor(format!("{i}.state.mean"))?, var: tensor(format!("{i}.state.var"))?, count })
    };
    doc.into_iter()
        .enumerate()
        .map(|(i, step)| {
            Ok(match step {
                WireStep::Failed { msg } => Obs::Failed(msg),
                WireStep::Skipped => Obs::Skipped,
                WireStep::Update { batch_count, combined_count, discounted, count } => Obs::Update {
                    batch: Moments {
                        mean: tensor(format!("{i}.batch.mean"))?,
                        var: tensor(format!("{i}.batch.var"))?,
                        count: batch_count,
                    },
                    combined: match combined_count {
                        Some(count) => Some(Moments {
                            mean: tensor(format!("{i}.combined.mean"))?,
                            var: tensor(format!("{i}.combined.var"))?,
                            count,
                        }),
                        None => None,
                    },
                    discounted: if discounted { Some(tensor(format!("{i}.discounted"))?) } else { None },
                    state: state(i, count)?,
                },
                WireStep::Normalize { count } => Obs::Normalize {
                    out: tensor(format!("{i}.out"))?,
                    std: tensor(format!("{i}.std"))?,
                    state: state(i, count)?,
                },
                WireStep::State { count } => Obs::State(state(i, count)?),
                WireStep::Combine { count } => Obs::Combine(Moments {
                    mean: tensor(format!("{i}.mean"))?,
                    var: tensor(format!("{i}.var"))?,
                    count,
                }),
            })
        })
        .collect()
}

/// Every rank's byte string, index = rank (lengths first, then the strings
/// padded to the longest).
pub(crate) fn gather_bytes(coll: &dyn Collective, bytes: &[u8]) -> pmstate_norm::Result<Vec<Vec<u8>>> {
    let len = Tensor::new(&[bytes.len() as i64], &Device::Cpu)?;
    let lens = coll
        .all_gather(&len)?
        .iter()
        .map(|t| Ok(usize::try_from(t.to_vec1::<i64>()?[0]).unwrap_or(0)))
        .collect::<pmstate_norm::Result<Vec<usize>>>()?;
    let max = lens.iter().copied().max().unwrap_or(0);
    let mut padded = bytes.to_vec();
    padded.resize(max, 0);
    let all = coll.all_gather(&Tensor::from_vec(padded, max, &Device::Cpu)?)?;
    all.iter()
        .zip(&lens)
        .map(|(t, &n)| {
            let mut v = t.to_vec1::<u8>()?;
            v.truncate(n);
            Ok(v)
        })
        .collect()
}
