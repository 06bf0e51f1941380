//! Reading torch.save files: the zip archive (torch >= 1.6) and the legacy stream.

use std::collections::HashMap;
use std::io::{Cursor, Read};
use std::sync::Arc;

use pmstate_pickle::{from_slice, from_slice_prefix, Limits, Value};
use zip::CompressionMethod;

use crate::error::{CkptError, Result};
use crate::interpret::{Declared, Interpreter, PidForm};
use crate::storage::{Backing, Bytes, Storage};
use crate::tree::Node;

/// Bounds on what reading a file may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadOptions {
    /// Limits for every pickle record.
    pub pickle: Limits,
    /// Most bytes all compressed (deflated) records together may expand
    /// to: the zip-bomb guard. `None`: 32 times the file size plus 64 MiB,
    /// which real deflated checkpoints (ratios of 1.1 to 3) never approach.
    /// Each record is also held to the size its storage declares.
    pub max_inflated_bytes: Option<u64>,
}

/// Where a record lives in the archive.
struct Record {
    index: usize,
    compression: CompressionMethod,
    data_start: u64,
    compressed_size: u64,
    size: u64,
}

pub(crate) struct Parsed {
    pub root: Node,
    pub storages: HashMap<String, Storage>,
    pub prefix: Option<String>,
}

fn container(path: &str, reason: impl Into<String>) -> CkptError {
    CkptError::Container { path: path.to_owned(), reason: reason.into() }
}

pub(crate) fn interpret(path: &str, value: Value, form: PidForm, declared: &mut Declared) -> Result<Node> {
    let mut it = Interpreter { declared, form, keys: Vec::new() };
    match it.node(value) {
        Ok(n) => Ok(n),
        Err(reason) => Err(CkptError::Value { path: path.to_owned(), key: it.key_path(), reason }),
    }
}

/// Reads a torch zip archive held in `map`.
pub(crate) fn read_zip(path: &str, map: &Arc<Backing>, opts: &ReadOptions) -> Result<Parsed> {
    let zerr = |e: zip::result::ZipError| container(path, format!("zip: {e}"));
    let mut za = zip::ZipArchive::new(Cursor::new(&map[..])).map_err(zerr)?;
    let mut prefix: Option<String> = None;
    let mut records: HashMap<String, Record> = HashMap::new();
    for i in 0..za.len() {
        let f = za.by_index_raw(i).map_err(zerr)?;
        let name = f.name().map_err(zerr)?.into_owned();
        let Some((pre, rest)) = name.split_once('/') else {
            return Err(container(path, format!("entry {name:?} is not in a subdirectory")));
        };
        match &prefix {
            None => prefix = Some(pre.to_owned()),
            Some(p) if p != pre => {
                return Err(container(path, format!("entry {name:?} is outside the archive's folder {p:?}")));
            }
            _ => {}
        }
        let data_start = f.data_start().ok_or_else(|| container(path, format!("entry {name:?}: no data offset")))?;
        let rec = Record {
            index: i,
            compression: f.compression(),
            data_start,
            compressed_size: f.compressed_size(),
            size: f.size(),
        };
        if records.insert(rest.to_owned(), rec).is_some() {
            return Err(container(path, format!("duplicate entry {name:?}")));
        }
    }
    if let Some(listed) = central_directory_entries(map) {
        if listed != za.len() {
            return Err(container(
                path,
                format!("duplicate entry names: the central directory lists {listed} entries, {} distinct", za.len()),
            ));
        }
    }
    if records.contains_key("constants.pkl") {
        return Err(container(path, "a TorchScript archive (constants.pkl), not a torch.save checkpoint"));
    }
    if let Some(order) = records.get("byteorder") {
        let b = read_record(path, map, &mut za, "byteorder", order, 16)?;
        if &b[..] != b"little" {
            return Err(container(
                path,
                format!("byteorder {:?}: only little-endian checkpoints are supported", String::from_utf8_lossy(&b)),
            ));
        }
    }
    if !records.contains_key("version") && !records.contains_key(".data/version") {
        return Err(container(path, "no version record"));
    }
    let pkl = records.get("data.pkl").ok_or_else(|| container(path, "no data.pkl record"))?;
    let pkl = read_record(path, map, &mut za, "data.pkl", pkl, opts.pickle.max_input_bytes)?;
    let value = from_slice(&pkl, &opts.pickle).map_err(|source| CkptError::Pickle {
        path: path.to_owned(),
        record: "data.pkl".into(),
        source,
    })?;
    let mut declared = Declared::default();
    let root = interpret(path, value, PidForm::Zip, &mut declared)?;
    let mut storages = HashMap::new();
    let mut inflate_budget = opts.max_inflated_bytes.unwrap_or((map.len() as u64).saturating_mul(32) + (64 << 20));
    for key in &declared.order {
        let decl = &declared.by_key[key];
        let name = format!("data/{key}");
        let rec = records.get(&name).ok_or_else(|| container(path, format!("storage {key}: no record {name}")))?;
        if rec.size != decl.nbytes as u64 {
            return Err(container(
                path,
                format!("record {name} holds {} bytes; its storage declares {}", rec.size, decl.nbytes),
            ));
        }
        let data = if rec.compression == CompressionMethod::Stored {
            mapped(path, map, &name, rec)?
        } else {
            if decl.nbytes as u64 > inflate_budget {
                return Err(container(
                    path,
                    format!(
                        "record {name}: inflating {} more bytes would pass the limit on inflated data ({} left); \
                         raise ReadOptions::max_inflated_bytes for a legitimate file",
                        decl.nbytes, inflate_budget
                    ),
                ));
            }
            inflate_budget -= decl.nbytes as u64;
            Bytes::owned(read_record(path, map, &mut za, &name, rec, decl.nbytes as u64)?)
        };
        storages.insert(
            key.clone(),
            Storage { typed: decl.typed, dtype: decl.dtype, location: decl.location.clone(), data },
        );
    }
    Ok(Parsed { root, storages, prefix })
}

