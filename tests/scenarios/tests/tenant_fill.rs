//! Tenants on one coordinator (issue 33): one tenant's producer fills the data Redis (`maxmemory`, `noeviction`)
//! until its writes fail. With the coordinator's metadata on a Redis of its own (`metadata_redis_url`), every
//! group keeps its assignments and every heartbeat is answered OK throughout and after; the producers get a
//! typed error that says Redis is out of memory; the per-tenant memory gauge shows who filled it. With one shared
//! Redis (the "before"), the same fill stops every tenant's heartbeats: the critical section's mutex `SET` is
//! refused under `noeviction`.

mod common;

use client_core::admin::AdminClient;
use common::*;
use coord_server::auth::Grant;
use coord_server::server::CoordinatorHandle;
use protocol::keys;
use protocol::messages::{CreateGroupRequest, HeartbeatResponse, RevokeState};
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream_producer::{Producer, PublishError};
use test_support::RedisServer;

/// The data Redis's `maxmemory`: small, so the fill takes about a second.
const MAXMEMORY_MB: u64 = 32;
/// One record's payload: big, so few publishes fill the data Redis.
const RECORD_BYTES: usize = 64 * 1024;
/// The records that take the data Redis over `maxmemory` once the big ones are refused.
const TOP_OFF_BYTES: usize = 256;
/// Shards per stream.
const SHARDS: u32 = 2;
/// Heartbeats of each member after the fill failed: 10 intervals (2 s) outlast the member TTL and the lease, so
/// an expiry or a lost assignment would show.
const BEATS_AFTER: usize = 10;
const ADMIN: &str = "admin-token";
const TABLE: &str = "admin:*:admin-token\n\
                     consumer:tenant-a.:a-consumer\nproducer:tenant-a.:a-producer\n\
                     consumer:tenant-b.:b-consumer\nproducer:tenant-b.:b-producer\n";

/// One tenant: its stream, its tokens.
#[derive(Clone, Copy)]
struct Tenant {
    prefix: &'static str,
    stream: &'static str,
    consumer_token: &'static str,
    producer_token: &'static str,
}

const A: Tenant = Tenant {
    prefix: "tenant-a.",
    stream: "tenant-a.orders",
    consumer_token: "a-consumer",
    producer_token: "a-producer",
};
const B: Tenant = Tenant {
    prefix: "tenant-b.",
    stream: "tenant-b.orders",
    consumer_token: "b-consumer",
    producer_token: "b-producer",
};

/// A data Redis with a small `maxmemory`, the metadata Redis when split, and a coordinator on them.
struct Setup {
    data: RedisServer,
    metadata: Option<RedisServer>,
    coord: CoordinatorHandle,
}

impl Setup {
    async fn start(split: bool) -> Setup {
        let data = RedisServer::builder()
            .extra_arg("--maxmemory")
            .extra_arg(format!("{MAXMEMORY_MB}mb"))
            .extra_arg("--maxmemory-policy")
            .extra_arg("noeviction")
            .start()
            .await;
        let metadata = if split { Some(RedisServer::start().await) } else { None };
        let mut config = coord_config(&data.url(), test_support::coordinator::any_port());
        config.metadata_redis_url = metadata.as_ref().map(|m| m.url());
        config.tokens = Grant::parse_table(TABLE).expect("token table");
        let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
        let admin = AdminClient::new(&coord.url(), Some(ADMIN.into()), Duration::from_secs(5)).expect("admin");
        for t in [A, B] {
            let req = CreateGroupRequest {
                shard_count: Some(SHARDS),
                timings: Some(timings()),
            };
            admin.create(t.stream, "g", &req).await.expect("group created");
        }
        Setup { data, metadata, coord }
    }

    fn producer(&self, t: Tenant) -> Producer {
        Producer::builder(t.stream)
            .coordinator(self.coord.url())
            .coordinator_token(t.producer_token)
            .redis(self.data.url())
            .coordinator_timeout(Duration::from_millis(400))
            .build()
            .expect("producer")
    }
}

/// One heartbeat of `m` to `t`'s group with `t`'s consumer token; a 200 answer is applied.
async fn beat(http: &reqwest::Client, url: &str, t: Tenant, m: &mut WireMember) -> Result<HeartbeatResponse, Refusal> {
    let req = m.request(RevokeState::Revoked);
    let resp = http
        .post(format!("{url}{}", protocol::routes::heartbeat(t.stream, "g")))
        .bearer_auth(t.consumer_token)
        .json(&req)
        .send()
        .await
        .expect("the coordinator answers");
    let answer = decode::<HeartbeatResponse>(resp).await;
    if let Ok(r) = &answer {
        m.apply(r, RevokeState::Revoked);
    }
    answer
}

