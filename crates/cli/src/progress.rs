//! Progress bars for long work, on stderr, only for large inputs and never
//! with `--quiet` or `--json`.

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
