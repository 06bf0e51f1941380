//! [`JsonProblem`]: why tree JSON does not decode (its own module, so
//! the readers in `json` and the error types in `error` stay apart).

/// What is wrong with pmstate's exact tree JSON ([`node_from_json`](crate::node_from_json),
/// [`value_from_json`](crate::value_from_json), and the tree a safetensors
/// file carries in its `__metadata__`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonProblem {
    /// An array where a node goes (arrays only stand inside tagged objects).
    #[error("unexpected bare array")]
    BareArray,
    /// A JSON number that is not an integer (floats are written by their bits).
    #[error("non-integer number {0} (floats are written by their bits)")]
    NotAnInteger(String),
    /// An integer beyond `i64` (larger ones are tagged `bigint`).
    #[error("integer {0} does not fit i64 (big ints are tagged)")]
    IntTooLarge(u64),
    /// An object with neither a `t` tag nor an `f` (float) field.
    #[error("object without a type tag")]
    NoTag,
    /// A tag this reader does not know.
    #[error("unknown {kind} type '{tag}'")]
    UnknownTag {
        /// `node` (a tree node) or `value` (a raw pickle value).
        kind: &'static str,
        /// The tag given (its first 40 characters).
        tag: String,
    },
    /// A field the object's tag requires, absent.
    #[error("{tag} without '{field}'")]
    Missing {
        /// The object's tag.
        tag: String,
        /// The field.
        field: &'static str,
    },
    /// A field of the wrong JSON type.
    #[error("{tag}: '{field}' is not {expected}")]
    WrongType {
        /// The object's tag.
        tag: String,
        /// The field.
        field: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// An item of `items` or `setitems` that is not a `[key, value]` array.
    #[error("an item of a dict or object is not a [key, value] pair")]
    NotAPair,
    /// A float object with fields besides `f`.
    #[error("a float object has one field, 'f'")]
    FloatFields,
    /// Float bits that are not a 64-bit hex number (its first 40 characters).
    #[error("float bits '{0}' are not a 64-bit hex number")]
    FloatBits(String),
    /// Hex with an odd number of digits.
    #[error("hex of odd length {0}")]
    OddHex(usize),
    /// A character that is not a hex digit, at this offset of the hex string.
    #[error("bad hex digit at {0}")]
    HexDigit(usize),
    /// A dict key given twice (a Python dict keeps one).
    #[error("dict key {0} appears twice")]
    DuplicateKey(String),
    /// A dtype name that is no torch dtype pmstate knows (its first 40 characters).
    #[error("torch.{0} is not a torch dtype pmstate knows")]
    UnknownDtype(String),
    /// An object's `construct` that is neither `reduce` nor `newobj`.
    #[error("object construct is not 'reduce' or 'newobj'")]
    Construct,
}
