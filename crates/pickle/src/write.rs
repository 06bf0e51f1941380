//! The writer: protocol 2 restricted to what `torch.load(weights_only=True)` reads (see the crate
//! docs, "Writing").

use std::collections::HashMap;
use std::io::Write;

use crate::opcodes as op;
use crate::{int, PickleError, Result, Value, WriteProblem};

/// Options of [`write()`]. `WriteOptions::default()` gives what [`to_vec`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOptions {
    /// Use only opcodes that torch's `weights_only` unpickler accepts (the
    /// default, `true`). When `false`, integers wider than 255 bytes are
    /// written with `LONG4` (still protocol 2, readable by `pickle.loads` and
    /// `torch.load(weights_only=False)`) instead of being unwritable.
    pub protocol2_only: bool,
    /// Write each distinct global once and refer back to it with `BINGET`
    /// (default `true`, as torch does). When `false` every occurrence is a
    /// full `GLOBAL` and the output has no memo opcodes at all.
    pub memoize_globals: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { protocol2_only: true, memoize_globals: true }
    }
}

/// Pickles `value` (protocol 2, see [Writing](crate#writing)) into a new vector.
///
/// # Errors
///
/// [`PickleError::Unwritable`] for values protocol 2 / `weights_only` cannot express.
pub fn to_vec(value: &Value) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write(value, &mut out, &WriteOptions::default())?;
    Ok(out)
}

/// Pickles `value` into `out` (protocol 2, see [Writing](crate#writing)).
///
/// Output is buffered internally in blocks of 64 KiB; on error `out` may
/// have received part of the pickle.
///
/// # Errors
///
/// [`PickleError::Unwritable`] (with the path of the offending node, e.g.
/// `root["model"][3]`) for values protocol 2 / `weights_only` cannot
/// express: a `NewObj` with `kwargs`, a global whose module or name
/// contains a newline, an integer wider than 255 bytes (unless
/// `protocol2_only` is off), a string longer than 4 GiB;
/// [`PickleError::Io`] when writing fails.
pub fn write(value: &Value, out: &mut impl Write, opts: &WriteOptions) -> Result<()> {
    let mut w = Writer { out, buf: Vec::with_capacity(FLUSH_AT), opts, memo: HashMap::new(), shared: HashMap::new() };
    w.buf.extend_from_slice(&[op::PROTO, 2]);
    match w.emit(value) {
        Ok(()) => {}
        Err(Failure::Io(e)) => return Err(PickleError::Io(e)),
        Err(Failure::Unwritable(at, problem)) => {
            return Err(PickleError::Unwritable { path: path_to(value, at), problem });
        }
    }
    w.buf.push(op::STOP);
    w.flush()?;
    Ok(())
}

const FLUSH_AT: usize = 64 * 1024;
/// Python's pickler batches `APPENDS` / `SETITEMS` by this many items.
const BATCH: usize = 1000;
/// `BINUNICODE` of `"latin1"`, the second argument of `_codecs.encode`.
const LATIN1_ARG: &[u8] = b"X\x06\x00\x00\x00latin1";

