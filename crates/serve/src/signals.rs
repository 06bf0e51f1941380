//! Unix signals for a server run from the command line: SIGINT and
//! SIGTERM drain and stop it, SIGHUP reloads the checkpoint.
//!
//! The handlers are installed ([`Signals::install`]) before the server
//! starts and says where it listens: a supervisor that sends SIGTERM as
//! soon as it reads the address must get a drain, not the default action;
//! and one that sends it while the model is still loading gets a prompt
//! exit ([`Signals::stopping`]), whatever the load is doing.

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

    /// Acts on signals for `handle` until one stops the server; returns
    /// its number (2 SIGINT, 15 SIGTERM).
    #[cfg(unix)]
    pub async fn serve(mut self, handle: ServerHandle) -> Option<i32> {
        loop {
            tokio::select! {
                _ = self.int.recv() => { handle.shutdown(); return Some(2); }
                _ = self.term.recv() => { handle.shutdown(); return Some(15); }
                _ = self.hup.recv() => handle.reload(),
            }
        }
    }

    /// Acts on Ctrl-C for `handle` (no SIGHUP off Unix).
    #[cfg(not(unix))]
    pub async fn serve(self, handle: ServerHandle) -> Option<i32> {
        tokio::signal::ctrl_c().await.ok()?;
        handle.shutdown();
        Some(2)
    }
}
