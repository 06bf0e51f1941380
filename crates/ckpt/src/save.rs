//! [`Checkpoint::save`]: writing a checkpoint in the format its file name
//! asks for. Kept apart from `checkpoint` so that the writers depend on the
//! checkpoint and this module on the writers, never the other way.

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::{CkptError, Result};
use crate::parsed::Format;
use crate::safetensors::{save_safetensors, SafetensorsOptions};
use crate::torch::save_torch;
use crate::write_options::WriteOptions;

impl Checkpoint {
    /// Writes the checkpoint, choosing the format by extension
    /// ([`Format::for_path`]), with default options (unsafe globals refused,
    /// fsync before the rename). Atomic.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.save_with(path, &WriteOptions::default())
    }

    /// [`Checkpoint::save`] with explicit options.
    pub fn save_with(&self, path: impl AsRef<Path>, opts: &WriteOptions<'_>) -> Result<()> {
        let path = path.as_ref();
        match Format::for_path(path) {
            Some(Format::Safetensors { .. }) => {
                let st = SafetensorsOptions { write: *opts, select: None };
                save_safetensors(self, path, &st).map(|_| ())
            }
            Some(_) => save_torch(self, path, opts),
            None => Err(CkptError::NotACheckpoint { path: path.display().to_string() }),
        }
    }
}
