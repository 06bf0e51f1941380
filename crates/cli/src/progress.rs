//! Progress bars for long work, on stderr, only for large inputs and never
//! with `--quiet` or `--json`.

use std::cell::OnceCell;
use std::path::Path;

use pmstate_ckpt::{Checkpoint, ReadOptions};

/// Files at least this large get a progress bar.
const PROGRESS_THRESHOLD: u64 = 64 << 20;

/// A byte-count progress bar, or nothing.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    /// A bar over `total` bytes labelled `what`, when it is worth showing.
    pub fn new(total: u64, what: &str, g: crate::Global) -> Self {
        if total < PROGRESS_THRESHOLD || g.quiet || g.json {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_owned());
        Progress(Some(bar))
    }

    /// Moves the bar to `done` bytes.
    pub fn update(&self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

/// Opens a checkpoint with a bar over the inflating of its compressed
/// records, the one part of opening that reads a whole large file (stored
/// records and safetensors data are mapped): `inspect` and `diff` of a
/// large deflated archive show where they are.
pub fn open_checkpoint(path: &Path, g: crate::Global) -> Result<Checkpoint, pmstate_ckpt::CkptError> {
    let bar: OnceCell<Progress> = OnceCell::new();
    let name = format!(
        "reading {}",
        path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
    );
    let ckpt = Checkpoint::open_with_progress(path, &ReadOptions::default(), &|done, total| {
        bar.get_or_init(|| Progress::new(total, &name, g)).update(done)
    });
    if let Some(b) = bar.get() {
        b.finish();
    }
    ckpt
}
