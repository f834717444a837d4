//! A TCP proxy that can pass, stall or reset traffic, for failure tests.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Size of each direction's forwarding buffer.
const BUFFER_SIZE: usize = 16 * 1024;

/// What a [`FaultProxy`] does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways (the default).
    Pass,
    /// Stop forwarding in both directions without closing anything: data
    /// waits in the socket buffers and flows again after a switch back to
    /// [`Mode::Pass`]. New connections are accepted but stalled too.
    Stall,
    /// Forward what clients send, hold what the server answers (it waits in the socket buffers and flows again
    /// after a switch back to [`Mode::Pass`]): the server runs a request whose answer the client does not have yet.
    HoldReplies,
    /// Drop every current connection (with a TCP reset) and reset every new
    /// connection right after accepting it, until the mode changes again.
    Reset,
}

/// Shared state the proxy's tasks watch.
#[derive(Debug, Clone, Copy)]
struct Control {
    mode: Mode,
    /// Where new connections are forwarded ([`FaultProxy::set_target`]).
    target: SocketAddr,
    /// Bumped on every switch to [`Mode::Reset`], so a connection notices a
    /// reset even if the mode was switched back before it looked.
    reset_epoch: u64,
    shutdown: bool,
}

impl Control {
    /// Whether a connection accepted during `epoch` must be dropped.
    fn must_drop(&self, epoch: u64) -> bool {
        self.shutdown || self.mode == Mode::Reset || self.reset_epoch != epoch
    }
}

/// A TCP forwarder on `127.0.0.1` in front of `target`, with switchable
/// [`Mode`]. Stops (closing every connection) when dropped.
///
/// Point a client at [`addr`](Self::addr) (or [`url`](Self::url)) instead of
/// the server, then inject faults with [`set_mode`](Self::set_mode).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    control: watch::Sender<Control>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy in [`Mode::Pass`] on a free port of `127.0.0.1`,
    /// forwarding to `target`. Must be called inside a tokio runtime.
    ///
    /// # Panics
    ///
    /// Panics if no loopback port can be bound.
    pub async fn start(target: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("fault proxy: cannot bind 127.0.0.1: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy: cannot read its address: {e}"));
        let (control, watcher) = watch::channel(Control {
            mode: Mode::Pass,
            target,
            reset_epoch: 0,
            shutdown: false,
        });
        let accept_task = tokio::spawn(accept_loop(listener, watcher));
        tracing::debug!(%addr, %target, "fault proxy started");
        FaultProxy {
            addr,
            control,
            accept_task,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://ADDR` for the proxy's address.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The address new connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.control.borrow().target
    }

    /// Forwards new connections to `target` from now on (a failover behind a stable address). Current
    /// connections keep their upstream; switch to [`Mode::Reset`] and back to drop them.
    pub fn set_target(&self, target: SocketAddr) {
        self.control.send_modify(|control| control.target = target);
        tracing::debug!(addr = %self.addr, %target, "fault proxy target");
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.control.borrow().mode
    }

    /// Switches the mode. Takes effect for new connections immediately and
    /// for current connections as soon as their task runs (before it forwards
    /// any more bytes).
    pub fn set_mode(&self, mode: Mode) {
        self.control.send_modify(|control| {
            if mode == Mode::Reset {
                control.reset_epoch += 1;
            }
            control.mode = mode;
        });
        tracing::debug!(addr = %self.addr, ?mode, "fault proxy mode");
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.control.send_modify(|control| control.shutdown = true);
        // The accept task owns the connection tasks: aborting it closes the
        // listener and every connection.
        self.accept_task.abort();
    }
}

async fn accept_loop(listener: TcpListener, mut control: watch::Receiver<Control>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            biased;
            changed = control.changed() => {
                if changed.is_err() || control.borrow_and_update().shutdown {
                    return;
                }
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                let now = *control.borrow();
                if now.shutdown {
                    return;
                }
                if now.mode == Mode::Reset {
                    reset(&client);
                    continue;
                }
                connections.spawn(run_connection(client, now.target, control.clone(), now.reset_epoch));
            }
            Err(e) => {
                // E.g. out of file descriptors; do not spin.
                tracing::warn!("fault proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Closes `stream` with a TCP reset instead of an orderly close.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// How a connection ended.
enum End {
    /// Both sides closed (or failed) on their own.
    Closed,
    /// The proxy dropped the connection (reset mode or shutdown).
    Dropped,
}

async fn run_connection(mut client: TcpStream, target: SocketAddr, mut control: watch::Receiver<Control>, epoch: u64) {
    let upstream = tokio::select! {
        biased;
        () = dropped(&mut control, epoch) => None,
        connected = TcpStream::connect(target) => connected.ok(),
    };
    let Some(mut upstream) = upstream else {
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if let End::Dropped = pump(&mut client, &mut upstream, &mut control, epoch).await {
        reset(&client);
        reset(&upstream);
    }
}

/// Resolves once the connection accepted during `epoch` must be dropped.
async fn dropped(control: &mut watch::Receiver<Control>, epoch: u64) {
    loop {
        if control.borrow_and_update().must_drop(epoch) {
            return;
        }
        if control.changed().await.is_err() {
            return;
        }
    }
}

/// Something that happened on a connection.
enum Event {
    Control,
    FromClient(std::io::Result<usize>),
    FromUpstream(std::io::Result<usize>),
}

async fn pump(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    control: &mut watch::Receiver<Control>,
    epoch: u64,
) -> End {
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let mut from_client = vec![0u8; BUFFER_SIZE];
    let mut from_upstream = vec![0u8; BUFFER_SIZE];
    let mut client_open = true;
    let mut upstream_open = true;
    loop {
        let now = *control.borrow_and_update();
        if now.must_drop(epoch) {
            return End::Dropped;
        }
        if !client_open && !upstream_open {
            return End::Closed;
        }
        let event = if now.mode == Mode::Stall {
            // Read nothing: the bytes stay in the kernel buffers.
            match control.changed().await {
                Ok(()) => Event::Control,
                Err(_) => return End::Dropped,
            }
        } else {
            tokio::select! {
                biased;
                changed = control.changed() => match changed {
                    Ok(()) => Event::Control,
                    Err(_) => return End::Dropped,
                },
                read = client_read.read(&mut from_client), if client_open => Event::FromClient(read),
                read = upstream_read.read(&mut from_upstream), if upstream_open && now.mode != Mode::HoldReplies => {
                    Event::FromUpstream(read)
                }
            }
        };
        match event {
            Event::Control => {}
            Event::FromClient(Ok(0)) => {
                client_open = false;
                let _ = upstream_write.shutdown().await;
            }
            Event::FromClient(Ok(n)) => {
                if !forward(&mut upstream_write, &from_client[..n], control, epoch).await {
                    return End::Dropped;
                }
            }
            Event::FromUpstream(Ok(0)) => {
                upstream_open = false;
                let _ = client_write.shutdown().await;
            }
            Event::FromUpstream(Ok(n)) => {
                if !forward(&mut client_write, &from_upstream[..n], control, epoch).await {
                    return End::Dropped;
                }
            }
            Event::FromClient(Err(_)) | Event::FromUpstream(Err(_)) => return End::Dropped,
        }
    }
}

/// Writes `data`; `false` if the write failed or the connection must be
/// dropped meanwhile.
async fn forward<W: AsyncWrite + Unpin>(
    writer: &mut W,
    data: &[u8],
    control: &mut watch::Receiver<Control>,
    epoch: u64,
) -> bool {
    tokio::select! {
        biased;
        () = dropped(control, epoch) => false,
        written = writer.write_all(data) => written.is_ok(),
    }
}
