//! The scenario environment, shared by every scenario file (`mod common;`):
//! * [`Scenario`]: a real `redis-server`, one or more in-process coordinators on fixed addresses (so one can be
//!   crashed and brought back on the same URL), and one group with short timings;
//! * [`Api`] and [`WireMember`]: level-2 scenarios craft the HTTP requests themselves;
//! * [`Trigger`]: a write-boundary fault ([`coord_server::fault`]) that fires once, on a predicate over the
//!   transition, and tells the test it fired;
//! * consumer and producer builders whose handlers and publishes record into a [`History`] (level 3).
#![allow(dead_code)] // each scenario file uses a different subset

use coord_server::fault::{self, Action, FaultGuard, Point, Site};
use coord_server::server::CoordinatorHandle;
use coord_server::state_machine::{Event, Transition};
use coord_server::Config;
use protocol::keys;
use protocol::messages::{
    CreateGroupRequest, ErrorResponse, GroupDescription, HeartbeatRequest, HeartbeatResponse, RecreateGroupRequest,
    RevokeState, RevokingShard,
};
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MemberEpoch, MetadataVersion, ShardId, Status};
use reqwest::StatusCode;
use scenario_tests::History;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stream_consumer::{ConsumerBuilder, ConsumerHandle, ConsumerStatus, Message};
use stream_producer::{Producer, ProducerBuilder, PublishError, Published};
use test_support::{wait_for, RedisServer};
use tokio::sync::watch;

/// Member TTL of scenario groups.
pub const TTL: Duration = Duration::from_millis(2000);
/// Heartbeat interval of scenario groups.
pub const HEARTBEAT: Duration = Duration::from_millis(200);
/// Assignment lease of scenario groups.
pub const LEASE: Duration = Duration::from_millis(1500);
/// Rebalance timeout of scenario groups.
pub const REBALANCE_TIMEOUT: Duration = Duration::from_millis(3000);
/// Consumer lease safety margin: a consumer reads at most `LEASE - MARGIN` past its last successful send.
pub const MARGIN: Duration = Duration::from_millis(200);
/// Group mutex TTL: how long a section that died before its write blocks the group.
pub const MUTEX_TTL: Duration = Duration::from_millis(1000);
/// Producers' routing lease.
pub const ROUTING_LEASE: Duration = Duration::from_millis(2000);
/// Generous deadline for conditions expected well within it.
pub const DEADLINE: Duration = Duration::from_secs(15);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub fn timings() -> GroupTimings {
    GroupTimings {
        member_ttl_ms: TTL.as_millis() as u64,
        heartbeat_interval_ms: HEARTBEAT.as_millis() as u64,
        rebalance_timeout_ms: REBALANCE_TIMEOUT.as_millis() as u64,
        assignment_lease_ms: LEASE.as_millis() as u64,
    }
}

/// A coordinator configuration with the scenario timings on `listen`.
pub fn coord_config(redis_url: &str, listen: SocketAddr) -> Config {
    let mut config = Config::new(redis_url);
    config.listen = listen;
    config.tick_interval = Duration::from_millis(50);
    config.mutex_ttl = MUTEX_TTL;
    // With MUTEX_TTL, exactly the 1.5 s lease: `Config::check_timings` refuses a lease a dead section's mutex can
    // outlast.
    config.critical_section_timeout = Duration::from_millis(500);
    config.default_timings = timings();
    config.routing_lease = ROUTING_LEASE;
    config
}

/// One coordinator instance on a fixed address: it can crash and come back on the same URL.
pub struct Coord {
    pub handle: Option<CoordinatorHandle>,
    pub addr: SocketAddr,
    pub redis_url: String,
}

impl Coord {
    /// Starts a coordinator on a free port of `redis_url`.
    pub async fn start(redis_url: &str) -> Coord {
        let handle = CoordinatorHandle::spawn(coord_config(redis_url, "127.0.0.1:0".parse().unwrap()))
            .await
            .expect("coordinator starts");
        Coord {
            addr: handle.addr(),
            handle: Some(handle),
            redis_url: redis_url.to_owned(),
        }
    }

