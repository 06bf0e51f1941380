//! Copying storage bytes into an output as fast as `cp` copies a file.
//!
//! `cp` calls copy_file_range(2) at equal source and destination offsets,
//! one copy inside the kernel. An export cannot: zip entries are 64-byte
//! aligned and safetensors packs tensors back to back, so the offsets
//! differ within a page. Measured on a 385 MiB checkpoint (warm page cache,
//! ext4, Linux 6.18, 2 cores; median of 10 interleaved runs, the same 111
//! ranges each way): `cp` 134 ms; populate a mapping 4 MiB at a time, then
//! write(2): 141 ms; pread(2) into a 4 MiB buffer, then write: 150 ms
//! (256 KiB: 177 ms); copy_file_range or sendfile at the unequal offsets:
//! 190 ms; write(2) from a mapping faulted in page by page: 280 ms and more.
//! This crate reads its input with positioned reads only (see
//! `io::source`: a mapping turns a concurrent truncation into SIGBUS), so
//! the copy is pread into one reused 4 MiB buffer, then a write that passes
//! straight through the caller's (smaller) write buffer.

use std::io::{self, Write};

use crate::error::CkptError;
use crate::io::storage::Bytes;

/// Bytes read per write: large enough that the per-call cost vanishes,
/// small enough that the chunk stays cached between the read and the write.
pub(crate) const CHUNK: usize = 4 << 20;

/// Why a copy stopped.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// Reading the input failed (or it changed under us).
    Read(CkptError),
    /// Writing the output failed.
    Write(io::Error),
}

/// Writes `len` bytes of `data` from `offset` to `w`, a chunk at a time
/// through `buf`, reporting each chunk to `advance`.
pub(crate) fn copy_bytes(
    data: &Bytes,
    offset: usize,
    len: usize,
    w: &mut dyn Write,
    buf: &mut Vec<u8>,
    advance: &mut dyn FnMut(usize),
) -> Result<(), CopyError> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK);
        match data.file_range(offset + done) {
            Some((file, at)) => {
                buf.resize(n, 0);
                crate::io::source::read_exact_at(file, at, &mut buf[..n]).map_err(|e| {
                    CopyError::Read(match (e.kind(), data.source()) {
                        (io::ErrorKind::UnexpectedEof, Some(src)) => src.changed_error(),
                        _ => CkptError::Io { path: "<input>".into(), source: e },
                    })
                })?;
                w.write_all(&buf[..n]).map_err(CopyError::Write)?;
            }
            None => {
                let part = data.read_range(offset + done, n).map_err(CopyError::Read)?;
                w.write_all(&part).map_err(CopyError::Write)?;
            }
        }
        done += n;
        advance(n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::io::source::Source;

    fn patterned(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    /// A slice starting and ending off chunk boundaries is copied exactly,
    /// from a file and from memory, and every byte is reported once.
    #[test]
    fn copies_exactly_the_slice_from_a_file_and_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let len = 2 * CHUNK + 12_345;
        let data = patterned(len);
        let path = dir.path().join("src.bin");
        std::fs::write(&path, &data).unwrap();
        let src = Arc::new(Source::open(&path).unwrap());
        let (from, to) = (777, len - 4_099);
        for bytes in [Bytes::range(&src, 0, len), Bytes::owned(data.clone())] {
            let mut out = b"header".to_vec();
            let mut reported = 0;
            copy_bytes(&bytes, from, to - from, &mut out, &mut Vec::new(), &mut |k| reported += k).unwrap();
            assert_eq!(reported, to - from);
            assert!(out[..6] == *b"header" && out[6..] == data[from..to], "{bytes:?}: bytes differ");
        }
    }

    /// A file that shrinks under the copy is "input changed", never garbage.
    #[test]
    fn a_file_that_shrank_is_input_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("src.bin");
        std::fs::write(&path, patterned(CHUNK + 10)).unwrap();
        let src = Arc::new(Source::open(&path).unwrap());
        let bytes = Bytes::range(&src, 0, CHUNK + 10);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
        let err = copy_bytes(&bytes, 0, CHUNK + 10, &mut Vec::new(), &mut Vec::new(), &mut |_| {}).unwrap_err();
        assert!(matches!(err, CopyError::Read(CkptError::InputChanged { .. })), "{err:?}");
    }
}
