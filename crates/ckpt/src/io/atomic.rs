//! Atomic writes that behave like files: a temporary file beside the
//! target, renamed over it only once complete, so a failed write never
//! leaves a half-written file; with the permissions `cp` or `torch.save`
//! would give the result; and no temporary file left behind by an error or
//! (through [`abandon_temporary_files`], which the CLI calls from its signal
//! handler) by SIGINT/SIGTERM.
//!
//! Temporary files are named `.pmstate-<pid>-<random>.tmp`, so one left by a
//! killed process (SIGKILL, power loss) can be told from one being written:
//! [`stale_temporary_files`] lists those whose process is gone.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{io_err, CkptError, Result};

/// Temporary files being written by this process (removed on SIGINT/SIGTERM
/// by the CLI), and whether that removal has happened (the process is
/// exiting: no new temporary file may be created).
struct Live {
    paths: BTreeSet<PathBuf>,
    closed: bool,
}

static LIVE: Mutex<Live> = Mutex::new(Live { paths: BTreeSet::new(), closed: false });

const PREFIX: &str = ".pmstate-";
const SUFFIX: &str = ".tmp";

fn live() -> std::sync::MutexGuard<'static, Live> {
    // A panic while holding the lock leaves the set as it was: still usable.
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn unregister(path: &Path) {
    live().paths.remove(path);
}

/// Removes every temporary file this process is writing (the writes in
/// flight then fail). Returns how many were removed. Writes started later
/// create temporary files as usual; a signal handler about to end the
/// process wants [`abandon_temporary_files`] instead.
pub fn remove_temporary_files() -> usize {
    remove_all(&mut live())
}

/// [`remove_temporary_files`] for a signal handler about to end the
/// process: also refuses every temporary file not yet created (such a
/// write fails as interrupted), so none can appear between this cleanup
/// and the exit. There is no undoing it.
pub fn abandon_temporary_files() -> usize {
    let mut live = live();
    live.closed = true;
    remove_all(&mut live)
}

/// Removed while holding the lock: a write creating its file meanwhile
/// waits, then sees whether the set was closed.
fn remove_all(live: &mut Live) -> usize {
    let paths = std::mem::take(&mut live.paths);
    paths.iter().filter(|p| std::fs::remove_file(p).is_ok()).count()
}

/// pmstate temporary files in `dir` whose writing process no longer runs
/// (killed before it could clean up): safe to delete. On systems without
/// `/proc`, files older than an hour count as stale.
pub fn stale_temporary_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(middle) = name.strip_prefix(PREFIX).and_then(|n| n.strip_suffix(SUFFIX)) else { continue };
        // pmstate only ever leaves regular files; a folder or link with such
        // a name is someone else's (and `clean-tmp --delete` must not touch it).
        if !entry.file_type()?.is_file() {
            continue;
        }
        let pid = middle.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = match pid {
            Some(pid) if Path::new("/proc/self").exists() => {
                pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
            }
            _ => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() < 3600),
        };
        if !alive {
            stale.push(entry.path());
        }
    }
    stale.sort();
    Ok(stale)
}

