//! Writing torch.save's zip layout: every record stored, 64-byte aligned,
//! the records torch 2.x writes, in its order; storages renumbered 0..N in
//! first-use order and located on `cpu`.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::path::Path;

use pmstate_pickle::{Limits, Value};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime};

use super::allowlist::is_safe_global;
use super::interpret::{to_value, StorageDecl};
use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::{CkptError, Result, ValueProblem};
use crate::io::atomic::{write_atomically_or_stream, Counting, Streaming};
use crate::io::bulk_copy::{copy_bytes, CopyError};
use crate::parsed::archive_prefix;
use crate::tree::{dotted, Node};
use crate::write_options::WriteOptions;

/// The pickle and the storages (new key, original key) a tree writes to.
pub(crate) struct Lowered {
    pub pickle: Vec<u8>,
    pub storages: Vec<(String, String)>,
}

fn contains_persistent_id(v: &Value) -> bool {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::PersistentId(_) => return true,
            _ => v.push_children(&mut stack),
        }
    }
    false
}

/// Everything in the tree a `.pt` cannot carry faithfully, found before
/// anything is written: storage references outside tensors, dtype nodes
/// naming no dtype, sizes past int64, tensors of several dtypes over one
/// storage (torch.save refuses those too), typed storages that are not a
/// whole number of elements.
pub(crate) fn check_writable(ckpt: &Checkpoint, output: &Path) -> Result<()> {
    let unwritable =
        |key: String, problem| CkptError::Unwritable { output: output.display().to_string(), key, problem };
    let mut failure: Option<CkptError> = None;
    let mut dtypes: HashMap<&str, DType> = HashMap::new();
    ckpt.root().walk_all(&mut |path, node| {
        let problem = match node {
            Node::Opaque(v) if contains_persistent_id(v) => Some(ValueProblem::StorageReference),
            Node::TorchDtype(name) if DType::from_torch_name(name).is_none() => {
                Some(ValueProblem::NotADtype(name.clone()))
            }
            Node::Tensor(t) => {
                let too_large =
                    std::iter::once(&t.offset).chain(&t.shape).chain(&t.stride).find(|&&x| i64::try_from(x).is_err());
                match (too_large, dtypes.insert(&t.storage, t.dtype)) {
                    (Some(x), _) => Some(ValueProblem::IntTooLarge(x.to_string())),
                    (None, Some(other)) if other != t.dtype => {
                        Some(ValueProblem::StorageDtypes { storage: t.storage.clone(), dtypes: (other, t.dtype) })
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(p) = problem {
            failure.get_or_insert_with(|| unwritable(dotted(path), p));
            return false;
        }
        true
    });
    if let Some(e) = failure {
        return Err(e);
    }
    for (key, dtype) in dtypes {
        let bytes = ckpt.storage(key)?.data.len();
        if dtype.storage_class().is_some() && bytes % dtype.size() != 0 {
            let problem = ValueProblem::StorageSize { storage: key.to_owned(), bytes, element: dtype.size() };
            return Err(unwritable(format!("<storage {key}>"), problem));
        }
    }
    Ok(())
}

/// Checks the tree may be written and lowers it to a protocol-2 pickle
/// that reads back under the default limits.
pub(crate) fn lower(ckpt: &Checkpoint, output: &Path, opts: &WriteOptions<'_>) -> Result<Lowered> {
    let flagged = opts.check_globals(ckpt)?;
    check_writable(ckpt, output)?;
    let unwritable = |key: &str, problem| CkptError::Unwritable {
        output: output.display().to_string(),
        key: key.to_owned(),
        problem,
    };
    let mut renumbered: HashMap<String, String> = HashMap::new();
    let mut order = Vec::new();
    let mut resolve = |t: &crate::tree::TensorRef| -> Result<(String, StorageDecl), ValueProblem> {
        let storage = ckpt.storages().get(&t.storage).ok_or_else(|| ValueProblem::MissingStorage(t.storage.clone()))?;
        let next = renumbered.len().to_string();
        let key = renumbered.entry(t.storage.clone()).or_insert_with(|| {
            order.push((next.clone(), t.storage.clone()));
            next
        });
        let decl = StorageDecl {
            typed: t.dtype.storage_class().is_some(),
            dtype: t.dtype,
            nbytes: storage.data.len(),
            location: "cpu".into(),
        };
        Ok((key.clone(), decl))
    };
    let value = to_value(ckpt.root(), &mut resolve).map_err(|p| unwritable("<tree>", p))?;
    check_emitted_globals(&value, &flagged).map_err(|p| unwritable("<data.pkl>", p))?;
    let pickle = pmstate_pickle::to_vec(&value).map_err(|source| CkptError::Pickle {
        path: output.display().to_string(),
        record: "data.pkl".into(),
        source,
    })?;
    drop(value);
    // Exit 0 must mean the output reads back: check it with a reader's defaults.
    pmstate_pickle::from_slice(&pickle, &Limits::default()).map_err(|source| CkptError::WouldNotReadBack {
        output: output.display().to_string(),
        record: "data.pkl".into(),
        source,
    })?;
    Ok(Lowered { pickle, storages: order })
}

/// The last gate before bytes are written: every global the pickle will
/// hold is on torch's weights_only allowlist, or is one of the `allowed`
/// globals the tree itself carries (present only when the caller allowed
/// unsafe globals). Anything else (a global this crate would have made up
/// from data) is refused.
fn check_emitted_globals(value: &Value, allowed: &[(String, String)]) -> Result<(), ValueProblem> {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Global { module, name } if !is_safe_global(module, name) => {
                let global = format!("{module}.{name}");
                if !allowed.iter().any(|(_, g)| *g == global) {
                    return Err(ValueProblem::UnsafeGlobal(global));
                }
            }
            _ => v.push_children(&mut stack),
        }
    }
    Ok(())
}

/// Writes `ckpt` as a torch.save zip archive at `path` (atomically):
/// loadable by `torch.load(weights_only=True)` unless unsafe globals were
/// allowed. Refused before anything is written when the tree holds
/// something a `.pt` cannot carry faithfully ([`CkptError::Unwritable`]).
pub fn save_torch(ckpt: &Checkpoint, path: impl AsRef<Path>, opts: &WriteOptions<'_>) -> Result<()> {
    let path = path.as_ref();
    let lowered = lower(ckpt, path, opts)?;
    let prefix = archive_prefix(path);
    // the zip writer seeks back over what it wrote: no pipe or device
    write_atomically_or_stream(path, opts.fsync(), Streaming::Refused, |w| {
        let mut counting = Counting { inner: w, written: 0, progress: opts.progress };
        write_archive(ckpt, &lowered, &prefix, path, &mut SeekAdapter(&mut counting))?;
        ckpt.check_unchanged()
    })
}

/// `Counting` is Write; the zip writer also needs Seek on the file underneath.
struct SeekAdapter<'a, 'b, W: Write + Seek>(&'a mut Counting<'b, W>);

impl<W: Write + Seek> Write for SeekAdapter<'_, '_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write + Seek> Seek for SeekAdapter<'_, '_, W> {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.0.inner.seek(pos)
    }
}

pub(crate) fn write_archive<W: Write + Seek>(
    ckpt: &Checkpoint,
    lowered: &Lowered,
    prefix: &str,
    output: &Path,
    out: W,
) -> Result<()> {
    let shown = output.display().to_string();
    let zerr = |e: zip::result::ZipError| CkptError::Zip { path: shown.clone(), source: Box::new(e) };
    let ioerr = |e: std::io::Error| CkptError::Io { path: shown.clone(), source: e };
    let mut zw = zip::ZipWriter::new(out);
    let opts = |len: usize| {
        SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .with_alignment(64)
            .last_modified_time(DateTime::default())
            .large_file(len as u64 >= 0xFFFF_FFFF)
    };
    let put = |zw: &mut zip::ZipWriter<W>, name: &str, data: &[u8]| -> Result<()> {
        zw.start_file(format!("{prefix}/{name}"), opts(data.len())).map_err(zerr)?;
        zw.write_all(data).map_err(ioerr)
    };
    put(&mut zw, "data.pkl", &lowered.pickle)?;
    put(&mut zw, ".format_version", b"1")?;
    put(&mut zw, ".storage_alignment", b"64")?;
    put(&mut zw, "byteorder", b"little")?;
    let mut id = Fnv::default();
    id.eat(&lowered.pickle);
    let mut buf = Vec::new();
    for (new_key, old_key) in &lowered.storages {
        let data = &ckpt.storage(old_key)?.data;
        zw.start_file(format!("{prefix}/data/{new_key}"), opts(data.len())).map_err(zerr)?;
        copy_bytes(data, 0, data.len(), &mut zw, &mut buf, &mut |_| {}).map_err(|e| match e {
            CopyError::Read(e) => e,
            CopyError::Write(e) => ioerr(e),
        })?;
        id.eat(&(data.len() as u64).to_le_bytes());
    }
    put(&mut zw, "version", b"3\n")?;
    let serialization_id = format!("{:020}{:020}", id.0, id.0.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15);
    put(&mut zw, ".data/serialization_id", serialization_id.as_bytes())?;
    zw.finish().map_err(zerr)?;
    Ok(())
}

/// FNV-1a, for a deterministic `serialization_id` (torch only needs 40 digits unique per file).
#[derive(Default)]
struct Fnv(u64);

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        if self.0 == 0 {
            self.0 = 0xcbf2_9ce4_8422_2325;
        }
        for &b in bytes.iter().take(1 << 16) {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
    }
}
