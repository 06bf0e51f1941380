//! An inference request body (JSON, or JSON followed by binary tensors)
//! checked against the served model's [`Interface`] and turned into what
//! the batcher runs: rows of float32 per observation key, the outputs
//! wanted, the seed. Every refusal names the input, output or parameter at
//! fault; nothing a client sends can panic here.

use serde_json::{Map, Value};

use crate::error::RequestError;
use crate::json_floats::quote_non_finite;
use crate::model::{Interface, Source};
use crate::options::NonFinite;
use crate::protocol::InferRequest;

/// An output to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// Its name (one of the interface's outputs).
    pub name: &'static str,
    /// What computes it.
    pub source: Source,
    /// Returned as binary data after the JSON header.
    pub binary: bool,
}

/// A request ready for the batcher.
#[derive(Debug)]
pub struct Decoded {
    /// The request's `id`.
    pub id: Option<String>,
    /// Rows (the same for every input).
    pub rows: usize,
    /// The inputs the needed networks read, in the interface's order:
    /// (key, width, rows x width values row-major).
    pub inputs: Vec<(String, usize, Vec<f32>)>,
    /// Outputs in response order.
    pub outputs: Vec<Wanted>,
    /// The seed of the action noise, when actions are drawn.
    pub seed: Option<u64>,
}

impl Decoded {
    /// Whether actor and critic run.
    pub fn actor_critic(&self) -> bool {
        self.outputs.iter().any(|o| o.source != Source::Discriminator)
    }

    /// Whether the discriminator networks run.
    pub fn discriminator(&self) -> bool {
        self.outputs.iter().any(|o| o.source == Source::Discriminator)
    }

    /// The keys and widths of the inputs: requests merge only when equal.
    pub fn signature(&self) -> Vec<(&str, usize)> {
        self.inputs.iter().map(|(k, w, _)| (k.as_str(), *w)).collect()
    }
}

/// Splits a body by the binary extension's `Inference-Header-Content-Length`.
fn split(body: &[u8], header_len: Option<usize>) -> Result<(&[u8], &[u8]), RequestError> {
    match header_len {
        None => Ok((body, &[])),
        Some(n) if n <= body.len() => Ok(body.split_at(n)),
        Some(n) => Err(RequestError::BadJson(format!(
            "Inference-Header-Content-Length is {n}, but the body has only {} bytes",
            body.len()
        ))),
    }
}

/// Parses the JSON header, accepting `NaN`/`Infinity` literals as Triton does.
fn parse(json: &[u8]) -> Result<InferRequest, RequestError> {
    match serde_json::from_slice::<InferRequest>(json) {
        Ok(r) => Ok(r),
        Err(e) => {
            let retry = quote_non_finite(json).and_then(|q| serde_json::from_slice::<InferRequest>(&q).ok());
            retry.ok_or_else(|| RequestError::BadJson(e.to_string()))
        }
    }
}

fn bool_param(p: &Map<String, Value>, name: &str, what: &str) -> Result<Option<bool>, RequestError> {
    match p.get(name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(RequestError::BadInput(format!("{what} parameter {name}: expected true or false, got {v}"))),
    }
}

