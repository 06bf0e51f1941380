//! Writing a large storage that is a range of a mapped input file to the
//! output as fast as `cp` copies a file.
//!
//! `cp` calls copy_file_range(2) at equal source and destination offsets,
//! one copy inside the kernel. An export cannot: zip entries are 64-byte
//! aligned and safetensors packs tensors back to back, so the offsets
//! differ within a page. Measured on a 385 MiB checkpoint (warm page cache,
//! ext4, Linux 6.18, 2 cores; median of 10 interleaved runs, the same 111
//! ranges each way): `cp` 134 ms; populate 4 MiB of the mapping at a time
//! with MADV_POPULATE_READ, then write(2) it: 141 ms; pread(2) into a 4 MiB
//! buffer, then write: 150 ms (256 KiB: 177 ms); copy_file_range or
//! sendfile at the unequal offsets: 190 ms; write(2) from the mapping with
//! the pages faulted in as the kernel reads them: 280 ms and more.
//! Population is the first choice; pread is the fallback where the kernel
//! lacks it (before Linux 5.14, or not Linux).

use std::fs::File;
use std::io::{self, Write};

use crate::storage::Bytes;

/// Storages at least this large take the bulk path; smaller ones go through
/// the caller's write buffer, where their page faults do not matter.
pub(crate) const BULK_MIN: usize = 1 << 20;

/// Bytes populated, or read, per write: large enough that the per-call
/// cost vanishes, small enough that the chunk stays cached between the
/// population (or read) and the write.
const CHUNK: usize = 4 << 20;

/// How a bulk copy reads its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Populate the mapping a chunk at a time, write from it.
    Populate,
    /// Positioned reads from the mapped file into a buffer.
    Pread,
}

/// Writes `part` (a slice of `origin`) to `dst` at its current position
/// when it is large and mapped from a file, reporting each piece to
/// `advance`; `strategy` is chosen here when `None` (population where the
/// kernel has it). Returns the bytes written: 0 when `part` is small or held
/// in memory, fewer than `part.len()` only if the input file shrank under
/// the mapping; the caller writes the rest.
pub(crate) fn copy_mapped(
    strategy: Option<Strategy>,
    part: &[u8],
    origin: &Bytes,
    dst: &mut File,
    buf: &mut Vec<u8>,
    advance: &mut dyn FnMut(usize),
) -> io::Result<usize> {
    if part.len() < BULK_MIN || !origin.is_mapped() {
        return Ok(0);
    }
    let strategy = strategy.unwrap_or_else(|| {
        if origin.populate(&part[..CHUNK.min(part.len())]) {
            Strategy::Populate
        } else {
            Strategy::Pread
        }
    });
    match strategy {
        Strategy::Populate => {
            for chunk in part.chunks(CHUNK) {
                origin.populate(chunk); // only a hint: the write faults in whatever it skipped
                dst.write_all(chunk)?;
                advance(chunk.len());
            }
            Ok(part.len())
        }
        Strategy::Pread => match origin.file_range(part) {
            Some((src, offset)) => pread_copy(src, offset, dst, part.len(), buf, advance),
            None => Ok(0),
        },
    }
}

