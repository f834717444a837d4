//! Shutdown and crash: the gate refuses new mutations while an entered critical section finishes, and a new
//! coordinator resumes from what Redis records after an abrupt stop.

mod common;

use common::*;
use coord_server::server::CoordinatorHandle;
use protocol::messages::HeartbeatResponse;
use protocol::Status;
use reqwest::StatusCode;
use std::time::Duration;
use test_support::{wait_for, wait_until, RedisServer};

const S: &str = "orders";
const G: &str = "billing";
const HB: &str = "/v1/streams/orders/groups/billing/heartbeat";
const WAIT: Duration = Duration::from_secs(10);

/// A coordinator whose tick loop never runs (so only the test's requests take the group's mutex) and whose
/// requests wait up to 8 s for the mutex (so the test, not a timeout, decides when the section proceeds).
async fn patient_coordinator(redis: &RedisServer) -> CoordinatorHandle {
    let mut config = config(&redis.url());
    config.tick_interval = Duration::from_secs(3600);
    config.mutex_ttl = Duration::from_secs(10);
    config.critical_section_timeout = Duration::from_secs(8);
    config.request_timeout = Duration::from_secs(9);
    config.default_timings = patient_timings();
    CoordinatorHandle::spawn(config).await.expect("coordinator starts")
}

/// Holds the group's Redis mutex from the test, so a heartbeat enters its critical section and then waits.
async fn hold_mutex(con: &mut redis::aio::MultiplexedConnection) {
    let taken: Option<String> = redis::Script::new(
        "local h = redis.call('GET', KEYS[1]) if h and h ~= '' then return nil end \
         return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
    )
    .key(mutex_key(S, G))
    .arg("test")
    .arg(10_000)
    .invoke_async(con)
    .await
    .unwrap();
    assert_eq!(taken.as_deref(), Some("OK"), "the mutex was free");
}

