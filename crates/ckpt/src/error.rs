//! The one error type of `pmstate-ckpt`, and the typed problems it carries.
//!
//! Every variant names the file (`path`) and, where there is one, the key
//! (dotted path in the tree), record or storage at fault, and keeps the
//! error it came from as its `source`. Callers match variants; messages are
//! for people.

use std::fmt;

use pmstate_pickle::PickleError;

use crate::tree::Shape;

/// What can be wrong with a checkpoint, or go wrong reading or writing one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CkptError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The input is a directory, a FIFO or a device, not a checkpoint file
    /// (or an output is a directory, a block device or a socket).
    #[error("{path}: not a regular file ({kind})")]
    NotAFile {
        /// The path given.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// An output that is a FIFO or a device, for a format written with seeks
    /// (a `.pt` zip archive); safetensors can be streamed into one.
    #[error("{path} is {kind}: a .pt archive is written with seeks and cannot be streamed into it (write safetensors there, or a regular file)")]
    NotSeekable {
        /// The output.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// The input was rewritten or truncated while it was being read (a
    /// training job saving over `last.ckpt`): what was read is not one file's
    /// content, so nothing was written.
    #[error("{path}: input changed while reading (rewritten or truncated by another process); nothing was written")]
    InputChanged {
        /// The file.
        path: String,
    },
    /// Not a format this crate reads.
    #[error("{path}: neither a torch zip archive, a legacy torch.save stream, nor a safetensors file")]
    NotACheckpoint {
        /// The file.
        path: String,
    },
    /// A TorchScript archive (`torch.jit.save`), which holds code, not a checkpoint.
    #[error("{path}: a TorchScript archive (constants.pkl), not a torch.save checkpoint")]
    TorchScript {
        /// The file.
        path: String,
    },
    /// The zip container does not parse.
    #[error("{path}: zip: {source}")]
    Zip {
        /// The file.
        path: String,
        /// The zip reader's error.
        source: Box<zip::result::ZipError>,
    },
    /// A zip entry that a torch archive cannot hold.
    #[error("{path}: entry '{entry}' {problem}")]
    Entry {
        /// The file.
        path: String,
        /// The entry's name.
        entry: String,
        /// What is wrong with it.
        problem: EntryProblem,
    },
    /// Two entries with one name (which one a reader sees depends on the reader).
    #[error("{path}: duplicate entry names: the central directory lists {listed} entries, {distinct} distinct")]
    DuplicateEntries {
        /// The file.
        path: String,
        /// Entries the end record declares.
        listed: u64,
        /// Distinct names.
        distinct: u64,
    },
    /// The end record's account of the central directory (its entry count
    /// and size) disagrees with the headers the directory holds: readers that
    /// trust the count and readers that walk the size would see different
    /// entries (an understated count hides a second `data/0`).
    #[error(
        "{path}: the end record declares {declared} entries in {size} bytes, but the central directory \
         holds {walked} entries in {walked_bytes} bytes before it: readers would disagree on the archive's entries"
    )]
    CentralDirectoryMismatch {
        /// The file.
        path: String,
        /// Entries the end record declares.
        declared: u64,
        /// Directory bytes the end record declares.
        size: u64,
        /// Headers found walking the directory (counting stops one past `declared`).
        walked: u64,
        /// Bytes those headers take.
        walked_bytes: u64,
    },
    /// A record the archive needs is absent.
    #[error("{path}: no record {record}")]
    MissingRecord {
        /// The file.
        path: String,
        /// The record (`data.pkl`, `version`, `data/0`).
        record: String,
    },
    /// A record whose size disagrees with what refers to it.
    #[error("{path}: record {record} holds {holds} bytes; its storage declares {declares}")]
    RecordSize {
        /// The file.
        path: String,
        /// The record.
        record: String,
        /// Bytes it holds (or inflates to).
        holds: u64,
        /// Bytes its storage declares.
        declares: u64,
    },
    /// The file ends inside something it declares.
    #[error("{path}: truncated: {what} reaches past the end of the file")]
    Truncated {
        /// The file.
        path: String,
        /// What was cut (`record data/0`, `legacy storage 3`).
        what: Truncation,
    },
    /// Inflating compressed records would pass the zip-bomb budget.
    #[error(
        "{path}: record {record}: inflating {needed} more bytes would pass the zip-bomb guard's limit on inflated \
         data, {limit} bytes for the whole file ({left} left; by default 32 times the file size plus 64 MiB, which real \
         checkpoints never approach; the CLI has no flag to raise it, Rust callers set ReadOptions::max_inflated_bytes)"
    )]
    InflateLimit {
        /// The file.
        path: String,
        /// The record.
        record: String,
        /// Bytes it would inflate to.
        needed: u64,
        /// Budget left.
        left: u64,
        /// The whole budget (the default or `ReadOptions::max_inflated_bytes`).
        limit: u64,
    },
    /// A compressed record does not inflate.
    #[error("{path}: record {record}: inflating: {source}")]
    Inflate {
        /// The file.
        path: String,
        /// The record.
        record: String,
        /// The decompressor's error.
        source: std::io::Error,
    },
    /// A big-endian checkpoint (torch writes the machine's order; this crate reads little-endian only).
    #[error("{path}: byteorder '{found}': only little-endian checkpoints are supported")]
    ByteOrder {
        /// The file.
        path: String,
        /// What the file says.
        found: String,
    },
    /// A pickle record does not decode.
    #[error("{path}: record {record}: {source}")]
    Pickle {
        /// The file.
        path: String,
        /// The record (`data.pkl`, or the legacy stream's part).
        record: String,
        /// The decoder's error.
        source: PickleError,
    },
    /// The legacy (pre-1.6) stream is not shaped as torch writes it.
    #[error("{path}: legacy stream: {problem}")]
    Legacy {
        /// The file.
        path: String,
        /// What is wrong.
        problem: LegacyProblem,
    },
    /// The safetensors container is invalid (header, offsets, sizes).
    #[error("{path}: safetensors: {source}")]
    Safetensors {
        /// The file.
        path: String,
        /// The safetensors crate's error.
        source: safetensors::SafeTensorError,
    },
    /// The safetensors header is ambiguous or not JSON of the right shape.
    #[error("{path}: safetensors header: {problem}")]
    Header {
        /// The file.
        path: String,
        /// What is wrong.
        problem: HeaderProblem,
    },
    /// A pmstate tree or storage table in `__metadata__` does not decode.
    #[error("{path}: __metadata__ {field}: {source}")]
    Metadata {
        /// The file.
        path: String,
        /// `pmstate.tree` or `pmstate.storages`.
        field: &'static str,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// A value in the tree is not what its position requires (a tensor
    /// whose view leaves its storage, a storage whose size disagrees...).
    #[error("{path}: {key}: {problem}")]
    Value {
        /// The file (or `<memory>`).
        path: String,
        /// The dotted key of the value.
        key: String,
        /// What is wrong.
        problem: ValueProblem,
    },
    /// A dtype this crate cannot carry.
    #[error("{path}: {}: unsupported dtype {dtype}", TensorPlace(.key.as_deref(), .storage.as_deref()))]
    UnsupportedDtype {
        /// The file.
        path: String,
        /// The dotted key of the tensor, where the caller knows it.
        key: Option<String>,
        /// The storage (archive record) holding its data, where there is one.
        storage: Option<String>,
        /// The name of the dtype or storage class.
        dtype: String,
    },
    /// Writing would re-emit globals torch's safe loader rejects.
    #[error(
        "refusing to write {count} unsafe global(s) ({first} at {key}); pass --allow-unsafe-globals to write them anyway"
    )]
    UnsafeGlobals {
        /// How many.
        count: usize,
        /// The first one, `module.name`.
        first: String,
        /// Where it is.
        key: String,
    },
    /// A bound on what an input may make this crate allocate or do.
    #[error(
        "{path}: {limit} needs {needed}, over the limit {} = {max}; raise it in ReadOptions for a legitimate file",
        limit.name()
    )]
    Limit {
        /// The file.
        path: String,
        /// Which limit, and what hit it.
        limit: ReadLimit,
        /// The limit.
        max: u64,
        /// What the input asks for.
        needed: u64,
    },
    /// A read outside a storage's bytes: a tensor that is not a tensor of
    /// this checkpoint (its view leaves the storage of that key here), or a
    /// range past the end of [`Bytes`](crate::Bytes).
    #[error(
        "a read of {len} bytes at offset {offset} lies outside a storage of {size} bytes (a tensor of another \
         checkpoint?)"
    )]
    StorageRange {
        /// The offset asked for, in bytes.
        offset: usize,
        /// The bytes asked for.
        len: usize,
        /// The storage's size in bytes.
        size: usize,
    },
    /// A key the caller asked for is not there.
    #[error("{path}: no key {key}{}", did_you_mean(closest))]
    NotFound {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// The nearest existing keys, best first.
        closest: Vec<String>,
    },
    /// A key that holds another kind of value than the caller needs.
    #[error("{path}: {key} is a {found}, not a {expected}")]
    WrongKind {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// What was needed (`tensor`, `dict`).
        expected: &'static str,
        /// What is there.
        found: &'static str,
    },
    /// No normalizer of that name in the checkpoint.
    #[error("{path}: no normalizer {name}{}", did_you_mean(closest))]
    NormalizerNotFound {
        /// The file.
        path: String,
        /// The name asked for.
        name: String,
        /// The nearest existing names (edit distance), best first.
        closest: Vec<String>,
    },
    /// A normalizer group could not be loaded or stored.
    #[error("normalizer {group}: {source}")]
    Norm {
        /// The group's dotted name.
        group: String,
        /// The normalizer's error.
        source: Box<pmstate_norm::NormError>,
    },
    /// candle refused a tensor.
    #[error("{}: {source}", TensorPlace(.key.as_deref(), .storage.as_deref()))]
    Candle {
        /// The dotted key of the tensor, where the caller knows it.
        key: Option<String>,
        /// The storage (archive record) holding its data, where there is one.
        storage: Option<String>,
        /// candle's error.
        source: Box<candle_core::Error>,
    },
    /// The pickle this crate would write would not read back under the
    /// default limits (too deep, too many nodes for its size): refused
    /// before anything is written.
    #[error("cannot write {output}: its {record} would not read back with the default limits: {source}")]
    WouldNotReadBack {
        /// The output file.
        output: String,
        /// The record (`data.pkl`).
        record: String,
        /// What the reader says.
        source: PickleError,
    },
    /// The tree holds something the output format cannot carry faithfully:
    /// refused before anything is written.
    #[error("cannot write {output}: {key}: {problem}")]
    Unwritable {
        /// The output file.
        output: String,
        /// The dotted key of the value.
        key: String,
        /// Why.
        problem: ValueProblem,
    },
}

