//! `abandon_temporary_files`, what the CLI's signal handler calls before it
//! exits: it removes the temporary file of a write in flight (that write
//! then fails, leaving nothing) and refuses every later one before it
//! creates a file, so none can appear between the cleanup and the exit.
//! A test binary of its own: abandoning is for the rest of the process.

use std::sync::atomic::{AtomicUsize, Ordering};

use pmstate_ckpt::{abandon_temporary_files, CkptError};
use pmstate_ckpt::{Durability, WriteOptions};

mod common;
use common::{names, small};

#[test]
fn abandoning_removes_writes_in_flight_and_refuses_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small();
    for name in ["in_flight.safetensors", "in_flight.pt"] {
        // Abandoned from inside the write (as a signal landing mid-write):
        // its temporary file goes, the write fails, nothing is left. The
        // first call removes one file; every later write is refused before
        // its file exists, so there is nothing left to remove.
        let removed = AtomicUsize::new(usize::MAX);
        let progress = |_: u64| {
            let _ = removed.compare_exchange(usize::MAX, abandon_temporary_files(), Ordering::SeqCst, Ordering::SeqCst);
        };
        let opts = WriteOptions { progress: Some(&progress), durability: Durability::NoFsync, ..Default::default() };
        let out = dir.path().join(name);
        let outcome = ckpt.save_with(&out, &opts);
        match name {
            "in_flight.safetensors" => {
                assert!(outcome.is_err(), "a write whose temporary file was removed cannot succeed");
                assert_eq!(removed.load(Ordering::SeqCst), 1, "its temporary file was registered");
            }
            _ => {
                let err = outcome.unwrap_err();
                assert!(
                    matches!(&err, CkptError::Io { source, .. } if source.kind() == std::io::ErrorKind::Interrupted),
                    "{err}"
                );
                assert_eq!(removed.load(Ordering::SeqCst), usize::MAX, "refused before it wrote anything");
            }
        }
        assert_eq!(names(dir.path()), Vec::<String>::new(), "{name}: something was left");
    }
    let err = ckpt.save(dir.path().join("later.pt")).unwrap_err();
    assert!(matches!(&err, CkptError::Io { source, .. } if source.kind() == std::io::ErrorKind::Interrupted), "{err}");
    assert!(err.to_string().contains("interrupted: exiting on a signal"), "{err}");
    assert!(names(dir.path()).is_empty());
}
