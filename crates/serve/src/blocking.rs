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
/// drained it. `transport_threads` sizes the runtime that answers HTTP and
/// gRPC (the forward runs on its own pool, [`ServeOptions::threads`]);
/// None: tokio's own `TOKIO_WORKER_THREADS` where it is set to a positive
/// number (as before the default changed), else
/// [`default_transport_threads`].
pub fn serve_until_signalled(
    opts: ServeOptions,
    events: EventSink,
    transport_threads: Option<usize>,
) -> Result<Stopped, StartError> {
    let from_env = || std::env::var("TOKIO_WORKER_THREADS").ok()?.trim().parse::<usize>().ok().filter(|&n| n > 0);
    let workers = transport_threads.or_else(from_env).unwrap_or_else(default_transport_threads);
    let rt = transport_runtime("pmstate-http", workers).map_err(StartError::Runtime)?;
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

/// The transport's default worker threads on this machine:
/// [`transport_threads_for`] its cores.
pub fn default_transport_threads() -> usize {
    transport_threads_for(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The transport's default worker threads on a machine of `cores` cores:
/// one per three cores, at least one. Under load the transport spends about
/// a third of what the forward does per row (25 against 57 µs of CPU at 256
/// streaming clients on 2 cores, docs/serve.md), and the forward's pool has
/// every core. Fewer workers also mean fewer wake-ups between them: on 2
/// cores one worker instead of two took a lone stream's transport from 56
/// to 34 µs of CPU per request and served 16 and 256 clients at the same
/// rows/s or more (docs/serve.md, Speed: gRPC).
pub fn transport_threads_for(cores: usize) -> usize {
    (cores / 3).max(1)
}

/// A multi-threaded tokio runtime of `workers` worker threads (at least
/// one) named `name`, with its I/O and time drivers: the server's
/// transport, or `pmstate bench-serve`'s clients.
pub(crate) fn transport_runtime(name: &str, workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(workers.max(1)).thread_name(name).enable_all().build()
}

/// How long the runtime's blocking threads get to finish once the server
/// has stopped (only an abandoned start-up load can still be running).
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_has_one_worker_per_three_cores_and_at_least_one() {
        let by_cores: Vec<usize> = [1, 2, 3, 4, 6, 16, 64].map(transport_threads_for).to_vec();
        assert_eq!(by_cores, [1, 1, 1, 1, 2, 5, 21]);
        for (asked, got) in [(0, 1), (1, 1), (3, 3)] {
            let rt = transport_runtime("pmstate-test", asked).expect("a runtime");
            assert_eq!(rt.metrics().num_workers(), got, "{asked} asked");
        }
    }
}
