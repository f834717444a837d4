//! The HTTP/1 accept loop: a connection cap with a reserve for health probes, header-read and idle timeouts, and
//! a shutdown that never waits for a client that sends nothing.
//!
//! `axum::serve` has none of these, so each connection is served by hyper's own HTTP/1 builder on a task of its
//! own, next to a watchdog that knows whether a request is in progress.
//!
//! # Timeouts
//! * Idle: from accepting the connection, or from answering its last request, until the first byte of the next
//!   request. A kept-alive connection nobody uses is closed after `idle_timeout`.
//! * Header read: from that first byte until the request head is complete. A client sending its head slowly
//!   (slowloris) is cut off after `header_read_timeout`, however steadily it trickles bytes.
//! * While a request is handled, neither runs: the router's request timeout bounds it.
//!
//! * TLS handshake (HTTPS, `Config::tls`): bounded by the header-read timeout too, and abandoned when shutdown
//!   begins, so a client that opens a connection and never completes the handshake holds no slot for long.
//!
//! # Connection cap
//! At most `max_connections` regular connections. When they are all taken, up to `probe_connections` more are
//! accepted as probe slots: one request each, no keep-alive, timeouts cut to [`PROBE_IDLE_TIMEOUT`] and
//! [`PROBE_HEADER_TIMEOUT`], and only `/healthz` and `/readyz` served (anything else gets
//! `503 STORE_UNAVAILABLE`). So a liveness probe still answers while idle clients hold every regular slot: idle
//! connections that landed in probe slots give them back within a quarter second. Beyond that, a new connection
//! is closed as soon as it is accepted, which keeps the process below its open-file limit.
//!
//! Unset, `max_connections` is derived from the soft `RLIMIT_NOFILE` (read from `/proc/self/limits`): three
//! quarters of it minus the probe reserve (twice the reserve with a probe listener), leaving a quarter for Redis
//! connections, the listeners and logs.
//!
//! # Probe listener
//! With `probe_listen` set, a second accept loop of its own serves the probe router (`/healthz`, `/readyz`,
//! `/metrics`) with `probe_connections` slots of its own ([`Limits::probe_listener`]). Probe slots on the main port
//! are taken by whatever connects when the regular slots are full, so a reconnect flood kept them busy and
//! most probes failed (57 to 76 % of them at `ulimit -n 1024`); on their own port the flood never
//! reaches them, and the open-file budget keeps descriptors for them.
//!
//! # Shutdown
//! When told to stop: the listener is closed, connections with no request in progress (idle, or with a half-sent
//! head) are closed at once, the others are answered with `Connection: close`. Whatever is still open after
//! `shutdown_grace` is dropped.

use axum::body::Body;
use axum::http::{Request, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::http::{ApiError, HEALTHZ, READYZ};
use crate::server::tls::CertStore;
use tokio_rustls::TlsAcceptor;

/// Idle timeout of a probe slot: a probe sends its request as soon as it is connected, so a connection that sends
/// nothing for this long is not a probe, and gives its slot back before the next probe comes.
pub const PROBE_IDLE_TIMEOUT: Duration = Duration::from_millis(250);
/// Header-read timeout of a probe slot: a probe's head is a few dozen bytes.
pub const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// `max_connections` when the open-file limit cannot be read.
const FALLBACK_MAX_CONNECTIONS: usize = 768;
/// Pause after an accept error other than a connection reset, so a full fd table is not spun on.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// At most one warning per this period about connections refused at the cap.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// The connection settings of one server, resolved from the [`Config`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub probe_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
}

impl Limits {
    /// The configured limits, deriving `max_connections` from the open-file limit when unset.
    pub fn from_config(config: &Config) -> Limits {
        let max_connections = config
            .max_connections
            .unwrap_or_else(|| derived_max_connections(open_file_limit(), probe_slots(config)));
        Limits {
            max_connections,
            probe_connections: config.probe_connections,
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            shutdown_grace: config.shutdown_grace,
        }
    }

    /// The probe listener's limits: `probe_connections` slots that serve every request they get (the listener's
    /// router has only the probe routes), keep-alive for the scraper, a probe's header-read timeout.
    pub fn probe_listener(config: &Config) -> Limits {
        Limits {
            max_connections: config.probe_connections,
            probe_connections: 0,
            header_read_timeout: config.header_read_timeout.min(PROBE_HEADER_TIMEOUT),
            idle_timeout: config.idle_timeout,
            shutdown_grace: config.shutdown_grace,
        }
    }
}

/// The main listener's probe reserve plus, with a probe listener, its slots: both come out of the same open-file
/// budget.
fn probe_slots(config: &Config) -> usize {
    let listeners = if config.probe_listen.is_some() { 2 } else { 1 };
    config.probe_connections * listeners
}

