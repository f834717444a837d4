//! The coordinator process in one piece: HTTP server, tick loop and their shutdown, embeddable in tests and
//! demos ([`CoordinatorHandle`]) or driven by a shutdown future ([`serve`], as mini-redis's `server::run`).
//!
//! # Shutdown order
//! When the shutdown future completes:
//! 1. the gate begins terminating: `/readyz` answers 503 and new mutations get `503 COORDINATOR_TERMINATING`
//!    (the server keeps accepting, so clients learn to go elsewhere instead of getting connection errors);
//! 2. the tick loop stops scheduling;
//! 3. critical sections already entered finish (their write and mutex release complete);
//! 4. the HTTP server stops accepting, closes idle and half-sent connections at once, and gives open requests
//!    `shutdown_grace` to be answered before it drops what remains (see [`connections`]);
//! 5. then the probe listener, if any, closes the same way: until here `/healthz` answers and `/readyz` says
//!    unready on it.
//!
//! Connection limits and timeouts (cap with a probe reserve, header-read and idle timeouts) and the probe listener
//! (`Config::probe_listen`: `/healthz`, `/readyz` and `/metrics` on a port of their own) are described in
//! [`connections`].
//!
//! With `Config::tls` the API listener serves HTTPS, its certificate reloaded on change and on SIGHUP without a
//! restart, optionally requiring client certificates; the probe listener stays plain HTTP (see [`tls`]).
//!
//! # Example
//! ```no_run
//! # async fn example() -> Result<(), coord_server::Error> {
//! use coord_server::{server::CoordinatorHandle, Config};
//!
//! let mut config = Config::new("redis://127.0.0.1:6379");
//! config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
//! let coordinator = CoordinatorHandle::spawn(config).await?;
//! println!("coordinator at {}", coordinator.url());
//! coordinator.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::{http, tick};

pub mod connections;
pub mod tls;

/// Serves the API on `listener` and runs the tick loop until `shutdown` completes, then shuts down in the order
/// of the module docs.
///
/// The tick loop runs inside this future (not in a task of its own), so dropping the future stops it at once.
///
/// # Errors
/// I/O errors of the server.
///
/// # Cancel safety
/// Dropping the future is an abrupt stop: no new connection is accepted and the tick loop stops, but requests
/// already accepted run on in their own tasks.
pub async fn serve(
    coordinator: Coordinator,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with_probes(coordinator, listener, None, shutdown).await
}