/// Copies `len` bytes of `src` from `offset` to `dst`: positioned reads
/// (its own offsets, not the file's cursor) into `buf`, then writes.
/// Returns the bytes copied, fewer than `len` only if the file ended early
/// (and 0 off Unix, where the caller writes everything from the mapping).
fn pread_copy(
    src: &File,
    offset: u64,
    dst: &mut File,
    len: usize,
    buf: &mut Vec<u8>,
    advance: &mut dyn FnMut(usize),
) -> io::Result<usize> {
    #[cfg(not(unix))]
    {
        let _ = (src, offset, dst, len, buf, advance);
        Ok(0)
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        buf.resize(CHUNK.min(len), 0);
        let mut copied = 0;
        while copied < len {
            let want = (len - copied).min(buf.len());
            let got = match src.read_at(&mut buf[..want], offset + copied as u64) {
                Ok(0) => return Ok(copied),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            dst.write_all(&buf[..got])?;
            copied += got;
            advance(got);
        }
        Ok(copied)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::Checkpoint;

    /// A checkpoint file whose one storage is `len` patterned bytes, opened
    /// (so the storage is a range of the mapping at a 64-byte aligned offset).
    fn mapped_storage(dir: &std::path::Path, len: usize) -> (Checkpoint, Vec<u8>) {
        let data: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let storage = crate::Storage {
            typed: true,
            dtype: crate::DType::U8,
            location: "cpu".into(),
            data: Bytes::owned(data.clone()),
        };
        let t = crate::Node::Tensor(crate::TensorRef {
            storage: "s".into(),
            dtype: crate::DType::U8,
            offset: 0,
            shape: vec![len],
            stride: vec![1],
            requires_grad: false,
            parameter: None,
            object: None,
        });
        let root = crate::Node::Dict(crate::Dict {
            ordered: false,
            entries: vec![(crate::Node::Str("t".into()), t)],
            state: None,
        });
        let path = dir.join("src.pt");
        crate::save_torch(
            &Checkpoint::from_parts(root, [("s".to_owned(), storage)].into()),
            &path,
            &Default::default(),
        )
        .unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.storages.len(), 1);
        (ckpt, data)
    }

    /// Both strategies write exactly the slice asked for (a view starting
    /// and ending off chunk and page boundaries), after what the file
    /// already holds, and report every byte once.
    #[test]
    fn both_strategies_copy_exactly_the_slice() {
        let dir = tempfile::tempdir().unwrap();
        let len = 2 * CHUNK + 12_345;
        let (ckpt, data) = mapped_storage(dir.path(), len);
        let origin = &ckpt.storages.values().next().unwrap().data;
        assert!(origin.is_mapped());
        let (from, to) = (777, len - 4_099);
        for strategy in [Strategy::Populate, Strategy::Pread] {
            let out = dir.path().join(format!("{strategy:?}.bin"));
            let mut dst = File::create(&out).unwrap();
            dst.write_all(b"header").unwrap();
            let mut reported = 0;
            let part = &origin[from..to];
            let n =
                copy_mapped(Some(strategy), part, origin, &mut dst, &mut Vec::new(), &mut |k| reported += k).unwrap();
            drop(dst);
            assert_eq!((n, reported), (to - from, to - from), "{strategy:?}");
            let mut got = Vec::new();
            File::open(&out).unwrap().read_to_end(&mut got).unwrap();
            assert!(got[..6] == *b"header" && got[6..] == data[from..to], "{strategy:?}: bytes differ");
        }
    }

    /// Small slices and bytes held in memory are left to the caller.
    #[test]
    fn small_or_in_memory_bytes_are_not_bulk_copied() {
        let dir = tempfile::tempdir().unwrap();
        let (ckpt, _) = mapped_storage(dir.path(), BULK_MIN + 10);
        let origin = &ckpt.storages.values().next().unwrap().data;
        let mut dst = File::create(dir.path().join("out.bin")).unwrap();
        let mut buf = Vec::new();
        assert_eq!(copy_mapped(None, &origin[..BULK_MIN - 1], origin, &mut dst, &mut buf, &mut |_| {}).unwrap(), 0);
        assert_eq!(copy_mapped(None, origin, origin, &mut dst, &mut buf, &mut |_| {}).unwrap(), BULK_MIN + 10);
        let owned = Bytes::owned(vec![7; BULK_MIN * 2]);
        assert_eq!(copy_mapped(None, &owned, &owned, &mut dst, &mut buf, &mut |_| {}).unwrap(), 0);
        assert_eq!(dst.metadata().unwrap().len(), (BULK_MIN + 10) as u64);
    }
}
