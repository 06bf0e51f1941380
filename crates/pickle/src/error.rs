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
    #[error("invalid pickle at byte {offset} ({opcode}): {reason}")]
    Invalid {
        /// Byte offset of the opcode.
        offset: usize,
        /// Opcode name.
        opcode: &'static str,
        /// What is wrong.
        reason: String,
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
    #[error("cannot pickle {path}: {reason}")]
    Unwritable {
        /// Where in the tree (e.g. `root["model"][3]`).
        path: String,
        /// Why.
        reason: String,
    },
    /// Writing to the output failed.
    #[error("writing pickle: {0}")]
    Io(#[from] std::io::Error),
}

/// Result alias of this crate.
pub type Result<T, E = PickleError> = std::result::Result<T, E>;