async fn release_mutex(con: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("DEL").arg(mutex_key(S, G)).query_async(con).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_refuses_new_heartbeats_while_an_entered_section_finishes() {
    let redis = RedisServer::start().await;
    let coord = patient_coordinator(&redis).await;
    let api = Api::new(coord.url());
    api.create_group_with(S, G, 2, patient_timings()).await;
    let mut con = redis.connection().await;

    hold_mutex(&mut con).await;
    let in_flight = tokio::spawn({
        let api = api.clone();
        async move { api.heartbeat(S, G, &join("a")).await }
    });
    let gate = coord.coordinator().gate().clone();
    wait_until(WAIT, "the heartbeat to enter its critical section", || {
        let gate = gate.clone();
        async move { gate.in_flight() == 1 }
    })
    .await;

    coord.begin_shutdown();
    let refused = api.post(HB, &join("b")).await;
    let body = error_json(refused, StatusCode::SERVICE_UNAVAILABLE, Status::CoordinatorTerminating).await;
    assert!(body.retry_after_ms.is_some(), "{body:?}");
    error_json(
        api.get("/readyz").await,
        StatusCode::SERVICE_UNAVAILABLE,
        Status::CoordinatorTerminating,
    )
    .await;
    assert_eq!(
        api.get("/healthz").await.status(),
        StatusCode::OK,
        "still alive while terminating"
    );
    let create = api
        .post(
            "/v1/streams/other/groups/g",
            &protocol::messages::CreateGroupRequest::default(),
        )
        .await;
    error_json(create, StatusCode::SERVICE_UNAVAILABLE, Status::CoordinatorTerminating).await;
    assert!(
        !in_flight.is_finished(),
        "the entered section still waits for the mutex"
    );

    release_mutex(&mut con).await;
    let answer: HeartbeatResponse = in_flight
        .await
        .expect("request task")
        .unwrap_or_else(|(status, body)| panic!("the entered section must finish: {status} {body:?}"));
    assert_eq!(answer.status, Status::Ok);
    assert_eq!(answer.assigned, shards(&[0, 1]));

    // Its write is in Redis: the member is recorded with its shards, and its lease in the liveness hash.
    let group = api.describe(S, G).await;
    let ids: Vec<&str> = group.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(ids, ["a"], "b was refused before anything was written");
    assert_eq!(group.members[0].assigned, shards(&[0, 1]));
    let leased: bool = redis::cmd("HEXISTS")
        .arg(liveness_key(S, G))
        .arg("a")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(leased);

    tokio::time::timeout(WAIT, coord.shutdown())
        .await
        .expect("shutdown completes once no section is in flight");
    let owner: Option<String> = redis::cmd("GET")
        .arg(mutex_key(S, G))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        owner.filter(|o| !o.is_empty()),
        None,
        "the finished section released the mutex"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_entered_section_before_stopping() {
    let redis = RedisServer::start().await;
    let coord = patient_coordinator(&redis).await;
    let api = Api::new(coord.url());
    api.create_group_with(S, G, 2, patient_timings()).await;
    let mut con = redis.connection().await;

    hold_mutex(&mut con).await;
    let in_flight = tokio::spawn({
        let api = api.clone();
        async move { api.heartbeat(S, G, &join("a")).await }
    });
    let gate = coord.coordinator().gate().clone();
    wait_until(WAIT, "the heartbeat to enter its critical section", || {
        let gate = gate.clone();
        async move { gate.in_flight() == 1 }
    })
    .await;

    let stopping = tokio::spawn(coord.shutdown());
    wait_until(WAIT, "readyz to turn unready", || {
        let api = api.clone();
        async move { api.get("/readyz").await.status() == StatusCode::SERVICE_UNAVAILABLE }
    })
    .await;
    assert!(!stopping.is_finished(), "shutdown waits for the section in flight");

    release_mutex(&mut con).await;
    let answer = in_flight.await.expect("request task");
    assert_eq!(answer.map(|r| r.status).ok(), Some(Status::Ok));
    tokio::time::timeout(WAIT, stopping)
        .await
        .expect("shutdown completes")
        .expect("shutdown task");
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_coordinator_resumes_from_redis_after_abort() {
    let redis = RedisServer::start().await;
    let first = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("first coordinator");
    let api = Api::new(first.url());
    api.create_group(S, G, 4).await;
    let a1 = api.hb(S, G, &join("a")).await;
    let b1 = api.hb(S, G, &join("b")).await;
    let drain = follow_up(&a1, &a1.assigned);
    let a2 = api.hb(S, G, &drain).await;
    assert!(!a2.revoke.is_empty(), "a was told to drain: {a2:?}");

    first.abort();

    let second = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect("second coordinator");
    let api = Api::new(second.url());
    // The aborted instance may have died holding the mutex (a tick): retry as a client would, until its TTL.
    let a2_again = wait_for(WAIT, "the new coordinator to answer a", || {
        let api = api.clone();
        let drain = drain.clone();
        async move {
            match api.heartbeat(S, G, &drain).await {
                Ok(resp) => Some(resp),
                Err((_, body)) if body.status == Status::StoreUnavailable => None,
                Err((status, body)) => panic!("unexpected refusal: {status} {body:?}"),
            }
        }
    })
    .await;
    assert_eq!(a2_again, a2, "the DRAIN decision is recorded, not remembered");
    let b2 = api.hb(S, G, &follow_up(&b1, &[])).await;
    assert_eq!(b2.pending, a2.revoke, "b still waits for what a drains");
    assert!(b2.assigned.is_empty());

    // The handshake goes on through the new instance.
    let a_reading = reading_after(&a2_again, &a1.assigned);
    api.hb(S, G, &follow_up(&a2_again, &a_reading)).await;
    let b3 = api.hb(S, G, &follow_up(&b2, &[])).await;
    assert_eq!(b3.assigned, a2.revoke);
    second.shutdown().await;
}

/// The `coord-server` binary, for the exit tests: they need a real process, whose runtime shutdown is part of it.
#[cfg(unix)]
const BIN: &str = env!("CARGO_BIN_EXE_coord-server");

/// The bound between the binary's last log line, "coordinator stopped", and its exit: nothing the coordinator owes
/// anyone is left by then, so an orchestrator waiting for the exit should not wait longer.
#[cfg(unix)]
const EXIT_AFTER_STOPPED: Duration = Duration::from_millis(200);

/// Starts the binary against `redis` with a fast tick, waits until it is ready and has a group with a member, and
/// returns it with its stderr lines (each with the instant it was read) and its API.
#[cfg(unix)]
async fn serving_binary(
    redis: &RedisServer,
) -> (
    tokio::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<(tokio::time::Instant, String)>,
    Api,
) {
    use tokio::io::AsyncBufReadExt;
    let port = test_support::free_port();
    let mut child = tokio::process::Command::new(BIN)
        .args(["--redis-url", &redis.url(), "--listen", &format!("127.0.0.1:{port}")])
        .args(["--tick-interval-ms", "20"])
        // Short enough for the 1.5 s lease of the groups `Api::create_group` creates.
        .args(["--mutex-ttl-ms", "900", "--critical-section-timeout-ms", "600"])
        .env("RUST_LOG", "info")
        .env_remove("COORD_ADMIN_TOKEN")
        .env_remove("COORD_CLIENT_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().expect("stderr is piped")).lines();
    let (lines, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            if lines.send((tokio::time::Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    wait_until(WAIT, "the binary to answer /readyz", || {
        let (http, url) = (http.clone(), format!("{base}/readyz"));
        async move { http.get(url).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;
    let api = Api::new(base);
    api.create_group(S, G, 2).await;
    api.hb(S, G, &join("a")).await;
    (child, received, api)
}

/// Sends SIGTERM, waits (with a deadline) for the exit, and returns how long after SIGTERM the "coordinator
/// stopped" line came and how long after that line the process exited, with every line for the messages.
#[cfg(unix)]
async fn terminate(
    mut child: tokio::process::Child,
    mut lines: tokio::sync::mpsc::UnboundedReceiver<(tokio::time::Instant, String)>,
) -> (Duration, Duration, String) {
    let pid = child.id().expect("running child has a pid");
    let sent = tokio::time::Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the binary exits after SIGTERM")
        .expect("wait for the binary");
    let exited = tokio::time::Instant::now();
    let mut log = String::new();
    let mut stopped = None;
    // The reader ends at the pipe's end, which the exit closes.
    while let Ok(Some((at, line))) = tokio::time::timeout(WAIT, lines.recv()).await {
        if line.contains("coordinator stopped") {
            stopped = Some(at);
        }
        log.push_str(&line);
        log.push('\n');
    }
    assert!(status.success(), "exit status {status:?}; stderr:\n{log}");
    let stopped = stopped.unwrap_or_else(|| panic!("no 'coordinator stopped' line; stderr:\n{log}"));
    (stopped - sent, exited.saturating_duration_since(stopped), log)
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_promptly_after_its_stopped_line() {
    let redis = RedisServer::start().await;
    let (child, lines, _) = serving_binary(&redis).await;
    let (_, exit, log) = terminate(child, lines).await;
    assert!(
        exit <= EXIT_AFTER_STOPPED,
        "exited {exit:?} after 'coordinator stopped' (bound {EXIT_AFTER_STOPPED:?}); stderr:\n{log}"
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_stops_promptly_when_redis_is_gone() {
    let redis = RedisServer::start().await;
    let (child, lines, api) = serving_binary(&redis).await;
    redis.kill();
    // Until the binary has met the dead Redis: by then its 20 ms tick is inside Redis calls that wait on
    // reconnection, the case under test.
    wait_until(WAIT, "/readyz to report the dead Redis", || {
        let api = api.clone();
        async move { api.get("/readyz").await.status() != StatusCode::OK }
    })
    .await;
    let (stop, exit, log) = terminate(child, lines).await;
    // Nothing was in a critical section: the HTTP side stops at once, and the tick loop must not wait out the
    // reconnection attempts (about 8 s before it abandoned them).
    assert!(
        stop <= Duration::from_secs(2),
        "'coordinator stopped' {stop:?} after SIGTERM with Redis gone; stderr:\n{log}"
    );
    assert!(
        exit <= EXIT_AFTER_STOPPED,
        "exited {exit:?} after 'coordinator stopped' (bound {EXIT_AFTER_STOPPED:?}); stderr:\n{log}"
    );
}
