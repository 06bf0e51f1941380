//! Storage bytes: a range of the input, read when asked for, or owned.

use std::borrow::Cow;
use std::fs::File;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{CkptError, Result};
use crate::io::source::Source;

/// The bytes of one storage, cheap to clone. Ranges of the input are read
/// only when asked for: opening a checkpoint reads no tensor data.
#[derive(Clone)]
pub struct Bytes(Repr);

#[derive(Clone)]
enum Repr {
    /// A range of the input (a file, or a buffer in memory), shared.
    Range {
        src: Arc<Source>,
        start: u64,
        len: usize,
    },
    Owned(Arc<[u8]>),
}

impl Bytes {
    /// Bytes owned in memory.
    pub fn owned(v: Vec<u8>) -> Self {
        Bytes(Repr::Owned(v.into()))
    }

    /// A range of the input; the caller has checked it lies inside.
    pub(crate) fn range(src: &Arc<Source>, start: u64, len: usize) -> Self {
        debug_assert!(start.checked_add(len as u64).is_some_and(|end| end <= src.len()));
        Bytes(Repr::Range { src: src.clone(), start, len })
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Range { len, .. } => *len,
            Repr::Owned(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes are a range of an input file (read on demand).
    pub fn is_file_backed(&self) -> bool {
        matches!(&self.0, Repr::Range { src, .. } if src.file().is_some())
    }

    /// All the bytes: borrowed when they are in memory, read from the file
    /// otherwise. A file that shrank since it was opened is
    /// [`crate::CkptError::InputChanged`].
    pub fn read(&self) -> Result<Cow<'_, [u8]>> {
        self.read_range(0, self.len())
    }

    /// `len` bytes from `offset` (relative to these bytes). A range that
    /// does not lie inside them (a [`TensorRef`](crate::TensorRef) of
    /// another checkpoint, whose view leaves this storage) is
    /// [`CkptError::StorageRange`], never a panic.
    pub fn read_range(&self, offset: usize, len: usize) -> Result<Cow<'_, [u8]>> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(CkptError::StorageRange { offset, len, size: self.len() });
        }
        match &self.0 {
            Repr::Owned(v) => Ok(Cow::Borrowed(&v[offset..offset + len])),
            Repr::Range { src, start, .. } => match src.as_mem() {
                Some(m) => {
                    let s = *start as usize + offset;
                    Ok(Cow::Borrowed(&m[s..s + len]))
                }
                None => Ok(Cow::Owned(src.read_vec(start + offset as u64, len)?)),
            },
        }
    }

    /// The input file these bytes are a range of, and the file offset of
    /// byte `offset` of them (for copies that read the file directly).
    pub(crate) fn file_range(&self, offset: usize) -> Option<(&File, u64)> {
        match &self.0 {
            Repr::Range { src, start, .. } => src.file().map(|f| (f, start + offset as u64)),
            Repr::Owned(_) => None,
        }
    }

    /// The input these bytes come from, when they are a range of one.
    pub(crate) fn source(&self) -> Option<&Arc<Source>> {
        match &self.0 {
            Repr::Range { src, .. } => Some(src),
            Repr::Owned(_) => None,
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes{})", self.len(), if self.is_file_backed() { ", in the input file" } else { "" })
    }
}

/// One storage: the flat buffer tensors are views of.
#[derive(Debug, Clone)]
pub struct Storage {
    /// Pickled through a typed storage class (`torch.FloatStorage`) rather than `UntypedStorage`.
    pub typed: bool,
    /// Element dtype (typed storages), or the dtype of the first tensor over it.
    pub dtype: DType,
    /// Where torch had it (`cpu`, `cuda:0`); written back as `cpu`.
    pub location: String,
    /// The bytes, little-endian.
    pub data: Bytes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_outside_the_bytes_are_errors_not_panics() {
        let mem = Arc::new(Source::Mem((0u8..32).collect()));
        for (b, first) in [(Bytes::owned((0u8..16).collect()), 0u8), (Bytes::range(&mem, 8, 16), 8)] {
            assert_eq!(&*b.read_range(4, 12).unwrap(), &(first + 4..first + 16).collect::<Vec<u8>>()[..]);
            assert!(b.read_range(16, 0).unwrap().is_empty());
            for (offset, len) in [(0, 17), (16, 1), (17, 0), (usize::MAX, 2)] {
                let e = b.read_range(offset, len).unwrap_err();
                assert!(
                    matches!(e, CkptError::StorageRange { offset: o, len: l, size: 16 } if o == offset && l == len),
                    "{e}"
                );
            }
        }
    }
}