fn did_you_mean(closest: &[String]) -> String {
    if closest.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", closest.join(", or "))
    }
}

/// What a file ends inside of ([`CkptError::Truncated`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Truncation {
    /// A zip entry (its data starts past the end).
    Entry(String),
    /// An archive record's data.
    Record(String),
    /// A legacy stream's storage, by key.
    LegacyStorage(String),
    /// A read of `len` bytes at `offset`.
    Read {
        /// Where the read starts.
        offset: u64,
        /// Bytes asked for.
        len: usize,
    },
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Truncation::Entry(name) => write!(f, "entry {name}"),
            Truncation::Record(name) => write!(f, "record {name}"),
            Truncation::LegacyStorage(key) => write!(f, "legacy storage {key}"),
            Truncation::Read { offset, len } => write!(f, "a read of {len} bytes at {offset}"),
        }
    }
}

/// Which bound an input hit ([`CkptError::Limit`]), and what hit it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadLimit {
    /// A pickle record larger than pickle's `Limits::max_input_bytes` (or
    /// than its storage declares).
    RecordBytes {
        /// The record (`data.pkl`).
        record: String,
    },
    /// [`ReadOptions::max_tree_values`](crate::ReadOptions::max_tree_values):
    /// the JSON values of a safetensors file's `__metadata__` tree.
    TreeValues,
    /// pickle's `Limits::max_depth` (three JSON levels per tree level): the
    /// nesting of a safetensors file's `__metadata__` tree.
    TreeDepth,
    /// [`ReadOptions::max_view_bytes`](crate::ReadOptions::max_view_bytes):
    /// the bytes a non-contiguous view expands to when gathered.
    ViewBytes {
        /// The view's dotted key, where the caller knows it.
        key: Option<String>,
        /// The view's storage.
        storage: String,
        /// The view's size.
        shape: Vec<usize>,
    },
}

