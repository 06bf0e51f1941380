//! The one error type of `pmstate-pickle`.

/// Why a pickle could not be read or written. Read errors carry the byte
/// offset of the opcode at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PickleError {
    /// The input ended inside an opcode or before `STOP`.
    #[error("pickle truncated at byte {offset}: {what}")]
    Truncated {
        /// Byte offset where more input was needed.
        offset: usize,
        /// What was being read.
        what: &'static str,
    },
    /// An opcode this reader does not know.
    #[error("unknown opcode 0x{opcode:02x} at byte {offset}")]
    UnknownOpcode {
        /// The opcode byte.
        opcode: u8,
        /// Its offset.
        offset: usize,
    },
    /// A well-formed opcode used in a way pickle does not allow (empty stack, no mark, wrong operand type, missing memo key...).
    #[error("invalid pickle at byte {offset} ({opcode}): {problem}")]
    Invalid {
        /// Byte offset of the opcode.
        offset: usize,
        /// Opcode name.
        opcode: &'static str,
        /// What is wrong.
        problem: ReadProblem,
    },
    /// A configured limit was exceeded (hostile or oversized input).
    #[error("pickle limit exceeded at byte {offset}: {limit} (limit {max}, needed {needed})")]
    Limit {
        /// Byte offset of the opcode.
        offset: usize,
        /// Which limit (a [`crate::Limits`] field name).
        limit: &'static str,
        /// The configured maximum.
        max: u64,
        /// What the input asked for.
        needed: u64,
    },
    /// A value the writer cannot emit in protocol 2 (or refuses to).
    #[error("cannot pickle {path}: {problem}")]
    Unwritable {
        /// Where in the tree (e.g. `root["model"][3]`).
        path: String,
        /// Why.
        problem: WriteProblem,
    },
    /// Writing to the output failed.
    #[error("writing pickle: {0}")]
    Io(#[from] std::io::Error),
}

/// What is wrong with a pickle ([`PickleError::Invalid`]): the opcode and
/// its offset are in the error, this says why the reader refused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadProblem {
    /// `PROTO` names a protocol newer than this reader knows (5).
    #[error("unsupported pickle protocol {0}")]
    Protocol(u8),
    /// A `LONG4` / `BINSTRING` length below zero.
    #[error("negative byte count")]
    NegativeLength,
    /// A text operand or persistent id with bytes outside ASCII.
    #[error("{0} is not ASCII")]
    NotAscii(Operand),
    /// A string, module or global name that is not UTF-8.
    #[error("{what} is not valid UTF-8 ({error})")]
    NotUtf8 {
        /// What was being decoded.
        what: Operand,
        /// Where the decoding stopped.
        error: std::str::Utf8Error,
    },
    /// A decimal `INT` / `LONG` longer than CPython converts (`sys.int_info.default_max_str_digits`).
    #[error("integer literal has {digits} digits (more than Python's {max})")]
    TooManyDigits {
        /// Digits given.
        digits: usize,
        /// The most CPython accepts.
        max: usize,
    },
    /// A text operand that does not parse (its first 40 characters).
    #[error("malformed {what} \"{}\"", .text.escape_debug())]
    MalformedLiteral {
        /// Which operand.
        what: Operand,
        /// The start of the text given (boxed, as the operand names are
        /// small enums: a [`PickleError`] stays small).
        text: Box<str>,
    },
    /// A `STRING` operand without its quotes.
    #[error("the STRING opcode argument must be quoted")]
    UnquotedString,
    /// A `STRING` operand ending in a lone backslash.
    #[error("trailing \\ in string")]
    TrailingBackslash,
    /// A `\x` escape of a `STRING` without two hex digits.
    #[error("invalid \\x escape at position {0}")]
    HexEscape(usize),
    /// A `\u` / `\U` escape of a `UNICODE` operand cut short by its end.
    #[error("truncated \\{0} escape")]
    TruncatedEscape(char),
    /// A `\u` / `\U` escape with a digit that is not hex.
    #[error("malformed \\{0} escape")]
    MalformedEscape(char),
    /// A `\u` / `\U` escape naming a surrogate or a code point past U+10FFFF.
    #[error("escape \\{escape}{code:x} is a surrogate or out of range")]
    NotAChar {
        /// `u` or `U`.
        escape: char,
        /// The code given.
        code: u32,
    },
    /// An opcode that pops from an empty stack.
    #[error("empty stack")]
    EmptyStack,
    /// An opcode that pops past the last `MARK` (its frame is empty).
    #[error("no item after the MARK")]
    EmptyFrame,
    /// An opcode that needs a `MARK` where there is none.
    #[error("no MARK on the stack")]
    NoMark,
    /// `TUPLE1` / `TUPLE2` / `TUPLE3` with fewer items in the frame.
    #[error("needs {0} items on the stack")]
    TooFewItems(usize),
    /// `STACK_GLOBAL` whose operands are not two strings.
    #[error("module and name must be strings")]
    GlobalNotStrings,
    /// `OBJ` with nothing after its `MARK`.
    #[error("no class after the MARK")]
    NoClass,
    /// `EXT1` / `EXT2` / `EXT4`: the copyreg extension registry, which a
    /// reader that imports nothing cannot consult.
    #[error("the extension registry (copyreg.add_extension) is not supported")]
    Extension,
    /// `NEXT_BUFFER` / `READONLY_BUFFER` (protocol 5 out-of-band buffers).
    #[error("out-of-band buffers not supported")]
    OutOfBand,
    /// `DICT` / `SETITEMS` with an odd number of items.
    #[error("odd number of items ({0}) for key/value pairs")]
    OddItems(usize),
    /// `GET` of a memo key no `PUT` stored.
    #[error("memo key {0} missing")]
    MissingMemo(u64),
    /// A dict key or set item that contains a mutable container.
    #[error("unhashable key or set item (contains a {0})")]
    Unhashable(&'static str),
    /// A dict key or set item that contains itself.
    #[error("recursive structure in a key")]
    RecursiveKey,
    /// A value that contains itself (the tree would be infinite).
    #[error("recursive structure (a {0} contains itself)")]
    Recursive(&'static str),
    /// `APPEND(S)` on something that is neither a list nor an object.
    #[error("cannot append to a {0}")]
    CannotAppend(&'static str),
    /// `SETITEM(S)` on something that is neither a dict nor an object.
    #[error("cannot set items on a {0}")]
    CannotSetItems(&'static str),
    /// `ADDITEMS` on something that is not a set.
    #[error("cannot add items to a {0}")]
    CannotAddItems(&'static str),
    /// More objects than the reader's 32-bit ids can address.
    #[error("more than 2^32 - 1 objects")]
    TooManyObjects,
    /// Bytes after the `STOP` that ends the pickle ([`crate::from_slice`]).
    #[error("{0} trailing bytes after the pickle")]
    TrailingBytes(usize),
}

/// The operand a [`ReadProblem`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operand {
    /// The decimal of `INT` / `LONG`.
    IntegerLiteral,
    /// The decimal of `FLOAT`.
    FloatLiteral,
    /// The decimal key of `GET` / `PUT`.
    MemoKey,
    /// The line of `PERSID`.
    PersistentId,
    /// The bytes of a `BINUNICODE` / `SHORT_BINUNICODE` / `BINUNICODE8` string.
    String,
    /// The module line of `GLOBAL` / `INST`.
    ModuleName,
    /// The name line of `GLOBAL` / `INST`.
    GlobalName,
}

/// `integer literal`, `memo key`, ...
impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operand::IntegerLiteral => "integer literal",
            Operand::FloatLiteral => "float literal",
            Operand::MemoKey => "memo key",
            Operand::PersistentId => "persistent id",
            Operand::String => "string",
            Operand::ModuleName => "module name",
            Operand::GlobalName => "global name",
        })
    }
}