/// The entry count the end-of-central-directory record declares (None for
/// ZIP64 archives, whose 16-bit field is saturated, or if not found). The
/// zip reader keeps one entry per name, so a difference means duplicates,
/// which could make two readers see different data under one name.
fn central_directory_entries(bytes: &[u8]) -> Option<usize> {
    let tail_start = bytes.len().saturating_sub(22 + 0xFFFF);
    let tail = &bytes[tail_start..];
    let at = tail.windows(4).rposition(|w| w == b"PK\x05\x06")?;
    let field = tail.get(at + 10..at + 12)?;
    let n = u16::from_le_bytes([field[0], field[1]]);
    (n != 0xFFFF).then_some(usize::from(n))
}

fn mapped(path: &str, map: &Arc<Backing>, name: &str, rec: &Record) -> Result<Bytes> {
    let start = usize::try_from(rec.data_start).ok();
    let len = usize::try_from(rec.size).ok();
    match (start, len) {
        (Some(s), Some(l)) if rec.compressed_size == rec.size && s.checked_add(l).is_some_and(|e| e <= map.len()) => {
            Ok(Bytes::mapped(map, s, l))
        }
        _ => Err(container(path, format!("record {name} reaches past the end of the file"))),
    }
}

/// Reads a whole record (inflating it if compressed), refusing more than `limit` bytes.
fn read_record(
    path: &str,
    map: &Arc<Backing>,
    za: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    rec: &Record,
    limit: u64,
) -> Result<Vec<u8>> {
    if rec.size > limit {
        return Err(container(path, format!("record {name} declares {} bytes (limit {limit})", rec.size)));
    }
    if rec.compression == CompressionMethod::Stored {
        return Ok(mapped(path, map, name, rec)?.to_vec());
    }
    let f = za.by_index(rec.index).map_err(|e| container(path, format!("record {name}: {e}")))?;
    let mut out = Vec::with_capacity(rec.size as usize);
    // Read one byte past the declared size: a record that inflates to more than it declares is refused.
    f.take(rec.size + 1)
        .read_to_end(&mut out)
        .map_err(|e| container(path, format!("record {name}: inflating: {e}")))?;
    if out.len() as u64 != rec.size {
        return Err(container(path, format!("record {name} inflates to {} bytes, declares {}", out.len(), rec.size)));
    }
    Ok(out)
}

