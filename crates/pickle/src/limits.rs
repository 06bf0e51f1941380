//! Limits that turn hostile input into errors instead of exhausted memory.

/// Bounds applied while reading a pickle. The defaults admit any real
/// checkpoint's `data.pkl` (ProtoMotions': a few hundred KiB, a few
/// thousand nodes; a resolved-configs file: 45 KiB, about 10,000 nodes)
/// with orders of magnitude to spare, while keeping what a hostile input
/// can claim small: at most 4,194,304 nodes (memo references and DUPs
/// charged at their full expanded size, so a few KB that reference one list
/// a million times are refused), about 1 GiB of decoded tree and checkpoint
/// tree together at the worst, and never more than 4 nodes per input byte
/// beyond the first 65,536.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted input, in bytes.
    pub max_input_bytes: u64,
    /// Deepest nesting of containers / reduce / build nodes in the result
    /// (a scalar has depth 0, a list of scalars 1). Also bounds the number
    /// of open `MARK`s. Keep it in the thousands at most: `Value`'s derived
    /// `Drop`, `Clone`, `PartialEq` and `Debug` recurse once per level.
    pub max_depth: usize,
    /// Most nodes in the decoded tree (memo references count again each
    /// time they are used: this is what stops memo bombs). It is also
    /// checked on every intermediate object as the pickle builds it, so
    /// hostile input fails at the opcode that crosses the limit (such an
    /// object can be up to two nodes larger than its result: `_codecs.encode`'s
    /// three-node argument tuple becomes one bytes node).
    pub max_nodes: u64,
    /// Most nodes per byte of input: the node limit actually applied is
    /// `min(max_nodes, max_nodes_per_input_byte * input_len + 65536)`, so
    /// what a small hostile pickle can make the reader allocate (memo
    /// references cloned into the tree) stays a small multiple of its size.
    /// Real pickles make at most about one node per byte. A pickle the
    /// writer makes from a value can be shorter than the one it was read
    /// from (memoized globals, binary opcodes), so a value read near this
    /// limit may need a larger one to be read back: raise this field, or set
    /// it to `u64::MAX` and bound `max_nodes` directly.
    pub max_nodes_per_input_byte: u64,
    /// Most entries in the memo.
    pub max_memo_entries: u64,
    /// Longest string / bytes / integer literal, in bytes.
    pub max_literal_bytes: u64,
}

impl Limits {
    /// These limits with `max_nodes` lowered to what an input of
    /// `input_len` bytes may claim (see [`Limits::max_nodes_per_input_byte`]).
    pub fn scaled_to(&self, input_len: usize) -> Limits {
        let scaled = self.max_nodes_per_input_byte.saturating_mul(input_len as u64).saturating_add(1 << 16);
        Limits { max_nodes: self.max_nodes.min(scaled), ..*self }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 1 << 30,
            max_depth: 256,
            max_nodes: 1 << 22,
            max_nodes_per_input_byte: 4,
            max_memo_entries: 10_000_000,
            max_literal_bytes: 1 << 30,
        }
    }
}
