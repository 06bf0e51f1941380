//! An inference request body (JSON, or JSON followed by binary tensors)
//! checked against the served model's [`Interface`] and turned into what
//! the batcher runs: rows of float32 per observation key, the outputs
//! wanted, the seed. Every refusal names the input, output or parameter at
//! fault; nothing a client sends can panic here.
//!
//! In four steps, each its own function: the request parameters
//! ([`Params`]), each input (shape, width, data: [`decode_tensor`]), the
//! outputs wanted ([`select_outputs`]), then the inputs the needed networks
//! read, in order, with the width sums the checkpoint fixes
//! ([`order_inputs`], [`check_width_sums`]).
//!
//! Both transports share these steps: a REST body and a gRPC
//! `ModelInferRequest` differ only in where an input's values are (JSON
//! `data` or the binary extension; `raw_input_contents` or typed
//! `contents`), which each reads through its own [`TensorSource`]; the
//! request's inputs go through [`read_tensors`], the rest through
//! [`assemble`].

use std::sync::Arc;

use serde_json::value::RawValue;

use crate::error::{Dims, InputError, RequestError};
use crate::json_floats::{quote_non_finite, read_bools, read_data, read_ints, BoolDataError, DataError, IntDataError};
use crate::model::{Datatype, InputSpec, Interface, Source, MAX_LOGITS_PER_FORWARD};
use crate::options::NonFinite;
use crate::protocol::{InferRequest, ParamValue, Parameters, RequestInput, RequestOutput};

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
    pub inputs: Vec<Input>,
    /// Outputs in response order.
    pub outputs: Vec<Wanted>,
    /// The seed of the action noise, when actions are drawn.
    pub seed: Option<u64>,
}

impl Decoded {
    /// Whether the actor (and maybe the critic) runs.
    pub fn actor_critic(&self) -> bool {
        self.outputs.iter().any(|o| o.source != Source::Discriminator)
    }

    /// Whether the critic runs too (some output is the critic's).
    pub fn critic(&self) -> bool {
        self.outputs.iter().any(|o| o.source == Source::Critic)
    }

    /// Whether the discriminator networks run.
    pub fn discriminator(&self) -> bool {
        self.outputs.iter().any(|o| o.source == Source::Discriminator)
    }

    /// The keys and widths of the inputs: requests merge only when equal
    /// (compared as iterators: the batcher compares every queued request's
    /// against its groups' while the next forward waits, without allocating).
    pub fn signature(&self) -> impl Iterator<Item = (&str, usize)> + '_ {
        self.inputs.iter().map(|(k, w, _)| (k.as_str(), *w))
    }
}

/// What a request is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The served model's inputs and outputs.
    pub iface: &'a Interface,
    /// The server's NaN policy.
    pub non_finite: NonFinite,
    /// Most rows one request may hold (`--max-batch`, Triton's `max_batch_size`).
    pub max_rows: usize,
}

/// One decoded input: (key, width, rows x width values row-major).
pub type Input = (String, usize, Values);

/// A tensor's values, row-major, in its datatype.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// FP32.
    F32(Vec<f32>),
    /// INT64 (a GPC prior's tokens).
    I64(Vec<i64>),
}

impl Values {
    /// How many values.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::I64(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float32 values (empty for INT64).
    pub fn f32s(&self) -> &[f32] {
        match self {
            Values::F32(v) => v,
            Values::I64(_) => &[],
        }
    }

    /// The datatype.
    pub fn datatype(&self) -> Datatype {
        match self {
            Values::F32(_) => Datatype::Fp32,
            Values::I64(_) => Datatype::Int64,
        }
    }
}

/// Splits a body by the binary extension's `Inference-Header-Content-Length`.
fn split(body: &[u8], header_len: Option<usize>) -> Result<(&[u8], &[u8]), RequestError> {
    match header_len {
        None => Ok((body, &[])),
        Some(n) if n <= body.len() => Ok(body.split_at(n)),
        Some(n) => Err(RequestError::HeaderPastBody { header: n, body: body.len() }),
    }
}

