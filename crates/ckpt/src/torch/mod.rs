//! torch.save files: reading the zip archive and the legacy stream,
//! interpreting their pickles, writing the zip layout, and torch's
//! allowlist of safe globals.

mod allowlist;
mod interpret;
mod read;
mod write;

pub(crate) use allowlist::{globals_outside, unsafe_globals};
pub use allowlist::{is_config_global, is_safe_global};
pub(crate) use read::{is_legacy, read_legacy, read_zip};
pub use write::save_torch;