/// Creates a new temporary file in `dir` with mode `0666 & ~umask` (what
/// `open(O_CREAT)` gives `torch.save` and `cp`), registered for removal on
/// a signal. Created and registered under one lock, so a signal handler's
/// [`remove_temporary_files`] sees it either not yet created (and then
/// refuses its creation) or created and registered (and removes it): there
/// is no moment at which it exists unregistered.
fn create_temporary(dir: &Path, target: &Path) -> Result<(File, PathBuf)> {
    let pid = std::process::id();
    let mut attempt = 0u32;
    loop {
        let tag = fastrand::u64(..);
        let path = dir.join(format!("{PREFIX}{pid}-{tag:016x}{SUFFIX}"));
        let mut opts = OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o666);
        let mut live = live();
        if live.closed {
            let interrupted = std::io::Error::new(std::io::ErrorKind::Interrupted, "interrupted: exiting on a signal");
            return Err(io_err(target)(interrupted));
        }
        match opts.open(&path) {
            Ok(f) => {
                live.paths.insert(path.clone());
                return Ok((f, path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(io_err(target)(e)),
        }
    }
}

/// Writes `path` through `fill`, which receives a buffered writer over a
/// temporary file in the same directory. On success the file is synced
/// (unless `fsync` is false) and renamed over `path`; on any error the
/// temporary file is removed and `path` is untouched. Replacing an existing
/// file keeps that file's permissions (as writing into it would); a new
/// file gets `0666 & ~umask`.
///
/// Without the fsync the write is still atomic for every reader while the
/// machine runs (the name points at the old file or at the whole new one),
/// but a power loss or kernel crash soon after may leave the new name with
/// missing data on filesystems that do not order the rename after the data.
///
/// A target that is a FIFO or a character device is written as a stream
/// (opened for writing, never unlinked or replaced: `--out /dev/null` run as
/// root must not replace the system's /dev/null) when `stream` says the
/// format can be; otherwise it, a block device or a socket, is refused.
pub(crate) fn write_atomically<T>(
    path: &Path,
    fsync: bool,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<T>,
) -> Result<T> {
    write_atomically_or_stream(path, fsync, Streaming::Allowed, fill)
}

/// Whether a format can be written into a pipe or device (one pass, no seeks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streaming {
    /// One pass: a FIFO or character device is written as a stream.
    Allowed,
    /// The writer seeks (a zip archive): such targets are refused.
    Refused,
}

/// What an existing output path is.
enum Target {
    /// A regular file, or nothing yet: written atomically.
    File,
    /// A FIFO or character device: written in place, as a stream.
    Stream(&'static str),
    /// Something no output may be: a directory, a block device, a socket.
    Refused(&'static str),
}

fn target_kind(path: &Path) -> Target {
    // follows symbolic links: a link to a FIFO is written as the FIFO
    let Ok(meta) = std::fs::metadata(path) else { return Target::File };
    let t = meta.file_type();
    if t.is_dir() {
        return Target::Refused("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Target::Stream("a FIFO");
        }
        if t.is_char_device() {
            return Target::Stream("a character device");
        }
        if t.is_block_device() {
            return Target::Refused("a block device");
        }
        if t.is_socket() {
            return Target::Refused("a socket");
        }
    }
    Target::File
}

/// Opens `path` for a writer that writes as it goes, in one pass (a flight
/// log): what `write_atomically` does with each kind of target, for a
/// file that is written while it grows instead of renamed into place once
/// complete.
///
/// - a regular file (or nothing yet) is created or truncated, mode
///   `0666 & ~umask`;
/// - a FIFO or a character device is opened as it is, never unlinked or
///   replaced. A FIFO is opened without blocking: one that no process has
///   open for reading is an error naming it (the caller is not held in
///   `open` until a reader comes); the file returned blocks on writes, as
///   a pipe does;
/// - a directory, a block device or a socket is [`CkptError::NotAFile`].
///
/// What was opened is checked again on the descriptor (`fstat`), so a FIFO
/// or device renamed over a regular file between the check and the open
/// is still treated as what it is.
pub fn open_stream_output(path: &Path) -> Result<File> {
    let shown = || path.display().to_string();
    if let Target::Refused(kind) = target_kind(path) {
        return Err(CkptError::NotAFile { path: shown(), kind });
    }
    let mut opts = OpenOptions::new();
    // no truncation here: a FIFO or device must be opened as it is (a
    // regular file is truncated once the descriptor says it is one)
    opts.write(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o666).custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| {
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ENXIO) {
            let why = "a FIFO that no process has open for reading (start its reader first)";
            return CkptError::Io { path: shown(), source: std::io::Error::new(e.kind(), why) };
        }
        io_err(path)(e)
    })?;
    let meta = file.metadata().map_err(io_err(path))?;
    let t = meta.file_type();
    if t.is_file() {
        file.set_len(0).map_err(io_err(path))?;
    } else {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if !(t.is_fifo() || t.is_char_device()) {
                let kind = if t.is_block_device() { "a block device" } else { "not a regular file" };
                return Err(CkptError::NotAFile { path: shown(), kind });
            }
        }
        #[cfg(not(unix))]
        return Err(CkptError::NotAFile { path: shown(), kind: "not a regular file" });
    }
    #[cfg(unix)]
    let file = blocking_writes(file).map_err(io_err(path))?;
    Ok(file)
}

/// `file` with `O_NONBLOCK` cleared (it was set to open a FIFO without
/// waiting for a reader), so that writes wait for the reader as a pipe's
/// writes do.
///
/// std has no safe `fcntl`, and this crate forbids unsafe code; a
/// socket's `set_nonblocking` sets or clears the descriptor's `O_NONBLOCK`
/// (`ioctl(FIONBIO)`, or `fcntl` on some systems) whatever file the
/// descriptor is, so the descriptor is carried through `UnixStream` for
/// that one call (never used as a socket) and handed back as a `File`.
#[cfg(unix)]
fn blocking_writes(file: File) -> std::io::Result<File> {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    let carrier = UnixStream::from(OwnedFd::from(file));
    carrier.set_nonblocking(false)?;
    Ok(File::from(OwnedFd::from(carrier)))
}