fn bool_param(p: &Parameters, name: &'static str, scope: &dyn Fn() -> String) -> Result<Option<bool>, InputError> {
    match p.get(name) {
        None => Ok(None),
        Some(ParamValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(InputError::Parameter { scope: scope(), name, expected: "true or false", got: v.to_string() }),
    }
}

/// The request parameters this server reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// `sample`: draw actions.
    pub sample: bool,
    /// `seed` of the action noise (default 0).
    pub seed: u64,
    /// What to do with non-finite inputs (the server's policy, or the
    /// request's `reject_non_finite`).
    pub non_finite: NonFinite,
    /// `binary_data_output`: outputs in binary unless an output says otherwise.
    pub binary_default: bool,
}

impl Params {
    /// Reads `p`; under [`NonFinite::Reject`] a request cannot waive the refusal.
    pub fn read(p: &Parameters, non_finite: NonFinite) -> Result<Params, InputError> {
        let request = || "request".to_string();
        let sample = bool_param(p, "sample", &request)?.unwrap_or(false);
        let seed = match p.get("seed") {
            None => 0,
            Some(v) => v.as_u64().ok_or_else(|| InputError::Parameter {
                scope: request(),
                name: "seed",
                expected: "an integer in [0, 2^64)",
                got: v.to_string(),
            })?,
        };
        // a request may ask for the refusal, not waive the server's
        let asked = bool_param(p, "reject_non_finite", &request)?.unwrap_or(false);
        let non_finite = if asked { NonFinite::Reject } else { non_finite };
        let binary_default = bool_param(p, "binary_data_output", &request)?.unwrap_or(false);
        Ok(Params { sample, seed, non_finite, binary_default })
    }
}

/// `[rows, width]` of an input, checked against its spec and `max_rows`.
fn shape_of(name: &str, shape: &[u64], width: Option<usize>, max_rows: usize) -> Result<(usize, usize), InputError> {
    let dims = || Dims(shape.to_vec());
    let [r, d] = shape[..] else {
        return Err(InputError::Rank { input: name.to_owned(), shape: dims(), width });
    };
    let (Ok(r), Ok(d)) = (usize::try_from(r), usize::try_from(d)) else {
        return Err(InputError::TooLarge { input: name.to_owned(), shape: dims() });
    };
    if r == 0 || d == 0 {
        return Err(InputError::Empty { input: name.to_owned(), shape: dims(), width });
    }
    if let Some(w) = width {
        if d != w {
            return Err(InputError::Width { input: name.to_owned(), width: d, expected: w });
        }
    }
    if r > max_rows {
        return Err(InputError::Batch { input: name.to_owned(), rows: r, max_batch: max_rows });
    }
    Ok((r, d))
}

/// `[rows, ...row]` of a pipeline input (any rank), checked against `max_rows`;
/// returns the rows and the values per row.
fn shaped(name: &str, shape: &[u64], row: &[usize], max_rows: usize) -> Result<(usize, usize), InputError> {
    let wrong = || InputError::Shape { input: name.to_owned(), shape: Dims(shape.to_vec()), expected: row.to_vec() };
    let Some((&r, rest)) = shape.split_first() else { return Err(wrong()) };
    if r == 0 || rest.len() != row.len() || rest.iter().zip(row).any(|(&a, &b)| usize::try_from(a) != Ok(b)) {
        return Err(wrong());
    }
    let Ok(r) = usize::try_from(r) else {
        return Err(InputError::TooLarge { input: name.to_owned(), shape: Dims(shape.to_vec()) });
    };
    if r > max_rows {
        return Err(InputError::Batch { input: name.to_owned(), rows: r, max_batch: max_rows });
    }
    let per_row = row.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let per_row =
        per_row.ok_or_else(|| InputError::TooLarge { input: name.to_owned(), shape: Dims(shape.to_vec()) })?;
    Ok((r, per_row))
}

/// Where one input's values come from, read only once its name, datatype
/// and shape have been checked: each transport's own form of tensor data
/// (REST's JSON `data` or binary extension, gRPC's raw or typed contents).
/// Everything else about a request is checked here once, whichever
/// transport it came by: [`decode_tensor`], [`read_tensors`], [`assemble`].
pub trait TensorSource {
    /// What the sources of one request share (REST's binary part of the
    /// body, which its binary inputs take in turn).
    type Shared;
    /// The `count` values of `input` in `datatype` (`shape` as sent, for
    /// refusals), exactly `count` of them or a refusal naming the input.
    fn values(
        self,
        shared: &mut Self::Shared,
        input: &str,
        shape: &[u64],
        count: usize,
        datatype: Datatype,
    ) -> Result<Values, InputError>;
}

