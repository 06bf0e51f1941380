//! The inference response: JSON, or with the binary extension a JSON
//! header followed by the binary outputs (little-endian float32, or
//! int64 for a GPC prior's tokens; row-major) and its length in
//! `Inference-Header-Content-Length`.

use crate::batcher::Answer;
use crate::decode::{Values, Wanted};
use crate::json_floats::{write_array, write_int_array};
use crate::model::{Datatype, Interface};

/// A response body.
#[derive(Debug)]
pub struct Encoded {
    /// The bytes.
    pub body: Vec<u8>,
    /// The JSON header's length, when binary outputs follow it.
    pub header_len: Option<usize>,
}

/// Bytes of the response header and of each output's JSON besides its values.
const OVERHEAD_BYTES: usize = 512;

/// A bound of the size of the answer to `rows` rows with `outputs`, from
/// the interface's shapes, before anything runs: 16 bytes a float32 in
/// JSON (ryu writes at most 15 characters, and a comma), 21 an int64, the
/// element size in binary. A width the checkpoint leaves open (`-1` past
/// the rows) counts as 1; such an answer is charged again once encoded.
pub fn answer_bound(iface: &Interface, rows: usize, outputs: &[Wanted]) -> usize {
    outputs.iter().fold(OVERHEAD_BYTES, |acc, w| {
        let Some(spec) = iface.output(w.name) else { return acc };
        let elements = spec.shape.iter().enumerate().fold(1usize, |n, (i, &d)| {
            let d = if i == 0 && d == -1 { rows } else { usize::try_from(d).unwrap_or(1) };
            n.saturating_mul(d)
        });
        let per_value = match (w.binary, spec.datatype) {
            (true, dt) => dt.size(),
            (false, Datatype::Fp32) => 16,
            (false, Datatype::Int64) => 21,
            (false, Datatype::Bool) => 6,
        };
        acc.saturating_add(elements.saturating_mul(per_value)).saturating_add(OVERHEAD_BYTES)
    })
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // serializing a &str into a Vec cannot fail
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `$inference_response` for `answer`.
pub fn encode(model_name: &str, id: Option<&str>, answer: &Answer) -> Encoded {
    let values: usize = answer.tensors.iter().map(|(_, _, d)| d.len()).sum();
    let mut out = Vec::with_capacity(128 + values * 12);
    out.extend_from_slice(b"{\"model_name\":");
    push_json_str(&mut out, model_name);
    out.extend_from_slice(format!(",\"model_version\":\"{}\"", answer.version).as_bytes());
    if let Some(id) = id {
        out.extend_from_slice(b",\"id\":");
        push_json_str(&mut out, id);
    }
    out.extend_from_slice(b",\"outputs\":[");
    for (i, (w, shape, data)) in answer.tensors.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"name\":");
        push_json_str(&mut out, w.name);
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let datatype = data.datatype();
        out.extend_from_slice(
            format!(",\"datatype\":\"{}\",\"shape\":[{}]", datatype.name(), dims.join(",")).as_bytes(),
        );
        if w.binary {
            let size = data.len() * datatype.size();
            out.extend_from_slice(format!(",\"parameters\":{{\"binary_data_size\":{size}}}}}").as_bytes());
        } else {
            out.extend_from_slice(b",\"data\":");
            match data {
                Values::F32(v) => write_array(&mut out, v),
                Values::I64(v) => write_int_array(&mut out, v),
            }
            out.push(b'}');
        }
    }
    out.extend_from_slice(b"]}");
    if !answer.tensors.iter().any(|(w, _, _)| w.binary) {
        return Encoded { body: out, header_len: None };
    }
    let header_len = out.len();
    for (w, _, data) in &answer.tensors {
        if w.binary {
            out.reserve(data.len() * data.datatype().size());
            match data {
                Values::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
                Values::I64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            }
        }
    }
    Encoded { body: out, header_len: Some(header_len) }
}
