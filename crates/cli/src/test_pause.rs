//! A pause for tests, and only for tests: with the environment variable
//! `PMSTATE_TEST_PAUSE_FILE=PATH` set, a command stops once at a fixed
//! point of its work, creates `PATH`, and waits until `PATH` is removed
//! (at most a minute) before it goes on. The points: `convert` with its
//! temporary output created and partly written; `inspect` and `diff`
//! between reading the inputs' structure and reading their tensor data.
//!
//! Tests use it to land a signal, or a rewrite of the input, at exactly that
//! point instead of racing the command for it. It is not a user feature
//! (no flag, not in `--help`); unset, it costs one environment lookup.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The variable naming the file to create while paused.
const VAR: &str = "PMSTATE_TEST_PAUSE_FILE";

/// How long a pause lasts at most, if the test never removes the file.
const MAX_PAUSE: Duration = Duration::from_secs(60);

static PAUSED: AtomicBool = AtomicBool::new(false);

/// Pauses here the first time it is reached, when the variable is set.
pub fn point() {
    if PAUSED.swap(true, Ordering::SeqCst) {
        return;
    }
    let Some(path) = std::env::var_os(VAR).map(PathBuf::from) else { return };
    if std::fs::write(&path, std::process::id().to_string()).is_err() {
        return;
    }
    let start = Instant::now();
    while path.exists() && start.elapsed() < MAX_PAUSE {
        std::thread::sleep(Duration::from_millis(5));
    }
}
