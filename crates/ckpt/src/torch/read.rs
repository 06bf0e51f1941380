//! Reading torch.save files: the zip archive (torch >= 1.6) and the legacy stream.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use pmstate_pickle::{from_slice, from_slice_prefix, PickleError, Value};
use zip::CompressionMethod;

use super::interpret::{Declared, Interpreter, PidForm};
use crate::error::{CkptError, EntryProblem, LegacyProblem, ReadLimit, Result, Truncation};
use crate::io::source::{Cursor, Source};
use crate::io::storage::{Bytes, Storage};
use crate::parsed::{Format, Parsed, ReadOptions};
use crate::tree::Node;

/// Where a record lives in the archive.
struct Record {
    index: usize,
    compression: CompressionMethod,
    data_start: u64,
    compressed_size: u64,
    size: u64,
}

fn interpret(path: &str, value: Value, form: PidForm, declared: &mut Declared) -> Result<Node> {
    let mut it = Interpreter { declared, form, keys: Vec::new() };
    match it.node(value) {
        Ok(n) => Ok(n),
        Err(problem) => Err(CkptError::Value { path: path.to_owned(), key: it.key_path(), problem }),
    }
}

/// The zip-bomb budget: what all compressed records may inflate to; and
/// what they have inflated to so far, for progress reports.
struct InflateBudget<'a> {
    left: u64,
    limit: u64,
    inflated: Inflated<'a>,
}

/// Bytes inflated between two progress reports.
const INFLATE_CHUNK: u64 = 4 << 20;

/// Reports the inflating of compressed records: (bytes inflated so far,
/// bytes all compressed records declare).
pub(crate) type InflateProgress<'a> = &'a dyn Fn(u64, u64);

/// Inflated bytes so far, against what every compressed record declares.
struct Inflated<'a> {
    done: u64,
    total: u64,
    report: InflateProgress<'a>,
}

impl Inflated<'_> {
    fn add(&mut self, n: u64) {
        self.done = self.done.saturating_add(n);
        (self.report)(self.done, self.total);
    }
}

impl InflateBudget<'_> {
    fn take(&mut self, path: &str, record: &str, n: u64) -> Result<()> {
        if n > self.left {
            return Err(CkptError::InflateLimit {
                path: path.to_owned(),
                record: record.to_owned(),
                needed: n,
                left: self.left,
                limit: self.limit,
            });
        }
        self.left -= n;
        Ok(())
    }
}

