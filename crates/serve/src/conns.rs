//! Accepting connections and serving each with hyper, within bounds a
//! slow or idle client cannot get around:
//!
//! - hyper is given the runtime's timer, so its header-read timeout applies:
//!   a client that sends its head slowly, or a kept-alive connection that
//!   sends nothing, is closed after [`crate::Limits::header_timeout`];
//! - at most [`crate::Limits::max_connections`] connections are open; at the
//!   cap, or when accepting fails for want of descriptors, the connection
//!   idle the longest (no request being handled) is closed to make room, so
//!   idle clients can never keep a new one out;
//! - a request with a transfer coding hyper does not decode is answered 501
//!   before any route sees it.
//!
//! Written here rather than with `axum::serve`, which has none of these
//! knobs (no timer, no connection cap).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::http::header::CONNECTION;
use axum::http::HeaderValue;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use crate::state::AppState;

/// How long to wait before accepting again when accepting failed and no
/// connection was idle to be closed.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// One open connection.
struct Conn {
    /// Requests being handled on it.
    busy: usize,
    /// Since when none is (or since it was opened).
    idle_since: Instant,
    /// Asked to close (to make room) and not closed yet.
    closing: bool,
    /// Wakes its task to close it.
    close: Arc<Notify>,
}

/// The open connections, by id.
#[derive(Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Conn>,
}

/// The open connections; `changed` ticks whenever one ends or becomes idle.
struct Registry {
    table: Mutex<Table>,
    changed: watch::Sender<()>,
    open: Gauge,
    evicted: Counter,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // the table stays consistent whatever panicked while holding it
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self) -> (u64, Arc<Notify>) {
        let close = Arc::new(Notify::new());
        let mut t = self.lock();
        let id = t.next;
        t.next += 1;
        t.open.insert(id, Conn { busy: 0, idle_since: Instant::now(), closing: false, close: close.clone() });
        self.open.set(t.open.len() as i64);
        (id, close)
    }

    fn remove(&self, id: u64) {
        let mut t = self.lock();
        t.open.remove(&id);
        self.open.set(t.open.len() as i64);
        drop(t);
        self.changed.send_replace(());
    }

    fn is_idle(&self, id: u64) -> bool {
        self.lock().open.get(&id).is_some_and(|c| c.busy == 0)
    }

    fn count(&self) -> usize {
        self.lock().open.len()
    }

    /// Requests being handled, over all connections.
    fn busy(&self) -> usize {
        self.lock().open.values().map(|c| c.busy).sum()
    }

    /// Whether connection `id`, asked to close, should: not when a request
    /// began on it meanwhile (it may be asked again once idle).
    fn should_close(&self, id: u64) -> bool {
        let mut t = self.lock();
        let Some(c) = t.open.get_mut(&id) else { return true };
        c.closing = c.busy == 0;
        c.closing
    }

    /// Asks the connection idle the longest to close, unless one asked
    /// already has not closed yet; whether one is closing.
    fn evict_oldest_idle(&self) -> bool {
        let mut t = self.lock();
        if t.open.values().any(|c| c.closing) {
            return true;
        }
        let oldest = t.open.values_mut().filter(|c| c.busy == 0).min_by_key(|c| c.idle_since);
        match oldest {
            Some(c) => {
                c.closing = true;
                c.close.notify_one();
                self.evicted.inc();
                true
            }
            None => false,
        }
    }
}

/// A request being handled on connection `id`: the connection is not idle
/// until this is dropped.
struct Busy {
    reg: Arc<Registry>,
    id: u64,
}

impl Busy {
    fn enter(reg: &Arc<Registry>, id: u64) -> Busy {
        if let Some(c) = reg.lock().open.get_mut(&id) {
            c.busy += 1;
        }
        Busy { reg: reg.clone(), id }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut t = self.reg.lock();
        if let Some(c) = t.open.get_mut(&self.id) {
            c.busy = c.busy.saturating_sub(1);
            if c.busy == 0 {
                c.idle_since = Instant::now();
            }
        }
        drop(t);
        self.reg.changed.send_replace(());
    }
}

/// Errors of one connection attempt, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// How often a drain says what it still waits for.
const DRAIN_REPORT_EVERY: Duration = Duration::from_secs(5);

/// What a drain waits for: open connections and the requests on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainWait {
    /// Connections still open (idle ones close at once).
    pub connections: usize,
    /// Requests being handled on them.
    pub requests: usize,
}