/// What one heartbeat of a [`Beater`] got: OK with the shards the member reads, or the refusal.
#[derive(Debug, Clone)]
struct Beat {
    at: Instant,
    answer: Result<usize, String>,
}

/// A member of `t`'s group heartbeating every [`HEARTBEAT`] in the background, keeping every answer.
struct Beater {
    log: Arc<Mutex<Vec<Beat>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Beater {
    /// Joins a member until it reads every shard, then heartbeats in the background.
    async fn start(url: String, t: Tenant) -> Beater {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http");
        let mut m = WireMember::new(&format!("{}m1", t.prefix));
        let m_ref = tokio::sync::Mutex::new(&mut m);
        test_support::wait_for(DEADLINE, "the member reads every shard", || async {
            let mut m = m_ref.lock().await;
            let _ = beat(&http, &url, t, &mut m).await;
            (m.reading.len() == SHARDS as usize).then_some(())
        })
        .await;
        let (log, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (log2, stop2) = (log.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !stop2.load(Ordering::Relaxed) {
                let answer = match beat(&http, &url, t, &mut m).await {
                    Ok(_) => Ok(m.reading.len()),
                    Err((status, e)) => Err(format!("{status} {:?}: {}", e.status, e.message)),
                };
                log2.lock().unwrap().push(Beat {
                    at: Instant::now(),
                    answer,
                });
                // The member's own cadence: a real consumer heartbeats every interval, not faster.
                tokio::time::sleep(HEARTBEAT).await;
            }
        });
        Beater { log, stop, task }
    }

    fn since(&self, t: Instant) -> Vec<Beat> {
        self.log.lock().unwrap().iter().filter(|b| b.at >= t).cloned().collect()
    }

    async fn stop(self) -> Vec<Beat> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("beater");
        Arc::try_unwrap(self.log).expect("one owner").into_inner().unwrap()
    }
}

/// What the fill reached.
struct Filled {
    /// Records written: big ones, then small ones.
    records: u64,
    took: Duration,
    /// The refusal of the last (small) record.
    error: PublishError,
}

/// Publishes records for `t` until one fails, twice: [`RECORD_BYTES`] records first, then records of
/// [`TOP_OFF_BYTES`]. A big record is refused while Redis is still somewhat under `maxmemory` (its query buffer
/// counts as used memory), and small writes would still pass then; the small records take Redis over the limit,
/// where every write that can grow memory is refused. Panics if four times `maxmemory` fit.
async fn fill(producer: &Producer) -> Filled {
    let started = Instant::now();
    let mut records = 0;
    let mut error = None;
    for size in [RECORD_BYTES, TOP_OFF_BYTES] {
        let payload = "x".repeat(size);
        let limit = 4 * MAXMEMORY_MB * 1024 * 1024 / size as u64;
        error = None;
        for i in 0..limit {
            if let Err(e) = producer.send(format!("k{i}"), &[("p", payload.as_str())]).await {
                error = Some(e);
                break;
            }
            records += 1;
        }
        assert_out_of_memory(error.as_ref().expect("the data Redis fills up"));
    }
    Filled {
        records,
        took: started.elapsed(),
        error: error.expect("refused"),
    }
}

/// The error a write into the full data Redis gets: `Rejected`, not written, and saying out of memory.
fn assert_out_of_memory(e: &PublishError) {
    assert!(matches!(e, PublishError::Rejected { .. }), "{e:?}");
    assert_eq!(e.write_state(), stream_producer::WriteState::NotWritten, "{e}");
    assert!(e.to_string().contains("OOM"), "the message says out of memory: {e}");
}

/// Tenant A's producer going on writing small records while the test watches, as a filling tenant does: each
/// time Redis frees a little (a client's query buffer shrinks), a record takes it over `maxmemory` again.
struct Pusher {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl Pusher {
    fn start(producer: Arc<Producer>) -> Pusher {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            let payload = "x".repeat(TOP_OFF_BYTES);
            let (mut written, mut refused) = (0, 0);
            while !stop2.load(Ordering::Relaxed) {
                match producer.send("more", &[("p", payload.as_str())]).await {
                    Ok(_) => written += 1,
                    Err(e) => {
                        assert_out_of_memory(&e);
                        refused += 1;
                    }
                }
                // The producer's own pace, so the refusals do not take the test's two cores.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (written, refused)
        });
        Pusher { stop, task }
    }

    /// Records written and refused.
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("pusher")
    }
}

/// Every key of `redis` matching `pattern` (`SCAN`).
async fn keys_of(redis: &RedisServer, pattern: &str) -> BTreeSet<String> {
    let mut conn = redis.connection().await;
    let mut found = BTreeSet::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        found.extend(batch);
        cursor = next;
        if cursor == 0 {
            return found;
        }
    }
}