/// One input tensor as a transport hands it over, its values not yet read.
#[derive(Debug)]
pub struct TensorIn<S> {
    /// The observation key.
    pub name: String,
    /// The datatype as sent (`FP32`, `INT64`).
    pub datatype: String,
    /// The shape as sent.
    pub shape: Vec<u64>,
    /// Where its values are.
    pub source: S,
}

/// Little-endian values of `datatype` from exactly `count * size` bytes
/// (the caller has checked the length).
pub fn values_from_le(bytes: &[u8], datatype: Datatype) -> Values {
    match datatype {
        Datatype::Fp32 => {
            Values::F32(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        }
        // numpy's and torch's bool bytes are 0 and 1; any nonzero byte is true
        Datatype::Bool => Values::F32(bytes.iter().map(|&b| if b != 0 { 1.0 } else { 0.0 }).collect()),
        Datatype::Int64 => Values::I64(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
        ),
    }
}

/// A REST input's data: its JSON `data`, or with the binary extension
/// `binary_data_size` bytes taken off the front of the binary part (4 a
/// value for FP32, 8 for INT64, little-endian).
struct RestData<'a> {
    binary_size: Option<ParamValue>,
    data: Option<&'a RawValue>,
}

impl<'a> TensorSource for RestData<'a> {
    type Shared = &'a [u8];

    fn values(
        self,
        binary: &mut &'a [u8],
        name: &str,
        shape: &[u64],
        count: usize,
        datatype: Datatype,
    ) -> Result<Values, InputError> {
        let input = || name.to_owned();
        let dims = || Dims(shape.to_vec());
        match (self.binary_size, self.data) {
            (Some(_), Some(_)) => Err(InputError::DataTwice { input: input() }),
            (None, None) => Err(InputError::NoData { input: input() }),
            (None, Some(raw)) => {
                let overflow = || InputError::DataOverflow { input: input(), shape: dims(), needed: count };
                let data = match datatype {
                    Datatype::Fp32 => Values::F32(read_data(raw, count).map_err(|e| match e {
                        DataError::TooMany => overflow(),
                        DataError::Json(e) => InputError::Data { input: input(), reason: e.to_string() },
                    })?),
                    Datatype::Int64 => Values::I64(read_ints(raw, count).map_err(|e| match e {
                        IntDataError::TooMany => overflow(),
                        IntDataError::Element { index, value, problem } => {
                            InputError::IntData { input: input(), index, value, problem }
                        }
                        IntDataError::Json(e) => InputError::Data { input: input(), reason: e.to_string() },
                    })?),
                    Datatype::Bool => Values::F32(read_bools(raw, count).map_err(|e| match e {
                        BoolDataError::TooMany => overflow(),
                        BoolDataError::Element { index, value, .. } => {
                            InputError::BoolData { input: input(), index, value }
                        }
                        BoolDataError::Json(e) => InputError::Data { input: input(), reason: e.to_string() },
                    })?),
                };
                if data.len() != count {
                    return Err(InputError::DataLength {
                        input: input(),
                        values: data.len(),
                        shape: dims(),
                        needed: count,
                    });
                }
                Ok(data)
            }
            (Some(size), None) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| InputError::BinarySizeValue { input: input(), size: size.to_string() })?;
                let elem = datatype.size();
                if Some(size) != count.checked_mul(elem) {
                    let needed = count.saturating_mul(elem);
                    return Err(InputError::BinarySize {
                        input: input(),
                        size,
                        datatype: datatype.name(),
                        shape: dims(),
                        needed,
                    });
                }
                if size > binary.len() {
                    return Err(InputError::BinaryShort { input: input(), size, left: binary.len() });
                }
                let (mine, rest) = binary.split_at(size);
                *binary = rest;
                Ok(values_from_le(mine, datatype))
            }
        }
    }
}

/// An INT64 input's values checked against the range its spec allows
/// (`[0, below)`), naming the row and position of the first outside it.
fn check_int_range(name: &str, values: &[i64], width: usize, below: usize) -> Result<(), InputError> {
    match values.iter().position(|&v| v < 0 || v as u64 >= below as u64) {
        None => Ok(()),
        Some(i) => Err(InputError::IntRange {
            input: name.to_owned(),
            row: i / width.max(1),
            position: i % width.max(1),
            value: values[i],
            below,
        }),
    }
}

