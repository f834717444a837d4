//! Shared pieces of the consumer's integration tests: a real `redis-server`, an in-process coordinator, a
//! recorder of every handler invocation, a background producer, and the invariant checks.
#![allow(dead_code)]

use coord_server::server::CoordinatorHandle;
use protocol::keys;
use protocol::messages::CreateGroupRequest;
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream_consumer::{ConsumerBuilder, ConsumerHandle, EntryId, Message};
use test_support::{wait_for, RedisServer};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const SHARDS: u32 = 8;
pub const MEMBER_TTL: Duration = Duration::from_millis(2000);
pub const HEARTBEAT: Duration = Duration::from_millis(200);
pub const LEASE: Duration = Duration::from_millis(1500);
pub const MARGIN: Duration = Duration::from_millis(200);
pub const REBALANCE_TIMEOUT: Duration = Duration::from_millis(3000);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub fn group_timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: MEMBER_TTL.as_millis() as u64,
        heartbeat_interval_ms: HEARTBEAT.as_millis() as u64,
        rebalance_timeout_ms: REBALANCE_TIMEOUT.as_millis() as u64,
        assignment_lease_ms: LEASE.as_millis() as u64,
    }
}

/// Redis, a coordinator on a fixed address (so it can come back on the same URL), and one group.
pub struct Env {
    pub redis: RedisServer,
    pub coord: Option<CoordinatorHandle>,
    pub addr: SocketAddr,
    pub stream: StreamName,
    pub group: GroupName,
}

fn coord_config(redis_url: &str, listen: SocketAddr) -> coord_server::Config {
    let mut config = coord_server::Config::new(redis_url);
    config.listen = listen;
    config.tick_interval = Duration::from_millis(50);
    // Short enough for the 1.5 s lease (`Config::check_timings`).
    config.mutex_ttl = Duration::from_millis(900);
    config.critical_section_timeout = Duration::from_millis(600);
    config
}

impl Env {
    pub async fn start(name: &str) -> Env {
        init_tracing();
        let redis = RedisServer::start().await;
        let coord = CoordinatorHandle::spawn(coord_config(&redis.url(), "127.0.0.1:0".parse().unwrap()))
            .await
            .expect("coordinator starts");
        let addr = coord.addr();
        let stream = StreamName::new(format!("{name}-stream")).unwrap();
        let group = GroupName::new(format!("{name}-group")).unwrap();
        coord
            .coordinator()
            .create_group(
                &stream,
                &group,
                &CreateGroupRequest {
                    shard_count: Some(SHARDS),
                    timings: Some(group_timings()),
                },
            )
            .await
            .expect("group created");
        Env {
            redis,
            coord: Some(coord),
            addr,
            stream,
            group,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn coord(&self) -> &CoordinatorHandle {
        self.coord.as_ref().expect("coordinator running")
    }

    /// Crashes the coordinator.
    pub fn abort_coordinator(&mut self) {
        self.coord.take().expect("coordinator running").abort();
    }

    /// Starts a coordinator again on the same address.
    pub async fn restart_coordinator(&mut self) {
        assert!(self.coord.is_none());
        let (url, addr) = (self.redis.url(), self.addr);
        let coord = wait_for(
            Duration::from_secs(10),
            "the coordinator to bind its old address",
            || {
                let config = coord_config(&url, addr);
                async move { CoordinatorHandle::spawn(config).await.ok() }
            },
        )
        .await;
        self.coord = Some(coord);
    }

    /// A consumer with the test timings, recording every handler invocation in `rec`.
    pub fn consumer(&self, member: &str, rec: &Recorder) -> ConsumerBuilder {
        self.consumer_with(member, rec, Gate::open())
    }

    /// Like [`Env::consumer`]; the handler waits for `gate` to be open before finishing each message.
    pub fn consumer_with(&self, member: &str, rec: &Recorder, gate: Gate) -> ConsumerBuilder {
        let rec = rec.clone();
        let who = member.to_owned();
        self.builder(member).handler(move |msg: Message| {
            let rec = rec.clone();
            let who = who.clone();
            let gate = gate.clone();
            async move {
                let guard = rec.begin(&who, &msg);
                gate.wait().await;
                guard.ok();
                Ok::<_, std::io::Error>(())
            }
        })
    }

    /// A builder with the test timings and no handler.
    pub fn builder(&self, member: &str) -> ConsumerBuilder {
        stream_consumer::Consumer::builder(self.stream.as_str(), self.group.as_str())
            .coordinator(self.url())
            .redis(self.redis.url())
            .member_id(member)
            .heartbeat_interval(HEARTBEAT)
            .member_ttl(MEMBER_TTL)
            .assignment_lease(LEASE)
            .lease_safety_margin(MARGIN)
            .request_timeout(Duration::from_millis(400))
            .read_block(Duration::from_millis(500))
            .drain_timeout(Duration::from_secs(5))
            .retry_backoff(Duration::from_millis(20), Duration::from_millis(200))
    }

    pub fn shard_key(&self, shard: u32) -> String {
        keys::shard_stream(&self.stream, ShardId(shard))
    }

    /// Appends one entry to `shard`.
    pub async fn produce_one(&self, shard: u32, n: u64) -> (u32, EntryId) {
        let mut con = self.redis.connection().await;
        let id: String = redis::cmd("XADD")
            .arg(self.shard_key(shard))
            .arg("*")
            .arg("n")
            .arg(n)
            .query_async(&mut con)
            .await
            .expect("XADD");
        (shard, id.parse().unwrap())
    }

    /// Appends entries round-robin over every shard, one every `every`, until stopped.
    pub fn spawn_producer(&self, every: Duration) -> Producer {
        let client = self.redis.client();
        let keys: Vec<String> = (0..SHARDS).map(|s| self.shard_key(s)).collect();
        let stop = CancellationToken::new();
        let produced = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let stop = stop.clone();
            let produced = Arc::clone(&produced);
            tokio::spawn(async move {
                let mut con = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("producer connects");
                let mut n: u64 = 0;
                while !stop.is_cancelled() {
                    let shard = (n % u64::from(SHARDS)) as u32;
                    let r: redis::RedisResult<String> = redis::cmd("XADD")
                        .arg(&keys[shard as usize])
                        .arg("*")
                        .arg("n")
                        .arg(n)
                        .query_async(&mut con)
                        .await;
                    if let Ok(id) = r {
                        produced
                            .lock()
                            .unwrap()
                            .push((shard, id.parse::<EntryId>().unwrap(), Instant::now()));
                    }
                    n += 1;
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(every) => {}
                    }
                }
            })
        };
        Producer { stop, produced, task }
    }

