//! Probes under a connection flood: the `coord-server` binary, run with its open-file limit at 1024, is flooded
//! by clients that reconnect in a loop while idle connections hold every regular slot; a prober paced like the
//! kubelet still gets `/healthz` and `/readyz` answered on the probe listener (`--probe-listen`). The same prober
//! against the main port measures what probes got before there was a probe listener.

#![cfg(target_os = "linux")]

use serde_json::Value;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use test_support::{poll_for, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_coord-server");
/// The open-file limit the flood was reported at (issue 33).
const FD_LIMIT: u64 = 1024;
/// A probe fails when it is not answered within this: the liveness probe's `timeoutSeconds` in
/// deploy/kubernetes/coordinator.yaml.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pace of each prober: 200 probes in 10 s, so one failure is half a percent.
const PROBE_EVERY: Duration = Duration::from_millis(50);
const PROBES: usize = 200;
/// Clients reconnecting in a loop.
const FLOOD_WORKERS: usize = 48;
/// Bound for the binary to start and for one flood connection attempt.
const WAIT: Duration = Duration::from_secs(20);

/// The binary's addresses and connection limits, read from its JSON log.
#[derive(Debug, Default, Clone)]
struct Started {
    api: Option<SocketAddr>,
    probes: Option<SocketAddr>,
    /// Regular slots plus the main listener's probe reserve.
    main_slots: Option<usize>,
}

/// Spawns the binary with `ulimit -n FD_LIMIT` (through `sh`, so the limit is the process's own from exec on).
fn spawn_limited(redis: &RedisServer) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {FD_LIMIT} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(["--redis-url", &redis.url(), "--listen", "127.0.0.1:0"])
        .args(["--probe-listen", "127.0.0.1:0", "--log-format", "json"])
        .env("RUST_LOG", "info")
        .env_remove("COORD_ADMIN_TOKEN")
        .env_remove("COORD_CLIENT_TOKEN")
        .env_remove("COORD_TOKENS_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sh runs the binary")
}

/// Reads the binary's log to its end (a full pipe would stall it), noting what [`Started`] needs; keeps every line
/// for the failure message.
fn read_log(child: &mut Child) -> (Arc<Mutex<Started>>, Arc<Mutex<Vec<String>>>) {
    let started = Arc::new(Mutex::new(Started::default()));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("piped stderr");
    let (s, l) = (started.clone(), lines.clone());
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                note_start(&mut s.lock().unwrap(), &v["fields"]);
            }
            l.lock().unwrap().push(line);
        }
    });
    (started, lines)
}

fn note_start(started: &mut Started, fields: &Value) {
    let addr = || fields["addr"].as_str().and_then(|a| a.parse().ok());
    match fields["message"].as_str() {
        Some("coordinator listening") => started.api = addr(),
        Some("probe listener") => started.probes = addr(),
        Some("connection limits") if started.main_slots.is_none() => {
            let n = |k: &str| fields[k].as_u64().and_then(|v| usize::try_from(v).ok());
            started.main_slots = n("max_connections").zip(n("probe_connections")).map(|(m, p)| m + p);
        }
        _ => {}
    }
}

/// The open-file soft limit of process `pid`.
fn open_file_limit(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Sends `GET path` on a new connection and reads the status code.
async fn status_of(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: coordinator\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&head).split_whitespace().nth(1)?.parse().ok()
}

/// What the flood saw: connections answered, closed unanswered (the cap), and attempts that failed to connect.
#[derive(Default)]
struct FloodCounts {
    answered: AtomicU64,
    closed: AtomicU64,
    unconnected: AtomicU64,
}