/// One input: known to the model, of its datatype (FP32, or INT64 within
/// the range the model allows), `[rows, width]` with the width the
/// model fixes (a pipeline's: `[rows, ...]` with the row shape it fixes),
/// its data filling the shape, finite where refused otherwise.
/// Returns the input and its rows.
pub fn decode_tensor<S: TensorSource>(
    t: TensorIn<S>,
    shared: &mut S::Shared,
    expect: &Expect,
    non_finite: NonFinite,
) -> Result<(Input, usize), RequestError> {
    let iface = expect.iface;
    let name = t.name;
    let spec = iface.input(&name);
    if spec.is_none() && !iface.ignored.contains(&name) {
        let known = iface.inputs.iter().map(|i| i.name.clone()).collect();
        return Err(InputError::UnexpectedInput { input: name, known }.into());
    }
    let own = spec.map_or(Datatype::Fp32, |s| s.datatype);
    let datatype = if spec.is_some_and(|s| s.also_bool) && t.datatype == Datatype::Bool.name() {
        Datatype::Bool
    } else if t.datatype == own.name() {
        own
    } else {
        let expected = if spec.is_some_and(|s| s.also_bool) { "FP32 or BOOL" } else { own.name() };
        return Err(InputError::Datatype { input: name, datatype: t.datatype, expected }.into());
    };
    let (r, d) = match spec.and_then(|s| s.row_shape.as_deref()) {
        Some(row) => shaped(&name, &t.shape, row, expect.max_rows)?,
        None => shape_of(&name, &t.shape, spec.and_then(|s| s.width), expect.max_rows)?,
    };
    let count = r
        .checked_mul(d)
        .ok_or_else(|| InputError::TooLarge { input: name.clone(), shape: Dims(vec![r as u64, d as u64]) })?;
    let values = t.source.values(shared, &name, &t.shape, count, datatype)?;
    match &values {
        Values::F32(v) if non_finite == NonFinite::Reject => {
            if let Some(i) = v.iter().position(|v| !v.is_finite()) {
                return Err(RequestError::NonFinite { input: name, row: i / d, column: i % d, value: v[i] });
            }
        }
        Values::I64(v) => {
            if let Some(below) = spec.and_then(|s| s.int_below) {
                check_int_range(&name, v, d, below)?;
            }
        }
        Values::F32(_) => {}
    }
    Ok(((name, d, values), r))
}

/// Every input of a request (each once, all with the same rows); returns
/// them and the rows (None: no input).
pub fn read_tensors<S: TensorSource>(
    list: Vec<TensorIn<S>>,
    shared: &mut S::Shared,
    expect: &Expect,
    non_finite: NonFinite,
) -> Result<(Vec<Input>, Option<usize>), RequestError> {
    let mut inputs: Vec<Input> = Vec::with_capacity(list.len());
    let mut rows: Option<(usize, String)> = None;
    for t in list {
        if inputs.iter().any(|(k, _, _)| *k == t.name) {
            return Err(InputError::DuplicateInput { input: t.name }.into());
        }
        let (input, r) = decode_tensor(t, shared, expect, non_finite)?;
        match &rows {
            None => rows = Some((r, input.0.clone())),
            Some((r0, first)) if *r0 != r => {
                let (input, first, first_rows) = (input.0, first.clone(), *r0);
                return Err(InputError::Rows { input, rows: r, first, first_rows }.into());
            }
            _ => {}
        }
        inputs.push(input);
    }
    Ok((inputs, rows.map(|(r, _)| r)))
}

/// A request whose inputs are read ([`read_tensors`]), made ready for the
/// batcher: at least one input, the outputs it asks for (or allows), the
/// inputs the networks behind them read, the width sums and logits bounds.
pub fn assemble(
    id: Option<String>,
    params: &Params,
    inputs: Vec<Input>,
    rows: Option<usize>,
    outputs: Option<Vec<RequestOutput>>,
    expect: &Expect,
) -> Result<Decoded, RequestError> {
    let Some(rows) = rows else {
        return Err(InputError::NoInputs.into());
    };
    let has = |k: &str| inputs.iter().any(|(n, _, _)| n == k);
    let outputs = select_outputs(outputs, expect.iface, params, &has)?;
    let ordered = order_inputs(expect.iface, inputs, &outputs, params)?;
    check_width_sums(expect.iface, &ordered)?;
    check_logits(expect.iface, rows)?;
    Ok(Decoded { id, rows, inputs: ordered, outputs, seed: params.sample.then_some(params.seed) })
}

