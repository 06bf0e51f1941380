//! The pickle machine: runs the opcodes of one pickle into an [`Arena`],
//! calling nothing. The semantics follow CPython's `pickle._Unpickler`.

use std::collections::HashMap;

use super::arena::{Arena, Call, Id, Keyed, Meta, Node};
use super::builtins::{self, Builtin};
use super::input::Input;
use super::keys::Keys;
use super::text;
use crate::opcodes::{self as op, name};
use crate::{int, Limits, Operand, PickleError, ReadProblem, Result};

/// The highest protocol this reader knows.
const HIGHEST_PROTOCOL: u8 = 5;

/// Slots of shared scalars: `None`, `True`, `False`, then the ints 0 to 255.
const SHARED_SLOTS: usize = 3 + 256;

/// A finished run: the object graph and where things ended.
pub(super) struct Finished {
    pub arena: Arena,
    pub root: Id,
    /// Offset of the `STOP` opcode.
    pub stop_offset: usize,
    /// Bytes consumed, `STOP` included.
    pub consumed: usize,
}

/// Runs one pickle from the start of `bytes`.
pub(super) fn run(bytes: &[u8], limits: &Limits) -> Result<Finished> {
    let mut m = Machine {
        input: Input::new(bytes),
        limits,
        arena: Arena::default(),
        keys: Keys::default(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        shared: [None; SHARED_SLOTS],
        op: 0,
        at: 0,
    };
    loop {
        m.at = m.input.pos();
        let Some(opcode) = m.input.next_byte() else {
            return Err(PickleError::Truncated { offset: m.at, what: "opcode (the pickle has no STOP)" });
        };
        m.op = opcode;
        let root = m.step()?;
        let consumed = m.input.pos();
        if consumed as u64 > limits.max_input_bytes {
            return Err(m.limit("max_input_bytes", limits.max_input_bytes, consumed as u64));
        }
        if let Some(root) = root {
            return Ok(Finished { arena: m.arena, root, stop_offset: m.at, consumed });
        }
    }
}

struct Machine<'a, 'l> {
    input: Input<'a>,
    limits: &'l Limits,
    arena: Arena,
    keys: Keys,
    /// The pickle stack, all frames; `marks` holds where each frame starts.
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
    /// The one node of each shared immutable scalar (see [`Machine::push_shared`]).
    shared: [Option<Id>; SHARED_SLOTS],
    /// The opcode being run and its offset.
    op: u8,
    at: usize,
}

impl<'a> Machine<'a, '_> {
    fn invalid(&self, problem: ReadProblem) -> PickleError {
        PickleError::Invalid { offset: self.at, opcode: name(self.op), problem }
    }

    fn limit(&self, limit: &'static str, max: u64, needed: u64) -> PickleError {
        PickleError::Limit { offset: self.at, limit, max, needed }
    }

    /// Runs the current opcode; `Some(root)` on `STOP`.
    fn step(&mut self) -> Result<Option<Id>> {
        match self.op {
            op::STOP => return self.pop().map(Some),
            op::PROTO => {
                let proto = self.input.u8("protocol number")?;
                if proto > HIGHEST_PROTOCOL {
                    return Err(self.invalid(ReadProblem::Protocol(proto)));
                }
            }
            op::FRAME => {
                let len = self.input.u64_le("frame length")?;
                if len > self.input.remaining() as u64 {
                    return Err(PickleError::Truncated { offset: self.input.pos(), what: "frame" });
                }
            }
            op::MARK => {
                if self.marks.len() >= self.limits.max_depth {
                    let max = self.limits.max_depth as u64;
                    return Err(self.limit("max_depth", max, max + 1));
                }
                self.marks.push(self.stack.len());
            }
            op::POP => {
                if self.stack.len() > self.frame_base() {
                    self.stack.pop();
                } else {
                    self.pop_mark()?;
                }
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let top = self.top()?;
                self.stack.push(top);
            }

            // Scalars.
            op::NONE => self.push_shared(0, Node::None)?,
            op::NEWTRUE => self.push_shared(1, Node::Bool(true))?,
            op::NEWFALSE => self.push_shared(2, Node::Bool(false))?,
            op::BININT => {
                let v = self.input.i32_le("BININT operand")?;
                self.push(Node::Int(v.into()))?;
            }
            op::BININT1 => {
                let v = self.input.u8("BININT1 operand")?;
                self.push_shared(3 + usize::from(v), Node::Int(v.into()))?;
            }
            op::BININT2 => {
                let v = self.input.u16_le("BININT2 operand")?;
                self.push(Node::Int(v.into()))?;
            }
            op::LONG1 => {
                let n = self.input.u8("LONG1 length")?;
                let bytes = self.literal(n.into(), "LONG1 bytes")?;
                self.push_value_int(int::from_le(bytes))?;
            }
            op::LONG4 => {
                let n = self.input.i32_le("LONG4 length")?;
                let n = u64::try_from(n).map_err(|_| self.invalid(ReadProblem::NegativeLength))?;
                let bytes = self.literal(n, "LONG4 bytes")?;
                self.push_value_int(int::from_le(bytes))?;
            }
            op::INT | op::LONG => {
                let line = self.line("integer literal")?;
                let parsed = if self.op == op::INT { text::int_operand(line) } else { text::long_operand(line) };
                let v = parsed.map_err(|e| self.invalid(e))?;
                self.push_value_int(v)?;
            }
            op::BINFLOAT => {
                let v = f64::from_be_bytes(self.input.array("BINFLOAT operand")?);
                self.push(Node::Float(v))?;
            }
            op::FLOAT => {
                let line = self.line("float literal")?;
                let v = text::float_operand(line).map_err(|e| self.invalid(e))?;
                self.push(Node::Float(v))?;
            }

            // Strings.
            op::BINUNICODE => {
                let n = self.input.u32_le("BINUNICODE length")?;
                self.push_utf8(n.into())?;
            }
            op::SHORT_BINUNICODE => {
                let n = self.input.u8("SHORT_BINUNICODE length")?;
                self.push_utf8(n.into())?;
            }
            op::BINUNICODE8 => {
                let n = self.input.u64_le("BINUNICODE8 length")?;
                self.push_utf8(n)?;
            }
            op::UNICODE => {
                let line = self.line("UNICODE literal")?;
                let s = text::raw_unicode_escape_decode(line).map_err(|e| self.invalid(e))?;
                self.push(Node::Str(s))?;
            }
            op::BINBYTES | op::SHORT_BINBYTES | op::BINBYTES8 | op::BYTEARRAY8 => {
                let n = match self.op {
                    op::BINBYTES => self.input.u32_le("BINBYTES length")?.into(),
                    op::SHORT_BINBYTES => self.input.u8("SHORT_BINBYTES length")?.into(),
                    _ => self.input.u64_le("length")?,
                };
                let bytes = self.literal(n, "bytes")?.to_vec();
                self.push(if self.op == op::BYTEARRAY8 { Node::ByteArray(bytes) } else { Node::Bytes(bytes) })?;
            }
            op::STRING => {
                let line = self.line("STRING literal")?;
                let bytes = text::string_operand(line).map_err(|e| self.invalid(e))?;
                self.push(py2_str(bytes))?;
            }
            op::BINSTRING => {
                let n = self.input.i32_le("BINSTRING length")?;
                let n = u64::try_from(n).map_err(|_| self.invalid(ReadProblem::NegativeLength))?;
                let bytes = self.literal(n, "BINSTRING bytes")?.to_vec();
                self.push(py2_str(bytes))?;
            }
            op::SHORT_BINSTRING => {
                let n = self.input.u8("SHORT_BINSTRING length")?;
                let bytes = self.literal(n.into(), "SHORT_BINSTRING bytes")?.to_vec();
                self.push(py2_str(bytes))?;
            }

            // Containers.
            op::EMPTY_LIST => self.push(Node::List(Vec::new()))?,
            op::EMPTY_TUPLE => self.push(Node::Tuple(Vec::new()))?,
            op::EMPTY_DICT => self.push(Node::Dict(Box::default()))?,
            op::EMPTY_SET => self.push(Node::Set(Box::default()))?,
            op::LIST => {
                let items = self.pop_mark()?;
                self.push(Node::List(items))?;
            }
            op::TUPLE => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items))?;
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = usize::from(self.op - op::TUPLE1) + 1;
                if self.stack.len() < self.frame_base() + n {
                    return Err(self.invalid(ReadProblem::TooFewItems(n)));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push(Node::Tuple(items))?;
            }
            op::DICT => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                let dict = self.new_node(Node::Dict(Box::default()))?;
                self.set_items(dict, pairs)?;
                self.stack.push(dict);
            }
            op::FROZENSET => {
                let items = self.pop_mark()?;
                let items = self.unique(items)?;
                self.push(Node::FrozenSet(items))?;
            }
            op::APPEND => {
                let item = self.pop()?;
                let target = self.top()?;
                self.append(target, vec![item])?;
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                let target = self.top()?;
                self.append(target, items)?;
            }
            op::SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                let target = self.top()?;
                self.set_items(target, vec![(key, value)])?;
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                let target = self.top()?;
                self.set_items(target, pairs)?;
            }
            op::ADDITEMS => {
                let items = self.pop_mark()?;
                let target = self.top()?;
                self.add_items(target, items)?;
            }

            // Memo.
            op::PUT => {
                let line = self.line("PUT key")?;
                let key = text::memo_key(line).map_err(|e| self.invalid(e))?;
                self.memo_put(key)?;
            }
            op::BINPUT => {
                let key = self.input.u8("BINPUT key")?;
                self.memo_put(key.into())?;
            }
            op::LONG_BINPUT => {
                let key = self.input.u32_le("LONG_BINPUT key")?;
                self.memo_put(key.into())?;
            }
            op::MEMOIZE => {
                let key = self.memo.len() as u64;
                self.memo_put(key)?;
            }
            op::GET => {
                let line = self.line("GET key")?;
                let key = text::memo_key(line).map_err(|e| self.invalid(e))?;
                self.memo_get(key)?;
            }
            op::BINGET => {
                let key = self.input.u8("BINGET key")?;
                self.memo_get(key.into())?;
            }
            op::LONG_BINGET => {
                let key = self.input.u32_le("LONG_BINGET key")?;
                self.memo_get(key.into())?;
            }

            // Globals and calls, recorded, never performed.
            op::GLOBAL => {
                let (module, name) = self.global_operands()?;
                self.push(Node::Global(Box::new((module, name))))?;
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Node::Str(module), Node::Str(name)) = (self.arena.node(module), self.arena.node(name)) else {
                    return Err(self.invalid(ReadProblem::GlobalNotStrings));
                };
                let global = Node::Global(Box::new((module.clone(), name.clone())));
                self.push(global)?;
            }
            op::REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let node = match builtins::recognize(&self.arena, callable, args) {
                    Some(Builtin::Bytes(b)) => Node::Bytes(b),
                    Some(Builtin::ByteArray(b)) => Node::ByteArray(b),
                    Some(Builtin::FrozenSet(items)) => Node::FrozenSet(self.unique(items)?),
                    Some(Builtin::Set(items)) => {
                        let set = self.new_node(Node::Set(Box::default()))?;
                        self.add_items(set, items)?;
                        self.stack.push(set);
                        return Ok(None);
                    }
                    None => Node::Reduce(Box::new(Call::new(callable, args, None))),
                };
                self.push(node)?;
            }
            op::NEWOBJ => {
                let args = self.pop()?;
                let cls = self.pop()?;
                self.push(Node::NewObj(Box::new(Call::new(cls, args, None))))?;
            }
            op::NEWOBJ_EX => {
                let kwargs = self.pop()?;
                let args = self.pop()?;
                let cls = self.pop()?;
                self.push(Node::NewObj(Box::new(Call::new(cls, args, Some(kwargs)))))?;
            }
            op::INST => {
                let (module, name) = self.global_operands()?;
                let args = self.pop_mark()?;
                let cls = self.new_node(Node::Global(Box::new((module, name))))?;
                let args = self.new_node(Node::Tuple(args))?;
                self.push(Node::NewObj(Box::new(Call::new(cls, args, None))))?;
            }
            op::OBJ => {
                let mut items = self.pop_mark()?;
                if items.is_empty() {
                    return Err(self.invalid(ReadProblem::NoClass));
                }
                let cls = items.remove(0);
                let args = self.new_node(Node::Tuple(items))?;
                self.push(Node::NewObj(Box::new(Call::new(cls, args, None))))?;
            }
            op::BUILD => {
                let state = self.pop()?;
                let object = self.top()?;
                self.build(object, state)?;
            }
            op::PERSID => {
                let line = self.line("persistent id")?;
                let pid = std::str::from_utf8(line)
                    .ok()
                    .filter(|s| s.is_ascii())
                    .ok_or_else(|| self.invalid(ReadProblem::NotAscii(Operand::PersistentId)))?;
                let pid = self.new_node(Node::Str(pid.to_owned()))?;
                self.push(Node::PersistentId(pid))?;
            }
            op::BINPERSID => {
                let pid = self.pop()?;
                self.push(Node::PersistentId(pid))?;
            }
            op::EXT1 | op::EXT2 | op::EXT4 => {
                return Err(self.invalid(ReadProblem::Extension));
            }
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.invalid(ReadProblem::OutOfBand));
            }
            other => return Err(PickleError::UnknownOpcode { opcode: other, offset: self.at }),
        }
        Ok(None)
    }

    // ----- stack -----

    /// Where the current frame (the items since the last MARK) starts.
    fn frame_base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Id> {
        if self.stack.len() <= self.frame_base() {
            let why = if self.marks.is_empty() { ReadProblem::EmptyStack } else { ReadProblem::EmptyFrame };
            return Err(self.invalid(why));
        }
        self.stack.pop().ok_or_else(|| self.invalid(ReadProblem::EmptyStack))
    }

    fn top(&self) -> Result<Id> {
        if self.stack.len() <= self.frame_base() {
            let why = if self.marks.is_empty() { ReadProblem::EmptyStack } else { ReadProblem::EmptyFrame };
            return Err(self.invalid(why));
        }
        self.stack.last().copied().ok_or_else(|| self.invalid(ReadProblem::EmptyStack))
    }

    fn pop_mark(&mut self) -> Result<Vec<Id>> {
        let mark = self.marks.pop().ok_or_else(|| self.invalid(ReadProblem::NoMark))?;
        Ok(self.stack.split_off(mark))
    }

    /// Stores `node` and pushes it.
    fn push(&mut self, node: Node) -> Result<()> {
        let id = self.new_node(node)?;
        self.stack.push(id);
        Ok(())
    }

    /// Pushes the one node of an immutable scalar (`None`, a bool, a
    /// `BININT1` int), so that a pickle of many of them costs one node, not
    /// one each. (`BUILD` never changes these in place, see [`Machine::build`].)
    fn push_shared(&mut self, slot: usize, node: Node) -> Result<()> {
        let id = match self.shared[slot] {
            Some(id) => id,
            None => {
                let id = self.new_node(node)?;
                self.shared[slot] = Some(id);
                id
            }
        };
        self.stack.push(id);
        Ok(())
    }

    fn push_value_int(&mut self, v: crate::Value) -> Result<()> {
        self.push(match v {
            crate::Value::Int(i) => Node::Int(i),
            crate::Value::BigInt(b) => Node::BigInt(b),
            crate::Value::Bool(b) => Node::Bool(b),
            // The integer decoders make nothing else; should one, the
            // operand was no integer.
            _ => {
                return Err(
                    self.invalid(ReadProblem::MalformedLiteral { what: Operand::IntegerLiteral, text: "".into() })
                )
            }
        })
    }

    /// Stores `node` (without pushing it), checking the limits on its size and depth.
    fn new_node(&mut self, node: Node) -> Result<Id> {
        let id = self.arena.push(node).ok_or_else(|| self.invalid(ReadProblem::TooManyObjects))?;
        self.check(self.arena.meta(id))?;
        Ok(id)
    }

    fn check(&self, meta: Meta) -> Result<()> {
        if meta.size > self.limits.max_nodes {
            return Err(self.limit("max_nodes", self.limits.max_nodes, meta.size));
        }
        if meta.depth as usize > self.limits.max_depth {
            return Err(self.limit("max_depth", self.limits.max_depth as u64, meta.depth.into()));
        }
        Ok(())
    }

    // ----- operands -----

    /// `n` literal bytes: `Truncated` if the input is shorter (checked before
    /// anything is allocated), `Limit` if longer than `max_literal_bytes`.
    fn literal(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.input.remaining() as u64 {
            return Err(PickleError::Truncated { offset: self.input.pos(), what });
        }
        if n > self.limits.max_literal_bytes {
            return Err(self.limit("max_literal_bytes", self.limits.max_literal_bytes, n));
        }
        self.input.take(n as usize, what)
    }

    /// A text operand line, bounded by `max_literal_bytes`.
    fn line(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let line = self.input.line(what)?;
        if line.len() as u64 > self.limits.max_literal_bytes {
            return Err(self.limit("max_literal_bytes", self.limits.max_literal_bytes, line.len() as u64));
        }
        Ok(line)
    }

    fn push_utf8(&mut self, n: u64) -> Result<()> {
        let bytes = self.literal(n, "string bytes")?;
        let s = std::str::from_utf8(bytes)
            .map_err(|error| self.invalid(ReadProblem::NotUtf8 { what: Operand::String, error }))?;
        let s = s.to_owned();
        self.push(Node::Str(s))
    }

    /// The `module\nname\n` operands of `GLOBAL` / `INST`.
    fn global_operands(&mut self) -> Result<(String, String)> {
        let module = self.line("global module")?;
        let module = std::str::from_utf8(module)
            .map_err(|error| self.invalid(ReadProblem::NotUtf8 { what: Operand::ModuleName, error }))?
            .to_owned();
        let name = self.line("global name")?;
        let name = std::str::from_utf8(name)
            .map_err(|error| self.invalid(ReadProblem::NotUtf8 { what: Operand::GlobalName, error }))?
            .to_owned();
        Ok((module, name))
    }

    fn pairs(&self, items: Vec<Id>) -> Result<Vec<(Id, Id)>> {
        if !items.len().is_multiple_of(2) {
            return Err(self.invalid(ReadProblem::OddItems(items.len())));
        }
        Ok(items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect())
    }

    // ----- memo -----

    fn memo_put(&mut self, key: u64) -> Result<()> {
        let top = self.top()?;
        if !self.memo.contains_key(&key) && self.memo.len() as u64 >= self.limits.max_memo_entries {
            let max = self.limits.max_memo_entries;
            return Err(self.limit("max_memo_entries", max, max + 1));
        }
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<()> {
        let id = *self.memo.get(&key).ok_or_else(|| self.invalid(ReadProblem::MissingMemo(key)))?;
        self.stack.push(id);
        Ok(())
    }

    // ----- mutation -----

    fn canon(&mut self, key: Id) -> Result<u32> {
        self.keys.canon(&self.arena, key).map_err(|problem| self.invalid(problem))
    }

    /// `APPEND` / `APPENDS`: extends a list, or records appends on an object.
    fn append(&mut self, target: Id, items: Vec<Id>) -> Result<()> {
        let meta = self.arena.grow(target, items.iter().copied());
        match self.arena.node_mut(target) {
            Node::List(xs) => xs.extend(items),
            Node::Reduce(call) | Node::NewObj(call) => call.appends.extend(items),
            other => {
                let kind = other.kind();
                return Err(self.invalid(ReadProblem::CannotAppend(kind)));
            }
        }
        self.check(meta)
    }

    /// `SETITEM(S)` / `DICT`: sets dict entries (a repeated key replaces the
    /// value in place, keeping the first key), or records setitems on an object.
    fn set_items(&mut self, target: Id, pairs: Vec<(Id, Id)>) -> Result<()> {
        match self.arena.node(target) {
            Node::Dict(_) => {
                for (key, value) in pairs {
                    let canon = self.canon(key)?;
                    let Node::Dict(dict) = self.arena.node_mut(target) else {
                        let kind = self.arena.node(target).kind();
                        return Err(self.invalid(ReadProblem::CannotSetItems(kind)));
                    };
                    match dict.find(canon) {
                        Some(pos) => dict.items[pos].1 = value,
                        None => {
                            dict.push(canon, (key, value));
                            let meta = self.arena.grow(target, [key, value]);
                            self.check(meta)?;
                        }
                    }
                }
                Ok(())
            }
            Node::Reduce(_) | Node::NewObj(_) => {
                let meta = self.arena.grow(target, pairs.iter().flat_map(|&(k, v)| [k, v]));
                if let Node::Reduce(call) | Node::NewObj(call) = self.arena.node_mut(target) {
                    call.setitems.extend(pairs);
                }
                self.check(meta)
            }
            other => Err(self.invalid(ReadProblem::CannotSetItems(other.kind()))),
        }
    }

    /// `ADDITEMS` (and `set(...)`): adds the items not already in the set.
    fn add_items(&mut self, target: Id, items: Vec<Id>) -> Result<()> {
        if !matches!(self.arena.node(target), Node::Set(_)) {
            return Err(self.invalid(ReadProblem::CannotAddItems(self.arena.node(target).kind())));
        }
        for item in items {
            let canon = self.canon(item)?;
            if let Node::Set(set) = self.arena.node_mut(target) {
                if set.find(canon).is_none() {
                    set.push(canon, item);
                    let meta = self.arena.grow(target, [item]);
                    self.check(meta)?;
                }
            }
        }
        Ok(())
    }

    /// `items` without duplicates (first occurrence kept), for a frozenset.
    fn unique(&mut self, items: Vec<Id>) -> Result<Vec<Id>> {
        let mut seen: Keyed<Id> = Keyed::default();
        for item in items {
            let canon = self.canon(item)?;
            if seen.find(canon).is_none() {
                seen.push(canon, item);
            }
        }
        Ok(seen.items)
    }

    /// `BUILD`, in place: the object's node becomes a `Build` of its former
    /// content (moved to a new node), so every reference to it sees the state.
    /// Immutable values (`None`, bools, numbers, strings, bytes, tuples,
    /// frozensets: Python cannot `BUILD` them anyway, and they may be shared
    /// nodes or dict keys) instead get a new `Build` node on the stack.
    fn build(&mut self, object: Id, state: Id) -> Result<()> {
        if matches!(
            self.arena.node(object),
            Node::None
                | Node::Bool(_)
                | Node::Int(_)
                | Node::BigInt(_)
                | Node::Float(_)
                | Node::Str(_)
                | Node::Bytes(_)
                | Node::Tuple(_)
                | Node::FrozenSet(_)
        ) {
            self.stack.pop();
            return self.push(Node::Build { object, state });
        }
        let content = std::mem::replace(self.arena.node_mut(object), Node::None);
        let meta = self.arena.meta(object);
        let moved = self.arena.push(content).ok_or_else(|| self.invalid(ReadProblem::TooManyObjects))?;
        self.arena.meta[moved as usize] = meta;
        *self.arena.node_mut(object) = Node::Build { object: moved, state };
        self.arena.meta[object as usize] = Meta { size: 1, depth: 1 };
        let meta = self.arena.grow(object, [moved, state]);
        self.check(meta)
    }
}

/// A Python 2 `str` (`STRING` / `BINSTRING` / `SHORT_BINSTRING`): text when
/// it is valid UTF-8 (as `torch.load`'s `encoding="utf-8"` decodes it), else bytes.
fn py2_str(bytes: Vec<u8>) -> Node {
    match String::from_utf8(bytes) {
        Ok(s) => Node::Str(s),
        Err(e) => Node::Bytes(e.into_bytes()),
    }
}
