//! Atomic writes: a temporary file beside the target, renamed over it only
//! once complete, so a failed write never leaves a half-written file.

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{io_err, Result};

/// Writes `path` through `fill`, which receives a buffered writer over a
/// temporary file in the same directory. On success the file is synced
/// (unless `fsync` is false) and renamed over `path`; on any error the
/// temporary file is removed and `path` is untouched.
///
/// Without the fsync the write is still atomic for every reader while the
/// machine runs (the name points at the old file or at the whole new one),
/// but a power loss or kernel crash soon after may leave the new name with
/// missing data on filesystems that do not order the rename after the data.
pub(crate) fn write_atomically<T>(
    path: &Path,
    fsync: bool,
    fill: impl FnOnce(&mut BufWriter<std::fs::File>) -> Result<T>,
) -> Result<T> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new().prefix(".pmstate-").suffix(".tmp").tempfile_in(dir).map_err(io_err(path))?;
    let (file, tmp_path) = tmp.into_parts();
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let out = fill(&mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error()).map_err(io_err(path))?;
    if fsync {
        file.sync_all().map_err(io_err(path))?;
    }
    drop(file);
    tmp_path.persist(path).map_err(|e| e.error).map_err(io_err(path))?;
    Ok(out)
}

/// A writer that reports how many bytes went through it.
pub(crate) struct Counting<'a, W: Write> {
    pub inner: W,
    pub written: u64,
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        if let Some(p) = self.progress {
            p(self.written);
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
