//! The scenario environment: a real `redis-server`, coordinators on fixed addresses (so one can be crashed and
//! brought back on the same URL), and one group with the short timings.

use super::*;

pub use test_support::timings::{HEARTBEAT, LEASE, MARGIN, MEMBER_TTL as TTL, MUTEX_TTL, REBALANCE_TIMEOUT};

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

/// The short group timings of every suite (`test_support::timings`).
pub fn timings() -> GroupTimings {
    test_support::timings::group_timings()
}

/// The test coordinator configuration (`test_support::coordinator`) on `listen`, with the scenarios' routing
/// lease.
pub fn coord_config(redis_url: &str, listen: SocketAddr) -> Config {
    let mut config = test_support::coordinator::config(redis_url, listen);
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

    /// Copies every shard's record (its fence hash) from the scenario's Redis to `to`. For tests whose shard
    /// streams live on another Redis than the coordinator's (a cluster beside a single-node coordinator): fenced
    /// producers check a shard's record where the shard lives (issue 30), as a coordinator writing there would
    /// have left it.
    pub async fn copy_shard_records(&self, to: &mut (impl redis::aio::ConnectionLike + Send)) {
        let mut from = self.redis.connection().await;
        for shard in 0..self.shards {
            let key = keys::shard_fence(&self.stream, ShardId(shard));
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut from)
                .await
                .expect("HGETALL record");
            assert!(!fields.is_empty(), "shard {shard} has its record");
            let mut hset = redis::cmd("HSET");
            hset.arg(&key);
            for (f, v) in fields {
                hset.arg(f).arg(v);
            }
            let _: i64 = hset.query_async(to).await.expect("HSET record");
        }
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
        let keys = (0..self.shards).map(|s| self.shard_key(s));
        test_support::pending_total(&self.redis, keys, self.group.as_str()).await
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
