//! `remove_temporary_files`, the cleanup hook for writes in flight: it
//! removes their temporary files (those writes then fail, leaving nothing)
//! and, unlike `abandon_temporary_files`, lets later writes go on.
//! A test binary of its own: the hook removes every temporary file the
//! process is writing, so a test beside it writing a file would lose it.

use pmstate_ckpt::remove_temporary_files;

mod common;
use common::{names, save_calling_mid_write, small};

#[test]
fn removing_takes_the_writes_in_flight_and_later_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small();
    for name in ["in_flight.safetensors", "in_flight.pt"] {
        // Removed from inside the write: its temporary file goes, the write
        // fails, nothing is left.
        let (outcome, removed) = save_calling_mid_write(&ckpt, &dir.path().join(name), remove_temporary_files);
        assert!(outcome.is_err(), "{name}: a write whose temporary file was removed cannot succeed");
        assert_eq!(removed, Some(1), "{name}: its temporary file was registered and removed");
        assert_eq!(names(dir.path()), Vec::<String>::new(), "{name}: something was left");
    }
    // nothing in flight: nothing removed, and a later write succeeds
    assert_eq!(remove_temporary_files(), 0);
    ckpt.save(dir.path().join("later.pt")).unwrap();
    assert_eq!(names(dir.path()), ["later.pt"]);
}