impl ReadLimit {
    /// The limit's name, where to raise it.
    pub fn name(&self) -> &'static str {
        match self {
            ReadLimit::RecordBytes { .. } => "pickle Limits::max_input_bytes (or the record's declared size)",
            ReadLimit::TreeValues => "ReadOptions::max_tree_values",
            ReadLimit::TreeDepth => "pickle Limits::max_depth (x3 for JSON nesting)",
            ReadLimit::ViewBytes { .. } => "ReadOptions::max_view_bytes",
        }
    }
}

/// What hit the limit, in words: `record data.pkl`, `__metadata__ pmstate.tree`.
impl fmt::Display for ReadLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadLimit::RecordBytes { record } => write!(f, "record {record}"),
            ReadLimit::TreeValues => f.write_str("__metadata__ pmstate.tree"),
            ReadLimit::TreeDepth => f.write_str("__metadata__ pmstate.tree nesting"),
            ReadLimit::ViewBytes { key: Some(key), storage, shape } => {
                write!(f, "gathering the view {key} (storage {storage}, size {})", Shape(shape))
            }
            ReadLimit::ViewBytes { key: None, storage, shape } => {
                write!(f, "gathering the view of storage {storage} (size {})", Shape(shape))
            }
        }
    }
}

/// What is wrong with a zip entry's name or position.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryProblem {
    /// torch puts every record in one folder (`last/data.pkl`).
    NotInFolder,
    /// The entry lies in another folder than the first one.
    OutsideFolder {
        /// The archive's folder.
        folder: String,
    },
    /// Another entry has the same name.
    Duplicate,
}