/// The value of the series `name{label="value"}` in a `/metrics` text.
fn series(text: &str, name: &str, label: &str, value: &str) -> Option<f64> {
    let head = format!("{name}{{{label}=\"{value}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&head)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filling_the_data_redis_stops_no_group_when_metadata_has_its_own_redis() {
    init_tracing();
    let s = Setup::start(true).await;
    let (a, b) = (
        Beater::start(s.coord.url(), A).await,
        Beater::start(s.coord.url(), B).await,
    );
    let producer_a = Arc::new(s.producer(A));
    let filled = fill(&producer_a).await;
    let full_at = Instant::now();
    let pusher = Pusher::start(producer_a.clone());
    // The data Redis is shared: tenant B's records are refused the same way (trimming, or a data Redis per tenant,
    // keeps tenants' data apart; what the metadata Redis keeps up is the coordination).
    let producer_b = s.producer(B);
    assert_out_of_memory(
        &producer_b
            .send("k", &[("p", "small")])
            .await
            .expect_err("the data Redis is full"),
    );

    test_support::wait_for(DEADLINE, "heartbeats after the fill", || async {
        (a.since(full_at).len() >= BEATS_AFTER && b.since(full_at).len() >= BEATS_AFTER).then_some(())
    })
    .await;
    let (written, refused) = pusher.stop().await;
    let admin = AdminClient::new(&s.coord.url(), Some(ADMIN.into()), Duration::from_secs(5)).expect("admin");
    let group_b = admin.describe(B.stream, "g").await.expect("group B described");
    let metrics = Api::new(s.coord.url()).metrics().await;
    let status = reqwest::Client::new()
        .get(format!("{}/status", s.coord.url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("status page")
        .text()
        .await
        .expect("status body");
    let (log_a, log_b) = (a.stop().await, b.stop().await);
    for (name, log) in [("A", &log_a), ("B", &log_b)] {
        let failed: Vec<&Beat> = log.iter().filter(|b| b.answer != Ok(SHARDS as usize)).collect();
        assert!(
            failed.is_empty(),
            "tenant {name}: heartbeats not OK or shards lost: {failed:?}"
        );
    }
    assert!(refused > 0, "the data Redis stayed full while the heartbeats went on");
    assert!(group_b
        .shards
        .iter()
        .all(|sh| sh.owner.as_ref().map(|m| m.as_str()) == Some("tenant-b.m1")));

    let max = (MAXMEMORY_MB * 1024 * 1024) as f64;
    let memory = |tenant| series(&metrics, "redis_stream_coord_tenant_memory_bytes", "tenant", tenant);
    let (mem_a, mem_b) = (
        memory(A.prefix).expect("A's memory"),
        memory(B.prefix).expect("B's memory"),
    );
    assert!(
        mem_a > 0.5 * max,
        "tenant A's shards hold most of the data Redis: {mem_a}\n{metrics}"
    );
    assert!(mem_b < 0.01 * max, "tenant B's hold almost nothing: {mem_b}");
    let redis =
        |name, role| series(&metrics, name, "redis", role).unwrap_or_else(|| panic!("{name} {role}\n{metrics}"));
    assert_eq!(redis("redis_stream_coord_redis_maxmemory_bytes", "data"), max);
    assert!(redis("redis_stream_coord_redis_used_memory_bytes", "data") > 0.9 * max);
    assert!(redis("redis_stream_coord_redis_used_memory_bytes", "metadata") > 0.0);
    assert!(
        status.contains("<tr class=\"tenant\"><td>tenant-a.</td><td>1</td><td>2</td>"),
        "the status page shows tenant A's usage: {status}"
    );
    assert!(status.contains("<tr class=\"redis\"><td>data</td>"), "{status}");
    let length_a = series(&metrics, "redis_stream_coord_tenant_stream_length", "tenant", A.prefix);
    assert_eq!(length_a, Some((filled.records + written) as f64));
    eprintln!(
        "split: fill of {} records ({:.1} MB) in {:?} until {}; then {written} written / {refused} refused; \
         heartbeats A {} B {} all OK ({} / {} after the fill); tenant memory A {mem_a} B {mem_b}; data used {}",
        filled.records,
        mem_a / 1e6,
        filled.took,
        filled.error,
        log_a.len(),
        log_b.len(),
        log_a.iter().filter(|b| b.at >= full_at).count(),
        log_b.iter().filter(|b| b.at >= full_at).count(),
        redis("redis_stream_coord_redis_used_memory_bytes", "data"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filling_one_shared_redis_stops_every_tenants_heartbeats() {
    init_tracing();
    let s = Setup::start(false).await;
    let b = Beater::start(s.coord.url(), B).await;
    let producer_a = Arc::new(s.producer(A));
    let beating = Instant::now();
    test_support::wait_for(DEADLINE, "B's first logged heartbeat", || async {
        (!b.since(beating).is_empty()).then_some(())
    })
    .await;
    // B's heartbeats may meet the full Redis before A's producer does: the fill's start divides before from after.
    let fill_started = Instant::now();
    let filled = fill(&producer_a).await;
    let full_at = Instant::now();
    let pusher = Pusher::start(producer_a.clone());
    let refused = test_support::wait_for(DEADLINE, "tenant B's heartbeats refused", || async {
        b.since(fill_started).into_iter().find_map(|beat| beat.answer.err())
    })
    .await;
    let (written, refused_records) = pusher.stop().await;
    let log = b.stop().await;
    assert!(
        refused.contains("StoreUnavailable") && refused.contains("OOM"),
        "{refused}"
    );
    let before: Vec<&Beat> = log.iter().filter(|beat| beat.at < fill_started).collect();
    assert!(
        !before.is_empty() && before.iter().all(|beat| beat.answer == Ok(SHARDS as usize)),
        "OK before the fill: {before:?}"
    );
    let after = log.iter().filter(|beat| beat.at >= fill_started);
    let (ok, failed) = after.fold((0, 0), |(ok, failed), beat| match beat.answer {
        Ok(_) => (ok + 1, failed),
        Err(_) => (ok, failed + 1),
    });
    eprintln!(
        "shared: fill of {} records in {:?} ({:?} to the first refused record) until {}; then {written} written / {refused_records} refused; B's \
         heartbeats: {} OK before, after the fill {ok} OK / {failed} refused, first: {refused}",
        filled.records,
        filled.took,
        full_at - fill_started,
        filled.error,
        before.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_redis_holds_the_coordinators_keys_and_the_data_redis_the_shards_and_their_fences() {
    init_tracing();
    let s = Setup::start(true).await;
    let metadata = s.metadata.as_ref().expect("split");
    let b = Beater::start(s.coord.url(), B).await;
    let producer = s.producer(B);
    for i in 0..20 {
        producer.send(format!("k{i}"), &[("n", "1")]).await.expect("published");
    }
    let admin = AdminClient::new(&s.coord.url(), Some(ADMIN.into()), Duration::from_secs(5)).expect("admin");
    let grown = admin.add_shards(B.stream, 2, None).await.expect("shards added");
    assert_eq!(grown.shard_count, 2 * SHARDS);
    // The growth seals the parents: producers of the old routing must be refused by the data Redis itself.
    let stream = StreamName::new(B.stream).expect("stream name");
    let fence = keys::shard_fence(&stream, ShardId(0));
    let data = s.data.connection().await;
    let sealed: Option<u64> = test_support::wait_for(DEADLINE, "shard 0 sealed on the data Redis", || {
        let (fence, mut data) = (fence.clone(), data.clone());
        async move {
            let v: Option<u64> = redis::cmd("HGET")
                .arg(&fence)
                .arg(keys::shard_fence_fields::ROUTING_VERSION)
                .query_async(&mut data)
                .await
                .expect("HGET");
            v.filter(|&v| v >= grown.routing_version.0).map(Some)
        }
    })
    .await;
    assert!(sealed.is_some());
    // This producer still holds the old routing unless its refresher fetched the new one meanwhile: the data
    // Redis then refuses its write into the sealed parent, by the fence the coordinator wrote there.
    match producer.send("k0", &[("n", "1")]).await {
        Err(PublishError::Fenced { fence, .. }) => assert_eq!(fence, grown.routing_version),
        Err(e) => panic!("{e:?}"),
        Ok(_) => assert!(producer.routing().is_some_and(|r| r.version >= grown.routing_version)),
    }

    let coord_on_data = keys_of(&s.data, "redis-stream:coord:*").await;
    assert!(
        coord_on_data.is_empty(),
        "no coordinator key on the data Redis: {coord_on_data:?}"
    );
    let fences = keys_of(&s.data, "redis-stream:shard-fence:*").await;
    assert_eq!(
        fences.len(),
        (2 * SHARDS + SHARDS) as usize,
        "every shard's record: {fences:?}"
    );
    assert!(!keys_of(&s.data, "redis-stream:shard:*").await.is_empty());
    let on_metadata = keys_of(metadata, "redis-stream:*").await;
    assert!(
        on_metadata.iter().all(|k| k.starts_with("redis-stream:coord:")),
        "only coordinator keys on the metadata Redis: {on_metadata:?}"
    );
    for key in [
        keys::group_metadata(&stream, &GroupName::new("g").expect("group")),
        keys::group_liveness(&stream, &GroupName::new("g").expect("group")),
        keys::stream_routing(&stream),
        keys::groups_index(),
    ] {
        assert!(
            on_metadata.contains(&key),
            "{key} on the metadata Redis: {on_metadata:?}"
        );
    }
    let log = b.stop().await;
    assert!(log.iter().all(|beat| beat.answer.is_ok()), "{log:?}");
    producer.close().await.expect("close");
}
