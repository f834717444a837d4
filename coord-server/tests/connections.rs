//! Connection hardening against real sockets: slow request heads are cut off, idle connections closed, the
//! connection cap keeps health probes answering, the probe listener serves the probes alone, and shutdown never
//! waits for a client that sends nothing.

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use std::net::SocketAddr;
use std::time::Duration;
use test_support::{wait_for, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Generous bound for anything that should happen within a second or two, even on a loaded machine.
const WAIT: Duration = Duration::from_secs(15);

async fn coordinator(redis: &RedisServer, adjust: impl FnOnce(&mut Config)) -> CoordinatorHandle {
    let mut config = config(&redis.url());
    adjust(&mut config);
    CoordinatorHandle::spawn(config).await.expect("coordinator starts")
}

/// Sends `GET path` on `stream` and reads the answer: (status code, lower-cased head, body).
async fn get(stream: &mut TcpStream, path: &str) -> Option<(u16, String, String)> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: coordinator\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
    Some((status, head, body))
}

/// How long until the server closes `stream` (reads end or fail), or `None` if it is still open after `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut chunk = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// Whether the server still holds `stream` open (nothing to read, no end of stream).
fn still_open(stream: &TcpStream) -> bool {
    let mut chunk = [0u8; 16];
    matches!(stream.try_read(&mut chunk), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// One request on a fresh connection, retried while the server closes connections without answering (a probe
/// slot freed a moment ago may not be released yet).
async fn fresh_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let path = path.to_owned();
    wait_for(WAIT, "an answer on a fresh connection", || {
        let path = path.clone();
        async move {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            get(&mut stream, &path).await
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_heads_are_cut_off_after_the_header_read_timeout() {
    const CONNECTIONS: usize = 100;
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis, |c| {
        c.header_read_timeout = Duration::from_secs(1);
        c.idle_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = coord.addr();
    // Slowloris: a head that never ends, one byte every 200 ms, on many connections at once.
    let attackers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.expect("connects");
                let (mut rd, mut wr) = stream.into_split();
                let start = Instant::now();
                wr.write_all(b"GET /healthz HTTP/1.1\r\nHost: coordinator\r\nX-Slow: ")
                    .await
                    .expect("first bytes are sent");
                let mut chunk = [0u8; 256];
                while start.elapsed() < WAIT {
                    tokio::select! {
                        read = rd.read(&mut chunk) => if matches!(read, Ok(0) | Err(_)) {
                            return Some(start.elapsed());
                        },
                        // Real time: the attacker's pace, against the server's header read timeout.
                        () = tokio::time::sleep(Duration::from_millis(200)) => {
                            if wr.write_all(b"a").await.is_err() {
                                return Some(start.elapsed());
                            }
                        }
                    }
                }
                None
            })
        })
        .collect();
    let mut closed = Vec::new();
    for attacker in attackers {
        if let Some(after) = attacker.await.expect("attacker task") {
            closed.push(after);
        }
    }
    let slowest = closed.iter().max().copied();
    eprintln!(
        "slowloris: {} of {CONNECTIONS} connections closed within {WAIT:?}, slowest after {slowest:?}",
        closed.len()
    );
    assert_eq!(closed.len(), CONNECTIONS, "every slow head is cut off");
    let fastest = closed.iter().min().copied().unwrap_or_default();
    assert!(
        fastest >= Duration::from_millis(900),
        "not before the timeout: {fastest:?}"
    );
    // The server still answers normal requests afterwards.
    let (status, _, _) = fresh_get(addr, "/healthz").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis, |c| {
        c.idle_timeout = Duration::from_secs(1);
        c.header_read_timeout = Duration::from_secs(30);
    })
    .await;
    let mut kept_alive = TcpStream::connect(coord.addr()).await.unwrap();
    let mut silent = TcpStream::connect(coord.addr()).await.unwrap();
    let (status, head, _) = get(&mut kept_alive, "/healthz").await.expect("answered");
    assert_eq!(status, 200);
    assert!(!head.contains("connection: close"), "kept alive: {head}");
    // A kept-alive connection is reused as long as it is not idle for the whole timeout.
    let (status, _, _) = get(&mut kept_alive, "/healthz").await.expect("answered again");
    assert_eq!(status, 200);

    let after_use = closed_within(&mut kept_alive, WAIT).await;
    let unused = closed_within(&mut silent, WAIT).await;
    eprintln!("idle: kept-alive connection closed after {after_use:?}, never-used connection after {unused:?}");
    let after_use = after_use.expect("the idle kept-alive connection is closed");
    unused.expect("the never-used connection is closed");
    assert!(
        after_use >= Duration::from_millis(900),
        "not before the timeout: {after_use:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_connection_cap_reached_health_probes_still_answer() {
    const CAP: usize = 3;
    const EXTRA: usize = 20;
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis, |c| {
        c.max_connections = Some(CAP);
        c.probe_connections = 2;
        c.idle_timeout = Duration::from_secs(60);
        c.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = coord.addr();
    // Each holder is answered first, so it is known to hold a regular slot.
    let mut holders = Vec::new();
    for _ in 0..CAP {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get(&mut stream, "/healthz").await.expect("answered").0, 200);
        holders.push(stream);
    }
    // Beyond the cap and the probe reserve, idle connections are closed (those in probe slots after 250 ms).
    let mut extras = Vec::new();
    for _ in 0..EXTRA {
        extras.push(TcpStream::connect(addr).await.unwrap());
    }
    let closed = futures::future::join_all(extras.iter_mut().map(|extra| closed_within(extra, WAIT)))
        .await
        .into_iter()
        .flatten()
        .count();
    eprintln!("cap {CAP}: {closed} of {EXTRA} extra idle connections closed by the server");
    assert_eq!(closed, EXTRA, "connections beyond the cap are not kept");
    assert!(holders.iter().all(still_open), "regular connections are kept");

    let (status, head, _) = fresh_get(addr, "/healthz").await;
    assert_eq!(status, 200, "liveness answers at the cap");
    assert!(
        head.contains("connection: close"),
        "a probe slot serves one request: {head}"
    );
    assert_eq!(fresh_get(addr, "/readyz").await.0, 200, "readiness answers at the cap");
    let (status, _, body) = fresh_get(addr, "/v1/groups").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("STORE_UNAVAILABLE"), "{body}");

    // A freed regular slot serves everything again.
    drop(holders.pop());
    wait_for(WAIT, "/v1/groups answered once a regular slot is free", || async move {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let (status, _, _) = get(&mut stream, "/v1/groups").await?;
        (status == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_and_half_sent_connections_within_the_grace_period() {
    const GRACE: Duration = Duration::from_secs(3);
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis, |c| {
        c.shutdown_grace = GRACE;
        c.idle_timeout = Duration::from_secs(60);
        c.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = coord.addr();
    let mut half_sent = TcpStream::connect(addr).await.unwrap();
    half_sent
        .write_all(b"POST /v1/streams/s/groups/g/heartbeat HTTP/1.1\r\nHost: coordinator\r\nContent-Le")
        .await
        .unwrap();
    let mut kept_alive = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get(&mut kept_alive, "/healthz").await.expect("answered").0, 200);
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // Answered only once the three connections above were accepted (the backlog is served in order).
    assert_eq!(fresh_get(addr, "/healthz").await.0, 200);

    let start = Instant::now();
    let stopped = tokio::time::timeout(WAIT, coord.shutdown()).await;
    let took = start.elapsed();
    eprintln!("shutdown with a half-sent head, an idle and a silent connection: {stopped:?} after {took:?}");
    assert!(stopped.is_ok(), "shutdown completes");
    assert!(took < GRACE, "nothing waits for the grace period: {took:?}");
    for stream in [&mut half_sent, &mut kept_alive, &mut silent] {
        assert!(closed_within(stream, Duration::from_secs(1)).await.is_some(), "closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_listener_serves_only_the_probes_and_closes_after_the_api() {
    let redis = RedisServer::start().await;
    let coord = coordinator(&redis, |c| {
        c.probe_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        // One regular slot, held below: the probe listener's slots are not the main port's.
        c.max_connections = Some(1);
        c.probe_connections = 1;
        c.idle_timeout = Duration::from_secs(60);
    })
    .await;
    let probes = coord.probe_addr().expect("a probe listener was asked for");
    assert_ne!(probes, coord.addr());
    let mut holder = TcpStream::connect(coord.addr()).await.unwrap();
    assert_eq!(get(&mut holder, "/v1/groups").await.expect("answered").0, 200);

    let mut scraper = TcpStream::connect(probes).await.unwrap();
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, head, body) = get(&mut scraper, path).await.expect("answered");
        assert_eq!(status, 200, "{path}: {body}");
        assert!(
            !head.contains("connection: close"),
            "kept alive for the scraper: {head}"
        );
    }
    for path in ["/v1/groups", "/status", "/v1/streams/s/routing"] {
        let (status, _, body) = get(&mut scraper, path).await.expect("answered");
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("INVALID_REQUEST"), "{body}");
    }

    // Its one slot is the scraper's until it closes; `fresh_get` retries until the server saw it close.
    drop(scraper);
    coord.begin_shutdown();
    assert_eq!(fresh_get(probes, "/readyz").await.0, 503, "unready while draining");
    assert_eq!(fresh_get(probes, "/healthz").await.0, 200, "alive while draining");
    tokio::time::timeout(WAIT, coord.shutdown())
        .await
        .expect("shutdown completes");
    assert!(
        TcpStream::connect(probes).await.is_err(),
        "the probe listener is closed"
    );
}
