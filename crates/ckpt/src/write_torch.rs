//! Writing torch.save's zip layout: every record stored, 64-byte aligned,
//! the records torch 2.x writes, in its order; storages renumbered 0..N in
//! first-use order and located on `cpu`.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::path::Path;

use pmstate_pickle::Value;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime};

use crate::atomic::write_atomically;
use crate::checkpoint::Checkpoint;
use crate::error::{CkptError, Result};
use crate::interpret::{to_value, StorageDecl};
use crate::tree::Node;

/// How to write a checkpoint.
#[derive(Default)]
pub struct SaveOptions<'a> {
    /// Write opaque values whose globals torch's safe loader rejects
    /// (`--allow-unsafe-globals`). Off by default: such a file only loads
    /// with `weights_only=False`, which would run them.
    pub allow_unsafe_globals: bool,
    /// Skip the fsync before the output is renamed into place (`--no-fsync`).
    /// Still atomic while the machine runs; durable only once the kernel has
    /// written it back. Off by default: a finished save survives a power loss.
    pub no_fsync: bool,
    /// Called with the bytes written so far (for progress bars).
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl std::fmt::Debug for SaveOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveOptions")
            .field("allow_unsafe_globals", &self.allow_unsafe_globals)
            .field("no_fsync", &self.no_fsync)
            .finish()
    }
}

/// The pickle and the storages (new key, original key) a tree writes to.
pub(crate) struct Lowered {
    pub pickle: Vec<u8>,
    pub storages: Vec<(String, String)>,
}

fn contains_persistent_id(v: &Value) -> bool {
    match v {
        Value::PersistentId(_) => true,
        Value::Shared { value, .. } => contains_persistent_id(value),
        Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => {
            xs.iter().any(contains_persistent_id)
        }
        Value::Dict(kv) => kv.iter().any(|(k, v)| contains_persistent_id(k) || contains_persistent_id(v)),
        Value::Reduce { callable, args, setitems, appends } => {
            contains_persistent_id(callable)
                || contains_persistent_id(args)
                || setitems.iter().any(|(k, v)| contains_persistent_id(k) || contains_persistent_id(v))
                || appends.iter().any(contains_persistent_id)
        }
        Value::NewObj { cls, args, kwargs, setitems, appends } => {
            contains_persistent_id(cls)
                || contains_persistent_id(args)
                || kwargs.as_deref().is_some_and(contains_persistent_id)
                || setitems.iter().any(|(k, v)| contains_persistent_id(k) || contains_persistent_id(v))
                || appends.iter().any(contains_persistent_id)
        }
        Value::Build { object, state } => contains_persistent_id(object) || contains_persistent_id(state),
        _ => false,
    }
}

/// Checks the tree may be written and lowers it to a protocol-2 pickle.
pub(crate) fn lower(ckpt: &Checkpoint, root: &Node, allow_unsafe_globals: bool) -> Result<Lowered> {
    let flagged = crate::safety::unsafe_globals(root);
    if let (false, Some((key, first))) = (allow_unsafe_globals, flagged.first()) {
        return Err(CkptError::UnsafeGlobals { count: flagged.len(), first: first.clone(), key: key.clone() });
    }
    let mut opaque_storage = None;
    root.walk_all(&mut |path, node| {
        if let Node::Opaque(v) = node {
            if opaque_storage.is_none() && contains_persistent_id(v) {
                opaque_storage = Some(crate::tree::dotted(path));
            }
        }
        true
    });
    if let Some(key) = opaque_storage {
        return Err(CkptError::Value {
            path: ckpt.path.clone(),
            key,
            reason: "an uninterpreted value refers to a storage; it cannot be re-emitted".into(),
        });
    }
    let mut renumbered: HashMap<String, String> = HashMap::new();
    let mut order = Vec::new();
    let mut resolve = |t: &crate::tree::TensorRef| -> Result<Option<(String, StorageDecl)>> {
        let storage = ckpt.storage_of(t)?;
        let next = renumbered.len().to_string();
        let key = renumbered.entry(t.storage.clone()).or_insert_with(|| {
            order.push((next.clone(), t.storage.clone()));
            next
        });
        Ok(Some((
            key.clone(),
            StorageDecl {
                typed: t.dtype.storage_class().is_some(),
                dtype: t.dtype,
                nbytes: storage.data.len(),
                location: "cpu".into(),
            },
        )))
    };
    let value = to_value(root, &mut resolve)?;
    check_emitted_globals(ckpt, &value, &flagged)?;
    let pickle = pmstate_pickle::to_vec(&value).map_err(|source| CkptError::Pickle {
        path: ckpt.path.clone(),
        record: "data.pkl".into(),
        source,
    })?;
    Ok(Lowered { pickle, storages: order })
}