/// The outputs to return: those asked for (each known, once, `action` and
/// `neglogp` only when sampling), or by default every output the request
/// allows (the discriminator's when all its inputs are given).
pub fn select_outputs(
    asked: Option<Vec<RequestOutput>>,
    iface: &Interface,
    params: &Params,
    has: &dyn Fn(&str) -> bool,
) -> Result<Vec<Wanted>, InputError> {
    let mut outputs: Vec<Wanted> = Vec::new();
    match asked {
        Some(list) => {
            for o in list {
                let Some(spec) = iface.output(&o.name.0) else {
                    let known = iface.outputs.iter().map(|o| o.name).collect();
                    return Err(InputError::UnknownOutput { output: o.name.0, known });
                };
                if outputs.iter().any(|w| w.name == spec.name) {
                    return Err(InputError::DuplicateOutput { output: spec.name });
                }
                if spec.source == Source::Sample && !params.sample {
                    return Err(InputError::NeedsSample { output: spec.name });
                }
                let scope = || format!("output {}", spec.name);
                let binary = bool_param(&o.parameters, "binary_data", &scope)?.unwrap_or(params.binary_default);
                outputs.push(Wanted { name: spec.name, source: spec.source, binary });
            }
        }
        None => {
            let disc = iface.inputs.iter().filter(|i| i.discriminator);
            let disc_inputs = disc.clone().all(|i| has(&i.name)) && disc.count() > 0;
            // the value when the critic's own inputs are given (a robot's
            // client sends the actor's alone and gets the actor's outputs)
            let critic_inputs = iface.inputs.iter().filter(|i| i.actor_critic && !i.actor).all(|i| has(&i.name));
            for spec in &iface.outputs {
                let take = match spec.source {
                    Source::Actor | Source::Pipeline => true,
                    Source::Critic => critic_inputs,
                    Source::Sample => params.sample,
                    Source::Discriminator => disc_inputs,
                };
                if take {
                    outputs.push(Wanted { name: spec.name, source: spec.source, binary: params.binary_default });
                }
            }
        }
    }
    if outputs.is_empty() {
        return Err(InputError::NoOutputs);
    }
    Ok(outputs)
}

/// Every input the networks behind `outputs` read, nothing else, in the
/// interface's order; a missing one is refused by name.
pub fn order_inputs(
    iface: &Interface,
    mut inputs: Vec<Input>,
    outputs: &[Wanted],
    params: &Params,
) -> Result<Vec<Input>, InputError> {
    // a GPC prior's tokens: teacher forced when given, generated when sampling, never both
    for spec in iface.drawn_inputs() {
        let given = inputs.iter().any(|(n, _, _)| *n == spec.name);
        if given && params.sample {
            return Err(InputError::GivenAndSampled { input: spec.name.clone() });
        }
        if !given && !params.sample {
            return Err(InputError::NotGiven { input: spec.name.clone(), width: spec.width });
        }
    }
    let need_actor = outputs.iter().any(|o| matches!(o.source, Source::Actor | Source::Sample | Source::Pipeline));
    let need_critic = outputs.iter().any(|o| o.source == Source::Critic);
    let need_disc = outputs.iter().any(|o| o.source == Source::Discriminator);
    let needed =
        |i: &&InputSpec| (need_critic && i.actor_critic) || (need_actor && i.actor) || (need_disc && i.discriminator);
    let mut ordered = Vec::with_capacity(inputs.len());
    for spec in iface.inputs.iter().filter(needed) {
        let Some(pos) = inputs.iter().position(|(n, _, _)| *n == spec.name) else {
            if spec.optional {
                continue;
            }
            return Err(match &spec.row_shape {
                Some(row) => InputError::MissingShaped { input: spec.name.clone(), expected: row.clone() },
                None => InputError::MissingInput { input: spec.name.clone(), width: spec.width },
            });
        };
        ordered.push(inputs.swap_remove(pos));
    }
    Ok(ordered)
}

