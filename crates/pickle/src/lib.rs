//! A safe torch-pickle reader and writer.
//!
//! [`from_slice`] decodes any pickle (protocols 0 to 5) into an ordered
//! [`Value`] tree **without executing anything**: globals, reduces, builds
//! and persistent ids stay inert nodes for the caller to interpret (or to
//! refuse). [`Limits`] bound what hostile input can claim. [`to_vec`] /
//! [`write()`] emit protocol 2 using only the opcodes that
//! `torch.load(weights_only=True)` accepts.
//!
//! ```
//! use pmstate_pickle::{from_slice, to_vec, Limits, Value};
//! let v = Value::Dict(vec![(Value::Str("epoch".into()), Value::Int(3))]);
//! let bytes = to_vec(&v)?;
//! assert_eq!(from_slice(&bytes, &Limits::default())?, v);
//! # Ok::<(), pmstate_pickle::PickleError>(())
//! ```
//!
//! # Reading
//!
//! Every opcode of protocols 0 to 5 is understood except the extension
//! registry (`EXT1/2/4`) and out-of-band buffers (`NEXT_BUFFER`,
//! `READONLY_BUFFER`), which are errors. What the reader does with the
//! opcodes that would run code or build objects:
//!
//! - `GLOBAL` / `STACK_GLOBAL` give [`Value::Global`] with the names as
//!   written (protocol 0-2 pickles from Python 3 say `__builtin__` and
//!   `copy_reg`; nothing is renamed);
//! - `REDUCE` gives [`Value::Reduce`], except the plain-data calls listed in
//!   the table below;
//! - `NEWOBJ`, `NEWOBJ_EX`, `OBJ` and `INST` give [`Value::NewObj`];
//! - `BUILD` turns the object, in place (every reference to it sees the
//!   change, as in Python), into [`Value::Build`]; immutable values
//!   (strings, numbers, tuples...), which Python cannot build, get a new
//!   `Build` node instead;
//! - `PERSID` / `BINPERSID` give [`Value::PersistentId`];
//! - `SETITEM(S)` and `APPEND(S)` on a reduce or new-object result are
//!   recorded in its `setitems` / `appends` (how `OrderedDict`s are pickled).
//!
//! Plain-data calls recognized (Python writes these types as calls in
//! protocols below 4, torch in protocol 2):
//!
//! | pickled as | decoded as |
//! |---|---|
//! | `_codecs.encode(str, 'latin1')` | [`Value::Bytes`] |
//! | `__builtin__.bytes()` (`b''` in protocols 0-2) | empty [`Value::Bytes`] |
//! | `__builtin__.bytearray()` / `(bytes)` / `(str, 'latin-1')` | [`Value::ByteArray`] |
//! | `__builtin__.set()` / `(list)` / `(tuple)` | [`Value::Set`] |
//! | `__builtin__.frozenset()` / `(list)` / `(tuple)` | [`Value::FrozenSet`] |
//!
//! (`builtins` is accepted as well as `__builtin__`.)
//!
//! Other decoding choices:
//!
//! - dict keys and set items compare structurally (floats by bit pattern);
//!   a repeated dict key replaces the value in place and keeps the first
//!   key, a repeated set item is dropped. Objects (reduce / new-object /
//!   build results, persistent ids) compare by identity, as Python's
//!   default `__eq__`. Lists, dicts, sets and bytearrays as keys are errors
//!   (unhashable, as in Python);
//! - Python 2 strings (`STRING`, `BINSTRING`, `SHORT_BINSTRING`) become
//!   [`Value::Str`] when they are valid UTF-8 (what `torch.load`'s
//!   `encoding="utf-8"` gives) and [`Value::Bytes`] otherwise;
//! - text `INT` / `LONG` accept at most 4300 digits, as CPython does;
//! - an object that contains itself is an error ("recursive structure"):
//!   the tree cannot represent it;
//! - items left on the stack under the result at `STOP` are ignored, as in Python.
//!
//! Limits ([`Limits`]) are checked as the pickle runs (the opcode that
//! crosses one is the error's offset), and exactly on the finished object
//! graph before the tree is built (offset of `STOP`). A length field
//! larger than the rest of the input is [`PickleError::Truncated`] before
//! anything is allocated. The reader's own bookkeeping is a small multiple
//! of the input size (about 60 bytes of arena and bookkeeping per object the
//! pickle creates; `None`, bools and small ints are shared); the result
//! costs `size_of::<Value>()` (72 bytes) per node plus its strings, and
//! memo references are only expanded after the node count has been
//! checked. Nothing recurses on input-controlled depth.
//!
//! # Writing
//!
//! torch 2.15's `torch/_weights_only_unpickler.py` accepts only these
//! opcodes: `PROTO`, `STOP`, `MARK`, `NONE`, `NEWTRUE`, `NEWFALSE`,
//! `BININT`, `BININT1`, `BININT2`, `LONG1`, `BINFLOAT`, `BINUNICODE`,
//! `SHORT_BINSTRING`, `EMPTY_TUPLE`, `TUPLE`, `TUPLE1-3`, `EMPTY_LIST`,
//! `APPEND(S)`, `EMPTY_DICT`, `SETITEM(S)`, `EMPTY_SET`, `GLOBAL`,
//! `REDUCE`, `NEWOBJ`, `BUILD`, `BINPERSID`, `BINPUT`, `LONG_BINPUT`,
//! `BINGET`, `LONG_BINGET`. The writer emits a subset of these, shaped the
//! way CPython's (C) pickler writes protocol 2, byte for byte except that
//! only globals are memoized (compared after `pickletools.optimize`):
//!
//! | [`Value`] | opcodes |
//! |---|---|
//! | `None`, `Bool` | `NONE`, `NEWTRUE` / `NEWFALSE` |
//! | `Int` | `BININT1` (0..=255), `BININT2` (..=65535), `BININT` (i32), else `LONG1` |
//! | `BigInt` | `LONG1` (at most 255 bytes; larger is [`PickleError::Unwritable`] unless `protocol2_only` is off, then `LONG4`) |
//! | `Float` | `BINFLOAT` (big-endian) |
//! | `Str` | `BINUNICODE` |
//! | `Bytes` | `GLOBAL _codecs encode`, the bytes as a latin-1 `str`, `'latin1'`, `TUPLE2`, `REDUCE` (as CPython; also for `b''`, which CPython writes as `__builtin__.bytes()`, a global torch refuses) |
//! | `ByteArray` | `GLOBAL __builtin__ bytearray`, the bytes as above, `TUPLE1`, `REDUCE` (`EMPTY_TUPLE` for an empty one) |
//! | `List` | `EMPTY_LIST`, then batches of 1000: `MARK` items `APPENDS` (`APPEND` for a list of one) |
//! | `Tuple` | `EMPTY_TUPLE`; items `TUPLE1`/`TUPLE2`/`TUPLE3`; `MARK` items `TUPLE` |
//! | `Dict` | `EMPTY_DICT`, then batches of 1000 pairs: `MARK` pairs `SETITEMS` (`SETITEM` for a dict of one) |
//! | `Set` / `FrozenSet` | `GLOBAL __builtin__ set` / `frozenset`, the items as a list, `TUPLE1`, `REDUCE` |
//! | `Global` | `GLOBAL module\nname\n` |
//! | `Reduce` | callable, args, `REDUCE`, then the appends and setitems batched as for lists and dicts (a trailing batch of one is `APPEND` / `SETITEM`) |
//! | `NewObj` | class, args, `NEWOBJ`, then appends and setitems (`kwargs` needs protocol 4: unwritable) |
//! | `Build` | object, state, `BUILD` |
//! | `PersistentId` | the id, `BINPERSID` |
//!
//! Each distinct global (including the ones above) is written once with
//! `GLOBAL` + `BINPUT` and then fetched with `BINGET`, as torch does; no
//! other object is memoized, so shared subtrees are written out again. (A
//! global that is the object of a `Build` is written fresh instead: `BUILD`
//! changes its object in place, which must not reach other references.)
//! Note that `weights_only` also checks *which* globals a pickle uses:
//! `__builtin__.frozenset`, and any callable torch does not allowlist, load
//! only with `weights_only=False`. The output is deterministic, and the
//! writer never recurses, so arbitrarily deep values are fine.
#![warn(missing_docs)]
// Parses untrusted files: fuzzed without a sanitizer, so no unsafe code here.
#![forbid(unsafe_code)]

mod error;
mod int;
mod limits;
mod opcodes;
mod read;
mod value;
mod write;

pub use error::{PickleError, Result};
pub use limits::Limits;
pub use read::{from_slice, from_slice_prefix};
pub use value::Value;
pub use write::{to_vec, write, WriteOptions};