    /// Pending entries of the group on every shard (`XPENDING` summary count).
    pub async fn pending_total(&self) -> u64 {
        let mut con = self.redis.connection().await;
        let mut total = 0;
        for s in 0..SHARDS {
            let r: redis::RedisResult<redis::Value> = redis::cmd("XPENDING")
                .arg(self.shard_key(s))
                .arg(self.group.as_str())
                .query_async(&mut con)
                .await;
            if let Ok(redis::Value::Array(items)) = r {
                if let Some(redis::Value::Int(n)) = items.first() {
                    total += *n as u64;
                }
            }
        }
        total
    }

    /// The group's current description.
    pub async fn describe(&self) -> protocol::messages::GroupDescription {
        self.coord()
            .coordinator()
            .describe_group(&self.stream, &self.group)
            .await
            .expect("describe group")
    }

    /// Glob matching the group's metadata and liveness hashes (not its mutex).
    pub fn group_state_pattern(&self) -> String {
        format!("redis-stream:coord:{{{}:{}}}:[ml][ei]*", self.stream, self.group)
    }
}

pub struct Producer {
    stop: CancellationToken,
    produced: Arc<Mutex<Vec<(u32, EntryId, Instant)>>>,
    task: JoinHandle<()>,
}

impl Producer {
    pub fn count(&self) -> usize {
        self.produced.lock().unwrap().len()
    }

    pub fn produced_since(&self, t: Instant) -> usize {
        self.produced
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, at)| *at > t)
            .count()
    }

    pub async fn stop(self) -> BTreeSet<(u32, EntryId)> {
        self.stop.cancel();
        self.task.await.expect("producer task");
        self.produced
            .lock()
            .unwrap()
            .iter()
            .map(|(s, id, _)| (*s, *id))
            .collect()
    }
}

/// Lets a test hold handlers inside their message until it opens the gate.
#[derive(Clone)]
pub struct Gate(watch::Sender<bool>);

impl Gate {
    pub fn open() -> Gate {
        Gate(watch::Sender::new(true))
    }

    pub fn closed() -> Gate {
        Gate(watch::Sender::new(false))
    }