/// Three quarters of the soft open-file limit minus the probe slots, at least 1.
fn derived_max_connections(soft_limit: Option<u64>, probe_slots: usize) -> usize {
    match soft_limit.and_then(|l| usize::try_from(l).ok()) {
        Some(limit) => (limit / 4 * 3).saturating_sub(probe_slots).max(1),
        None => FALLBACK_MAX_CONNECTIONS,
    }
}

/// The soft `RLIMIT_NOFILE`, from `/proc/self/limits` (Linux); `None` elsewhere or when unlimited.
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limit(&text)
}

fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Accepts and serves connections until `stop` completes, then shuts them down (see the module docs).
pub(crate) async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<Arc<CertStore>>,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    info!(
        addr = %listener.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
        max_connections = limits.max_connections,
        probe_connections = limits.probe_connections,
        header_read_timeout_ms = limits.header_read_timeout.as_millis() as u64,
        idle_timeout_ms = limits.idle_timeout.as_millis() as u64,
        "connection limits"
    );
    let regular = Arc::new(Semaphore::new(limits.max_connections));
    let probes = Arc::new(Semaphore::new(limits.probe_connections));
    let tracker = TaskTracker::new();
    let closing = CancellationToken::new();
    let dropping = CancellationToken::new();
    let mut refused = Refusals::default();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let slot = if let Ok(permit) = regular.clone().try_acquire_owned() {
            Slot::Regular(permit)
        } else if let Ok(permit) = probes.clone().try_acquire_owned() {
            Slot::Probe(permit)
        } else {
            refused.count(limits.max_connections + limits.probe_connections);
            drop(stream);
            continue;
        };
        // Small answers are written whole: Nagle's delay would only add latency.
        if let Err(e) = stream.set_nodelay(true) {
            debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let connection = Connection {
            app: app.clone(),
            limits,
            slot,
            closing: closing.clone(),
            dropping: dropping.clone(),
        };
        let acceptor = tls.as_ref().map(|certs| certs.acceptor());
        tracker.spawn(connection.run(stream, acceptor));
    }
    drop(listener);
    closing.cancel();
    tracker.close();
    if tokio::time::timeout(limits.shutdown_grace, tracker.wait())
        .await
        .is_err()
    {
        warn!(
            open = tracker.len(),
            grace_ms = limits.shutdown_grace.as_millis() as u64,
            "connections still busy after the shutdown grace period; dropping them"
        );
        dropping.cancel();
        tracker.wait().await;
    }
    Ok(())
}

/// Errors of one incoming connection, not of the listener: accept the next one at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Rate-limited warning about connections closed at the cap.
#[derive(Default)]
struct Refusals {
    since_log: u64,
    logged_at: Option<Instant>,
}

impl Refusals {
    fn count(&mut self, limit: usize) {
        self.since_log += 1;
        let now = Instant::now();
        if self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_PERIOD)
        {
            warn!(
                refused = self.since_log,
                limit, "connection limit reached (including the probe reserve): closing new connections"
            );
            self.since_log = 0;
            self.logged_at = Some(now);
        }
    }
}

/// The slot a connection holds until it closes.
enum Slot {
    Regular(#[allow(dead_code)] OwnedSemaphorePermit),
    Probe(#[allow(dead_code)] OwnedSemaphorePermit),
}

/// One accepted connection and what it needs to serve itself.
struct Connection {
    app: Router,
    limits: Limits,
    slot: Slot,
    /// Shutdown began: close when no request is in progress.
    closing: CancellationToken,
    /// The grace period is over: close now.
    dropping: CancellationToken,
}

impl Connection {
    fn timeouts(&self) -> (Duration, Duration) {
        if matches!(self.slot, Slot::Probe(_)) {
            (
                self.limits.idle_timeout.min(PROBE_IDLE_TIMEOUT),
                self.limits.header_read_timeout.min(PROBE_HEADER_TIMEOUT),
            )
        } else {
            (self.limits.idle_timeout, self.limits.header_read_timeout)
        }
    }

    async fn run(self, stream: TcpStream, tls: Option<TlsAcceptor>) {
        let Some(acceptor) = tls else {
            return self.serve(stream).await;
        };
        // The handshake is part of the request head's clock: a client that opens a connection and never
        // finishes it is cut off like a slow head.
        let (_, header_timeout) = self.timeouts();
        let handshake = tokio::time::timeout(header_timeout, acceptor.accept(stream));
        let stream = tokio::select! {
            result = handshake => match result {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!("TLS handshake timed out");
                    return;
                }
            },
            () = self.closing.cancelled() => return,
        };
        self.serve(stream).await;
    }

    async fn serve<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let probe = matches!(self.slot, Slot::Probe(_));
        let (idle_timeout, header_timeout) = self.timeouts();
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Tracked {
            inner: stream,
            activity: activity.clone(),
        });
        let service = {
            let activity = activity.clone();
            let app = self.app.clone();
            let limit = self.limits.max_connections;
            hyper::service::service_fn(move |req: Request<Incoming>| {
                let request = activity.begin_request();
                let app = app.clone();
                async move {
                    let response = if probe && !is_probe_path(req.uri().path()) {
                        axum::response::IntoResponse::into_response(ApiError::at_connection_limit(limit))
                    } else {
                        app.oneshot(req.map(Body::new)).await?
                    };
                    drop(request);
                    Ok::<Response<Body>, Infallible>(response)
                }
            })
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.keep_alive(!probe);
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        let mut draining = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = activity.expired(idle_timeout, header_timeout) => {
                    debug!("closing a connection that sat idle or sent its request head too slowly");
                    return;
                }
                () = self.closing.cancelled(), if !draining => {
                    if !activity.in_request() {
                        // Idle or a half-sent head: no request was accepted, so nothing is lost.
                        return;
                    }
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = self.dropping.cancelled() => return,
            }
        }
    }
}

