//! What both writers share: what to do with unsafe globals, durability,
//! progress, and the one refusal of unsafe globals.

use crate::checkpoint::Checkpoint;
use crate::error::{CkptError, Result};

/// What a writer does with globals `torch.load(weights_only=True)` rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnsafeGlobals {
    /// Refuse to write ([`CkptError::UnsafeGlobals`]). The default: such a
    /// file only loads with `weights_only=False`, which would run them.
    #[default]
    Refuse,
    /// Write them (`--allow-unsafe-globals`).
    Allow,
}

/// Whether a finished write waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync the output before it is renamed into place: a finished save
    /// survives a power loss. The default.
    #[default]
    Fsync,
    /// Skip the fsync (`--no-fsync`): still atomic while the machine runs,
    /// durable only once the kernel has written it back.
    NoFsync,
}

/// How to write a checkpoint, in either format.
#[derive(Clone, Copy, Default)]
pub struct WriteOptions<'a> {
    /// Unsafe globals: refused (default) or written.
    pub unsafe_globals: UnsafeGlobals,
    /// fsync before the rename (default) or not.
    pub durability: Durability,
    /// Called with the bytes written so far (for progress bars).
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl std::fmt::Debug for WriteOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteOptions")
            .field("unsafe_globals", &self.unsafe_globals)
            .field("durability", &self.durability)
            .field("progress", &self.progress.map(|_| "<callback>"))
            .finish()
    }
}

impl WriteOptions<'_> {
    pub(crate) fn fsync(&self) -> bool {
        self.durability == Durability::Fsync
    }

    /// The one refusal of unsafe globals, for both writers: the globals
    /// found (empty when none), or the error when they are refused.
    pub(crate) fn check_globals(&self, ckpt: &Checkpoint) -> Result<Vec<(String, String)>> {
        let flagged = ckpt.unsafe_globals();
        if let (UnsafeGlobals::Refuse, Some((key, first))) = (self.unsafe_globals, flagged.first()) {
            return Err(CkptError::UnsafeGlobals { count: flagged.len(), first: first.clone(), key: key.clone() });
        }
        Ok(flagged)
    }
}
