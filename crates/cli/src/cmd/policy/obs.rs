//! The observations file of `policy run`: a safetensors file of one f32
//! `[B, D]` tensor per in_key, read so that a hostile file costs little.
//!
//! The safetensors crate (and candle on top of it) parses the whole header
//! into a map and maps every tensor before anyone can look at the keys: a
//! file of 1.4 million empty extra tensors cost 1.2 GB and seconds before
//! the "unexpected observation" error. Here the header is streamed from
//! the open file and each entry checked as it comes (a key the policy does
//! not accept, a key given twice, a dtype other than F32 (or BOOL, read as
//! 0.0 / 1.0: the releases' environments make their masks boolean), a rank other than
//! 2, more than a few dimensions, data outside the file), so the first bad
//! entry ends the read with at most one entry in memory; only then are the
//! accepted tensors read, each exactly its declared bytes.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::{Device, Tensor};
use pmstate_policy::served::{Datatype, Signature};
use pmstate_policy::PolicyError;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::CliError;

/// What a file that is no safetensors file at all is told.
const NOT_OBS: &str = "not a safetensors observation file (expected one f32 [B, D] tensor per in_key, as \
                       `policy run` writes and the recorded traces hold)";

/// The most header bytes the safetensors format allows.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Most dimensions read from a shape before it is refused (an observation has 2).
const MAX_DIMS: usize = 8;

/// What is wrong with an observations file beyond what the policy checks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObsProblem {
    /// Shorter than its 8-byte header length, or than the header it declares.
    #[error("{NOT_OBS}: the file ends inside its header ({len} bytes, the header needs {needed})")]
    Truncated {
        /// The file's size.
        len: u64,
        /// What the header needs.
        needed: u64,
    },
    /// A header over the format's limit.
    #[error("{NOT_OBS}: a header of {len} bytes, over the safetensors limit of {MAX_HEADER_BYTES}")]
    HeaderTooLarge {
        /// Its declared length.
        len: u64,
    },
    /// The header is not a JSON object of tensor entries.
    #[error("{NOT_OBS}: its header is not safetensors JSON: {0}")]
    Header(#[source] serde_json::Error),
    /// A tensor named twice in the header.
    #[error("tensor {0} is listed twice in the safetensors header")]
    Duplicate(String),
    /// A shape of more than [`MAX_DIMS`] dimensions.
    #[error("tensor {key}: a shape of more than {MAX_DIMS} dimensions")]
    TooManyDims {
        /// The tensor.
        key: String,
    },
    /// An input the model takes as int64 given in another element type.
    #[error("tensor {key}: dtype {dtype}, expected int64 [B, {width}]")]
    NotInt64 {
        /// The tensor.
        key: String,
        /// Its dtype, as the file names it (lower case).
        dtype: String,
        /// Its width.
        width: String,
    },
    /// Data offsets that do not hold exactly the shape's f32 values inside the file.
    #[error(
        "tensor {key}: data offsets [{start}, {end}] do not hold its {needed} bytes inside the file's {available}"
    )]
    Offsets {
        /// The tensor.
        key: String,
        /// Declared start.
        start: u64,
        /// Declared end.
        end: u64,
        /// What its shape needs.
        needed: u64,
        /// Bytes after the header.
        available: u64,
    },
}

/// One header entry, shape bounded while it is parsed.
#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Shape,
    data_offsets: [u64; 2],
}

/// A shape's first [`MAX_DIMS`] dimensions, and whether it has more (the
/// rest are skipped unread: a 60 MB shape list is never held).
struct Shape {
    dims: Vec<u64>,
    more: bool,
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of dimensions")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
                let mut dims = Vec::new();
                while dims.len() < MAX_DIMS {
                    match seq.next_element::<u64>()? {
                        Some(d) => dims.push(d),
                        None => return Ok(Shape { dims, more: false }),
                    }
                }
                let mut more = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    more = true;
                }
                Ok(Shape { dims, more })
            }
        }
        d.deserialize_seq(V)
    }
}