fn is_probe_path(path: &str) -> bool {
    path == HEALTHZ || path == READYZ
}

/// What one connection is doing, shared by its I/O wrapper, its service and its watchdog.
struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
}

struct ActivityState {
    /// A request is being handled (from its complete head until its answer is ready).
    in_request: bool,
    /// Start of the idle period: accepted, or last answer ready.
    idle_since: Instant,
    /// First byte of the next request head, when one arrived.
    head_started: Option<Instant>,
}

/// Marks the request in progress; dropped when its answer is ready (or its handler is cancelled).
struct InRequest {
    activity: Arc<Activity>,
}

impl Drop for InRequest {
    fn drop(&mut self) {
        let mut state = self.activity.lock();
        state.in_request = false;
        state.idle_since = Instant::now();
        state.head_started = None;
        drop(state);
        self.activity.changed.notify_waiters();
    }
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: Mutex::new(ActivityState {
                in_request: false,
                idle_since: Instant::now(),
                head_started: None,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ActivityState> {
        // The state is three plain fields, valid whatever a panicking holder did.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn begin_request(self: &Arc<Self>) -> InRequest {
        let mut state = self.lock();
        state.in_request = true;
        state.head_started = None;
        drop(state);
        self.changed.notify_waiters();
        InRequest { activity: self.clone() }
    }

    fn in_request(&self) -> bool {
        self.lock().in_request
    }

    /// Bytes arrived: outside a request they start a request head, and its clock.
    fn bytes_read(&self) {
        let mut state = self.lock();
        if state.in_request || state.head_started.is_some() {
            return;
        }
        state.head_started = Some(Instant::now());
        drop(state);
        self.changed.notify_waiters();
    }

    /// Completes when the connection exceeded its idle or header-read timeout.
    async fn expired(&self, idle_timeout: Duration, header_timeout: Duration) {
        loop {
            let changed = self.changed.notified();
            let deadline = {
                let state = self.lock();
                if state.in_request {
                    None
                } else if let Some(started) = state.head_started {
                    Some(started + header_timeout)
                } else {
                    Some(state.idle_since + idle_timeout)
                }
            };
            match deadline {
                None => changed.await,
                Some(deadline) if deadline <= Instant::now() => return,
                Some(deadline) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }
}

/// A stream that reports reads to its connection's [`Activity`].
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_file_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63704                63704                processes \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_file_limit(text), Some(1024));
        assert_eq!(parse_open_file_limit("Max open files  unlimited unlimited files"), None);
        assert_eq!(parse_open_file_limit(""), None);
    }

    #[test]
    fn derived_cap_stays_below_the_open_file_limit() {
        assert_eq!(derived_max_connections(Some(1024), 8), 760);
        assert_eq!(derived_max_connections(Some(4), 8), 1);
        assert_eq!(derived_max_connections(None, 8), FALLBACK_MAX_CONNECTIONS);
    }

    #[test]
    fn the_probe_listener_has_slots_of_its_own_out_of_the_same_budget() {
        let mut config = Config {
            probe_listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            max_connections: Some(100),
            ..Config::default()
        };
        let probes = Limits::probe_listener(&config);
        assert_eq!(probes.max_connections, config.probe_connections);
        assert_eq!(
            probes.probe_connections, 0,
            "no second-class slots: every slot serves the probe routes"
        );
        assert!(probes.header_read_timeout <= PROBE_HEADER_TIMEOUT);
        assert_eq!(
            Limits::from_config(&config).max_connections,
            100,
            "an explicit cap is kept"
        );
        // Derived at 1024 open files: 768 for both listeners' slots, a quarter left for Redis and the rest.
        assert_eq!(derived_max_connections(Some(1024), probe_slots(&config)), 752);
        config.probe_listen = None;
        assert_eq!(derived_max_connections(Some(1024), probe_slots(&config)), 760);
    }
}