/// Why a value cannot be pickled ([`PickleError::Unwritable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteProblem {
    /// A `NewObj` with keyword arguments: `NEWOBJ_EX` is protocol 4.
    #[error("NEWOBJ_EX (keyword arguments) needs protocol 4, which torch's weights_only refuses")]
    KeywordArguments,
    /// A global whose module or name contains a newline (`GLOBAL` operands are lines).
    #[error("a global's module or name contains a newline")]
    NewlineInGlobal,
    /// An integer wider than `LONG1` holds while
    /// [`WriteOptions::protocol2_only`](crate::WriteOptions::protocol2_only) is on.
    #[error(
        "integer needs {0} bytes: LONG1 holds at most 255 and torch's weights_only refuses LONG4 \
         (set WriteOptions::protocol2_only = false to use it)"
    )]
    NeedsLong4(usize),
    /// An integer wider than `LONG4` holds.
    #[error("integer needs {0} bytes (LONG4 max 2^31-1)")]
    IntegerTooLarge(usize),
    /// A string of 4 GiB or more (`BINUNICODE` has a 32-bit length).
    #[error("string of {0} bytes (BINUNICODE max 4 GiB)")]
    StringTooLong(usize),
    /// Bytes whose latin-1 text form reaches 4 GiB.
    #[error("bytes of {0} bytes (too long for protocol 2)")]
    BytesTooLong(usize),
}

/// Result alias of this crate.
pub type Result<T, E = PickleError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// `PickleError` travels inside the checkpoint and policy errors, which
    /// clippy's `result_large_err` holds under 128 bytes: it stays at six words.
    #[test]
    fn errors_stay_small() {
        assert!(std::mem::size_of::<ReadProblem>() <= 24, "{}", std::mem::size_of::<ReadProblem>());
        assert!(std::mem::size_of::<PickleError>() <= 48, "{}", std::mem::size_of::<PickleError>());
    }
}
