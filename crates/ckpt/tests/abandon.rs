//! `abandon_temporary_files`, what the CLI's signal handler calls before it
//! exits: it removes the temporary file of a write in flight (that write
//! then fails, leaving nothing) and refuses every later one before it
//! creates a file, so none can appear between the cleanup and the exit.
//! A test binary of its own: abandoning is for the rest of the process.

use pmstate_ckpt::{abandon_temporary_files, CkptError};

mod common;
use common::{names, save_calling_mid_write, small};

#[test]
fn abandoning_removes_writes_in_flight_and_refuses_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small();
    for name in ["in_flight.safetensors", "in_flight.pt"] {
        // Abandoned from inside the write (as a signal landing mid-write):
        // its temporary file goes, the write fails, nothing is left. The
        // first call removes one file; every later write is refused before
        // its file exists, so there is nothing left to remove.
        let (outcome, removed) = save_calling_mid_write(&ckpt, &dir.path().join(name), abandon_temporary_files);
        match name {
            "in_flight.safetensors" => {
                assert!(outcome.is_err(), "a write whose temporary file was removed cannot succeed");
                assert_eq!(removed, Some(1), "its temporary file was registered");
            }
            _ => {
                let err = outcome.unwrap_err();
                assert!(
                    matches!(&err, CkptError::Io { source, .. } if source.kind() == std::io::ErrorKind::Interrupted),
                    "{err}"
                );
                assert_eq!(removed, None, "refused before it wrote anything");
            }
        }
        assert_eq!(names(dir.path()), Vec::<String>::new(), "{name}: something was left");
    }
    let err = ckpt.save(dir.path().join("later.pt")).unwrap_err();
    assert!(matches!(&err, CkptError::Io { source, .. } if source.kind() == std::io::ErrorKind::Interrupted), "{err}");
    assert!(err.to_string().contains("interrupted: exiting on a signal"), "{err}");
    assert!(names(dir.path()).is_empty());
}