/// What a tensors file must hold: which keys, dtypes and shapes.
pub(crate) trait Schema {
    /// Which flag names the file in errors (`--obs`, `--inputs`).
    fn flag(&self) -> &'static str;
    /// Refuses an entry the reader of the file does not accept.
    fn check_entry(&self, key: &str, dtype: &str, dims: &[u64]) -> Result<(), CliError>;
}

/// `policy run --obs`: one tensor per input of the model's signature (or
/// key its configs list and no network reads), f32 `[B, D]` (its width
/// named in errors where the checkpoint fixes it), or `[B, D]` int64 where
/// the signature takes int64 (a GPC prior's tokens).
struct ObsSchema<'a> {
    signature: &'a Signature,
    /// The file, for errors naming it.
    path: &'a Path,
}

impl ObsSchema<'_> {
    fn accepted(&self) -> Vec<String> {
        let sig = self.signature;
        sig.inputs.iter().map(|i| i.name.clone()).chain(sig.ignored.iter().cloned()).collect()
    }
}

impl Schema for ObsSchema<'_> {
    fn flag(&self) -> &'static str {
        "--obs"
    }

    fn check_entry(&self, key: &str, dtype: &str, dims: &[u64]) -> Result<(), CliError> {
        let sig = self.signature;
        let spec = sig.input(key);
        if spec.is_none() && !sig.ignored.iter().any(|k| k == key) {
            return Err(PolicyError::ExtraObs { key: key.to_owned(), expected: self.accepted() }.into());
        }
        let key = key.to_owned();
        let shape = || dims.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect::<Vec<_>>();
        let width = spec.and_then(|s| s.width);
        // an int64 input also reads as f32, for its model to say what it
        // takes in its own words (a GPC prior's "prior tokens must be int64")
        let takes_int64 = spec.is_some_and(|s| s.datatype == Datatype::Int64);
        if takes_int64 && dtype != "I64" && dtype != "F32" {
            let width = width.map_or("D".to_owned(), |w| w.to_string());
            let problem = ObsProblem::NotInt64 { key, dtype: dtype.to_lowercase(), width };
            return Err(obs_error(self.flag(), self.path, problem));
        }
        // a boolean tensor (a mask as the releases' environments make it) reads as 0.0 / 1.0
        if dtype != "F32" && dtype != "BOOL" && !(takes_int64 && dtype == "I64") {
            return Err(PolicyError::ObsDtype { key, dtype: dtype.to_lowercase(), width }.into());
        }
        if dims.len() != 2 {
            return Err(PolicyError::ObsRank { key, shape: shape(), width }.into());
        }
        Ok(())
    }
}

/// Reads the inputs `signature` takes from the safetensors file at
/// `path`; see the module documentation for what is checked, and when.
pub fn read_obs(path: &Path, signature: &Signature) -> Result<HashMap<String, Tensor>, CliError> {
    read_tensors(path, &ObsSchema { signature, path })
}

/// The accepted entries of a header, refused at the first bad one.
struct Header<'a> {
    path: &'a Path,
    schema: &'a dyn Schema,
    /// The typed problem behind a serde error raised while streaming.
    problem: &'a RefCell<Option<CliError>>,
}

impl<'de> DeserializeSeed<'de> for Header<'_> {
    type Value = Vec<(String, Entry)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Header<'_> {
    type Value = Vec<(String, Entry)>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header (a JSON object)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out: Vec<(String, Entry)> = Vec::new();
        let mut seen = HashSet::new();
        let fail = |e: CliError| {
            *self.problem.borrow_mut() = Some(e);
            de::Error::custom("refused")
        };
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if !seen.insert(key.clone()) {
                return Err(fail(obs_error(self.schema.flag(), self.path, ObsProblem::Duplicate(key))));
            }
            let entry = map.next_value::<Entry>()?;
            if entry.shape.more {
                return Err(fail(obs_error(self.schema.flag(), self.path, ObsProblem::TooManyDims { key })));
            }
            if let Err(e) = self.schema.check_entry(&key, &entry.dtype, &entry.shape.dims) {
                return Err(fail(e));
            }
            out.push((key, entry));
        }
        Ok(out)
    }
}