/// The width sums the checkpoint fixes, for keys whose own width it leaves open.
pub fn check_width_sums(iface: &Interface, inputs: &[Input]) -> Result<(), InputError> {
    for (module, keys, total) in &iface.groups {
        if !keys.iter().any(|k| inputs.iter().any(|(n, _, _)| n == k)) {
            continue;
        }
        let width = |k: &String| {
            inputs.iter().find(|(n, _, _)| n == k).map(|(_, w, _)| *w).or_else(|| iface.input(k).and_then(|i| i.width))
        };
        let Some(ws) = keys.iter().map(width).collect::<Option<Vec<usize>>>() else { continue };
        let sum: usize = ws.iter().sum();
        if sum != *total {
            let input = keys
                .iter()
                .find(|k| iface.input(k).is_some_and(|i| i.width.is_none()))
                .or(keys.first())
                .map_or_else(|| module.clone(), String::clone);
            let parts = keys.iter().cloned().zip(ws).collect();
            return Err(InputError::WidthSum { input, module: module.clone(), parts, sum, total: *total });
        }
    }
    Ok(())
}

/// A GPC prior's request whose logits pass [`MAX_LOGITS_PER_FORWARD`],
/// refused before any work (the rows of one request run in one forward).
fn check_logits(iface: &Interface, rows: usize) -> Result<(), InputError> {
    let Some(per_row) = iface.logits_per_row else { return Ok(()) };
    match rows.checked_mul(per_row) {
        Some(n) if n <= MAX_LOGITS_PER_FORWARD => Ok(()),
        _ => Err(InputError::TooManyLogits {
            rows,
            per_row,
            limit: MAX_LOGITS_PER_FORWARD,
            max_rows: MAX_LOGITS_PER_FORWARD / per_row.max(1),
        }),
    }
}

/// Reads a request (`header_len`: the binary extension's header length)
/// against `expect`. The JSON is parsed as the protocol's shadow structs
/// (see [`crate::protocol`]); when that fails and the JSON holds `NaN` /
/// `Infinity` literals in tensor data, once more with those quoted.
///
/// Memory: besides the body, at most a copy of the JSON header (only
/// when it holds such literals, 5/3 of its size at most) and the values,
/// which never outnumber what the checked shapes hold nor one per two
/// bytes of JSON data or one per element size of binary data: float32
/// values take at most twice the bytes they came in, int64 values (a GPC
/// prior's tokens) and BOOL values (float32s from one byte each; from JSON
/// at least five bytes each) four times: in all under 7 times the body's size.
pub fn decode(body: &[u8], header_len: Option<usize>, expect: &Expect) -> Result<Decoded, RequestError> {
    let (json, binary) = split(body, header_len)?;
    match serde_json::from_slice::<InferRequest>(json) {
        Ok(req) => decode_request(req, binary, expect),
        Err(e) => {
            let Some(quoted) = quote_non_finite(json) else {
                return Err(RequestError::BadJson(Arc::new(e)));
            };
            match serde_json::from_slice::<InferRequest>(&quoted) {
                Ok(req) => decode_request(req, binary, expect),
                Err(_) => Err(RequestError::BadJson(Arc::new(e))),
            }
        }
    }
}