    /// A coordinator address reserved for later ([`Coord::restart_on`]): clients can be given its URL now.
    pub fn reserved(redis_url: &str) -> Coord {
        Coord {
            handle: None,
            addr: SocketAddr::from(([127, 0, 0, 1], test_support::free_port())),
            redis_url: redis_url.to_owned(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api(&self) -> Api {
        Api::new(self.url())
    }

    pub fn handle(&self) -> &CoordinatorHandle {
        self.handle.as_ref().expect("coordinator running")
    }

    pub fn coordinator(&self) -> &coord_server::Coordinator {
        self.handle().coordinator()
    }

    pub fn is_running(&self) -> bool {
        self.handle.is_some()
    }

    /// Crashes it (no drain, mutexes left to their TTL).
    pub fn abort(&mut self) {
        self.handle.take().expect("coordinator running").abort();
    }

    /// Graceful shutdown (terminating, entered sections finish, server closes).
    pub async fn shutdown(&mut self) {
        self.handle.take().expect("coordinator running").shutdown().await;
    }

    /// Starts it again on the same address, on `redis_url` (the same Redis unless a failover moved it).
    pub async fn restart_on(&mut self, redis_url: &str) {
        assert!(self.handle.is_none(), "restart of a running coordinator");
        self.redis_url = redis_url.to_owned();
        let addr = self.addr;
        let url = redis_url.to_owned();
        let handle = wait_for(DEADLINE, "the coordinator to bind its old address", || {
            let config = coord_config(&url, addr);
            async move { CoordinatorHandle::spawn(config).await.ok() }
        })
        .await;
        self.handle = Some(handle);
    }

    pub async fn restart(&mut self) {
        let url = self.redis_url.clone();
        self.restart_on(&url).await;
    }
}

/// Redis, coordinators and one group.
pub struct Scenario {
    pub redis: RedisServer,
    pub coords: Vec<Coord>,
    pub stream: StreamName,
    pub group: GroupName,
    pub shards: u32,
}

impl Scenario {
    /// A Redis, one coordinator and the group `<name>-group` on `<name>-stream` with `shards` shards.
    pub async fn start(name: &str, shards: u32) -> Scenario {
        init_tracing();
        let redis = RedisServer::start().await;
        Self::on(redis, name, shards).await
    }

    /// As [`Scenario::start`], on a given Redis.
    pub async fn on(redis: RedisServer, name: &str, shards: u32) -> Scenario {
        init_tracing();
        let coord = Coord::start(&redis.url()).await;
        let s = Scenario {
            redis,
            coords: vec![coord],
            stream: StreamName::new(format!("{name}-stream")).unwrap(),
            group: GroupName::new(format!("{name}-group")).unwrap(),
            shards,
        };
        s.coordinator()
            .create_group(
                &s.stream,
                &s.group,
                &CreateGroupRequest {
                    shard_count: Some(shards),
                    timings: Some(timings()),
                },
            )
            .await
            .expect("group created");
        s
    }

    /// The first running coordinator.
    pub fn coord(&self) -> &Coord {
        self.coords
            .iter()
            .find(|c| c.is_running())
            .expect("a coordinator is running")
    }

    pub fn coordinator(&self) -> &coord_server::Coordinator {
        self.coord().coordinator()
    }

    /// A wire client of the first running coordinator, bound to the group.
    pub fn api(&self) -> GroupApi {
        self.api_of(
            self.coords
                .iter()
                .position(Coord::is_running)
                .expect("a coordinator is running"),
        )
    }

    /// A wire client of coordinator `i`, bound to the group.
    pub fn api_of(&self, i: usize) -> GroupApi {
        GroupApi {
            api: self.coords[i].api(),
            stream: self.stream.to_string(),
            group: self.group.to_string(),
        }
    }

    /// Starts one more coordinator on the same Redis; returns its index.
    pub async fn add_coordinator(&mut self) -> usize {
        self.add_coordinator_with(|_| {}).await
    }

    /// Starts one more coordinator on the same Redis with a changed configuration; returns its index.
    pub async fn add_coordinator_with(&mut self, change: impl FnOnce(&mut Config)) -> usize {
        let mut config = coord_config(&self.redis.url(), "127.0.0.1:0".parse().unwrap());
        change(&mut config);
        let handle = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
        self.coords.push(Coord {
            addr: handle.addr(),
            handle: Some(handle),
            redis_url: self.redis.url(),
        });
        self.coords.len() - 1
    }

    /// Reserves the address of one more coordinator on the same Redis, not started; returns its index.
    pub fn reserve_coordinator(&mut self) -> usize {
        self.coords.push(Coord::reserved(&self.redis.url()));
        self.coords.len() - 1
    }

    /// Every coordinator URL, running or not (what clients are configured with).
    pub fn urls(&self) -> Vec<String> {
        self.coords.iter().map(Coord::url).collect()
    }

    /// The group as stored (read by a running coordinator).
    pub async fn describe(&self) -> GroupDescription {
        self.coordinator()
            .describe_group(&self.stream, &self.group)
            .await
            .expect("describe group")
    }

    pub fn shard_key(&self, shard: u32) -> String {
        keys::shard_stream(&self.stream, ShardId(shard))
    }

    pub fn metadata_key(&self) -> String {
        keys::group_metadata(&self.stream, &self.group)
    }

    /// Glob of the group's metadata and liveness hashes (not its mutex).
    pub fn group_state_pattern(&self) -> String {
        format!("redis-stream:coord:{{{}:{}}}:[ml][ei]*", self.stream, self.group)
    }

    /// A consumer builder with the scenario timings on every coordinator URL and the scenario's Redis, without a
    /// handler ([`Scenario::spawn_with`] adds the recording one).
    pub fn builder(&self, member: &str) -> ConsumerBuilder {
        consumer_builder(&self.stream, &self.group, member, self.urls(), self.redis.url())
    }

    /// Adds a handler recording into `history` (waiting for `gate` inside every message) to `builder`, builds
    /// and spawns it.
    pub fn spawn_with(builder: ConsumerBuilder, member: &str, history: &History, gate: &Gate) -> ConsumerHandle {
        let slot = StatusSlot::default();
        let consumer = builder
            .handler(recording_handler(member, history, gate.clone(), &slot))
            .build()
            .expect("valid consumer configuration");
        let _ = slot.0.set(consumer.status());
        consumer.spawn()
    }

    /// A consumer recording into `history`, spawned.
    pub fn spawn_consumer(&self, member: &str, history: &History) -> ConsumerHandle {
        Self::spawn_with(self.builder(member), member, history, &Gate::open())
    }

    /// A consumer recording into `history` whose handler waits for `gate`, spawned.
    pub fn spawn_gated(&self, member: &str, history: &History, gate: &Gate) -> ConsumerHandle {
        Self::spawn_with(self.builder(member), member, history, gate)
    }

    /// A producer builder on every coordinator URL and the scenario's Redis.
    pub fn producer(&self) -> ProducerBuilder {
        Producer::builder(self.stream.as_str())
            .coordinators(self.urls())
            .redis(self.redis.url())
            .coordinator_timeout(Duration::from_millis(400))
            .refresh_retry(Duration::from_millis(20), Duration::from_millis(200))
    }

    /// Pending entries of the group over every shard (`XPENDING` summary).
    pub async fn pending_total(&self) -> u64 {
        let mut con = self.redis.connection().await;
        let mut total = 0;
        for s in 0..self.shards {
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

    /// Whether the group's metadata hash exists.
    pub async fn metadata_exists(&self) -> bool {
        let mut con = self.redis.connection().await;
        let n: i64 = redis::cmd("EXISTS")
            .arg(self.metadata_key())
            .query_async(&mut con)
            .await
            .expect("EXISTS");
        n == 1
    }
}

/// Where a recording handler finds its consumer's status (set once the consumer is built).
#[derive(Clone, Default)]
pub struct StatusSlot(Arc<OnceLock<watch::Receiver<ConsumerStatus>>>);

impl StatusSlot {
    pub fn lease_until(&self) -> Option<Instant> {
        self.0.get().and_then(|rx| rx.borrow().lease_expires_at)
    }
}

/// A handler that records every invocation into `history` (with the member's lease end as its consumer knows
/// it) and waits for `gate` before finishing.
pub fn recording_handler(
    member: &str,
    history: &History,
    gate: Gate,
    status: &StatusSlot,
) -> impl Fn(Message) -> futures::future::BoxFuture<'static, Result<(), std::io::Error>> + Send + Sync + 'static {
    let history = history.clone();
    let who = member.to_owned();
    let status = status.clone();
    move |msg: Message| {
        let history = history.clone();
        let who = who.clone();
        let gate = gate.clone();
        let lease = status.lease_until();
        Box::pin(async move {
            let handling = history.begin(&who, &msg, lease);
            gate.wait().await;
            handling.succeeded();
            Ok(())
        })
    }
}

/// A consumer builder with the scenario timings and no handler.
pub fn consumer_builder(
    stream: &StreamName,
    group: &GroupName,
    member: &str,
    coordinators: Vec<String>,
    redis_url: String,
) -> ConsumerBuilder {
    stream_consumer::Consumer::builder(stream.as_str(), group.as_str())
        .coordinators(coordinators)
        .redis(redis_url)
        .member_id(member)
        .heartbeat_interval(HEARTBEAT)
        .member_ttl(TTL)
        .assignment_lease(LEASE)
        .lease_safety_margin(MARGIN)
        .request_timeout(Duration::from_millis(400))
        .read_block(Duration::from_millis(300))
        .drain_timeout(Duration::from_secs(5))
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(200))
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

/// Waits until `handle`'s status satisfies `f`; the panic shows the last status.
pub async fn wait_status(
    handle: &ConsumerHandle,
    timeout: Duration,
    what: &str,
    f: impl Fn(&ConsumerStatus) -> bool,
) -> ConsumerStatus {
    let mut rx = handle.watch_status();
    let waited = tokio::time::timeout(timeout, async {
        loop {
            {
                let s = rx.borrow_and_update();
                if f(&s) {
                    return s.clone();
                }
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    })
    .await;
    match waited {
        Ok(s) => s,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}; last status: {:#?}",
            *rx.borrow()
        ),
    }
}

/// Publishes `n` records with keys `key-0..key-<keys>` (the key also in field `key`, a sequence number in
/// `n`), recording every acknowledged one. Returns how many were acknowledged.
pub async fn publish(producer: &Producer, history: &History, from: u64, n: u64, keys: u64) -> u64 {
    let mut acked = 0;
    for i in from..from + n {
        if publish_one(producer, history, i, keys).await.is_ok() {
            acked += 1;
        }
    }
    acked
}

/// Publishes record `i` (key `key-<i % keys>`), recording it if acknowledged.
pub async fn publish_one(producer: &Producer, history: &History, i: u64, keys: u64) -> Result<Published, PublishError> {
    let key = format!("key-{}", i % keys.max(1));
    let r = producer
        .send(&key, &[("key", key.as_str()), ("n", i.to_string().as_str())])
        .await;
    if let Ok(p) = &r {
        history.published(Some(&key), p);
    }
    r
}

/// A background publisher: one record every `every` until stopped, counting outcomes.
pub struct Publisher {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Outcomes>,
}

/// What a [`Publisher`] saw.
#[derive(Debug, Default, Clone)]
pub struct Outcomes {
    pub written: u64,
    pub not_written: u64,
    pub unknown: u64,
    pub routing_unavailable: u64,
}

impl Publisher {
    pub fn spawn(producer: Arc<Producer>, history: &History, every: Duration, keys: u64) -> Publisher {
        let stop = tokio_util::sync::CancellationToken::new();
        let history = history.clone();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut o = Outcomes::default();
                let mut i = 0;
                while !stop.is_cancelled() {
                    match publish_one(&producer, &history, i, keys).await {
                        Ok(_) => o.written += 1,
                        Err(e) => {
                            if e.is_routing_unavailable() {
                                o.routing_unavailable += 1;
                            }
                            match e.write_state() {
                                stream_producer::WriteState::Unknown => o.unknown += 1,
                                _ => o.not_written += 1,
                            }
                        }
                    }
                    i += 1;
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(every) => {}
                    }
                }
                o
            })
        };
        Publisher { stop, task }
    }

    pub async fn stop(self) -> Outcomes {
        self.stop.cancel();
        self.task.await.expect("publisher task")
    }
}

/// Waits until every acknowledged publish was handled successfully.
pub async fn wait_all_handled(history: &History, timeout: Duration) {
    test_support::wait_until(timeout, "every acknowledged publish to be handled", || {
        let done = history.all_published_handled();
        async move { done }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------------------------
// Level 2: wire-level client.

/// A client of one coordinator URL speaking the wire types.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

/// An error answer: HTTP status and typed body.
pub type Refusal = (StatusCode, ErrorResponse);

impl Api {
    pub fn new(base: impl Into<String>) -> Self {
        Api {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("http client"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends and decodes: `Ok` for 2xx, `Err` with the typed error otherwise; panics when nothing answers.
    pub async fn send<T: serde::de::DeserializeOwned>(&self, rb: reqwest::RequestBuilder) -> Result<T, Refusal> {
        let resp = rb.send().await.expect("the coordinator answers");
        decode(resp).await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url(protocol::routes::METRICS))
            .send()
            .await
            .expect("metrics answered")
            .text()
            .await
            .expect("metrics body")
    }
}

pub async fn decode<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T, Refusal> {
    let status = resp.status();
    let text = resp.text().await.expect("body");
    if status.is_success() {
        Ok(serde_json::from_str(&text).unwrap_or_else(|e| panic!("cannot decode {text}: {e}")))
    } else {
        let body: ErrorResponse =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not an ErrorResponse ({status}): {text}: {e}"));
        Err((status, body))
    }
}

/// A wire client bound to the scenario's group.
#[derive(Clone)]
pub struct GroupApi {
    pub api: Api,
    pub stream: String,
    pub group: String,
}

impl GroupApi {
    fn group_path(&self) -> String {
        protocol::routes::group(&self.stream, &self.group)
    }

    pub fn heartbeat_request(&self, req: &HeartbeatRequest) -> reqwest::RequestBuilder {
        self.api
            .http
            .post(self.api.url(&protocol::routes::heartbeat(&self.stream, &self.group)))
            .json(req)
    }

    pub async fn heartbeat(&self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Refusal> {
        self.api.send(self.heartbeat_request(req)).await
    }

    /// A heartbeat that must be answered 200.
    pub async fn hb(&self, req: &HeartbeatRequest) -> HeartbeatResponse {
        match self.heartbeat(req).await {
            Ok(r) => r,
            Err((status, body)) => panic!("heartbeat {req:?} refused: {status} {body:?}"),
        }
    }

    /// Retries a heartbeat while the answer is a retryable 503 (a mutex left by a dead section, a restart).
    pub async fn hb_retrying(&self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Refusal> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match self.heartbeat(req).await {
                Err((status, body)) if status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline => {
                    let _ = body;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    pub async fn describe(&self) -> Result<GroupDescription, Refusal> {
        self.api.send(self.api.http.get(self.api.url(&self.group_path()))).await
    }

    pub async fn create(&self, shards: u32) -> Result<GroupDescription, Refusal> {
        let req = CreateGroupRequest {
            shard_count: Some(shards),
            timings: Some(timings()),
        };
        self.api
            .send(self.api.http.post(self.api.url(&self.group_path())).json(&req))
            .await
    }

    pub async fn recreate(&self, shards: u32) -> Result<GroupDescription, Refusal> {
        let req = RecreateGroupRequest {
            confirm: true,
            shard_count: shards,
            timings: Some(timings()),
        };
        self.api
            .send(
                self.api
                    .http
                    .post(self.api.url(&protocol::routes::recreate(&self.stream, &self.group)))
                    .json(&req),
            )
            .await
    }

    pub fn fence_request(&self, member: &str, if_match: Option<u64>) -> reqwest::RequestBuilder {
        let rb = self.api.http.post(
            self.api
                .url(&protocol::routes::fence(&self.stream, &self.group, member)),
        );
        match if_match {
            Some(rev) => rb.header("If-Match", format!("\"{rev}\"")),
            None => rb,
        }
    }

    pub async fn fence(&self, member: &str, if_match: Option<u64>) -> Result<GroupDescription, Refusal> {
        self.api.send(self.fence_request(member, if_match)).await
    }

    pub async fn add_shards(
        &self,
        count: u32,
        if_match: Option<u64>,
    ) -> Result<protocol::messages::RoutingDescription, Refusal> {
        let rb = self
            .api
            .http
            .post(self.api.url(&protocol::routes::shards(&self.stream)))
            .json(&protocol::messages::AddShardsRequest { count });
        let rb = match if_match {
            Some(rev) => rb.header("If-Match", format!("\"{rev}\"")),
            None => rb,
        };
        self.api.send(rb).await
    }

    pub async fn describe_routing(&self) -> Result<protocol::messages::RoutingDescription, Refusal> {
        self.api
            .send(self.api.http.get(self.api.url(&protocol::routes::stream(&self.stream))))
            .await
    }

    pub async fn routing(
        &self,
        version: u64,
        max_observed: u64,
    ) -> Result<protocol::messages::RoutingResponse, Refusal> {
        self.api
            .send(self.api.http.get(self.api.url(&protocol::routes::routing_with(
                &self.stream,
                &protocol::messages::RoutingQuery {
                    routing_version: protocol::RoutingVersion(version),
                    max_observed_version: protocol::RoutingVersion(max_observed),
                },
            ))))
            .await
    }
}

/// A consumer played by the test over the wire: it keeps what a well-behaved client keeps (epoch, versions,
/// what it reads) and builds the next request from the last answer.
#[derive(Debug, Clone)]
pub struct WireMember {
    pub id: MemberId,
    pub instance: String,
    pub epoch: MemberEpoch,
    pub version: MetadataVersion,
    pub max_observed: MetadataVersion,
    /// Shards it reads.
    pub reading: BTreeSet<ShardId>,
    /// Shards it was told to drain and has not reported released yet.
    pub revoking: BTreeSet<ShardId>,
    pub last: Option<HeartbeatResponse>,
}

impl WireMember {
    pub fn new(name: &str) -> WireMember {
        WireMember {
            id: MemberId::new(name).unwrap(),
            instance: format!("{name}-i"),
            epoch: MemberEpoch::JOIN,
            version: MetadataVersion(0),
            max_observed: MetadataVersion(0),
            reading: BTreeSet::new(),
            revoking: BTreeSet::new(),
            last: None,
        }
    }

    /// The next request: current epoch and versions, what it reads, and its revoking shards as `state`.
    pub fn request(&self, state: RevokeState) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: self.id.clone(),
            instance_id: self.instance.clone(),
            member_epoch: self.epoch,
            metadata_version: self.version,
            max_observed_version: self.max_observed.max(self.version),
            owned: self.reading.iter().copied().collect(),
            revoking: self
                .revoking
                .iter()
                .map(|&shard| RevokingShard { shard, state })
                .collect(),
        }
    }

    /// Applies an answer the way the SDK does: every status stops reading what is not assigned or is to be
    /// drained; a shard to drain that is not read is acknowledged at once; a shard reported `REVOKED` is forgotten
    /// once an answer stops listing it in `revoke`; only `OK` starts (or resumes) assigned shards.
    pub fn apply(&mut self, r: &HeartbeatResponse, reported: RevokeState) {
        self.epoch = r.member_epoch;
        self.version = r.metadata_version;
        self.max_observed = self.max_observed.max(r.metadata_version);
        let assigned: BTreeSet<ShardId> = r.assigned.iter().copied().collect();
        let revoke: BTreeSet<ShardId> = r.revoke.iter().copied().collect();
        if reported == RevokeState::Revoked {
            self.revoking.retain(|s| revoke.contains(s));
        }
        let stop: Vec<ShardId> = self
            .reading
            .iter()
            .filter(|s| !assigned.contains(s) || revoke.contains(s))
            .copied()
            .collect();
        for s in stop {
            self.reading.remove(&s);
            self.revoking.insert(s);
        }
        self.revoking.extend(revoke.iter().copied());
        if r.status == Status::Ok {
            for s in &assigned {
                self.revoking.remove(s);
                self.reading.insert(*s);
            }
        }
        self.last = Some(r.clone());
    }

    /// Sends the next heartbeat (revoking shards reported `state`) and applies a 200 answer.
    pub async fn beat(&mut self, api: &GroupApi, state: RevokeState) -> Result<HeartbeatResponse, Refusal> {
        let r = api.heartbeat(&self.request(state)).await;
        if let Ok(resp) = &r {
            self.apply(resp, state);
        }
        r
    }

    /// A heartbeat reporting everything drained, which must be answered 200.
    pub async fn ok(&mut self, api: &GroupApi) -> HeartbeatResponse {
        let req = self.request(RevokeState::Revoked);
        let r = api.hb(&req).await;
        self.apply(&r, RevokeState::Revoked);
        r
    }

    /// Like [`WireMember::ok`], retrying retryable 503s.
    pub async fn ok_retrying(&mut self, api: &GroupApi) -> HeartbeatResponse {
        let req = self.request(RevokeState::Revoked);
        match api.hb_retrying(&req).await {
            Ok(r) => {
                self.apply(&r, RevokeState::Revoked);
                r
            }
            Err(e) => panic!("heartbeat {req:?} refused: {e:?}"),
        }
    }

    /// Forgets everything (a new process with the same id).
    pub fn restart(&mut self, instance: &str) {
        let id = self.id.clone();
        *self = WireMember::new(id.as_str());
        self.instance = instance.to_owned();
    }
}

/// No shard is readable by two members: every shard is in at most one member's `assigned` view, and a shard is
/// in a member's `assigned` only if Redis records that member as its owner.
pub fn assert_no_split(g: &GroupDescription) {
    let owners: BTreeMap<ShardId, Option<&MemberId>> = g.shards.iter().map(|s| (s.shard, s.owner.as_ref())).collect();
    let mut readable: BTreeMap<ShardId, &MemberId> = BTreeMap::new();
    for m in &g.members {
        for s in &m.assigned {
            if let Some(other) = readable.insert(*s, &m.member_id) {
                panic!("shard {s} assigned to both {other} and {}: {g:#?}", m.member_id);
            }
            assert_eq!(
                owners.get(s).copied().flatten(),
                Some(&m.member_id),
                "shard {s} assigned to {} but owned by someone else: {g:#?}",
                m.member_id
            );
        }
    }
}

/// Members' readers, as wire members see them: no shard read by two.
pub fn assert_no_two_readers(members: &[&WireMember]) {
    let mut seen: BTreeMap<ShardId, &MemberId> = BTreeMap::new();
    for m in members {
        for s in &m.reading {
            if let Some(other) = seen.insert(*s, &m.id) {
                panic!("shard {s} read by both {other} and {}", m.id);
            }
        }
    }
}

/// Owner per shard, as stored.
pub fn owners(g: &GroupDescription) -> Vec<Option<String>> {
    g.shards
        .iter()
        .map(|s| s.owner.as_ref().map(|m| m.to_string()))
        .collect()
}

/// Targets per shard, as stored.
pub fn targets(g: &GroupDescription) -> Vec<Option<String>> {
    g.shards
        .iter()
        .map(|s| s.target.as_ref().map(|m| m.to_string()))
        .collect()
}

pub fn member<'a>(g: &'a GroupDescription, id: &str) -> Option<&'a protocol::messages::MemberDescription> {
    g.members.iter().find(|m| m.member_id.as_str() == id)
}

pub fn shard_set(v: &[ShardId]) -> BTreeSet<u32> {
    v.iter().map(|s| s.0).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// Write-boundary faults.

/// A fault that fires on the first writing section of one coordinator matching a predicate at a point, and lets
/// the test wait until it fired.
pub struct Trigger {
    fired: watch::Receiver<usize>,
    /// Transitions it fired on (clones), for assertions.
    pub seen: Arc<Mutex<Vec<Transition>>>,
    _guard: FaultGuard,
}

impl Trigger {
    /// Fires `action` at `point` on the first `times` sections whose transition satisfies `pred`.
    pub fn new(
        coordinator: &coord_server::Coordinator,
        point: Point,
        action: Action,
        times: usize,
        pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
    ) -> Trigger {
        let (tx, rx) = watch::channel(0usize);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_in_hook = Arc::clone(&seen);
        let guard = fault::install(coordinator, move |site: &Site<'_>| {
            if site.point != point || !pred(site.transition) {
                return Action::Continue;
            }
            let mut fire = false;
            tx.send_if_modified(|n| {
                if *n < times {
                    *n += 1;
                    fire = true;
                    true
                } else {
                    false
                }
            });
            if fire {
                seen_in_hook.lock().unwrap().push(site.transition.clone());
                action
            } else {
                Action::Continue
            }
        });
        Trigger {
            fired: rx,
            seen,
            _guard: guard,
        }
    }

    /// Fires once.
    pub fn once(
        coordinator: &coord_server::Coordinator,
        point: Point,
        action: Action,
        pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
    ) -> Trigger {
        Self::new(coordinator, point, action, 1, pred)
    }

    pub fn count(&self) -> usize {
        *self.fired.borrow()
    }

    /// Waits until it fired at least once.
    pub async fn fired(&self) {
        let mut rx = self.fired.clone();
        tokio::time::timeout(DEADLINE, rx.wait_for(|n| *n >= 1))
            .await
            .expect("the fault fired in time")
            .expect("trigger alive");
    }
}

/// Predicates over a transition, for [`Trigger`]s.
pub mod on {
    use super::*;

    pub fn event(t: &Transition, f: impl Fn(&Event) -> bool) -> bool {
        t.events.iter().any(f)
    }

    pub fn joined(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| event(t, |e| matches!(e, Event::MemberJoined(m) if m.as_str() == name))
    }

    pub fn released_by(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| {
            event(
                t,
                |e| matches!(e, Event::ShardReleased { from, .. } if from.as_str() == name),
            )
        }
    }

    pub fn expired(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| event(t, |e| matches!(e, Event::MemberExpired(m) if m.as_str() == name))
    }

    pub fn fenced(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| {
            event(
                t,
                |e| matches!(e, Event::MemberFenced { member, .. } if member.as_str() == name),
            )
        }
    }

    pub fn correction_opened() -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        |t| event(t, |e| matches!(e, Event::CorrectionOpened { .. }))
    }

    pub fn correction_closed() -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        |t| event(t, |e| matches!(e, Event::CorrectionClosed))
    }

    pub fn routing_adopted() -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        |t| event(t, |e| matches!(e, Event::RoutingAdopted { .. }))
    }

    /// A section that renews `name`'s lease (any heartbeat of it, also one that changes nothing else).
    pub fn renews(name: &'static str) -> impl Fn(&Transition) -> bool + Send + Sync + 'static {
        move |t| t.renew.iter().any(|(m, _)| m.as_str() == name)
    }
}

/// Reads one counter from a `/metrics` text (sum over label sets).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Crashes coordinator `i` at `point` of its first section matching `pred`, while `during` runs (the request
/// that reaches that section, or nothing when a tick will), then starts a new coordinator on the same URL and the
/// same Redis. `during` is abandoned: its answer never comes (the client would time out).
pub async fn crash_at<F>(
    s: &mut Scenario,
    i: usize,
    point: Point,
    pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
    during: F,
) where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let armed = arm_crash(s, i, point, pred);
    let task = tokio::spawn(during);
    crash_when_fired(s, i, armed, task).await;
}

/// The first half of [`crash_at`], for a test that must cause the section itself after arming (e.g. a Redis
/// rollback that a tick would notice at once): the first section of coordinator `i` matching `pred` will hang at
/// `point`.
pub fn arm_crash(
    s: &Scenario,
    i: usize,
    point: Point,
    pred: impl Fn(&Transition) -> bool + Send + Sync + 'static,
) -> Trigger {
    Trigger::once(s.coords[i].coordinator(), point, Action::Hang, pred)
}

/// The second half of [`crash_at`]: once `armed` fired, aborts coordinator `i` and `task`, and starts a new
/// coordinator on the same URL.
pub async fn crash_when_fired<T>(s: &mut Scenario, i: usize, armed: Trigger, task: tokio::task::JoinHandle<T>) {
    armed.fired().await;
    s.coords[i].abort();
    task.abort();
    // Uninstalled before anything else can take the dead coordinator's place (its address could be reused).
    drop(armed);
    s.coords[i].restart().await;
}

/// A heartbeat sent in the background (its answer may never come).
pub fn send_heartbeat(api: &GroupApi, req: HeartbeatRequest) -> impl std::future::Future<Output = ()> + Send + 'static {
    let api = api.clone();
    async move {
        let _ = api.heartbeat(&req).await;
    }
}

/// Heartbeats (a copy of) `m` every heartbeat interval in the background, so its lease holds while the test
/// looks elsewhere. Abort the handle to stop.
pub fn keep_alive(api: &GroupApi, m: &WireMember) -> tokio::task::JoinHandle<()> {
    let api = api.clone();
    let mut m = m.clone();
    tokio::spawn(async move {
        loop {
            m.ok_retrying(&api).await;
            tokio::time::sleep(HEARTBEAT).await;
        }
    })
}