impl fmt::Display for EntryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryProblem::NotInFolder => f.write_str("is not in a subdirectory"),
            EntryProblem::OutsideFolder { folder } => write!(f, "is outside the archive's folder '{folder}'"),
            EntryProblem::Duplicate => f.write_str("appears twice (duplicate entry)"),
        }
    }
}

/// What is wrong with a legacy stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LegacyProblem {
    /// The protocol number after the magic is not 1001.
    Protocol(String),
    /// `sys_info` does not say little-endian.
    NotLittleEndian,
    /// The storage key list is not a list (what it is instead).
    NotAKeyList(String),
    /// A storage key that is neither a string nor an int (what it is).
    KeyNotAString(String),
    /// A storage listed after the object that no tensor uses.
    UnusedStorage(String),
    /// A storage a tensor uses that the stream does not hold.
    MissingStorage(String),
    /// A storage key listed twice: two readers could pair data and tensors differently.
    DuplicateStorage(String),
    /// A storage's element count disagrees with its declaration.
    StorageSize {
        /// The storage key.
        key: String,
        /// Elements the stream says.
        numel: i64,
        /// Bytes the pickle declared.
        declared: u64,
    },
}

impl fmt::Display for LegacyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LegacyProblem::Protocol(found) => write!(f, "protocol version {found}, expected 1001"),
            LegacyProblem::NotLittleEndian => f.write_str("sys_info is not little-endian"),
            LegacyProblem::NotAKeyList(found) => write!(f, "storage key list: not a list but {found}"),
            LegacyProblem::KeyNotAString(found) => write!(f, "storage key list: key {found} is not a string"),
            LegacyProblem::UnusedStorage(k) => write!(f, "storage {k} is listed but no tensor uses it"),
            LegacyProblem::MissingStorage(k) => write!(f, "storage {k} is used but has no data"),
            LegacyProblem::DuplicateStorage(k) => write!(f, "storage {k} is listed twice"),
            LegacyProblem::StorageSize { key, numel, declared } => {
                write!(f, "storage {key}: {numel} elements, declared {declared} bytes")
            }
        }
    }
}

/// What is wrong with a safetensors header beyond what the safetensors crate checks.
#[derive(Debug)]
#[non_exhaustive]
pub enum HeaderProblem {
    /// Not the JSON object of tensor entries the format defines.
    Json(serde_json::Error),
    /// A tensor name given twice (JSON allows it; which one wins depends on the reader).
    DuplicateKey(String),
    /// A `__metadata__` key given twice.
    DuplicateMetadata(String),
    /// Offsets or sizes that do not tile the data (the safetensors crate's check).
    Invalid(safetensors::SafeTensorError),
}

impl fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderProblem::Json(e) => write!(f, "{e}"),
            HeaderProblem::DuplicateKey(k) => write!(f, "tensor '{k}' is listed twice"),
            HeaderProblem::DuplicateMetadata(k) => write!(f, "__metadata__ key '{k}' is listed twice"),
            HeaderProblem::Invalid(e) => write!(f, "{e}"),
        }
    }
}