/// Reads a torch zip archive.
pub(crate) fn read_zip(
    path: &str,
    src: &Arc<Source>,
    opts: &ReadOptions,
    progress: InflateProgress<'_>,
) -> Result<Parsed> {
    let zerr = |e: zip::result::ZipError| CkptError::Zip { path: path.to_owned(), source: Box::new(e) };
    let entry_err = |entry: &str, problem| CkptError::Entry { path: path.to_owned(), entry: entry.to_owned(), problem };
    let mut za = zip::ZipArchive::new(Cursor::new(src)).map_err(zerr)?;
    let mut prefix: Option<String> = None;
    let mut records: HashMap<String, Record> = HashMap::with_capacity(za.len());
    for i in 0..za.len() {
        let f = za.by_index_raw(i).map_err(zerr)?;
        let name = f.name().map_err(zerr)?.into_owned();
        let Some((pre, rest)) = name.split_once('/') else {
            return Err(entry_err(&name, EntryProblem::NotInFolder));
        };
        match &prefix {
            None => prefix = Some(pre.to_owned()),
            Some(p) if p != pre => return Err(entry_err(&name, EntryProblem::OutsideFolder { folder: p.clone() })),
            _ => {}
        }
        let data_start = f
            .data_start()
            .ok_or_else(|| CkptError::Truncated { path: path.to_owned(), what: Truncation::Entry(name.clone()) })?;
        let rec = Record {
            index: i,
            compression: f.compression(),
            data_start,
            compressed_size: f.compressed_size(),
            size: f.size(),
        };
        if records.insert(rest.to_owned(), rec).is_some() {
            return Err(entry_err(&name, EntryProblem::Duplicate));
        }
    }
    if let Some(cd) = central_directory(src)? {
        if cd.walked != cd.declared || cd.walked_bytes != cd.size {
            return Err(CkptError::CentralDirectoryMismatch {
                path: path.to_owned(),
                declared: cd.declared,
                size: cd.size,
                walked: cd.walked,
                walked_bytes: cd.walked_bytes,
            });
        }
        if cd.declared != za.len() as u64 {
            return Err(CkptError::DuplicateEntries {
                path: path.to_owned(),
                listed: cd.declared,
                distinct: za.len() as u64,
            });
        }
    }
    if records.contains_key("constants.pkl") {
        return Err(CkptError::TorchScript { path: path.to_owned() });
    }
    let limit = opts.max_inflated_bytes.unwrap_or(src.len().saturating_mul(32).saturating_add(64 << 20));
    let total = records
        .values()
        .filter(|r| r.compression != CompressionMethod::Stored)
        .fold(0u64, |s, r| s.saturating_add(r.size));
    let inflated = Inflated { done: 0, total, report: progress };
    let mut budget = InflateBudget { left: limit, limit, inflated };
    let mut read = |name: &str, rec: &Record, limit: u64, budget: &mut InflateBudget| -> Result<Vec<u8>> {
        read_record(path, src, &mut za, name, rec, limit, budget)
    };
    if let Some(order) = records.get("byteorder") {
        let b = read("byteorder", order, 16, &mut budget)?;
        if &b[..] != b"little" {
            return Err(CkptError::ByteOrder {
                path: path.to_owned(),
                found: String::from_utf8_lossy(&b).into_owned(),
            });
        }
    }
    if !records.contains_key("version") && !records.contains_key(".data/version") {
        return Err(CkptError::MissingRecord { path: path.to_owned(), record: "version".into() });
    }
    let pkl = records
        .get("data.pkl")
        .ok_or_else(|| CkptError::MissingRecord { path: path.to_owned(), record: "data.pkl".into() })?;
    let pkl = read("data.pkl", pkl, opts.pickle.max_input_bytes, &mut budget)?;
    let value = from_slice(&pkl, &opts.pickle).map_err(|source| CkptError::Pickle {
        path: path.to_owned(),
        record: "data.pkl".into(),
        source,
    })?;
    drop(pkl);
    let mut declared = Declared::default();
    let root = interpret(path, value, PidForm::Zip, &mut declared)?;
    let mut storages = HashMap::with_capacity(declared.order.len());
    for key in &declared.order {
        let decl = &declared.by_key[key];
        let name = format!("data/{key}");
        let rec = records
            .get(&name)
            .ok_or_else(|| CkptError::MissingRecord { path: path.to_owned(), record: name.clone() })?;
        if rec.size != decl.nbytes as u64 {
            return Err(CkptError::RecordSize {
                path: path.to_owned(),
                record: name,
                holds: rec.size,
                declares: decl.nbytes as u64,
            });
        }
        let data = if rec.compression == CompressionMethod::Stored {
            stored(path, src, &name, rec)?
        } else {
            Bytes::owned(read(&name, rec, decl.nbytes as u64, &mut budget)?)
        };
        storages.insert(
            key.clone(),
            Storage { typed: decl.typed, dtype: decl.dtype, location: decl.location.clone(), data },
        );
    }
    let prefix = prefix.unwrap_or_default();
    Ok(Parsed { root, storages, format: Format::TorchZip { prefix } })
}

/// What the end of a zip archive declares about its central directory,
/// and what walking the directory header by header finds.
struct CentralDirectory {
    /// Entries the end record (or the ZIP64 end record) declares.
    declared: u64,
    /// The directory's size in bytes, as declared.
    size: u64,
    /// Headers found walking from the directory's start to its end record
    /// (stopping at one past `declared`).
    walked: u64,
    /// Bytes those headers take.
    walked_bytes: u64,
}

fn le16(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 2).map_or(0, |x| u64::from(u16::from_le_bytes([x[0], x[1]])))
}

fn le32(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 4).map_or(0, |x| u64::from(u32::from_le_bytes([x[0], x[1], x[2], x[3]])))
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |x| u64::from_le_bytes(x.try_into().unwrap_or([0; 8])))
}

