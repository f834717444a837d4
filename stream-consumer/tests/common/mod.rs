//! Shared pieces of the consumer's integration tests: a real `redis-server`, an in-process coordinator, a
//! recorder of every handler invocation, a background producer, and the invariant checks.
#![allow(dead_code)]
#![allow(unused_imports)] // the re-exported harness pieces: each test binary uses a different subset

use coord_server::server::CoordinatorHandle;
use protocol::keys;
use protocol::messages::CreateGroupRequest;
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream_consumer::{ConsumerBuilder, EntryId, Message};
use test_support::history::{Handled, Handling, History};
use test_support::{wait_for, RedisServer};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const SHARDS: u32 = 8;
pub use test_support::timings::{HEARTBEAT, LEASE, MARGIN, MEMBER_TTL, REBALANCE_TIMEOUT};

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The short group timings of every suite (`test_support::timings`).
pub fn group_timings() -> GroupTimings {
    test_support::timings::group_timings()
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
    test_support::coordinator::config(redis_url, listen)
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

    /// A builder with the test timings (`test_support::consumer::builder`) and no handler.
    pub fn builder(&self, member: &str) -> ConsumerBuilder {
        test_support::consumer::builder(self.stream.as_str(), self.group.as_str(), member)
            .coordinator(self.url())
            .redis(self.redis.url())
            .read_block(Duration::from_millis(500))
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
                        // Real time: the load's pace, as a producer process writes.
                        _ = tokio::time::sleep(every) => {}
                    }
                }
            })
        };
        Producer { stop, produced, task }
    }

    /// Pending entries of the group on every shard (`XPENDING` summary count).
    pub async fn pending_total(&self) -> u64 {
        let keys = (0..SHARDS).map(|s| self.shard_key(s));
        test_support::pending_total(&self.redis, keys, self.group.as_str()).await
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

pub use test_support::consumer::wait_status;
pub use test_support::Gate;

/// One handler invocation, as the tests here read it.
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

impl From<Handled> for Record {
    fn from(h: Handled) -> Record {
        Record {
            member: h.member,
            shard: h.shard,
            id: h.entry,
            delivery: h.delivery,
            start: h.started,
            end: h.ended,
            ok: h.ok,
        }
    }
}

/// Every handler invocation of every member of a test, recorded into the one history checker
/// (`test_support::history`).
#[derive(Clone, Default)]
pub struct Recorder {
    history: History,
}

/// Records the end of an invocation when dropped (also when the handler's future is dropped).
pub struct InvocationGuard(Handling);

impl InvocationGuard {
    pub fn ok(self) {
        self.0.succeeded();
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    pub fn begin(&self, member: &str, msg: &Message) -> InvocationGuard {
        InvocationGuard(self.history.begin(member, msg, None))
    }

    /// Finished invocations, plus the ones still running (with `end` = now), by start.
    pub fn all(&self) -> Vec<Record> {
        let mut all: Vec<Record> = self.history.handled().into_iter().map(Record::from).collect();
        all.sort_by_key(|r| r.start);
        all
    }

    pub fn of(&self, member: &str) -> Vec<Record> {
        self.all().into_iter().filter(|r| r.member == member).collect()
    }

    /// Entries whose handler succeeded at least once.
    pub fn acked(&self) -> BTreeSet<(u32, EntryId)> {
        self.history.acked()
    }

    /// Shards `member` handled something of, started after `t`.
    pub fn shards_read_after(&self, member: &str, t: Instant) -> BTreeSet<u32> {
        self.all()
            .iter()
            .filter(|r| r.member == member && r.start > t)
            .map(|r| r.shard)
            .collect()
    }

    /// The invariant: no shard handled by two members at the same time (the history checker's rule (a), over
    /// finished and running invocations).
    pub fn assert_no_overlap(&self) {
        self.history.assert_no_overlap();
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
