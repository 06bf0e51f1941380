//! The few `REDUCE`s that only rebuild plain data (`_codecs.encode` for
//! bytes, `bytearray`, `set`, `frozenset`, `bytes()`), recognized without
//! calling anything: the table is in the crate docs, "Reading". Any other
//! callable, or these with other arguments, stays an inert `Value::Reduce`.

use super::arena::{Arena, Id, Node};

/// What a recognized `REDUCE` evaluates to.
pub(super) enum Builtin {
    Bytes(Vec<u8>),
    ByteArray(Vec<u8>),
    /// Items of a set, before duplicates are removed.
    Set(Vec<Id>),
    /// Items of a frozenset, before duplicates are removed.
    FrozenSet(Vec<Id>),
}

/// The plain value `callable(*args)` denotes, if it is one of the table above.
pub(super) fn recognize(arena: &Arena, callable: Id, args: Id) -> Option<Builtin> {
    let Node::Global(global) = arena.node(callable) else {
        return None;
    };
    let Node::Tuple(args) = arena.node(args) else {
        return None;
    };
    let args: Vec<&Node> = args.iter().map(|&a| arena.node(a)).collect();
    let (module, name) = (global.0.as_str(), global.1.as_str());
    if (module, name) == ("_codecs", "encode") {
        return match args.as_slice() {
            [Node::Str(s), Node::Str(encoding)] => latin1(s, encoding).map(Builtin::Bytes),
            _ => None,
        };
    }
    if module != "__builtin__" && module != "builtins" {
        return None;
    }
    match (name, args.as_slice()) {
        ("bytes", []) => Some(Builtin::Bytes(Vec::new())),
        ("bytearray", []) => Some(Builtin::ByteArray(Vec::new())),
        ("bytearray", [Node::Bytes(b)]) => Some(Builtin::ByteArray(b.clone())),
        ("bytearray", [Node::Str(s), Node::Str(encoding)]) => latin1(s, encoding).map(Builtin::ByteArray),
        ("set", []) => Some(Builtin::Set(Vec::new())),
        ("set", [Node::List(items) | Node::Tuple(items)]) => Some(Builtin::Set(items.clone())),
        ("frozenset", []) => Some(Builtin::FrozenSet(Vec::new())),
        ("frozenset", [Node::List(items) | Node::Tuple(items)]) => Some(Builtin::FrozenSet(items.clone())),
        _ => None,
    }
}

/// `s.encode(encoding)` when `encoding` names latin-1 and every char of `s` is below U+0100.
fn latin1(s: &str, encoding: &str) -> Option<Vec<u8>> {
    let encoding = encoding.to_ascii_lowercase().replace('_', "-");
    if !matches!(encoding.as_str(), "latin1" | "latin-1" | "iso-8859-1" | "iso8859-1" | "l1") {
        return None;
    }
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_encoding() {
        assert_eq!(latin1("a\u{ff}", "latin1"), Some(vec![b'a', 0xff]));
        assert_eq!(latin1("a", "Latin_1"), Some(vec![b'a']));
        assert_eq!(latin1("\u{100}", "latin1"), None);
        assert_eq!(latin1("a", "utf-8"), None);
    }
}