/// The central directory as the end record declares it (ZIP64 when its
/// classic fields are saturated) and as walking it finds it; `None` if no
/// end record is found (the zip reader has accepted the archive by then).
///
/// Two checks come of it. The zip reader reads as many headers as the end
/// record counts and keeps one entry per name, so a count above the
/// reader's entries means duplicate names. And other readers (Python's
/// `zipfile`) walk the directory's declared size instead: an end record
/// that understates the count hides headers (a second `data/0`) from this
/// reader that they see, so the walk must find exactly the declared
/// headers, filling the directory exactly up to its end record.
fn central_directory(src: &Source) -> Result<Option<CentralDirectory>> {
    let tail_len = src.len().min(22 + 0xFFFF + 56 + 20);
    let tail_start = src.len() - tail_len;
    let tail = src.read_vec(tail_start, tail_len as usize)?;
    let Some(at) = tail.windows(4).rposition(|w| w == b"PK\x05\x06") else { return Ok(None) };
    let (mut declared, mut size, mut offset) = (le16(&tail, at + 10), le32(&tail, at + 12), le32(&tail, at + 16));
    // The directory ends where its end record (or the ZIP64 end record) starts.
    let mut end = tail_start + at as u64;
    if declared == 0xFFFF || size == 0xFFFF_FFFF || offset == 0xFFFF_FFFF {
        // ZIP64: the locator precedes the classic end record and points at the ZIP64 end record.
        let Some(loc) = at.checked_sub(20).filter(|&l| tail.get(l..l + 4) == Some(b"PK\x06\x07")) else {
            return Ok(None);
        };
        let z64 = le64(&tail, loc + 8);
        if z64.checked_add(56).is_none_or(|e| e > src.len()) {
            return Ok(None);
        }
        let rec = src.read_vec(z64, 56)?;
        if &rec[..4] != b"PK\x06\x06" {
            return Ok(None);
        }
        (declared, size, offset, end) = (le64(&rec, 32), le64(&rec, 40), le64(&rec, 48), z64);
    }
    let (walked, walked_bytes) = walk_central_directory(src, offset, end, declared.saturating_add(1))?;
    Ok(Some(CentralDirectory { declared, size, walked, walked_bytes }))
}

/// Counts central directory headers from `start` up to `end` (at most
/// `max`), with the bytes they take: each is 46 bytes plus its name, extra
/// field and comment.
fn walk_central_directory(src: &Source, start: u64, end: u64, max: u64) -> Result<(u64, u64)> {
    let (mut at, mut n) = (start, 0u64);
    while n < max && at.checked_add(46).is_some_and(|e| e <= end) {
        let h = src.read_vec(at, 46)?;
        if &h[..4] != b"PK\x01\x02" {
            break;
        }
        let len = 46 + le16(&h, 28) + le16(&h, 30) + le16(&h, 32);
        if at + len > end {
            break;
        }
        at += len;
        n += 1;
    }
    Ok((n, at.saturating_sub(start)))
}

/// A stored record as a range of the input.
fn stored(path: &str, src: &Arc<Source>, name: &str, rec: &Record) -> Result<Bytes> {
    let len = usize::try_from(rec.size).ok();
    match len {
        Some(l)
            if rec.compressed_size == rec.size
                && rec.data_start.checked_add(rec.size).is_some_and(|e| e <= src.len()) =>
        {
            Ok(Bytes::range(src, rec.data_start, l))
        }
        _ => Err(CkptError::Truncated { path: path.to_owned(), what: Truncation::Record(name.to_owned()) }),
    }
}

/// Reads a whole record (inflating it if compressed, against the budget),
/// refusing more than `limit` bytes.
fn read_record(
    path: &str,
    src: &Arc<Source>,
    za: &mut zip::ZipArchive<Cursor<'_>>,
    name: &str,
    rec: &Record,
    limit: u64,
    budget: &mut InflateBudget<'_>,
) -> Result<Vec<u8>> {
    if rec.size > limit {
        return Err(CkptError::Limit {
            path: path.to_owned(),
            limit: ReadLimit::RecordBytes { record: name.to_owned() },
            max: limit,
            needed: rec.size,
        });
    }
    if rec.compression == CompressionMethod::Stored {
        return Ok(stored(path, src, name, rec)?.read()?.into_owned());
    }
    budget.take(path, name, rec.size)?;
    let f = za.by_index(rec.index).map_err(|e| CkptError::Zip { path: path.to_owned(), source: Box::new(e) })?;
    let mut out = Vec::with_capacity(usize::try_from(rec.size).unwrap_or(0));
    // Read one byte past the declared size: a record that inflates to more than it declares is refused.
    let mut f = f.take(rec.size.saturating_add(1));
    loop {
        let n = (&mut f).take(INFLATE_CHUNK).read_to_end(&mut out).map_err(|source| CkptError::Inflate {
            path: path.to_owned(),
            record: name.to_owned(),
            source,
        })?;
        if n == 0 {
            break;
        }
        budget.inflated.add(n as u64);
    }
    if out.len() as u64 != rec.size {
        return Err(CkptError::RecordSize {
            path: path.to_owned(),
            record: name.to_owned(),
            holds: out.len() as u64,
            declares: rec.size,
        });
    }
    Ok(out)
}

/// The legacy stream's magic number, pickled first (`0x1950a86a20f9469cfc6c`).
const LEGACY_MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// Whether `head` (a file's first bytes) starts like a legacy torch.save stream (a pickled LONG1 magic).
pub(crate) fn is_legacy(head: &[u8]) -> bool {
    head.len() >= 14 && head[0] == 0x80 && head[2] == 0x8a && head[3] == 10 && head[4..14] == LEGACY_MAGIC
}