/// One client reconnecting in a loop: connect, ask for the group list, read what comes, close, again.
async fn reconnect_loop(addr: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<FloodCounts>) {
    while !stop.load(Ordering::Relaxed) {
        let attempt = tokio::time::timeout(WAIT, async {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            // A write may fail on a connection the server already closed; the read below tells which.
            let _ = stream
                .write_all(b"GET /v1/groups HTTP/1.1\r\nHost: coordinator\r\n\r\n")
                .await;
            let mut chunk = [0u8; 256];
            Some(matches!(stream.read(&mut chunk).await, Ok(n) if n > 0))
        })
        .await;
        let counter = match attempt {
            Ok(Some(true)) => &counts.answered,
            Ok(Some(false)) => &counts.closed,
            Ok(None) | Err(_) => &counts.unconnected,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Probes each (address, path) every [`PROBE_EVERY`], each probe on a task of its own (a slow one does not delay
/// the next), on a thread and runtime of their own so the flood's tasks cannot delay them. Returns, per target,
/// how many of [`PROBES`] were answered `200` within [`PROBE_TIMEOUT`].
fn probe(targets: Vec<(SocketAddr, &'static str)>) -> std::thread::JoinHandle<Vec<usize>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("prober runtime");
        runtime.block_on(async move {
            let mut pace = tokio::time::interval(PROBE_EVERY);
            let mut probes = Vec::new();
            for _ in 0..PROBES {
                pace.tick().await;
                for (i, &(addr, path)) in targets.iter().enumerate() {
                    probes.push((
                        i,
                        tokio::spawn(tokio::time::timeout(PROBE_TIMEOUT, status_of(addr, path))),
                    ));
                }
            }
            let mut answered = vec![0; targets.len()];
            for (i, probe) in probes {
                if matches!(probe.await, Ok(Ok(Some(200)))) {
                    answered[i] += 1;
                }
            }
            answered
        })
    })
}

/// Waits until the log has told the addresses and limits.
async fn wait_started(started: &Mutex<Started>, log: &Mutex<Vec<String>>) -> (SocketAddr, SocketAddr, usize) {
    let ready = poll_for(WAIT, || {
        let s = started.lock().unwrap().clone();
        async move { Some((s.api?, s.probes?, s.main_slots?)) }
    })
    .await;
    ready.unwrap_or_else(|| panic!("the binary did not start:\n{}", log.lock().unwrap().join("\n")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_on_the_probe_listener_answer_through_a_reconnect_flood_at_1024_open_files() {
    let redis = RedisServer::start().await;
    let mut child = spawn_limited(&redis);
    let (started, log) = read_log(&mut child);
    let (api, probe_addr, main_slots) = wait_started(&started, &log).await;
    let pid = child.id().expect("running");
    assert_eq!(
        open_file_limit(pid),
        Some(FD_LIMIT),
        "the binary runs with the lowered limit"
    );
    assert_eq!(status_of(probe_addr, "/healthz").await, Some(200), "probe listener up");

    // Idle clients take every regular slot and the main listener's probe reserve, so each flood connection is
    // one the server must accept and close.
    let idle = main_slots + 16;
    // Three probe targets, each with at most a timeout's worth of probes open; 64 for Redis, the runtime, stdio.
    let probes_open = 3 * (PROBE_TIMEOUT.as_millis() / PROBE_EVERY.as_millis()) as usize;
    let needed = (idle + FLOOD_WORKERS + probes_open + 64) as u64;
    let own = open_file_limit(std::process::id()).unwrap_or(u64::MAX);
    assert!(own >= needed, "this test needs {needed} open files; its limit is {own}");
    let mut holders = Vec::with_capacity(idle);
    for _ in 0..idle {
        holders.push(TcpStream::connect(api).await.expect("the backlog takes idle clients"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(FloodCounts::default());
    let flood: Vec<_> = (0..FLOOD_WORKERS)
        .map(|_| tokio::spawn(reconnect_loop(api, stop.clone(), counts.clone())))
        .collect();

    let answered = tokio::task::spawn_blocking(move || {
        probe(vec![
            (probe_addr, "/healthz"),
            (probe_addr, "/readyz"),
            (api, "/healthz"),
        ])
        .join()
        .expect("prober")
    })
    .await
    .expect("prober thread");
    stop.store(true, Ordering::Relaxed);
    for worker in flood {
        worker.await.expect("flood worker");
    }
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (ok, closed, unconnected) = (load(&counts.answered), load(&counts.closed), load(&counts.unconnected));
    let percent = |n: usize| format!("{n}/{PROBES} ({:.1} %)", n as f64 * 100.0 / PROBES as f64);
    eprintln!(
        "ulimit -n {FD_LIMIT}, {idle} idle clients, {FLOOD_WORKERS} reconnecting ({} connections: {ok} answered, \
         {closed} closed unanswered, {unconnected} not connected within {WAIT:?}); answered within \
         {PROBE_TIMEOUT:?}: probe listener /healthz {}, /readyz {}; main listener /healthz {}",
        ok + closed + unconnected,
        percent(answered[0]),
        percent(answered[1]),
        percent(answered[2]),
    );
    assert!(closed > 0, "the flood reached the connection cap");
    for (i, path) in [(0, "/healthz"), (1, "/readyz")] {
        assert!(
            answered[i] * 100 >= PROBES * 99,
            "probe listener answered {} of {PROBES} {path} probes; log:\n{}",
            answered[i],
            log.lock().unwrap().join("\n")
        );
    }
    drop(holders);
}