/// Serves `app` on `listener` until `stop` turns true; then calls
/// `on_drain` with what it waits for, stops accepting, closes the idle
/// connections, lets every other finish the request it is handling
/// (hyper's graceful shutdown), calls `on_drain` again every
/// [`DRAIN_REPORT_EVERY`] while some are open, and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    on_drain: impl Fn(DrainWait),
) -> std::io::Result<()> {
    let limits = state.limits;
    let reg = Arc::new(Registry {
        table: Mutex::new(Table::default()),
        changed: watch::Sender::new(()),
        open: state.metrics.connections.clone(),
        evicted: state.metrics.connections_evicted.clone(),
    });
    let mut changed = reg.changed.subscribe();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let mut tasks = JoinSet::new();
    'accept: loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((tcp, _)) => {
                // room for it: close the connection idle the longest, or wait for one to end
                while reg.count() >= limits.max_connections {
                    reg.evict_oldest_idle();
                    tokio::select! {
                        _ = changed.changed() => {}
                        _ = stop.wait_for(|s| *s) => break 'accept,
                    }
                }
                // answers are one write each: do not hold them back (Nagle)
                let _ = tcp.set_nodelay(true);
                // counted from now, not from when its task first runs
                let (id, close) = reg.add();
                let conn = Connection { reg: reg.clone(), app: app.clone(), state: state.clone(), stop: stop.clone() };
                tasks.spawn(conn.run(tcp, http.clone(), id, close));
            }
            Err(e) if is_connection_error(&e) => {}
            Err(_) => {
                // out of descriptors (or memory): make room, then accept again
                let wait = async {
                    if reg.evict_oldest_idle() {
                        let _ = changed.changed().await;
                    } else {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                };
                tokio::select! {
                    _ = wait => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
    }
    let waiting = || DrainWait { connections: reg.count(), requests: reg.busy() };
    on_drain(waiting());
    drop(listener);
    let mut report = tokio::time::interval_at(tokio::time::Instant::now() + DRAIN_REPORT_EVERY, DRAIN_REPORT_EVERY);
    loop {
        tokio::select! {
            done = tasks.join_next() => if done.is_none() { break },
            _ = report.tick() => on_drain(waiting()),
        }
    }
    Ok(())
}

/// A request body that records whether it was read to its end. An answer
/// given before that (a refusal: 413 for a declared length over the limit,
/// 408, a 404 on a POST) makes hyper close the connection once the answer
/// is written, since the rest of the body would otherwise be read as the
/// next request; the answer must then say `Connection: close` (RFC 9112,
/// 9.6), or a keep-alive client may send its next request on the closing
/// connection and lose it.
struct ReadToEnd {
    inner: Incoming,
    read: Arc<AtomicBool>,
}

impl ReadToEnd {
    /// The request with its body tracked, and the flag that turns true once
    /// the body has been read to its end (at once for a request without one).
    fn track(req: hyper::Request<Incoming>) -> (hyper::Request<ReadToEnd>, Arc<AtomicBool>) {
        let read = Arc::new(AtomicBool::new(req.body().is_end_stream()));
        let flag = read.clone();
        (req.map(|inner| ReadToEnd { inner, read: flag }), read)
    }
}

impl hyper::body::Body for ReadToEnd {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// What one connection's task needs.
struct Connection {
    reg: Arc<Registry>,
    app: Router,
    state: Arc<AppState>,
    stop: watch::Receiver<bool>,
}

impl Connection {
    /// Serves the connection until the client closes it, a timeout closes
    /// it, it is closed to make room (when idle), or the server stops.
    /// `id` is its entry in the registry, `close` what asks it to close.
    async fn run(self, tcp: TcpStream, http: http1::Builder, id: u64, close: Arc<Notify>) {
        let Connection { reg, app, state, mut stop } = self;
        {
            let svc_reg = reg.clone();
            let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let busy = Busy::enter(&svc_reg, id);
                let (app, state) = (app.clone(), state.clone());
                async move {
                    let answer = match crate::routes::unknown_coding(req.headers()) {
                        Some(coding) => crate::routes::refuse_coding(&state, coding),
                        None => {
                            let (req, read) = ReadToEnd::track(req);
                            let mut app = app;
                            // a Router is always ready (its poll_ready returns Ready)
                            let Ok(mut answer) = tower_service::Service::call(&mut app, req).await;
                            if !read.load(Ordering::Relaxed) {
                                answer.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
                            }
                            answer
                        }
                    };
                    // busy until the answer is written (hyper drops its body then)
                    let answer = answer.map(|body| {
                        axum::body::Body::new(body.map_frame(move |frame| {
                            let _busy = &busy;
                            frame
                        }))
                    });
                    Ok::<_, Infallible>(answer)
                }
            });
            let conn = http.serve_connection(TokioIo::new(tcp), svc);
            tokio::pin!(conn);
            let mut draining = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = close.notified() => {
                        if reg.should_close(id) {
                            break;
                        }
                    }
                    _ = stop.wait_for(|s| *s), if !draining => {
                        // no request on it (kept alive, or a head still arriving): nothing to finish
                        if reg.is_idle(id) {
                            break;
                        }
                        conn.as_mut().graceful_shutdown();
                        draining = true;
                    }
                }
            }
            // the connection (and its descriptor) is dropped here, before it is counted out
        }
        reg.remove(id);
    }
}