/// The pickles at the start of a legacy stream, read into a buffer that
/// grows (doubling from 1 MiB) until they decode: the storages that follow
/// stay in the file.
struct LegacyPickles<'a> {
    src: &'a Source,
    buf: Vec<u8>,
    pos: usize,
    limit: u64,
}

impl LegacyPickles<'_> {
    fn next(&mut self, path: &str, what: &str, opts: &ReadOptions) -> Result<Value> {
        loop {
            match from_slice_prefix(&self.buf[self.pos..], &opts.pickle) {
                Ok((v, used)) => {
                    self.pos += used;
                    return Ok(v);
                }
                Err(PickleError::Truncated { .. }) if (self.buf.len() as u64) < self.src.len().min(self.limit) => {
                    let grown = (self.buf.len() as u64 * 2).max(1 << 20).min(self.src.len()).min(self.limit);
                    let more = self.src.read_vec(self.buf.len() as u64, (grown - self.buf.len() as u64) as usize)?;
                    self.buf.extend_from_slice(&more);
                }
                Err(source) => {
                    return Err(CkptError::Pickle { path: path.to_owned(), record: what.to_owned(), source });
                }
            }
        }
    }
}

/// Reads a legacy (pre-1.6) torch.save stream: magic, protocol, sys_info,
/// the object, the storage key list, then each storage as an i64 element
/// count and its bytes.
pub(crate) fn read_legacy(path: &str, src: &Arc<Source>, opts: &ReadOptions) -> Result<Parsed> {
    let legacy = |problem| CkptError::Legacy { path: path.to_owned(), problem };
    let mut p = LegacyPickles { src, buf: Vec::new(), pos: 0, limit: opts.pickle.max_input_bytes };
    let _magic = p.next(path, "magic number", opts)?;
    match p.next(path, "protocol version", opts)? {
        Value::Int(1001) => {}
        other => return Err(legacy(LegacyProblem::Protocol(other.to_string()))),
    }
    let sys_info = p.next(path, "sys_info", opts)?;
    let little = match &sys_info {
        Value::Dict(kv) => kv.iter().find(|(k, _)| k.as_str() == Some("little_endian")).map(|(_, v)| v.clone()),
        _ => None,
    };
    if little != Some(Value::Bool(true)) {
        return Err(legacy(LegacyProblem::NotLittleEndian));
    }
    let value = p.next(path, "data", opts)?;
    let keys = match p.next(path, "storage keys", opts)? {
        Value::List(ks) => ks,
        other => return Err(legacy(LegacyProblem::NotAKeyList(other.to_string()))),
    };
    let mut pos = p.pos as u64;
    drop(p);
    let mut declared = Declared::default();
    let root = interpret(path, value, PidForm::Legacy, &mut declared)?;
    let mut storages = HashMap::with_capacity(keys.len());
    for k in keys {
        let key = match k {
            Value::Str(s) => s,
            Value::Int(i) => i.to_string(),
            other => return Err(legacy(LegacyProblem::KeyNotAString(other.to_string()))),
        };
        let decl = declared.by_key.get(&key).ok_or_else(|| legacy(LegacyProblem::UnusedStorage(key.clone())))?;
        if storages.contains_key(&key) {
            return Err(legacy(LegacyProblem::DuplicateStorage(key)));
        }
        let truncated = || CkptError::Truncated { path: path.to_owned(), what: Truncation::LegacyStorage(key.clone()) };
        if pos.checked_add(8).is_none_or(|e| e > src.len()) {
            return Err(truncated());
        }
        let mut n8 = [0u8; 8];
        src.read_exact_at(pos, &mut n8)?;
        let numel = i64::from_le_bytes(n8);
        let elem = if decl.typed { decl.dtype.size() } else { 1 };
        let nbytes = usize::try_from(numel).ok().and_then(|n| n.checked_mul(elem));
        if nbytes != Some(decl.nbytes) {
            return Err(legacy(LegacyProblem::StorageSize { key, numel, declared: decl.nbytes as u64 }));
        }
        pos += 8;
        if pos.checked_add(decl.nbytes as u64).is_none_or(|e| e > src.len()) {
            return Err(truncated());
        }
        let data = Bytes::range(src, pos, decl.nbytes);
        pos += decl.nbytes as u64;
        storages.insert(key, Storage { typed: decl.typed, dtype: decl.dtype, location: decl.location.clone(), data });
    }
    if let Some(missing) = declared.order.iter().find(|k| !storages.contains_key(*k)) {
        return Err(legacy(LegacyProblem::MissingStorage(missing.clone())));
    }
    Ok(Parsed { root, storages, format: Format::TorchLegacy })
}