/// The last gate before bytes are written: every global the pickle will
/// hold is on torch's weights_only allowlist, or is one of the `allowed`
/// globals the tree carried in opaque values (present only when the caller
/// allowed unsafe globals). Anything else (a global this crate would have
/// made up from data) is an error naming it.
fn check_emitted_globals(ckpt: &Checkpoint, value: &Value, allowed: &[(String, String)]) -> Result<()> {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Global { module, name } if !crate::safety::is_safe_global(module, name) => {
                let global = format!("{module}.{name}");
                if !allowed.iter().any(|(_, g)| *g == global) {
                    return Err(CkptError::Value {
                        path: ckpt.path.clone(),
                        key: "<data.pkl>".into(),
                        reason: format!(
                            "would emit the global {global}, which is not on torch's weights_only allowlist"
                        ),
                    });
                }
            }
            Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => stack.extend(xs),
            Value::Dict(kv) => stack.extend(kv.iter().flat_map(|(k, v)| [k, v])),
            Value::Reduce { callable, args, setitems, appends } => {
                stack.extend([&**callable, &**args]);
                stack.extend(setitems.iter().flat_map(|(k, v)| [k, v]));
                stack.extend(appends);
            }
            Value::NewObj { cls, args, kwargs, setitems, appends } => {
                stack.extend([&**cls, &**args]);
                stack.extend(kwargs.as_deref());
                stack.extend(setitems.iter().flat_map(|(k, v)| [k, v]));
                stack.extend(appends);
            }
            Value::Build { object, state } => stack.extend([&**object, &**state]),
            Value::PersistentId(p) | Value::Shared { value: p, .. } => stack.push(p),
            _ => {}
        }
    }
    Ok(())
}

/// The archive folder torch.save uses for a file: its name without the last extension.
pub(crate) fn archive_prefix(path: &Path) -> String {
    match path.file_stem().and_then(|s| s.to_str()) {
        Some(s) if !s.is_empty() && !s.contains('/') => s.to_owned(),
        _ => "archive".to_owned(),
    }
}

/// Writes `ckpt` as a torch.save zip archive at `path` (atomically).
pub fn save_torch(ckpt: &Checkpoint, path: impl AsRef<Path>, opts: &SaveOptions<'_>) -> Result<()> {
    let path = path.as_ref();
    let lowered = lower(ckpt, &ckpt.root, opts.allow_unsafe_globals)?;
    let prefix = archive_prefix(path);
    write_atomically(path, !opts.no_fsync, |w| {
        let mut counting = crate::atomic::Counting { inner: w, written: 0, progress: opts.progress };
        write_archive(ckpt, &lowered, &prefix, &mut SeekAdapter(&mut counting))
    })
}

/// `Counting` is Write; the zip writer also needs Seek on the file underneath.
struct SeekAdapter<'a, 'b, W: Write + Seek>(&'a mut crate::atomic::Counting<'b, W>);

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

pub(crate) fn write_archive<W: Write + Seek>(ckpt: &Checkpoint, lowered: &Lowered, prefix: &str, out: W) -> Result<()> {
    let path = ckpt.path.clone();
    let zerr = |e: zip::result::ZipError| CkptError::Container { path: path.clone(), reason: format!("zip: {e}") };
    let ioerr = |e: std::io::Error| CkptError::Io { path: path.clone(), source: e };
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
    for (new_key, old_key) in &lowered.storages {
        let data = &ckpt.storages[old_key].data;
        put(&mut zw, &format!("data/{new_key}"), data)?;
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