/// What is wrong with one value of the tree (read, or about to be written).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueProblem {
    /// A size, stride, offset or element count below zero.
    Negative {
        /// `size`, `stride`, `storage offset`, `storage numel`.
        what: &'static str,
        /// The value.
        value: i64,
    },
    /// A field that must be an int is not (`what` names it; `found` is its kind).
    NotAnInt {
        /// The field.
        what: &'static str,
        /// What it is.
        found: String,
    },
    /// A field of the wrong shape (`tensor rebuild args`, `persistent id`).
    Malformed {
        /// The field.
        what: &'static str,
        /// What it holds instead.
        found: Found,
    },
    /// A size or element count whose arithmetic overflows.
    Overflow {
        /// What overflowed (`view extent`, `storage size`, `element count`).
        what: &'static str,
    },
    /// The tensor's view reaches past its storage.
    ViewPastStorage(Box<View>),
    /// Size and stride have different lengths.
    RankMismatch {
        /// Sizes.
        shape: Vec<usize>,
        /// Strides.
        stride: Vec<usize>,
    },
    /// A typed storage holding another dtype than the tensor over it.
    DtypeMismatch {
        /// The storage.
        storage: String,
        /// The tensor's dtype.
        tensor: crate::DType,
        /// The storage's dtype.
        declared: crate::DType,
    },
    /// Several tensors of different dtypes over one untyped storage: the
    /// writers can declare it only once.
    StorageDtypes {
        /// The storage.
        storage: String,
        /// The two dtypes.
        dtypes: (crate::DType, crate::DType),
    },
    /// A storage whose size is not a whole number of its dtype's elements.
    StorageSize {
        /// The storage.
        storage: String,
        /// Its bytes.
        bytes: usize,
        /// The element size.
        element: usize,
    },
    /// A storage declared twice with different attributes.
    StorageRedeclared(String),
    /// A tensor over a storage the checkpoint does not hold.
    MissingStorage(String),
    /// Two tensors that claim one Python object identity but differ.
    ObjectIdentity(u64),
    /// A storage reference where the writer cannot re-emit one (inside an
    /// uninterpreted value, or as a dict key).
    StorageReference,
    /// A dtype node that names no torch dtype (it would be written as the global `torch.<name>`).
    NotADtype(String),
    /// A global the writer would emit that is not on torch's weights_only allowlist.
    UnsafeGlobal(String),
    /// A tensor rebuild this reader does not carry (`what` says which part).
    Unsupported(&'static str),
    /// A storage class that is not a torch storage.
    StorageClass(String),
    /// `_codecs.encode` of a string that is not latin-1.
    NotLatin1,
    /// Two entries with the same key in one dict.
    DuplicateKey(String),
    /// Deeper than the output format's reader accepts.
    TooDeep {
        /// The depth.
        depth: usize,
        /// The limit.
        max: usize,
    },
    /// More than the output's header can hold (safetensors: 100 MB).
    HeaderTooLarge {
        /// Bytes needed.
        needed: usize,
        /// The limit.
        max: usize,
    },
    /// An integer the output format cannot hold (torch pickles ints as i64 in shapes).
    IntTooLarge(String),
}

