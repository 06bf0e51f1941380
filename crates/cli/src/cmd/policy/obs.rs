//! The observations file of `policy run`: a safetensors file of one f32
//! `[B, D]` tensor per in_key, read so that a hostile file costs little.
//!
//! The safetensors crate (and candle on top of it) parses the whole header
//! into a map and maps every tensor before anyone can look at the keys: a
//! file of 1.4 million empty extra tensors cost 1.2 GB and seconds before
//! the "unexpected observation" error. Here the header is streamed from
//! the open file and each entry checked as it comes (a key the policy does
//! not accept, a key given twice, a dtype other than F32, a rank other than
//! 2, more than a few dimensions, data outside the file), so the first bad
//! entry ends the read with at most one entry in memory; only then are the
//! accepted tensors read, each exactly its declared bytes.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::{Device, Tensor};
use pmstate_policy::gpc::problem::PriorProblem;
use pmstate_policy::gpc::LatentPrior;
use pmstate_policy::{Policy, PolicyError};
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

/// `policy run --obs`: one f32 `[B, D]` tensor per observation key the
/// model accepts (its width named in errors where the checkpoint fixes it),
/// and for a GPC prior its int64 `[B, T]` teacher-forced tokens.
struct ObsSchema {
    accepted: Vec<String>,
    /// Widths the model fixes, per key.
    known: BTreeMap<String, usize>,
    /// A GPC prior's token key and tokens per row.
    tokens: Option<(String, usize)>,
}

impl Schema for ObsSchema {
    fn flag(&self) -> &'static str {
        "--obs"
    }

    fn check_entry(&self, key: &str, dtype: &str, dims: &[u64]) -> Result<(), CliError> {
        let key = key.to_owned();
        if !self.accepted.contains(&key) {
            return Err(PolicyError::ExtraObs { key, expected: self.accepted.clone() }.into());
        }
        let shape = || dims.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect::<Vec<_>>();
        if let Some((token_key, tokens)) = &self.tokens {
            if key == *token_key {
                let tokens = *tokens;
                if dtype != "I64" {
                    let problem = PriorProblem::TokensDtype { dtype: dtype.to_lowercase(), tokens };
                    return Err(PolicyError::Prior { path: key, problem }.into());
                }
                if dims.len() != 2 || dims[1] != tokens as u64 {
                    let batch = dims.first().map_or(0, |&b| usize::try_from(b).unwrap_or(usize::MAX));
                    let problem = PriorProblem::TokensShape { shape: shape(), batch, tokens };
                    return Err(PolicyError::Prior { path: key, problem }.into());
                }
                return Ok(());
            }
        }
        let width = self.known.get(&key).copied();
        if dtype != "F32" {
            return Err(PolicyError::ObsDtype { key, dtype: dtype.to_lowercase(), width }.into());
        }
        if dims.len() != 2 {
            return Err(PolicyError::ObsRank { key, shape: shape(), width }.into());
        }
        Ok(())
    }
}

/// Reads the observations `policy` accepts from the safetensors file at
/// `path`; see the module documentation for what is checked, and when.
pub fn read_obs(path: &Path, policy: &Policy) -> Result<HashMap<String, Tensor>, CliError> {
    let schema = ObsSchema { accepted: policy.accepted_keys(), known: policy.widths().known.clone(), tokens: None };
    read_tensors(path, &schema)
}

/// Reads a MaskedMimic model's observations (and `vae_noise`) as [`read_obs`] does.
pub fn read_masked_mimic_obs(
    path: &Path,
    model: &pmstate_policy::MaskedMimic,
) -> Result<HashMap<String, Tensor>, CliError> {
    let noise = pmstate_policy::masked_mimic::VAE_NOISE_KEY;
    let mut accepted = model.in_keys();
    accepted.push(noise.to_owned());
    let mut known = model.widths.known.clone();
    known.insert(noise.to_owned(), model.config.latent_dim);
    read_tensors(path, &ObsSchema { accepted, known, tokens: None })
}

/// Reads what `prior` accepts (its observations, its tokens) from the
/// safetensors file at `path`, as [`read_obs`] does.
pub fn read_prior_obs(path: &Path, prior: &LatentPrior) -> Result<HashMap<String, Tensor>, CliError> {
    let mut accepted = prior.obs_keys();
    accepted.push(prior.token_key().to_owned());
    let tokens = Some((prior.token_key().to_owned(), prior.tokenization().tokens));
    read_tensors(path, &ObsSchema { accepted, known: prior.widths().known.clone(), tokens })
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
        // the schemas accept f32, and int64 only where a reader asks for it
        let elem: u64 = if e.dtype == "I64" { 8 } else { 4 };
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
        let t = if elem == 8 {
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