/// The legacy stream's magic number, pickled first (`0x1950a86a20f9469cfc6c`).
const LEGACY_MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// Whether `bytes` start like a legacy torch.save stream (a pickled LONG1 magic).
pub(crate) fn is_legacy(bytes: &[u8]) -> bool {
    bytes.len() >= 14 && bytes[0] == 0x80 && bytes[2] == 0x8a && bytes[3] == 10 && bytes[4..14] == LEGACY_MAGIC
}

/// Reads a legacy (pre-1.6) torch.save stream: magic, protocol, sys_info,
/// the object, the storage key list, then each storage as an i64 element
/// count and its bytes.
pub(crate) fn read_legacy(path: &str, map: &Arc<Backing>, opts: &ReadOptions) -> Result<Parsed> {
    let mut pos = 0usize;
    let mut next = |what: &str| -> Result<Value> {
        let (v, used) = from_slice_prefix(&map[pos..], &opts.pickle).map_err(|source| CkptError::Pickle {
            path: path.to_owned(),
            record: what.to_owned(),
            source,
        })?;
        pos += used;
        Ok(v)
    };
    let _magic = next("magic number")?;
    match next("protocol version")? {
        Value::Int(1001) => {}
        other => return Err(container(path, format!("legacy protocol version {other:?}, expected 1001"))),
    }
    let sys_info = next("sys_info")?;
    let little = match &sys_info {
        Value::Dict(kv) => kv.iter().find(|(k, _)| k.as_str() == Some("little_endian")).map(|(_, v)| v.clone()),
        _ => None,
    };
    if little != Some(Value::Bool(true)) {
        return Err(container(path, "legacy sys_info is not little-endian"));
    }
    let value = next("data")?;
    let keys = match next("storage keys")? {
        Value::List(ks) => ks,
        other => return Err(container(path, format!("legacy storage key list is not a list: {other:?}"))),
    };
    let mut declared = Declared::default();
    let root = interpret(path, value, PidForm::Legacy, &mut declared)?;
    let mut storages = HashMap::new();
    for k in keys {
        let key = match k {
            Value::Str(s) => s,
            Value::Int(i) => i.to_string(),
            other => return Err(container(path, format!("legacy storage key {other:?} is not a string"))),
        };
        let decl = declared
            .by_key
            .get(&key)
            .ok_or_else(|| container(path, format!("legacy storage {key} is listed but no tensor uses it")))?;
        let header =
            map.get(pos..pos + 8).ok_or_else(|| container(path, format!("legacy storage {key}: truncated")))?;
        let mut n8 = [0u8; 8];
        n8.copy_from_slice(header);
        let numel = i64::from_le_bytes(n8);
        let elem = if decl.typed { decl.dtype.size() } else { 1 };
        let nbytes = usize::try_from(numel).ok().and_then(|n| n.checked_mul(elem));
        if nbytes != Some(decl.nbytes) {
            return Err(container(path, format!("legacy storage {key}: {numel} elements, declared {}", decl.nbytes)));
        }
        pos += 8;
        if pos.checked_add(decl.nbytes).is_none_or(|e| e > map.len()) {
            return Err(container(path, format!("legacy storage {key}: truncated")));
        }
        let data = Bytes::mapped(map, pos, decl.nbytes);
        pos += decl.nbytes;
        storages.insert(key, Storage { typed: decl.typed, dtype: decl.dtype, location: decl.location.clone(), data });
    }
    if let Some(missing) = declared.order.iter().find(|k| !storages.contains_key(*k)) {
        return Err(container(path, format!("legacy storage {missing} is used but has no data")));
    }
    Ok(Parsed { root, storages, prefix: None })
}