impl fmt::Display for ValueProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueProblem::Negative { what, value } => write!(f, "negative {what} {value}"),
            ValueProblem::NotAnInt { what, found } => write!(f, "{what} is not an int but {found}"),
            ValueProblem::Malformed { what, found } => write!(f, "{what} is malformed: {found}"),
            ValueProblem::Overflow { what } => write!(f, "{what} overflows"),
            ValueProblem::ViewPastStorage(v) => write!(
                f,
                "view (offset {}, size {}, stride {}) reaches element {} of a storage of {} bytes",
                v.offset,
                Shape(&v.shape),
                Shape(&v.stride),
                v.extent,
                v.storage_bytes
            ),
            ValueProblem::RankMismatch { shape, stride } => {
                write!(f, "size {} and stride {} differ in length", Shape(shape), Shape(stride))
            }
            ValueProblem::DtypeMismatch { storage, tensor, declared } => {
                write!(f, "a {tensor} tensor over storage {storage} of {declared}")
            }
            ValueProblem::StorageDtypes { storage, dtypes } => write!(
                f,
                "tensors of {} and {} over one untyped storage {storage}: it can be declared with one dtype only",
                dtypes.0, dtypes.1
            ),
            ValueProblem::StorageSize { storage, bytes, element } => {
                write!(f, "storage {storage} of {bytes} bytes is not a whole number of {element}-byte elements")
            }
            ValueProblem::StorageRedeclared(s) => write!(f, "storage {s} declared twice differently"),
            ValueProblem::MissingStorage(s) => write!(f, "refers to storage {s}, which is not in the checkpoint"),
            ValueProblem::ObjectIdentity(id) => {
                write!(f, "two different tensors claim one object identity ({id}); the second would become the first")
            }
            ValueProblem::StorageReference => {
                f.write_str("a storage reference outside a tensor (in an uninterpreted value or a dict key)")
            }
            ValueProblem::NotADtype(name) => write!(f, "torch.{name} is not a torch dtype"),
            ValueProblem::UnsafeGlobal(g) => write!(f, "the global {g} is not on torch's weights_only allowlist"),
            ValueProblem::Unsupported(what) => write!(f, "unsupported: {what}"),
            ValueProblem::StorageClass(c) => write!(f, "unsupported storage type {c}"),
            ValueProblem::NotLatin1 => f.write_str("_codecs.encode of a string that is not latin-1"),
            ValueProblem::DuplicateKey(k) => write!(f, "key {k} appears twice in one dict"),
            ValueProblem::TooDeep { depth, max } => write!(f, "nested {depth} deep; the reader accepts {max}"),
            ValueProblem::HeaderTooLarge { needed, max } => {
                write!(f, "the safetensors header would be {needed} bytes; readers accept {max}")
            }
            ValueProblem::IntTooLarge(v) => write!(f, "{v} does not fit the output's integers"),
        }
    }
}

/// What a malformed field holds instead of what its position requires
/// ([`ValueProblem::Malformed`]). Values are shown as Python writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Found {
    /// A value of another kind than the field takes.
    Value(String),
    /// A value that is not a tuple.
    NotATuple(String),
    /// A value that is not a persistent id.
    NotAPersistentId(String),
    /// A persistent id that is not torch's `('storage', ...)` tuple of `len` items.
    NotAStorageTuple {
        /// The persistent id.
        pid: String,
        /// The items torch writes.
        len: usize,
    },
    /// `torch.Size` called with these arguments instead of one tuple.
    TorchSizeOf(String),
    /// A tuple of `len` arguments where this reader handles `expected`
    /// (extra ones are tensor metadata, such as conjugate bits).
    Arguments {
        /// Arguments given.
        len: usize,
        /// Arguments this reader handles.
        expected: usize,
    },
    /// An `nn.Parameter` of something that is not a tensor (its kind).
    ParameterOf(&'static str),
    /// `len` bytes where the field takes `expected`.
    Bytes {
        /// Bytes given.
        len: usize,
        /// Bytes the field takes.
        expected: usize,
    },
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Value(v) => f.write_str(v),
            Found::NotATuple(v) => write!(f, "{v}, not a tuple"),
            Found::NotAPersistentId(v) => write!(f, "{v}, not a persistent id"),
            Found::NotAStorageTuple { pid, len } => write!(f, "{pid}, not a storage {len}-tuple"),
            Found::TorchSizeOf(args) => write!(f, "torch.Size of {args}"),
            Found::Arguments { len, expected } => {
                write!(f, "{len} arguments (this reader handles {expected}; extra ones are tensor metadata)")
            }
            Found::ParameterOf(kind) => write!(f, "a parameter of a {kind}"),
            Found::Bytes { len, expected } => write!(f, "{len} bytes, not {expected}"),
        }
    }
}

/// A tensor view, as [`ValueProblem::ViewPastStorage`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Offset in elements.
    pub offset: usize,
    /// Sizes.
    pub shape: Vec<usize>,
    /// Strides in elements.
    pub stride: Vec<usize>,
    /// One past the last element the view touches.
    pub extent: usize,
    /// The storage's size in bytes.
    pub storage_bytes: usize,
}

/// Result alias of this crate.
pub type Result<T, E = CkptError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CkptError + '_ {
    move |source| CkptError::Io { path: path.display().to_string(), source }
}

/// Names a tensor in a message by its key, its storage, or both.
struct TensorPlace<'a>(Option<&'a str>, Option<&'a str>);

impl fmt::Display for TensorPlace<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (Some(key), Some(storage)) => write!(f, "{key} (storage {storage})"),
            (Some(key), None) => f.write_str(key),
            (None, Some(storage)) => write!(f, "storage {storage}"),
            (None, None) => f.write_str("a tensor"),
        }
    }
}
