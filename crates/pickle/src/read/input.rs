//! A bounds-checked cursor over the pickle bytes.

use crate::{PickleError, Result};

/// Reads operands from the input; every read past the end is a
/// [`PickleError::Truncated`] naming what was being read.
pub(super) struct Input<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Input { bytes, pos: 0 }
    }

    /// Offset of the next unread byte.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next byte, or `None` at the end.
    pub(super) fn next_byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// The next `n` bytes.
    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(PickleError::Truncated { offset: self.pos, what });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    pub(super) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(super) fn u16_le(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u32_le(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn i32_le(&mut self, what: &'static str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64_le(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A text operand up to (not including) the next `\n`, which is consumed.
    pub(super) fn line(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let rest = &self.bytes[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(PickleError::Truncated { offset: self.bytes.len(), what }),
        }
    }
}
