//! Pickle opcodes of protocols 0 to 5 (CPython `Lib/pickle.py`), with their names for error messages.
//!
//! One table: the macro below makes each opcode's constant and its name
//! from the same line, so the two cannot disagree.

macro_rules! opcodes {
    ($($(#[doc = $doc:literal])* $name:ident = $byte:expr;)*) => {
        $($(#[doc = $doc])* pub const $name: u8 = $byte;)*

        /// The name of an opcode as CPython's `pickletools` spells it, or `"UNKNOWN"`.
        pub fn name(op: u8) -> &'static str {
            match op {
                $($name => stringify!($name),)*
                _ => "UNKNOWN",
            }
        }
    };
}

opcodes! {
    /// Push a mark onto the stack (protocol 0).
    MARK = b'(';
    /// End of pickle: return the top of the stack.
    STOP = b'.';
    /// Discard the top of the stack (or the topmost mark when the current frame is empty).
    POP = b'0';
    /// Discard everything up to and including the topmost mark.
    POP_MARK = b'1';
    /// Duplicate the top of the stack.
    DUP = b'2';
    /// Text float, `F<repr>\n`.
    FLOAT = b'F';
    /// Text int, `I<decimal>\n` (`I00`/`I01` are False/True).
    INT = b'I';
    /// 4-byte signed little-endian int.
    BININT = b'J';
    /// 1-byte unsigned int.
    BININT1 = b'K';
    /// Text long, `L<decimal>L\n`.
    LONG = b'L';
    /// 2-byte unsigned little-endian int.
    BININT2 = b'M';
    /// Push `None`.
    NONE = b'N';
    /// Text persistent id, `P<ascii>\n`.
    PERSID = b'P';
    /// Persistent id taken from the stack.
    BINPERSID = b'Q';
    /// `callable(*args)`.
    REDUCE = b'R';
    /// Quoted, escaped Python 2 string, `S'...'\n`.
    STRING = b'S';
    /// Python 2 string with a 4-byte signed length.
    BINSTRING = b'T';
    /// Python 2 string with a 1-byte length.
    SHORT_BINSTRING = b'U';
    /// Raw-unicode-escaped text string, `V...\n`.
    UNICODE = b'V';
    /// UTF-8 string with a 4-byte length.
    BINUNICODE = b'X';
    /// Append the top of the stack to the list below it.
    APPEND = b'a';
    /// `obj.__setstate__(state)`.
    BUILD = b'b';
    /// Push a global, `c<module>\n<name>\n`.
    GLOBAL = b'c';
    /// Build a dict from the items since the mark.
    DICT = b'd';
    /// Push an empty dict.
    EMPTY_DICT = b'}';
    /// Extend the list below the mark with the items since the mark.
    APPENDS = b'e';
    /// Text memo get, `g<decimal>\n`.
    GET = b'g';
    /// Memo get with a 1-byte key.
    BINGET = b'h';
    /// Instantiate a class, `i<module>\n<name>\n`, args since the mark.
    INST = b'i';
    /// Memo get with a 4-byte key.
    LONG_BINGET = b'j';
    /// Build a list from the items since the mark.
    LIST = b'l';
    /// Push an empty list.
    EMPTY_LIST = b']';
    /// Instantiate the class at the mark with the following args.
    OBJ = b'o';
    /// Text memo put, `p<decimal>\n`.
    PUT = b'p';
    /// Memo put with a 1-byte key.
    BINPUT = b'q';
    /// Memo put with a 4-byte key.
    LONG_BINPUT = b'r';
    /// `dict[key] = value` from the top two stack items.
    SETITEM = b's';
    /// Build a tuple from the items since the mark.
    TUPLE = b't';
    /// Push an empty tuple.
    EMPTY_TUPLE = b')';
    /// `dict[k] = v` for each pair since the mark.
    SETITEMS = b'u';
    /// 8-byte big-endian IEEE float.
    BINFLOAT = b'G';
    /// Protocol header, followed by the protocol number (protocol 2).
    PROTO = 0x80;
    /// `cls.__new__(cls, *args)` (protocol 2).
    NEWOBJ = 0x81;
    /// Extension registry code, 1 byte (protocol 2).
    EXT1 = 0x82;
    /// Extension registry code, 2 bytes (protocol 2).
    EXT2 = 0x83;
    /// Extension registry code, 4 bytes (protocol 2).
    EXT4 = 0x84;
    /// Build a 1-tuple from the top of the stack (protocol 2).
    TUPLE1 = 0x85;
    /// Build a 2-tuple (protocol 2).
    TUPLE2 = 0x86;
    /// Build a 3-tuple (protocol 2).
    TUPLE3 = 0x87;
    /// Push `True` (protocol 2).
    NEWTRUE = 0x88;
    /// Push `False` (protocol 2).
    NEWFALSE = 0x89;
    /// Two's complement little-endian int with a 1-byte length (protocol 2).
    LONG1 = 0x8a;
    /// Two's complement little-endian int with a 4-byte signed length (protocol 2).
    LONG4 = 0x8b;
    /// `bytes` with a 4-byte length (protocol 3).
    BINBYTES = b'B';
    /// `bytes` with a 1-byte length (protocol 3).
    SHORT_BINBYTES = b'C';
    /// UTF-8 string with a 1-byte length (protocol 4).
    SHORT_BINUNICODE = 0x8c;
    /// UTF-8 string with an 8-byte length (protocol 4).
    BINUNICODE8 = 0x8d;
    /// `bytes` with an 8-byte length (protocol 4).
    BINBYTES8 = 0x8e;
    /// Push an empty set (protocol 4).
    EMPTY_SET = 0x8f;
    /// Add the items since the mark to the set below it (protocol 4).
    ADDITEMS = 0x90;
    /// Build a frozenset from the items since the mark (protocol 4).
    FROZENSET = 0x91;
    /// `cls.__new__(cls, *args, **kwargs)` (protocol 4).
    NEWOBJ_EX = 0x92;
    /// Global from the module and name strings on the stack (protocol 4).
    STACK_GLOBAL = 0x93;
    /// Memoize the top of the stack at the next free index (protocol 4).
    MEMOIZE = 0x94;
    /// Frame header with an 8-byte length (protocol 4).
    FRAME = 0x95;
    /// `bytearray` with an 8-byte length (protocol 5).
    BYTEARRAY8 = 0x96;
    /// Out-of-band buffer (protocol 5).
    NEXT_BUFFER = 0x97;
    /// Make the out-of-band buffer on the stack read-only (protocol 5).
    READONLY_BUFFER = 0x98;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_cover_68_opcodes() {
        let known: Vec<u8> = (0..=255u8).filter(|&op| name(op) != "UNKNOWN").collect();
        assert_eq!(known.len(), 68);
        let mut names: Vec<&str> = known.iter().map(|&op| name(op)).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 68);
    }
}