/// Reads a request against `iface`.
pub fn decode(
    body: &[u8],
    header_len: Option<usize>,
    iface: &Interface,
    non_finite: NonFinite,
) -> Result<Decoded, RequestError> {
    let (json, mut binary) = split(body, header_len)?;
    let req = parse(json)?;
    let p = &req.parameters;
    let sample = bool_param(p, "sample", "request")?.unwrap_or(false);
    let seed = match p.get("seed") {
        None => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            RequestError::BadInput(format!("request parameter seed: expected an integer in [0, 2^64), got {v}"))
        })?,
    };
    // a request may ask for the refusal, not waive the server's
    let reject = bool_param(p, "reject_non_finite", "request")?.unwrap_or(false) || non_finite == NonFinite::Reject;
    let binary_default = bool_param(p, "binary_data_output", "request")?.unwrap_or(false);
    let names = |iface: &Interface| iface.outputs.iter().map(|o| o.name).collect::<Vec<_>>().join(", ");

    // inputs
    let mut inputs: Vec<(String, usize, Vec<f32>)> = Vec::with_capacity(req.inputs.len());
    let mut rows: Option<(usize, String)> = None;
    for inp in req.inputs {
        let name = inp.name;
        let spec = iface.input(&name);
        if spec.is_none() && !iface.ignored.contains(&name) {
            let known: Vec<&str> = iface.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(RequestError::BadInput(format!(
                "unexpected input {name}: the model's inputs are {}",
                known.join(", ")
            )));
        }
        if inputs.iter().any(|(k, _, _)| *k == name) {
            return Err(RequestError::BadInput(format!("input {name} is given twice")));
        }
        if inp.datatype != "FP32" {
            return Err(RequestError::BadInput(format!("input {name}: datatype {}, expected FP32", inp.datatype)));
        }
        let width = spec.and_then(|s| s.width);
        let want = width.map_or("[rows, D]".to_string(), |w| format!("[rows, {w}]"));
        let [r, d] = inp.shape[..] else {
            return Err(RequestError::BadInput(format!("input {name}: shape {:?}, expected {want}", inp.shape)));
        };
        let (Ok(r), Ok(d)) = (usize::try_from(r), usize::try_from(d)) else {
            return Err(RequestError::BadInput(format!("input {name}: shape {:?} is too large", inp.shape)));
        };
        if r == 0 || d == 0 {
            return Err(RequestError::BadInput(format!(
                "input {name}: shape {:?} is empty, expected {want} with rows >= 1",
                inp.shape
            )));
        }
        if let Some(w) = width {
            if d != w {
                return Err(RequestError::BadInput(format!("input {name}: width {d}, expected {w}")));
            }
        }
        match &rows {
            None => rows = Some((r, name.clone())),
            Some((r0, first)) if *r0 != r => {
                return Err(RequestError::BadInput(format!("input {name}: {r} rows, but input {first} has {r0}")))
            }
            _ => {}
        }
        let count = r.checked_mul(d).ok_or_else(|| RequestError::BadInput(format!("input {name}: shape too large")))?;
        let values = match (inp.parameters.get("binary_data_size"), inp.data) {
            (Some(_), Some(_)) => {
                return Err(RequestError::BadInput(format!("input {name}: both data and binary_data_size are given")))
            }
            (None, None) => {
                return Err(RequestError::BadInput(format!(
                    "input {name}: no data (neither data nor binary_data_size)"
                )))
            }
            (None, Some(data)) => {
                if data.0.len() != count {
                    return Err(RequestError::BadInput(format!(
                        "input {name}: {} values, but shape [{r}, {d}] needs {count}",
                        data.0.len()
                    )));
                }
                data.0
            }
            (Some(size), None) => {
                let size = size.as_u64().and_then(|s| usize::try_from(s).ok()).ok_or_else(|| {
                    RequestError::BadInput(format!("input {name}: binary_data_size {size} is not a byte count"))
                })?;
                if Some(size) != count.checked_mul(4) {
                    return Err(RequestError::BadInput(format!(
                        "input {name}: binary_data_size {size}, but FP32 shape [{r}, {d}] needs {} bytes",
                        count.saturating_mul(4)
                    )));
                }
                if size > binary.len() {
                    return Err(RequestError::BadInput(format!(
                        "input {name}: binary_data_size {size}, but only {} bytes of binary data are left",
                        binary.len()
                    )));
                }
                let (mine, rest) = binary.split_at(size);
                binary = rest;
                mine.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
        };
        if reject {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(RequestError::NonFinite { input: name, row: i / d, column: i % d, value: values[i] });
            }
        }
        inputs.push((name, d, values));
    }
    if !binary.is_empty() {
        return Err(RequestError::BadInput(format!(
            "{} bytes of binary data after the last binary input",
            binary.len()
        )));
    }
    let Some((rows, _)) = rows else {
        return Err(RequestError::BadInput("no inputs".into()));
    };

    // outputs
    let has = |k: &str| inputs.iter().any(|(n, _, _)| n == k);
    let mut outputs: Vec<Wanted> = Vec::new();
    match req.outputs {
        Some(list) => {
            for o in list {
                let Some(spec) = iface.output(&o.name) else {
                    return Err(RequestError::BadInput(format!(
                        "unknown output {}: the model's outputs are {}",
                        o.name,
                        names(iface)
                    )));
                };
                if outputs.iter().any(|w| w.name == spec.name) {
                    return Err(RequestError::BadInput(format!("output {} is asked for twice", spec.name)));
                }
                if spec.source == Source::Sample && !sample {
                    return Err(RequestError::BadInput(format!(
                        "output {}: draws actions; set the request parameter sample to true (and seed)",
                        spec.name
                    )));
                }
                let binary = bool_param(&o.parameters, "binary_data", &format!("output {}", spec.name))?
                    .unwrap_or(binary_default);
                outputs.push(Wanted { name: spec.name, source: spec.source, binary });
            }
        }
        None => {
            let disc_inputs = iface.inputs.iter().filter(|i| i.discriminator).all(|i| has(&i.name))
                && iface.inputs.iter().any(|i| i.discriminator);
            for spec in &iface.outputs {
                let take = match spec.source {
                    Source::ActorCritic => true,
                    Source::Sample => sample,
                    Source::Discriminator => disc_inputs,
                };
                if take {
                    outputs.push(Wanted { name: spec.name, source: spec.source, binary: binary_default });
                }
            }
        }
    }
    if outputs.is_empty() {
        return Err(RequestError::BadInput("no outputs asked for".into()));
    }
    let need_ac = outputs.iter().any(|o| o.source != Source::Discriminator);
    let need_disc = outputs.iter().any(|o| o.source == Source::Discriminator);

    // every input the needed networks read, nothing else, in interface order
    let needed = |i: &crate::model::InputSpec| (need_ac && i.actor_critic) || (need_disc && i.discriminator);
    for spec in iface.inputs.iter().filter(|i| needed(i)) {
        if !has(&spec.name) {
            let w = spec.width.map_or("D".to_string(), |w| w.to_string());
            return Err(RequestError::BadInput(format!("missing input {} (shape [rows, {w}])", spec.name)));
        }
    }
    let mut ordered = Vec::with_capacity(inputs.len());
    for spec in iface.inputs.iter().filter(|i| needed(i)) {
        if let Some(pos) = inputs.iter().position(|(n, _, _)| *n == spec.name) {
            ordered.push(inputs.swap_remove(pos));
        }
    }

    // width sums, for keys whose own width the checkpoint leaves open
    for (module, keys, total) in &iface.groups {
        if !keys.iter().any(|k| ordered.iter().any(|(n, _, _)| n == k)) {
            continue;
        }
        let ws: Option<Vec<usize>> = keys
            .iter()
            .map(|k| {
                ordered
                    .iter()
                    .find(|(n, _, _)| n == k)
                    .map(|(_, w, _)| *w)
                    .or_else(|| iface.input(k).and_then(|i| i.width))
            })
            .collect();
        let Some(ws) = ws else { continue };
        let sum: usize = ws.iter().sum();
        if sum != *total {
            let parts: Vec<String> = keys.iter().zip(&ws).map(|(k, w)| format!("{k} {w}")).collect();
            let key = keys
                .iter()
                .find(|k| iface.input(k).is_some_and(|i| i.width.is_none()))
                .or(keys.first())
                .map_or(module.as_str(), String::as_str);
            return Err(RequestError::BadInput(format!(
                "input {key}: {module} reads {} = {sum} columns, expected {total} in all",
                parts.join(" + ")
            )));
        }
    }
    Ok(Decoded { id: req.id, rows, inputs: ordered, outputs, seed: sample.then_some(seed) })
}