    pub fn set(&self, open: bool) {
        self.0.send_replace(open);
    }

    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// One handler invocation.
#[derive(Debug, Clone)]
pub struct Record {
    pub member: String,
    pub shard: u32,
    pub id: EntryId,
    pub delivery: u32,
    pub start: Instant,
    /// When the handler returned, or its future was dropped.
    pub end: Instant,
    pub ok: bool,
}

/// Every handler invocation of every member of a test.
#[derive(Clone, Default)]
pub struct Recorder {
    records: Arc<Mutex<Vec<Record>>>,
    open: Arc<Mutex<BTreeMap<u64, Record>>>,
    next: Arc<Mutex<u64>>,
}

/// Records the end of an invocation when dropped (also when the handler's future is dropped).
pub struct InvocationGuard {
    rec: Recorder,
    key: u64,
    ok: bool,
}

impl InvocationGuard {
    pub fn ok(mut self) {
        self.ok = true;
    }
}

impl Drop for InvocationGuard {
    fn drop(&mut self) {
        if let Some(mut r) = self.rec.open.lock().unwrap().remove(&self.key) {
            r.end = Instant::now();
            r.ok = self.ok;
            self.rec.records.lock().unwrap().push(r);
        }
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    pub fn begin(&self, member: &str, msg: &Message) -> InvocationGuard {
        let key = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n
        };
        let now = Instant::now();
        self.open.lock().unwrap().insert(
            key,
            Record {
                member: member.to_owned(),
                shard: msg.shard().0,
                id: msg.id(),
                delivery: msg.delivery_count(),
                start: now,
                end: now,
                ok: false,
            },
        );
        InvocationGuard {
            rec: self.clone(),
            key,
            ok: false,
        }
    }

    /// Finished invocations, plus the ones still running (with `end` = now).
    pub fn all(&self) -> Vec<Record> {
        let mut all = self.records.lock().unwrap().clone();
        let now = Instant::now();
        all.extend(self.open.lock().unwrap().values().cloned().map(|mut r| {
            r.end = now;
            r
        }));
        all.sort_by_key(|r| r.start);
        all
    }

    pub fn of(&self, member: &str) -> Vec<Record> {
        self.all().into_iter().filter(|r| r.member == member).collect()
    }

    /// Entries whose handler succeeded at least once.
    pub fn acked(&self) -> BTreeSet<(u32, EntryId)> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.ok)
            .map(|r| (r.shard, r.id))
            .collect()
    }

    /// Shards `member` handled something of, started after `t`.
    pub fn shards_read_after(&self, member: &str, t: Instant) -> BTreeSet<u32> {
        self.all()
            .iter()
            .filter(|r| r.member == member && r.start > t)
            .map(|r| r.shard)
            .collect()
    }

    /// The invariant: per shard, the invocations split into consecutive stints of one member each, and no stint
    /// overlaps the next one (no shard handled by two members at the same time).
    pub fn assert_no_overlap(&self) {
        let all = self.all();
        let mut by_shard: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
        for r in &all {
            by_shard.entry(r.shard).or_default().push(r);
        }
        for (shard, records) in by_shard {
            // (member, first start, last end) per stint
            let mut stints: Vec<(String, Instant, Instant)> = Vec::new();
            for r in records {
                match stints.last_mut() {
                    Some((m, _, end)) if *m == r.member => *end = (*end).max(r.end),
                    _ => stints.push((r.member.clone(), r.start, r.end)),
                }
            }
            for pair in stints.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                assert!(
                    a.2 <= b.1,
                    "shard {shard}: {} handled it until {:?} after {} started at {:?} (overlap of {:?})",
                    a.0,
                    a.2,
                    b.0,
                    b.1,
                    a.2 - b.1
                );
            }
        }
    }

    /// Checks every entry in `produced` was handled successfully.
    pub fn assert_all_acked(&self, produced: &BTreeSet<(u32, EntryId)>) {
        let acked = self.acked();
        let missing: Vec<_> = produced.difference(&acked).collect();
        assert!(
            missing.is_empty(),
            "{} of {} entries never handled: {:?}",
            missing.len(),
            produced.len(),
            &missing[..missing.len().min(10)]
        );
    }
}

/// Waits until `handle`'s status satisfies `f`; the panic shows the last status.
pub async fn wait_status(
    handle: &ConsumerHandle,
    timeout: Duration,
    what: &str,
    f: impl Fn(&stream_consumer::ConsumerStatus) -> bool,
) {
    let mut rx = handle.watch_status();
    let waited = tokio::time::timeout(timeout, async {
        loop {
            if f(&rx.borrow_and_update()) {
                return;
            }
            if rx.changed().await.is_err() {
                // The consumer stopped: no further change will come.
                std::future::pending::<()>().await;
            }
        }
    })
    .await;
    if waited.is_err() {
        panic!(
            "timed out after {timeout:?} waiting for {what}; last status: {:#?}",
            *rx.borrow()
        );
    }
}

/// Waits until every produced entry was handled successfully and nothing is pending.
pub async fn wait_all_handled(env: &Env, rec: &Recorder, produced: &BTreeSet<(u32, EntryId)>) {
    test_support::wait_until(Duration::from_secs(20), "every produced entry to be handled", || {
        let acked = rec.acked();
        let done = produced.is_subset(&acked);
        async move { done }
    })
    .await;
    test_support::wait_until(Duration::from_secs(10), "no entry left pending", || async {
        env.pending_total().await == 0
    })
    .await;
}

pub fn shards(v: &[ShardId]) -> BTreeSet<u32> {
    v.iter().map(|s| s.0).collect()
}