/// [`decode`] once the JSON is parsed.
fn decode_request<'a>(req: InferRequest<'a>, mut binary: &'a [u8], expect: &Expect) -> Result<Decoded, RequestError> {
    let params = Params::read(&req.parameters, expect.non_finite)?;
    let list = req
        .inputs
        .0
        .into_iter()
        .map(|i: RequestInput<'a>| TensorIn {
            name: i.name.0,
            datatype: i.datatype.0,
            shape: i.shape.0,
            source: RestData { binary_size: i.parameters.get("binary_data_size").cloned(), data: i.data },
        })
        .collect();
    let (inputs, rows) = read_tensors(list, &mut binary, expect, params.non_finite)?;
    if !binary.is_empty() {
        return Err(InputError::BinaryLeftOver { bytes: binary.len() }.into());
    }
    assemble(req.id, &params, inputs, rows, req.outputs.map(|o| o.0), expect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LoadedModel;
    use serde_json::{json, Value};

    fn variant(name: &str, pins: &[(String, usize)]) -> LoadedModel {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(name);
        LoadedModel::load(&dir.join("last.ckpt"), None, &candle_core::Device::Cpu, pins, 1).expect(name)
    }

    fn tracker(pins: &[(String, usize)]) -> LoadedModel {
        variant("smpl_tracker", pins)
    }

    /// A JSON request of zeros with these (key, rows, width) inputs and extra fields.
    fn body(inputs: &[(&str, usize, usize)], extra: Value) -> Vec<u8> {
        let inputs: Vec<Value> = inputs
            .iter()
            .map(|(k, r, w)| json!({"name": k, "shape": [r, w], "datatype": "FP32", "data": vec![0.0f32; r * w]}))
            .collect();
        let mut req = json!({ "inputs": inputs });
        if let (Value::Object(m), Value::Object(e)) = (&mut req, extra) {
            m.extend(e);
        }
        serde_json::to_vec(&req).expect("JSON")
    }

    const TRACKER: [(&str, usize, usize); 3] =
        [("max_coords_obs", 2, 358), ("mimic_target_poses", 2, 576), ("previous_actions", 2, 69)];

    #[test]
    fn refusals_are_typed_and_name_the_input_and_what_was_expected() {
        let pins = [("max_coords_obs".to_string(), 358), ("mimic_target_poses".to_string(), 576)];
        let (open, pinned) = (tracker(&[]), tracker(&pins));
        fn expect(m: &LoadedModel, max_rows: usize) -> Expect<'_> {
            Expect { iface: &m.interface, non_finite: NonFinite::Pass, max_rows }
        }
        let ok = decode(&body(&TRACKER, json!({})), None, &expect(&open, 256)).expect("a good request");
        assert_eq!(
            (ok.rows, ok.signature().collect::<Vec<_>>()),
            (2, vec![("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 69)])
        );
        assert_eq!(ok.outputs.iter().map(|o| o.name).collect::<Vec<_>>(), ["mean_action", "value", "std", "norm_obs"]);

        let split = [("max_coords_obs", 2, 357), ("mimic_target_poses", 2, 577), ("previous_actions", 2, 69)];
        // the tracker's widths, pinned or from its configs: another split is refused by key and width
        for m in [&open, &pinned] {
            let e = decode(&body(&split, json!({})), None, &expect(m, 256)).unwrap_err();
            assert!(
                matches!(&e, RequestError::BadInput(InputError::Width { input, width: 357, expected: 358 }) if input == "max_coords_obs"),
                "{e}"
            );
        }
        // open widths (a synthetic policy: only obs_a + obs_b + obs_c = 18 is known): a split that adds up is taken
        let sum_only = variant("layernorm_activations", &[]);
        let split = [("obs_a", 2, 6), ("obs_b", 2, 6), ("obs_c", 2, 6)];
        assert!(decode(&body(&split, json!({})), None, &expect(&sum_only, 256)).is_ok());
        // widths that do not add up
        let short = [("obs_a", 2, 6), ("obs_b", 2, 6), ("obs_c", 2, 5)];
        let e = decode(&body(&short, json!({})), None, &expect(&sum_only, 256)).unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::WidthSum { sum: 17, total: 18, .. })), "{e}");
        // more rows than max_batch
        let e = decode(&body(&TRACKER, json!({})), None, &expect(&open, 1)).unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::Batch { rows: 2, max_batch: 1, .. })), "{e}");
        // a missing input, with the width the pins fix
        let e = decode(&body(&TRACKER[..2], json!({})), None, &expect(&pinned, 256)).unwrap_err();
        assert!(
            matches!(&e, RequestError::BadInput(InputError::MissingInput { input, width: Some(69) }) if input == "previous_actions"),
            "{e}"
        );
        // parameters and outputs
        let e = decode(&body(&TRACKER, json!({"parameters": {"seed": -1}})), None, &expect(&open, 256)).unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::Parameter { name: "seed", .. })), "{e}");
        let e =
            decode(&body(&TRACKER, json!({"outputs": [{"name": "action"}]})), None, &expect(&open, 256)).unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::NeedsSample { output: "action" })), "{e}");
        let e = decode(&body(&TRACKER, json!({"outputs": [{"name": "q"}]})), None, &expect(&open, 256)).unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::UnknownOutput { output, .. }) if output == "q"), "{e}");
        // the binary extension: a header length past the body
        let e = decode(b"{}", Some(9), &expect(&open, 256)).unwrap_err();
        assert!(matches!(e, RequestError::HeaderPastBody { header: 9, body: 2 }), "{e}");
        let e = decode(b"{\"inputs\": [", None, &expect(&open, 256)).unwrap_err();
        assert!(matches!(e, RequestError::BadJson(_)), "{e}");
    }

    /// v3.1's MaskedMimic takes its masks as BOOL too (JSON true/false, or
    /// one byte each with the binary extension), read as the FP32 0.0/1.0
    /// they stand for; a BOOL element that is not true or false is refused
    /// naming it, and a model without `also_bool` (today's tracker)
    /// refuses BOOL as Triton refuses a datatype other than the input's.
    #[test]
    fn an_older_masked_mimic_takes_bool_masks_as_their_floats() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/v31_masked_mimic");
        let obs = candle_core::safetensors::load(dir.join("obs.safetensors"), &candle_core::Device::Cpu).expect("obs");
        let mm = variant("v31_masked_mimic", &[]);
        let ex = Expect { iface: &mm.interface, non_finite: NonFinite::Pass, max_rows: 256 };
        let mut keys: Vec<&String> = obs.keys().collect();
        keys.sort();
        let values = |k: &str| obs[k].flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32");
        let masks: Vec<&String> = keys.iter().copied().filter(|k| k.ends_with("_masks")).collect();
        assert!(!masks.is_empty(), "{keys:?}");
        assert!(masks.iter().all(|k| values(k).iter().all(|v| *v == 0.0 || *v == 1.0)));
        // (JSON datatype and data of one input, binary bytes) as FP32, or BOOL where `as_bool`
        let request = |as_bool: &dyn Fn(&str) -> bool, binary: bool| -> (Vec<u8>, usize) {
            let mut tail = Vec::new();
            let inputs: Vec<Value> = keys
                .iter()
                .map(|k| {
                    let (v, b) = (values(k), as_bool(k));
                    let mut i =
                        json!({"name": k, "shape": obs[*k].dims(), "datatype": if b { "BOOL" } else { "FP32" }});
                    if binary && b {
                        tail.extend(v.iter().map(|x| u8::from(*x != 0.0)));
                        i["parameters"] = json!({"binary_data_size": v.len()});
                    } else if b {
                        i["data"] = json!(v.iter().map(|x| *x != 0.0).collect::<Vec<_>>());
                    } else {
                        i["data"] = json!(v);
                    }
                    i
                })
                .collect();
            let mut body = serde_json::to_vec(&json!({"inputs": inputs})).expect("JSON");
            let header = body.len();
            body.extend(tail);
            (body, header)
        };
        let floats = decode(&request(&|_| false, false).0, None, &ex).expect("FP32 masks");
        let is_mask = |k: &str| k.ends_with("_masks");
        let json_bools = decode(&request(&is_mask, false).0, None, &ex).expect("BOOL masks as JSON");
        let (body, header) = request(&is_mask, true);
        let binary_bools = decode(&body, Some(header), &ex).expect("BOOL masks, binary");
        assert_eq!(json_bools.inputs, floats.inputs);
        assert_eq!(binary_bools.inputs, floats.inputs);

        // an element that is not a bool, named by input and position
        let mask = masks[0].as_str();
        let (body, _) = request(&|k| k == mask, false);
        let text = String::from_utf8(body).expect("UTF-8").replacen("false", "2", 1).replacen("true", "2", 1);
        let e = decode(text.as_bytes(), None, &ex).unwrap_err();
        assert!(
            matches!(&e, RequestError::BadInput(InputError::BoolData { input, value, .. }) if input == mask && value == "2"),
            "{e}"
        );

        // today's tracker: FP32 only
        let t = tracker(&[]);
        let bools: Vec<Value> = TRACKER
            .iter()
            .map(|(k, r, w)| json!({"name": k, "shape": [r, w], "datatype": "BOOL", "data": vec![false; r * w]}))
            .collect();
        let body = serde_json::to_vec(&json!({"inputs": bools})).expect("JSON");
        let e = decode(&body, None, &Expect { iface: &t.interface, non_finite: NonFinite::Pass, max_rows: 256 })
            .unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::Datatype { expected: "FP32", .. })), "{e}");
        // the older MaskedMimic names both it takes
        let (body, _) = request(&|k| k == mask, false);
        let text = String::from_utf8(body).expect("UTF-8").replacen("\"BOOL\"", "\"INT64\"", 1);
        let e = decode(text.as_bytes(), None, &ex).unwrap_err();
        assert!(matches!(&e, RequestError::BadInput(InputError::Datatype { expected: "FP32 or BOOL", .. })), "{e}");
    }
}