/// Why emitting stopped: an I/O error, or the node that cannot be written.
enum Failure {
    Io(std::io::Error),
    Unwritable(*const Value, WriteProblem),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

/// One step of the output, run from an explicit stack instead of recursion.
enum Task<'v> {
    Value(&'v Value),
    /// The object of a `BUILD`: a global is written without the memo, since
    /// `BUILD` changes its object in place and must not reach other references.
    BuildObject(&'v Value),
    Op(u8),
    Raw(&'static [u8]),
    Global(&'v str, &'v str),
    /// `bytes` as a latin-1 `str`: one char per byte, `BINUNICODE` in UTF-8.
    Latin1(&'v [u8], &'v Value),
    /// The values, in order (expanded one at a time, so the task stack
    /// stays small for big containers).
    Items(&'v [Value]),
    /// The keys and values, in order.
    Pairs(&'v [(Value, Value)]),
    /// Batched `APPENDS` of these items onto the list or object below; a
    /// batch of one is a plain `APPEND` if the flag is set.
    Appends(&'v [Value], bool),
    /// Batched `SETITEMS` of these pairs onto the dict or object below; a
    /// batch of one is a plain `SETITEM` if the flag is set.
    SetItems(&'v [(Value, Value)], bool),
    /// Memoize the object just written as shared object `id`.
    Put(u64),
}

struct Writer<'o, 'p, 'v, W: Write> {
    out: &'o mut W,
    buf: Vec<u8>,
    opts: &'p WriteOptions,
    memo: HashMap<(&'v str, &'v str), u32>,
    /// Memo slots of [`Value::Shared`] objects already written.
    shared: HashMap<u64, u32>,
}

impl<'v, W: Write> Writer<'_, '_, 'v, W> {
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    fn maybe_flush(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= FLUSH_AT {
            self.flush()?;
        }
        Ok(())
    }

    fn emit(&mut self, root: &'v Value) -> Result<(), Failure> {
        let mut stack = vec![Task::Value(root)];
        let mut seq: Vec<Task<'v>> = Vec::new();
        while let Some(task) = stack.pop() {
            self.maybe_flush()?;
            match task {
                Task::Op(b) => self.buf.push(b),
                Task::Raw(bytes) => self.buf.extend_from_slice(bytes),
                Task::Global(module, name) => self.global(module, name, true),
                Task::BuildObject(v @ Value::Global { module, name }) => {
                    check_global(module, name, v)?;
                    self.global(module, name, false);
                }
                Task::BuildObject(v) => stack.push(Task::Value(v)),
                Task::Latin1(bytes, at) => self.latin1(bytes, at)?,
                Task::Value(v) => self.value(v, &mut seq)?,
                Task::Items([first, rest @ ..]) => seq.extend([Task::Value(first), Task::Items(rest)]),
                Task::Pairs([(k, v), rest @ ..]) => seq.extend([Task::Value(k), Task::Value(v), Task::Pairs(rest)]),
                Task::Appends(items, single) if !items.is_empty() => {
                    let (batch, rest) = items.split_at(items.len().min(BATCH));
                    match batch {
                        [one] if single => seq.extend([Task::Value(one), Task::Op(op::APPEND)]),
                        _ => seq.extend([Task::Op(op::MARK), Task::Items(batch), Task::Op(op::APPENDS)]),
                    }
                    seq.push(Task::Appends(rest, single));
                }
                Task::SetItems(pairs, single) if !pairs.is_empty() => {
                    let (batch, rest) = pairs.split_at(pairs.len().min(BATCH));
                    match batch {
                        [(k, v)] if single => seq.extend([Task::Value(k), Task::Value(v), Task::Op(op::SETITEM)]),
                        _ => seq.extend([Task::Op(op::MARK), Task::Pairs(batch), Task::Op(op::SETITEMS)]),
                    }
                    seq.push(Task::SetItems(rest, single));
                }
                Task::Put(id) => {
                    let idx = self.next_memo_index();
                    self.put(idx);
                    self.shared.insert(id, idx);
                }
                Task::Items(_) | Task::Pairs(_) | Task::Appends(..) | Task::SetItems(..) => {}
            }
            stack.extend(seq.drain(..).rev());
        }
        Ok(())
    }

    /// Writes `v` if it is a leaf, else appends the tasks that write it to `seq` (in order).
    fn value(&mut self, v: &'v Value, seq: &mut Vec<Task<'v>>) -> Result<(), Failure> {
        match v {
            Value::None => self.buf.push(op::NONE),
            Value::Bool(b) => self.buf.push(if *b { op::NEWTRUE } else { op::NEWFALSE }),
            Value::Int(i) => self.int(*i),
            Value::BigInt(bytes) => self.big_int(bytes, v)?,
            Value::Float(f) => {
                self.buf.push(op::BINFLOAT);
                self.buf.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => self.str(s, v)?,
            Value::Bytes(b) => bytes_tasks(b, v, seq),
            Value::ByteArray(b) => {
                seq.push(Task::Global("__builtin__", "bytearray"));
                if b.is_empty() {
                    seq.push(Task::Op(op::EMPTY_TUPLE));
                } else {
                    bytes_tasks(b, v, seq);
                    seq.push(Task::Op(op::TUPLE1));
                }
                seq.push(Task::Op(op::REDUCE));
            }
            Value::List(items) => {
                seq.push(Task::Op(op::EMPTY_LIST));
                list_items(items, seq);
            }
            Value::Tuple(items) => match items.len() {
                0 => seq.push(Task::Op(op::EMPTY_TUPLE)),
                n @ 1..=3 => seq.extend([Task::Items(items), Task::Op([op::TUPLE1, op::TUPLE2, op::TUPLE3][n - 1])]),
                _ => seq.extend([Task::Op(op::MARK), Task::Items(items), Task::Op(op::TUPLE)]),
            },
            Value::Dict(pairs) => {
                seq.push(Task::Op(op::EMPTY_DICT));
                match pairs.as_slice() {
                    [(k, v)] => seq.extend([Task::Value(k), Task::Value(v), Task::Op(op::SETITEM)]),
                    _ => seq.push(Task::SetItems(pairs, false)),
                }
            }
            Value::Set(items) | Value::FrozenSet(items) => {
                let name = if matches!(v, Value::Set(_)) { "set" } else { "frozenset" };
                seq.push(Task::Global("__builtin__", name));
                seq.push(Task::Op(op::EMPTY_LIST));
                list_items(items, seq);
                seq.extend([Task::Op(op::TUPLE1), Task::Op(op::REDUCE)]);
            }
            Value::Global { module, name } => {
                check_global(module, name, v)?;
                self.global(module, name, true);
            }
            Value::Reduce { callable, args, setitems: items, appends: extra } => {
                seq.extend([Task::Value(callable), Task::Value(args), Task::Op(op::REDUCE)]);
                seq.extend([Task::Appends(extra, true), Task::SetItems(items, true)]);
            }
            Value::NewObj { cls, args, kwargs, setitems: items, appends: extra } => {
                if kwargs.is_some() {
                    return Err(Failure::Unwritable(v, WriteProblem::KeywordArguments));
                }
                seq.extend([Task::Value(cls), Task::Value(args), Task::Op(op::NEWOBJ)]);
                seq.extend([Task::Appends(extra, true), Task::SetItems(items, true)]);
            }
            Value::Build { object, state } => {
                seq.extend([Task::BuildObject(object), Task::Value(state), Task::Op(op::BUILD)]);
            }
            Value::PersistentId(pid) => seq.extend([Task::Value(pid), Task::Op(op::BINPERSID)]),
            Value::Shared { id, value } => match self.shared.get(id) {
                Some(&idx) => self.get(idx),
                None => seq.extend([Task::Value(value), Task::Put(*id)]),
            },
        }
        Ok(())
    }

    fn int(&mut self, i: i64) {
        match i {
            0..=0xff => self.buf.extend_from_slice(&[op::BININT1, i as u8]),
            0x100..=0xffff => {
                self.buf.push(op::BININT2);
                self.buf.extend_from_slice(&(i as u16).to_le_bytes());
            }
            _ => match i32::try_from(i) {
                Ok(i) => {
                    self.buf.push(op::BININT);
                    self.buf.extend_from_slice(&i.to_le_bytes());
                }
                Err(_) => {
                    let bytes = int::i64_to_le(i);
                    self.buf.extend_from_slice(&[op::LONG1, bytes.len() as u8]);
                    self.buf.extend_from_slice(&bytes);
                }
            },
        }
    }

    fn big_int(&mut self, bytes: &[u8], at: &Value) -> Result<(), Failure> {
        let bytes = int::minimal(bytes);
        if let Value::Int(i) = int::from_le(bytes) {
            self.int(i);
            return Ok(());
        }
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.buf.extend_from_slice(&[op::LONG1, n]);
        } else if self.opts.protocol2_only {
            return Err(Failure::Unwritable(at, WriteProblem::NeedsLong4(bytes.len())));
        } else {
            let n = i32::try_from(bytes.len())
                .map_err(|_| Failure::Unwritable(at, WriteProblem::IntegerTooLarge(bytes.len())))?;
            self.buf.push(op::LONG4);
            self.buf.extend_from_slice(&n.to_le_bytes());
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    fn str(&mut self, s: &str, at: &Value) -> Result<(), Failure> {
        let n = u32::try_from(s.len()).map_err(|_| Failure::Unwritable(at, WriteProblem::StringTooLong(s.len())))?;
        self.buf.push(op::BINUNICODE);
        self.buf.extend_from_slice(&n.to_le_bytes());
        self.payload(s.as_bytes())?;
        Ok(())
    }

    /// Appends a large payload, writing it straight through when big.
    fn payload(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() >= FLUSH_AT {
            self.flush()?;
            self.out.write_all(bytes)
        } else {
            self.buf.extend_from_slice(bytes);
            Ok(())
        }
    }

    fn latin1(&mut self, bytes: &[u8], at: &Value) -> Result<(), Failure> {
        let utf8_len = bytes.len() + bytes.iter().filter(|&&b| b >= 0x80).count();
        let n =
            u32::try_from(utf8_len).map_err(|_| Failure::Unwritable(at, WriteProblem::BytesTooLong(bytes.len())))?;
        self.buf.push(op::BINUNICODE);
        self.buf.extend_from_slice(&n.to_le_bytes());
        for chunk in bytes.chunks(FLUSH_AT) {
            let mut tmp = [0u8; 4];
            for &b in chunk {
                self.buf.extend_from_slice(char::from(b).encode_utf8(&mut tmp).as_bytes());
            }
            self.maybe_flush()?;
        }
        Ok(())
    }

    /// `GLOBAL module\nname\n`, memoized (`BINPUT` on first use, `BINGET`
    /// after) if `memoize` and the options allow.
    fn global(&mut self, module: &'v str, name: &'v str, memoize: bool) {
        let memoize = memoize && self.opts.memoize_globals;
        if let Some(&idx) = self.memo.get(&(module, name)).filter(|_| memoize) {
            self.get(idx);
            return;
        }
        self.buf.push(op::GLOBAL);
        for part in [module, name] {
            self.buf.extend_from_slice(part.as_bytes());
            self.buf.push(b'\n');
        }
        if !memoize {
            return;
        }
        let idx = self.next_memo_index();
        self.put(idx);
        self.memo.insert((module, name), idx);
    }

    /// The next free memo slot (globals and shared objects share the numbering).
    fn next_memo_index(&self) -> u32 {
        u32::try_from(self.memo.len() + self.shared.len()).unwrap_or(u32::MAX)
    }

    /// `BINPUT` / `LONG_BINPUT` of the value on top of the stack.
    fn put(&mut self, idx: u32) {
        match u8::try_from(idx) {
            Ok(i) => self.buf.extend_from_slice(&[op::BINPUT, i]),
            Err(_) => {
                self.buf.push(op::LONG_BINPUT);
                self.buf.extend_from_slice(&idx.to_le_bytes());
            }
        }
    }

    /// `BINGET` / `LONG_BINGET` of memo slot `idx`.
    fn get(&mut self, idx: u32) {
        match u8::try_from(idx) {
            Ok(i) => self.buf.extend_from_slice(&[op::BINGET, i]),
            Err(_) => {
                self.buf.push(op::LONG_BINGET);
                self.buf.extend_from_slice(&idx.to_le_bytes());
            }
        }
    }
}

/// The items of a list: `APPEND` for a list of one, else `MARK` ... `APPENDS`
/// batches (CPython's `batch_list_exact`; for the appends and setitems of
/// a reduce, which CPython writes from an iterator, a trailing batch of one
/// is a plain `APPEND` / `SETITEM` instead).
fn list_items<'v>(items: &'v [Value], seq: &mut Vec<Task<'v>>) {
    match items {
        [one] => seq.extend([Task::Value(one), Task::Op(op::APPEND)]),
        _ => seq.push(Task::Appends(items, false)),
    }
}

/// A global's names must not contain the newline that ends them in `GLOBAL`.
fn check_global(module: &str, name: &str, at: &Value) -> Result<(), Failure> {
    if module.contains('\n') || name.contains('\n') {
        return Err(Failure::Unwritable(at, WriteProblem::NewlineInGlobal));
    }
    Ok(())
}

/// `_codecs.encode(<bytes as latin-1 str>, 'latin1')`, as CPython pickles `bytes` in protocol 2.
fn bytes_tasks<'v>(b: &'v [u8], at: &'v Value, seq: &mut Vec<Task<'v>>) {
    seq.extend([
        Task::Global("_codecs", "encode"),
        Task::Latin1(b, at),
        Task::Raw(LATIN1_ARG),
        Task::Op(op::TUPLE2),
        Task::Op(op::REDUCE),
    ]);
}

/// The path from `root` to the node at address `target`, e.g. `root["model"][3].args`.
/// Searched without recursion; only used to report an error.
fn path_to(root: &Value, target: *const Value) -> String {
    let mut path: Vec<String> = Vec::new();
    let mut stack: Vec<(&Value, usize, String)> = vec![(root, 0, "root".to_owned())];
    while let Some((v, depth, segment)) = stack.pop() {
        path.truncate(depth);
        path.push(segment);
        if std::ptr::eq(v, target) {
            return path.concat();
        }
        let mut children: Vec<(&Value, String)> = Vec::new();
        match v {
            Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => children = indexed("", xs),
            Value::Dict(pairs) => children = keyed("", pairs),
            Value::Reduce { callable, args, setitems, appends } => {
                children.extend([(&**callable, ".callable".to_owned()), (&**args, ".args".to_owned())]);
                children.extend(keyed(".setitems", setitems));
                children.extend(indexed(".appends", appends));
            }
            Value::NewObj { cls, args, kwargs, setitems, appends } => {
                children.extend([(&**cls, ".cls".to_owned()), (&**args, ".args".to_owned())]);
                children.extend(kwargs.as_deref().map(|k| (k, ".kwargs".to_owned())));
                children.extend(keyed(".setitems", setitems));
                children.extend(indexed(".appends", appends));
            }
            Value::Build { object, state } => {
                children.extend([(&**object, ".object".to_owned()), (&**state, ".state".to_owned())]);
            }
            Value::PersistentId(pid) => children.push((&**pid, ".pid".to_owned())),
            Value::Shared { value, .. } => children.push((&**value, ".shared".to_owned())),
            _ => {}
        }
        stack.extend(children.into_iter().rev().map(|(c, s)| (c, depth + 1, s)));
    }
    "root".to_owned()
}

/// Children of a list-like node with their path segments.
fn indexed<'v>(name: &str, items: &'v [Value]) -> Vec<(&'v Value, String)> {
    items.iter().enumerate().map(|(i, x)| (x, format!("{name}[{i}]"))).collect()
}

/// Keys and values of a dict-like node with their path segments.
fn keyed<'v>(name: &str, pairs: &'v [(Value, Value)]) -> Vec<(&'v Value, String)> {
    pairs
        .iter()
        .enumerate()
        .flat_map(|(i, (k, x))| [(k, format!("{name}.keys()[{i}]")), (x, format!("{name}[{}]", key_label(k, i)))])
        .collect()
}

/// A dict key as shown in a path: `"name"` for strings, the number for ints, else `#index`.
fn key_label(k: &Value, index: usize) -> String {
    match k {
        Value::Str(s) => format!("{s:?}"),
        Value::Int(i) => i.to_string(),
        _ => format!("#{index}"),
    }
}
