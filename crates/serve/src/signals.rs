//! Unix signals for a server run from the command line: SIGINT and
//! SIGTERM drain and stop it (a second one while the drain waits stops at
//! once), SIGHUP reloads the checkpoint.
//!
//! The handlers are installed ([`Signals::install`]) before the server
//! starts and says where it listens: a supervisor that sends SIGTERM as
//! soon as it reads the address must get a drain, not the default action;
//! and one that sends it while the model is still loading gets a prompt
//! exit ([`Signals::stopping`]), whatever the load is doing.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use crate::server::ServerHandle;

/// Installed signal handlers, waiting for a server to act on.
pub struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (on the current tokio runtime).
    #[cfg(unix)]
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Installs the handlers (Ctrl-C only off Unix).
    #[cfg(not(unix))]
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {})
    }

    /// Waits for SIGINT or SIGTERM (a SIGHUP meanwhile is ignored: there is
    /// nothing to reload yet); returns its number. What start-up waits on,
    /// so that a server still loading its model stops at once.
    #[cfg(unix)]
    pub async fn stopping(&mut self) -> i32 {
        loop {
            tokio::select! {
                _ = self.int.recv() => return 2,
                _ = self.term.recv() => return 15,
                _ = self.hup.recv() => {}
            }
        }
    }

    /// Waits for Ctrl-C (off Unix).
    #[cfg(not(unix))]
    pub async fn stopping(&mut self) -> i32 {
        let _ = tokio::signal::ctrl_c().await;
        2
    }

    /// Acts on signals for `handle`: SIGHUP reloads, the first SIGINT or
    /// SIGTERM drains (recorded in `log`), a second one while the drain
    /// waits stops at once ([`ServerHandle::stop_now`]). Returns after the
    /// second; the caller drops it once the server has stopped.
    #[cfg(unix)]
    pub async fn serve(mut self, handle: ServerHandle, log: Arc<SignalLog>) {
        let first = loop {
            tokio::select! {
                _ = self.int.recv() => break 2,
                _ = self.term.recv() => break 15,
                _ = self.hup.recv() => handle.reload(),
            }
        };
        log.first.store(first, Ordering::SeqCst);
        handle.shutdown();
        let second = loop {
            tokio::select! {
                _ = self.int.recv() => break 2,
                _ = self.term.recv() => break 15,
                // nothing to reload while draining
                _ = self.hup.recv() => {}
            }
        };
        log.second.store(second, Ordering::SeqCst);
        handle.stop_now(second);
    }

    /// Acts on Ctrl-C for `handle` (no SIGHUP off Unix): the first drains,
    /// a second stops at once.
    #[cfg(not(unix))]
    pub async fn serve(self, handle: ServerHandle, log: Arc<SignalLog>) {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        log.first.store(2, Ordering::SeqCst);
        handle.shutdown();
        if tokio::signal::ctrl_c().await.is_ok() {
            log.second.store(2, Ordering::SeqCst);
            handle.stop_now(2);
        }
    }
}

/// The signals [`Signals::serve`] acted on (0: none).
#[derive(Debug, Default)]
pub struct SignalLog {
    /// The one that began the drain.
    pub first: AtomicI32,
    /// The one that stopped it without waiting.
    pub second: AtomicI32,
}

impl SignalLog {
    fn get(v: &AtomicI32) -> Option<i32> {
        Some(v.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// The signal that began the drain, if one did.
    pub fn first(&self) -> Option<i32> {
        Self::get(&self.first)
    }

    /// The signal that forced the stop, if one did.
    pub fn second(&self) -> Option<i32> {
        Self::get(&self.second)
    }
}
