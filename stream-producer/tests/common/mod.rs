//! Shared setup of the producer's integration tests: a real `redis-server` and an in-process coordinator.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use coord_server::server::CoordinatorHandle;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::{keys, ShardId};
use stream_producer::{Producer, ProducerBuilder};
use test_support::RedisServer;

/// Generous deadline for conditions that should hold within a fraction of it.
pub const DEADLINE: Duration = Duration::from_secs(10);

pub const STREAM: &str = "orders";

pub fn stream() -> StreamName {
    StreamName::new(STREAM).expect("valid stream name")
}

/// Gives the producer a version store of its own. Every test here uses the stream name [`STREAM`] against its
/// own Redis; with the default, process-wide store, tests sharing a process (`cargo test`) would report each
/// other's routing versions. nextest runs each test in its own process, where this changes nothing.
pub fn isolated(builder: ProducerBuilder) -> ProducerBuilder {
    builder.version_store(stream_producer::MemoryVersionStore::new())
}

/// A coordinator configuration for tests: fast ticks and the given routing lease.
pub fn coordinator_config(redis_url: &str, lease: Duration, listen: SocketAddr) -> coord_server::Config {
    let mut config = coord_server::Config::new(redis_url);
    config.listen = listen;
    config.tick_interval = Duration::from_millis(50);
    config.routing_lease = lease;
    config
}

pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid address")
}

/// Redis, a coordinator on it, and a stream with `shards` shards.
pub struct Env {
    pub redis: RedisServer,
    pub coordinator: CoordinatorHandle,
}

impl Env {
    pub async fn start(shards: u32, lease: Duration) -> Env {
        Env::start_on(RedisServer::start().await, shards, lease).await
    }

    /// As [`Env::start`], on a Redis with an append-only file: [`RedisServer::restart`] keeps its data under a new
    /// run id, which is how a coordinator tells that the routing's Redis lost writes (a failover, a restore).
    pub async fn start_persistent(shards: u32, lease: Duration) -> Env {
        Env::start_on(RedisServer::builder().persistence(true).start().await, shards, lease).await
    }

    /// As [`Env::start`], on a Redis the test configured itself.
    pub async fn start_on(redis: RedisServer, shards: u32, lease: Duration) -> Env {
        let coordinator = CoordinatorHandle::spawn(coordinator_config(&redis.url(), lease, any_port()))
            .await
            .expect("coordinator starts");
        coordinator
            .coordinator()
            .create_group(
                &stream(),
                &GroupName::new("billing").expect("valid group name"),
                &CreateGroupRequest {
                    shard_count: Some(shards),
                    timings: None,
                },
            )
            .await
            .expect("stream routing created");
        Env { redis, coordinator }
    }

    /// A builder pointed at this Redis and coordinator, with a version store of its own ([`isolated`]).
    pub fn producer(&self) -> ProducerBuilder {
        isolated(
            Producer::builder(STREAM)
                .coordinator(self.coordinator.url())
                .redis(self.redis.url()),
        )
    }

    pub async fn add_shards(&self, count: u32) {
        self.coordinator
            .coordinator()
            .add_shards(&stream(), count, None)
            .await
            .expect("shards added");
    }
}

/// Sets the fence of shards `0..shards` to `version`, as the coordinator's seal does.
pub async fn fence(redis: &RedisServer, shards: u32, version: u64) {
    let mut con = redis.connection().await;
    for s in 0..shards {
        let _: u64 = redis::cmd("HSET")
            .arg(keys::shard_fence(&stream(), ShardId(s)))
            .arg(keys::shard_fence_fields::ROUTING_VERSION)
            .arg(version)
            .query_async(&mut con)
            .await
            .expect("HSET fence");
    }
}

/// Entries in one shard stream.
pub async fn xlen(redis: &RedisServer, shard: u32) -> u64 {
    let mut con = redis.connection().await;
    redis::cmd("XLEN")
        .arg(keys::shard_stream(&stream(), ShardId(shard)))
        .query_async(&mut con)
        .await
        .expect("XLEN")
}

/// Entries across shards `0..shards`.
pub async fn total_len(redis: &RedisServer, shards: u32) -> u64 {
    let mut total = 0;
    for s in 0..shards {
        total += xlen(redis, s).await;
    }
    total
}

/// The field `name` of every entry of one shard stream, in order.
pub async fn field_values(redis: &RedisServer, shard: u32, name: &str) -> Vec<String> {
    let mut con = redis.connection().await;
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(keys::shard_stream(&stream(), ShardId(shard)))
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .expect("XRANGE");
    entries
        .into_iter()
        .filter_map(|(_, fields)| fields.into_iter().find(|(n, _)| n == name).map(|(_, v)| v))
        .collect()
}
