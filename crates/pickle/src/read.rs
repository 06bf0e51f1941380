//! The reader: a pickle machine that records instead of executing (semantics in the crate docs, "Reading").

mod arena;
mod builtins;
mod convert;
mod input;
mod keys;
mod text;
mod vm;

use crate::{Limits, PickleError, ReadProblem, Result, Value};

/// Decodes `bytes`, which must be exactly one pickle (ending with `STOP`, nothing after it).
///
/// Nothing in the pickle is executed or imported; see [Reading](crate#reading)
/// for how calls, globals and builds are represented.
///
/// # Errors
///
/// [`PickleError::Truncated`] if the input ends early,
/// [`PickleError::UnknownOpcode`], [`PickleError::Invalid`] for malformed
/// pickles and trailing bytes, [`PickleError::Limit`] when `limits` are exceeded.
pub fn from_slice(bytes: &[u8], limits: &Limits) -> Result<Value> {
    if bytes.len() as u64 > limits.max_input_bytes {
        return Err(PickleError::Limit {
            offset: 0,
            limit: "max_input_bytes",
            max: limits.max_input_bytes,
            needed: bytes.len() as u64,
        });
    }
    let (value, consumed) = from_slice_prefix(bytes, limits)?;
    if consumed != bytes.len() {
        return Err(PickleError::Invalid {
            offset: consumed,
            opcode: "STOP",
            problem: ReadProblem::TrailingBytes(bytes.len() - consumed),
        });
    }
    Ok(value)
}

/// Decodes the one pickle at the start of `bytes`, returning it and the
/// number of bytes it took (`STOP` included); what follows is not read.
///
/// This reads torch's legacy (pre-1.6) format, several pickles back to
/// back followed by raw storage bytes. `limits.max_input_bytes` bounds the
/// bytes consumed, not `bytes.len()`.
///
/// # Errors
///
/// As [`from_slice`], except that trailing bytes are not an error.
pub fn from_slice_prefix(bytes: &[u8], limits: &Limits) -> Result<(Value, usize)> {
    let limits = &limits.scaled_to(bytes.len());
    let done = vm::run(bytes, limits)?;
    let consumed = done.consumed;
    let value = convert::to_value(done.arena, done.root, limits, done.stop_offset)?;
    Ok((value, consumed))
}
