//! Unix signals for a server run from the command line: SIGINT and
//! SIGTERM drain and stop it, SIGHUP reloads the checkpoint.

use crate::server::ServerHandle;

/// Handles signals for `handle` until the server stops; returns the
/// number of the signal that stopped it (None if stopped otherwise).
#[cfg(unix)]
pub async fn handle_signals(handle: ServerHandle) -> std::io::Result<Option<i32>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = int.recv() => { handle.shutdown(); return Ok(Some(2)); }
            _ = term.recv() => { handle.shutdown(); return Ok(Some(15)); }
            _ = hup.recv() => handle.reload(),
        }
    }
}

/// Handles Ctrl-C for `handle` (no SIGHUP off Unix).
#[cfg(not(unix))]
pub async fn handle_signals(handle: ServerHandle) -> std::io::Result<Option<i32>> {
    tokio::signal::ctrl_c().await?;
    handle.shutdown();
    Ok(Some(2))
}
