//! Pickle opcodes of protocols 0 to 5 (CPython `Lib/pickle.py`), with their names for error messages.

/// Push a mark onto the stack (protocol 0).
pub const MARK: u8 = b'(';
/// End of pickle: return the top of the stack.
pub const STOP: u8 = b'.';
/// Discard the top of the stack (or the topmost mark when the current frame is empty).
pub const POP: u8 = b'0';
/// Discard everything up to and including the topmost mark.
pub const POP_MARK: u8 = b'1';
/// Duplicate the top of the stack.
pub const DUP: u8 = b'2';
/// Text float, `F<repr>\n`.
pub const FLOAT: u8 = b'F';
/// Text int, `I<decimal>\n` (`I00`/`I01` are False/True).
pub const INT: u8 = b'I';
/// 4-byte signed little-endian int.
pub const BININT: u8 = b'J';
/// 1-byte unsigned int.
pub const BININT1: u8 = b'K';
/// Text long, `L<decimal>L\n`.
pub const LONG: u8 = b'L';
/// 2-byte unsigned little-endian int.
pub const BININT2: u8 = b'M';
/// Push `None`.
pub const NONE: u8 = b'N';
/// Text persistent id, `P<ascii>\n`.
pub const PERSID: u8 = b'P';
/// Persistent id taken from the stack.
pub const BINPERSID: u8 = b'Q';
/// `callable(*args)`.
pub const REDUCE: u8 = b'R';
/// Quoted, escaped Python 2 string, `S'...'\n`.
pub const STRING: u8 = b'S';
/// Python 2 string with a 4-byte signed length.
pub const BINSTRING: u8 = b'T';
/// Python 2 string with a 1-byte length.
pub const SHORT_BINSTRING: u8 = b'U';
/// Raw-unicode-escaped text string, `V...\n`.
pub const UNICODE: u8 = b'V';
/// UTF-8 string with a 4-byte length.
pub const BINUNICODE: u8 = b'X';
/// Append the top of the stack to the list below it.
pub const APPEND: u8 = b'a';
/// `obj.__setstate__(state)`.
pub const BUILD: u8 = b'b';
/// Push a global, `c<module>\n<name>\n`.
pub const GLOBAL: u8 = b'c';
/// Build a dict from the items since the mark.
pub const DICT: u8 = b'd';
/// Push an empty dict.
pub const EMPTY_DICT: u8 = b'}';
/// Extend the list below the mark with the items since the mark.
pub const APPENDS: u8 = b'e';
/// Text memo get, `g<decimal>\n`.
pub const GET: u8 = b'g';
/// Memo get with a 1-byte key.
pub const BINGET: u8 = b'h';
/// Instantiate a class, `i<module>\n<name>\n`, args since the mark.
pub const INST: u8 = b'i';
/// Memo get with a 4-byte key.
pub const LONG_BINGET: u8 = b'j';
/// Build a list from the items since the mark.
pub const LIST: u8 = b'l';
/// Push an empty list.
pub const EMPTY_LIST: u8 = b']';
/// Instantiate the class at the mark with the following args.
pub const OBJ: u8 = b'o';
/// Text memo put, `p<decimal>\n`.
pub const PUT: u8 = b'p';
/// Memo put with a 1-byte key.
pub const BINPUT: u8 = b'q';
/// Memo put with a 4-byte key.
pub const LONG_BINPUT: u8 = b'r';
/// `dict[key] = value` from the top two stack items.
pub const SETITEM: u8 = b's';
/// Build a tuple from the items since the mark.
pub const TUPLE: u8 = b't';
/// Push an empty tuple.
pub const EMPTY_TUPLE: u8 = b')';
/// `dict[k] = v` for each pair since the mark.
pub const SETITEMS: u8 = b'u';
/// 8-byte big-endian IEEE float.
pub const BINFLOAT: u8 = b'G';

/// Protocol header, followed by the protocol number (protocol 2).
pub const PROTO: u8 = 0x80;
/// `cls.__new__(cls, *args)` (protocol 2).
pub const NEWOBJ: u8 = 0x81;
/// Extension registry code, 1 byte (protocol 2).
pub const EXT1: u8 = 0x82;
/// Extension registry code, 2 bytes (protocol 2).
pub const EXT2: u8 = 0x83;
/// Extension registry code, 4 bytes (protocol 2).
pub const EXT4: u8 = 0x84;
/// Build a 1-tuple from the top of the stack (protocol 2).
pub const TUPLE1: u8 = 0x85;
/// Build a 2-tuple (protocol 2).
pub const TUPLE2: u8 = 0x86;
/// Build a 3-tuple (protocol 2).
pub const TUPLE3: u8 = 0x87;
/// Push `True` (protocol 2).
pub const NEWTRUE: u8 = 0x88;
/// Push `False` (protocol 2).
pub const NEWFALSE: u8 = 0x89;
/// Two's complement little-endian int with a 1-byte length (protocol 2).
pub const LONG1: u8 = 0x8a;
/// Two's complement little-endian int with a 4-byte signed length (protocol 2).
pub const LONG4: u8 = 0x8b;

/// `bytes` with a 4-byte length (protocol 3).
pub const BINBYTES: u8 = b'B';
/// `bytes` with a 1-byte length (protocol 3).
pub const SHORT_BINBYTES: u8 = b'C';

/// UTF-8 string with a 1-byte length (protocol 4).
pub const SHORT_BINUNICODE: u8 = 0x8c;
/// UTF-8 string with an 8-byte length (protocol 4).
pub const BINUNICODE8: u8 = 0x8d;
/// `bytes` with an 8-byte length (protocol 4).
pub const BINBYTES8: u8 = 0x8e;
/// Push an empty set (protocol 4).
pub const EMPTY_SET: u8 = 0x8f;
/// Add the items since the mark to the set below it (protocol 4).
pub const ADDITEMS: u8 = 0x90;
/// Build a frozenset from the items since the mark (protocol 4).
pub const FROZENSET: u8 = 0x91;
/// `cls.__new__(cls, *args, **kwargs)` (protocol 4).
pub const NEWOBJ_EX: u8 = 0x92;
/// Global from the module and name strings on the stack (protocol 4).
pub const STACK_GLOBAL: u8 = 0x93;
/// Memoize the top of the stack at the next free index (protocol 4).
pub const MEMOIZE: u8 = 0x94;
/// Frame header with an 8-byte length (protocol 4).
pub const FRAME: u8 = 0x95;

/// `bytearray` with an 8-byte length (protocol 5).
pub const BYTEARRAY8: u8 = 0x96;
/// Out-of-band buffer (protocol 5).
pub const NEXT_BUFFER: u8 = 0x97;
/// Make the out-of-band buffer on the stack read-only (protocol 5).
pub const READONLY_BUFFER: u8 = 0x98;

/// The name of an opcode as CPython's `pickletools` spells it, or `"UNKNOWN"`.
pub fn name(op: u8) -> &'static str {
    match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        LONG => "LONG",
        BININT2 => "BININT2",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        GET => "GET",
        BINGET => "BINGET",
        INST => "INST",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        OBJ => "OBJ",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        PROTO => "PROTO",
        NEWOBJ => "NEWOBJ",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        NEWOBJ_EX => "NEWOBJ_EX",
        STACK_GLOBAL => "STACK_GLOBAL",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => "UNKNOWN",
    }
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