/// [`write_atomically`], with the format's [`Streaming`] said.
pub(crate) fn write_atomically_or_stream<T>(
    path: &Path,
    fsync: bool,
    streaming: Streaming,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<T>,
) -> Result<T> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (target_kind(path), streaming) {
        (Target::File, _) => {}
        (Target::Refused(kind), _) => return Err(CkptError::NotAFile { path: path.display().to_string(), kind }),
        (Target::Stream(kind), Streaming::Refused) => {
            return Err(CkptError::NotSeekable { path: path.display().to_string(), kind })
        }
        (Target::Stream(_), Streaming::Allowed) => {
            // opened as it is: no create, no truncation, no rename
            let file = OpenOptions::new().write(true).open(path).map_err(io_err(path))?;
            let mut w = BufWriter::with_capacity(1 << 20, file);
            let out = fill(&mut w)?;
            w.into_inner().map_err(|e| e.into_error()).map_err(io_err(path))?;
            return Ok(out);
        }
    }
    let (file, tmp) = create_temporary(dir, path)?;
    let outcome = finish(file, &tmp, path, fsync, fill);
    if outcome.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    unregister(&tmp);
    outcome
}

fn finish<T>(
    file: File,
    tmp: &Path,
    path: &Path,
    fsync: bool,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<T>,
) -> Result<T> {
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let out = fill(&mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error()).map_err(io_err(path))?;
    if let Ok(existing) = std::fs::metadata(path) {
        file.set_permissions(existing.permissions()).map_err(io_err(path))?;
    }
    if fsync {
        file.sync_all().map_err(io_err(path))?;
    }
    drop(file);
    std::fs::rename(tmp, path).map_err(io_err(path))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// A new file gets 0666 & ~umask; replacing a file keeps its mode.
    #[cfg(unix)]
    #[test]
    fn outputs_get_the_permissions_cp_would_give() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("fresh.bin");
        write_atomically(&fresh, false, |w| w.write_all(b"x").map_err(io_err(&fresh))).unwrap();
        // What the kernel gives a new file with mode 0666 here.
        let probe = dir.path().join("probe");
        let mut o = OpenOptions::new();
        std::os::unix::fs::OpenOptionsExt::mode(o.write(true).create_new(true), 0o666);
        drop(o.open(&probe).unwrap());
        assert_eq!(mode(&fresh), mode(&probe));
        assert_ne!(mode(&fresh), 0o600, "not the temporary file's private mode");
        let shared = dir.path().join("shared.bin");
        std::fs::write(&shared, b"old").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&shared, false, |w| w.write_all(b"new").map_err(io_err(&shared))).unwrap();
        assert_eq!(mode(&shared), 0o640);
        assert_eq!(std::fs::read(&shared).unwrap(), b"new");
    }

    /// An error leaves neither the target changed nor a temporary file.
    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t.bin");
        std::fs::write(&target, b"keep").unwrap();
        let err = write_atomically(&target, false, |w| -> Result<()> {
            w.write_all(b"partial").map_err(io_err(&target))?;
            Err(CkptError::InputChanged { path: "in".into() })
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A FIFO is written as a stream (the reader gets the bytes; the FIFO
    /// stays a FIFO), a character device is written into and stays one, and
    /// a format that seeks refuses both; nothing is unlinked or replaced.
    #[cfg(unix)]
    #[test]
    fn fifos_and_devices_are_streamed_into_never_replaced() {
        use std::io::Read;
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("out.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED the FIFO half: mkfifo is not available here");
        } else {
            let reader_path = fifo.clone();
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                File::open(&reader_path).unwrap().read_to_end(&mut got).unwrap();
                got
            });
            let wrote = write_atomically(&fifo, true, |w| w.write_all(b"streamed bytes").map_err(io_err(&fifo)));
            release_reader(&fifo);
            wrote.unwrap();
            assert_eq!(reader.join().unwrap(), b"streamed bytes");
            assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
            let err = write_atomically_or_stream(&fifo, false, Streaming::Refused, |_| Ok(())).unwrap_err();
            assert!(matches!(err, CkptError::NotSeekable { kind: "a FIFO", .. }), "{err}");
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "a temporary file was left");
        }
        // a device node made here (root with CAP_MKNOD), never the machine's own /dev/null
        let null = dir.path().join("null");
        let made = std::process::Command::new("mknod").arg(&null).args(["c", "1", "3"]).output();
        if !made.is_ok_and(|o| o.status.success()) {
            eprintln!("SKIPPED the device half: mknod is not permitted here (needs CAP_MKNOD)");
            return;
        }
        write_atomically(&null, true, |w| w.write_all(b"into the void").map_err(io_err(&null))).unwrap();
        assert!(std::fs::metadata(&null).unwrap().file_type().is_char_device(), "the device was replaced");
    }

    /// [`open_stream_output`]: a regular file truncated; a FIFO with a
    /// reader written as a stream and left a FIFO; a FIFO without one an
    /// error at once (not a caller held in `open`); a directory, a socket
    /// and a block device refused, naming them; nothing replaced.
    #[cfg(unix)]
    #[test]
    fn stream_outputs_open_what_is_there_or_refuse() {
        use std::io::Read;
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let dir = tempfile::tempdir().unwrap();
        let regular = dir.path().join("log.bin");
        std::fs::write(&regular, b"an older, longer log").unwrap();
        open_stream_output(&regular).unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&regular).unwrap(), b"new");
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        let err = open_stream_output(&folder).unwrap_err();
        assert!(matches!(err, CkptError::NotAFile { kind: "a directory", .. }), "{err}");
        assert!(err.to_string().contains(&folder.display().to_string()), "{err}");
        let socket = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let err = open_stream_output(&socket).unwrap_err();
        assert!(matches!(err, CkptError::NotAFile { kind: "a socket", .. }), "{err}");
        assert!(std::fs::metadata(&socket).unwrap().file_type().is_socket(), "the socket was replaced");
        let fifo = dir.path().join("log.fifo");
        if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
            // no reader: an error naming the FIFO, returned at once
            let err = open_stream_output(&fifo).unwrap_err();
            assert!(err.to_string().contains("no process has open for reading"), "{err}");
            assert!(err.to_string().contains(&fifo.display().to_string()), "{err}");
            // a reader (opened without waiting for a writer): the bytes reach it
            let mut reader = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
            let mut w = open_stream_output(&fifo).unwrap();
            // writes wait for the reader (O_NONBLOCK, 0o4000 on Linux, was cleared after the open)
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", w.as_raw_fd())).unwrap();
                let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap().trim();
                let flags = u32::from_str_radix(flags, 8).unwrap();
                assert_eq!(flags & libc::O_NONBLOCK as u32, 0, "the FIFO's writes would not wait: flags {flags:o}");
            }
            w.write_all(b"streamed").unwrap();
            drop(w);
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            assert_eq!(got, b"streamed");
            assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
        } else {
            eprintln!("SKIPPED the FIFO half: mkfifo is not available here");
        }
        // a block device node made here, never opened; its numbers (major 120:
        // local/experimental use) are no driver's, so not even a writer that
        // wrongly opened it could reach a disk
        let block = dir.path().join("block");
        let made = std::process::Command::new("mknod").arg(&block).args(["b", "120", "0"]).output();
        if !made.is_ok_and(|o| o.status.success()) {
            eprintln!("SKIPPED the block-device half: mknod is not permitted here (needs CAP_MKNOD)");
            return;
        }
        let err = open_stream_output(&block).unwrap_err();
        assert!(matches!(err, CkptError::NotAFile { kind: "a block device", .. }), "{err}");
        assert!(std::fs::metadata(&block).unwrap().file_type().is_block_device(), "the device was replaced");
    }

    /// Unblocks a reader still waiting in `open` on `fifo` (the write under
    /// test failed before opening it), so a failure fails the test instead of
    /// hanging it: a non-blocking open for writing succeeds only while a
    /// reader has the FIFO open, and then closes at once.
    #[cfg(unix)]
    fn release_reader(fifo: &Path) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(fifo);
    }

    /// A temporary file whose process is gone is reported as stale. (That
    /// the signal-handler hook removes the files in flight is tested in
    /// `tests/remove_temporary.rs`, a binary of its own: the hook removes
    /// every write in flight in the process, other tests' too.)
    #[test]
    fn stale_temporary_files_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join(format!("{PREFIX}{}-00{SUFFIX}", u32::MAX - 1));
        std::fs::write(&dead, b"left by a killed run").unwrap();
        let mine = dir.path().join(format!("{PREFIX}{}-01{SUFFIX}", std::process::id()));
        std::fs::write(&mine, b"being written").unwrap();
        std::fs::write(dir.path().join("unrelated.tmp"), b"").unwrap();
        std::fs::create_dir(dir.path().join(format!("{PREFIX}{}-02{SUFFIX}", u32::MAX - 1))).unwrap();
        let stale = stale_temporary_files(dir.path()).unwrap();
        if Path::new("/proc/self").exists() {
            assert_eq!(stale, [dead]);
        }
    }
}
