//! Running a server from a synchronous program (the `pmstate` CLI): a
//! tokio runtime of its own, the server started on it, Unix signals
//! handled (SIGINT/SIGTERM drain and stop, SIGHUP reloads), and the call
//! returns once everything has stopped. The CLI thus needs no async code
//! and no tokio dependency of its own.

use crate::error::StartError;
use crate::events::EventSink;
use crate::options::ServeOptions;
use crate::server::Server;
use crate::signals::Signals;

/// How a server run from [`serve_until_signalled`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The signal that stopped it (2 SIGINT, 15 SIGTERM), if one did.
    pub signal: Option<i32>,
    /// The second signal, when one came while the drain waited and
    /// stopped the server without waiting (requests in flight dropped).
    pub forced_by: Option<i32>,
}

/// Starts a server with `opts` and serves until SIGINT or SIGTERM has
/// drained it. `tokio_threads` sizes the runtime that answers HTTP (the
/// forward runs on its own pool, [`ServeOptions::threads`]); None: tokio's
/// default, one per core.
pub fn serve_until_signalled(
    opts: ServeOptions,
    events: EventSink,
    tokio_threads: Option<usize>,
) -> Result<Stopped, StartError> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all().thread_name("pmstate-http");
    if let Some(n) = tokio_threads {
        b.worker_threads(n.max(1));
    }
    let rt = b.build().map_err(StartError::Runtime)?;
    let result = rt.block_on(async move {
        let mut signals = Signals::install().map_err(StartError::Runtime)?;
        // a signal during start-up stops at once: the load is left behind
        let server = tokio::select! {
            started = Server::start(opts, events) => started?,
            signal = signals.stopping() => return Ok(Stopped { signal: Some(signal), forced_by: None }),
        };
        let log = std::sync::Arc::new(crate::signals::SignalLog::default());
        let signals = tokio::spawn(signals.serve(server.handle(), log.clone()));
        server.wait().await.map_err(StartError::Runtime)?;
        // the server stopped: by signals (recorded in the log) or otherwise
        signals.abort();
        Ok(Stopped { signal: log.first(), forced_by: log.second() })
    });
    // a load abandoned by a signal at start-up may still run on a blocking
    // thread: dropping the runtime would wait for it, this does not
    rt.shutdown_timeout(SHUTDOWN_WAIT);
    result
}

/// How long the runtime's blocking threads get to finish once the server
/// has stopped (only an abandoned start-up load can still be running).
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