/// [`serve`], plus the probe listener on `probes` when given: `/healthz`, `/readyz` and `/metrics` with
/// connection slots of their own (see [`connections`]). It closes after the API server, so probes see `/readyz`
/// unready and `/healthz` alive for the whole drain.
///
/// # Errors
/// I/O errors of either server.
///
/// # Cancel safety
/// As [`serve`].
pub async fn serve_with_probes(
    coordinator: Coordinator,
    listener: TcpListener,
    probes: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let stop_ticks = CancellationToken::new();
    let ticks_stopped = CancellationToken::new();
    let ticks = {
        let coordinator = coordinator.clone();
        let stop = stop_ticks.clone();
        let stopped = ticks_stopped.clone();
        async move {
            tick::run(coordinator, stop).await;
            stopped.cancel();
        }
    };
    let drained = {
        let gate = coordinator.gate().clone();
        let stop = stop_ticks.clone();
        async move {
            shutdown.await;
            info!("shutting down: refusing new mutations");
            gate.begin();
            stop.cancel();
            ticks_stopped.cancelled().await;
            gate.wait_idle().await;
            info!("critical sections finished; closing the HTTP server");
        }
    };
    let limits = connections::Limits::from_config(coordinator.config());
    let api_stopped = CancellationToken::new();
    let certs = match &coordinator.config().tls {
        Some(files) => Some(Arc::new(
            tls::CertStore::load(files.clone()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        )),
        None => None,
    };
    let rotation = {
        let (certs, interval, stopped) = (
            certs.clone(),
            coordinator.config().tls_reload_interval,
            api_stopped.clone(),
        );
        async move {
            if let Some(certs) = certs {
                certs.watch(interval, stopped).await;
            }
        }
    };
    let probe_server = {
        let (config, stopped) = (coordinator.config(), api_stopped.clone());
        let serve = probes.map(|probes| {
            let (app, limits) = (
                http::probe_router(coordinator.clone()),
                connections::Limits::probe_listener(config),
            );
            connections::serve_connections(probes, app, limits, None, stopped.cancelled_owned())
        });
        async move {
            match serve {
                Some(serve) => serve.await,
                None => Ok(()),
            }
        }
    };
    let app = http::router(coordinator);
    let server = async move {
        let result = connections::serve_connections(listener, app, limits, certs, drained).await;
        // Also when the server fails on its own: the tick loop must not outlive it.
        stop_ticks.cancel();
        api_stopped.cancel();
        result
    };
    let (result, probe_result, (), ()) = tokio::join!(server, probe_server, ticks, rotation);
    result.and(probe_result)
}

/// An in-process coordinator: HTTP server plus tick loop on a task it owns.
///
/// Dropping the handle begins a graceful shutdown in the background; it cannot wait for it, so call
/// [`CoordinatorHandle::shutdown`] to know when it is done.
#[derive(Debug)]
pub struct CoordinatorHandle {
    /// Shared with the handlers; tests read its stats and store through [`CoordinatorHandle::coordinator`].
    coordinator: Coordinator,
    /// The bound address (the real port when the configuration asked for port 0).
    addr: SocketAddr,
    /// The probe listener's bound address, when the configuration has one.
    probe_addr: Option<SocketAddr>,
    /// Completes the shutdown future given to [`serve`].
    shutdown: CancellationToken,
    /// The task running [`serve`]; `None` once taken by `shutdown` or `abort`.
    task: Option<JoinHandle<io::Result<()>>>,
}

impl CoordinatorHandle {
    /// Connects to Redis (checking its version and commands), binds `config.listen` and starts serving.
    ///
    /// # Errors
    /// Those of [`Coordinator::connect`]; a listen address that cannot be bound is reported as
    /// [`Error::Listen`] naming the address.
    pub async fn spawn(config: Config) -> Result<CoordinatorHandle, Error> {
        let listen = config.listen;
        if let Some(files) = &config.tls {
            // Before Redis and the port: a bad certificate is a configuration error, reported as one.
            tls::check(files).map_err(Error::Tls)?;
        }
        let coordinator = Coordinator::connect(config).await?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| Error::Listen { addr: listen, source })?;
        let addr = bound_addr(&listener, listen)?;
        let (probes, probe_addr) = match coordinator.config().probe_listen {
            Some(at) => {
                let probes = TcpListener::bind(at)
                    .await
                    .map_err(|source| Error::Listen { addr: at, source })?;
                let bound = bound_addr(&probes, at)?;
                (Some(probes), Some(bound))
            }
            None => (None, None),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve_with_probes(
            coordinator.clone(),
            listener,
            probes,
            shutdown.clone().cancelled_owned(),
        ));
        info!(%addr, "coordinator listening");
        if let Some(addr) = probe_addr {
            info!(%addr, "probe listener");
        }
        Ok(CoordinatorHandle {
            coordinator,
            addr,
            probe_addr,
            shutdown,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The probe listener's bound address, when the configuration asked for one (`Config::probe_listen`).
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probe_addr
    }

    /// The base URL, `http://<addr>`, or `https://<addr>` when the configuration has TLS.
    pub fn url(&self) -> String {
        let scheme = if self.coordinator.config().tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The coordinator behind the server.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Shuts down gracefully (see the module docs) and waits until the server has stopped.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => info!(addr = %self.addr, "coordinator stopped"),
                Ok(Err(e)) => warn!(addr = %self.addr, error = %e, "coordinator server failed"),
                Err(e) => warn!(addr = %self.addr, error = %e, "coordinator task failed"),
            }
        }
    }

    /// Enters terminating mode only: `/readyz` turns unready and new mutations are refused, while the server keeps
    /// answering. For observing the terminating state; [`CoordinatorHandle::shutdown`] completes it.
    pub fn begin_shutdown(&self) {
        self.coordinator.gate().begin();
    }

    /// Stops at once, like a crash: the server and the tick loop are aborted, nothing is waited for and nothing is
    /// cleaned up in Redis (a mutex held by a tick stays until its TTL).
    ///
    /// Each connection is served on a task of its own, which aborting cannot reach; the gate is closed so a
    /// kept-alive connection to this instance gets `COORDINATOR_TERMINATING` instead of a live coordinator.
    pub fn abort(mut self) {
        self.coordinator.gate().begin();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The address `listener` is bound to (`requested` names it in the error).
fn bound_addr(listener: &TcpListener, requested: SocketAddr) -> Result<SocketAddr, Error> {
    listener
        .local_addr()
        .map_err(|e| Error::InvalidRequest(format!("cannot read the bound address of {requested}: {e}")))
}

impl Drop for CoordinatorHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