fn obs_error(flag: &'static str, path: &Path, problem: ObsProblem) -> CliError {
    CliError::Obs { flag, path: path.display().to_string(), problem }
}

/// Reads the f32 tensors `schema` accepts from the safetensors file at
/// `path`, as [`read_obs`] does.
pub(crate) fn read_tensors(path: &Path, schema: &dyn Schema) -> Result<HashMap<String, Tensor>, CliError> {
    let (file, meta) = pmstate_ckpt::open_regular(path)?;
    let len = meta.len();
    let shown = || path.display().to_string();
    let io = |e: std::io::Error| CliError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", shown())));
    let problem = |p| obs_error(schema.flag(), path, p);
    if len < 8 {
        return Err(problem(ObsProblem::Truncated { len, needed: 8 }));
    }
    let mut n = [0u8; 8];
    read_exact_at(&file, 0, &mut n).map_err(io)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES {
        return Err(problem(ObsProblem::HeaderTooLarge { len: n }));
    }
    let data_start = 8 + n;
    if data_start > len {
        return Err(problem(ObsProblem::Truncated { len, needed: data_start }));
    }
    let refused = RefCell::new(None);
    let mut reader = BufReader::new(ReadAt { file: &file, pos: 8, end: data_start });
    let mut de = serde_json::Deserializer::from_reader(&mut reader);
    let parsed = Header { path, schema, problem: &refused }.deserialize(&mut de).and_then(|v| {
        de.end()?;
        Ok(v)
    });
    let entries = match (parsed, refused.into_inner()) {
        (_, Some(e)) => return Err(e),
        (Err(e), None) => return Err(problem(ObsProblem::Header(e))),
        (Ok(v), None) => v,
    };
    let available = len - data_start;
    let mut out = HashMap::with_capacity(entries.len());
    for (key, e) in entries {
        let [start, end] = e.data_offsets;
        // the schemas accept f32, bool, and int64 only where a reader asks for it
        let elem: u64 = match e.dtype.as_str() {
            "I64" => 8,
            "BOOL" => 1,
            _ => 4,
        };
        let needed = e.shape.dims.iter().try_fold(elem, |acc, &d| acc.checked_mul(d));
        let bad = ObsProblem::Offsets { key: key.clone(), start, end, needed: needed.unwrap_or(u64::MAX), available };
        let Some(needed) = needed.filter(|&x| start <= end && end <= available && end - start == x) else {
            return Err(problem(bad));
        };
        let dims: Option<Vec<usize>> = e.shape.dims.iter().map(|&d| usize::try_from(d).ok()).collect();
        let (Some(dims), Ok(bytes)) = (dims, usize::try_from(needed)) else {
            return Err(problem(bad));
        };
        let mut raw = vec![0u8; bytes];
        read_exact_at(&file, data_start + start, &mut raw).map_err(io)?;
        let t = if elem == 1 {
            // torch's promotion of a bool next to floats: true 1.0, false 0.0
            let values: Vec<f32> = raw.iter().map(|&b| if b != 0 { 1.0 } else { 0.0 }).collect();
            Tensor::from_vec(values, dims, &Device::Cpu)?
        } else if elem == 8 {
            let values: Vec<i64> = raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            Tensor::from_vec(values, dims, &Device::Cpu)?
        } else {
            let values: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            Tensor::from_vec(values, dims, &Device::Cpu)?
        };
        drop(raw);
        out.insert(key, t);
    }
    Ok(out)
}

/// A `Read` over `file[pos..end]` by positioned reads.
struct ReadAt<'a> {
    file: &'a std::fs::File,
    pos: u64,
    end: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
        let n = buf.len().min(left);
        if n == 0 {
            return Ok(0);
        }
        read_exact_at(self.file, self.pos, &mut buf[..n])?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}
