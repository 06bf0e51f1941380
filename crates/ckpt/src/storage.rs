//! Storage bytes: mapped from the file where the entry is stored, owned otherwise.

use std::fs::File;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

use crate::dtype::DType;

/// A whole input file: mapped, or held in memory ([`crate::Checkpoint::from_bytes`]).
pub(crate) enum Backing {
    /// The map and the file it maps (kept for file-to-file copies).
    Map(Mmap, File),
    Mem(Vec<u8>),
}

impl Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(m, _) => m,
            Backing::Mem(v) => v,
        }
    }
}

/// The bytes of one storage, cheap to clone. Mapped bytes are read lazily
/// by the OS: opening a checkpoint reads no tensor data.
#[derive(Clone)]
pub struct Bytes(Repr);

#[derive(Clone)]
enum Repr {
    /// A range of the input (mapped file or in-memory buffer), shared.
    Mapped {
        map: Arc<Backing>,
        start: usize,
        len: usize,
    },
    Owned(Arc<[u8]>),
}

impl Bytes {
    /// Bytes owned in memory.
    pub fn owned(v: Vec<u8>) -> Self {
        Bytes(Repr::Owned(v.into()))
    }

    /// A range of the input. Panics if the range is outside it (callers check first).
    pub(crate) fn mapped(map: &Arc<Backing>, start: usize, len: usize) -> Self {
        assert!(start.checked_add(len).is_some_and(|end| end <= map.len()), "mapped range outside the file");
        Bytes(Repr::Mapped { map: map.clone(), start, len })
    }

    /// Whether the bytes come from a file mapping (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(&self.0, Repr::Mapped { map, .. } if matches!(**map, Backing::Map(..)))
    }

    /// Where `part` (a slice of these bytes) lies in the mapped file: the
    /// file and the offset of `part`'s first byte. `None` for bytes not
    /// mapped from a file, or a `part` that is not inside these bytes.
    pub(crate) fn file_range(&self, part: &[u8]) -> Option<(&File, u64)> {
        let Repr::Mapped { map, start, .. } = &self.0 else { return None };
        let Backing::Map(_, file) = &**map else { return None };
        let whole: &[u8] = self;
        let at = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
        (at.checked_add(part.len())? <= whole.len()).then(|| (file, (start + at) as u64))
    }
}

impl Bytes {
    /// Asks the kernel to map `part` (a slice of these bytes) in now, in one
    /// call, rather than page fault by page fault as it is read
    /// (MADV_POPULATE_READ). Returns whether the kernel did: false for bytes
    /// not mapped from a file, a `part` outside them, kernels before Linux
    /// 5.14 and other systems. Reading works the same either way.
    pub(crate) fn populate(&self, part: &[u8]) -> bool {
        #[cfg(target_os = "linux")]
        if let Repr::Mapped { map, .. } = &self.0 {
            if let Backing::Map(m, _) = &**map {
                let at = (part.as_ptr() as usize).checked_sub(m.as_ptr() as usize);
                if let Some(at) = at.filter(|at| at.checked_add(part.len()).is_some_and(|end| end <= m.len())) {
                    return m.advise_range(memmap2::Advice::PopulateRead, at, part.len()).is_ok();
                }
            }
        }
        let _ = part;
        false
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Mapped { map, start, len } => &map[*start..*start + *len],
            Repr::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes{})", self.len(), if self.is_mapped() { ", mapped" } else { "" })
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
