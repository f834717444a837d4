//! `deploy/redis/users.acl` and `deploy/redis/redis.conf` on a real Redis: the coordinator runs as its ACL user
//! (create, join, heartbeat, tick, lag scrape, admin calls) without a single `NOPERM`, the producer and consumer
//! users publish and consume, each user is refused what it does not need, and `FLUSHALL` is denied to all of them.
//! Consumer and producer users are per tenant (stream-name prefix): tenant a's users reach none of tenant b's
//! shards or dead-letter streams. A token's group-create mutex works under the coordinator's user too.

mod common;

use common::{follow_up, join, Api};
use coord_server::metrics::names;
use coord_server::server::CoordinatorHandle;
use protocol::names::StreamName;
use protocol::{ShardId, Status};
use redis::aio::MultiplexedConnection;
use redis::{RedisError, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use test_support::{wait_until, RedisServer};

const S: &str = "tenant-a.orders";
/// A stream of the other tenant of `deploy/redis/users.acl`.
const OTHER: &str = "tenant-b.orders";
const G: &str = "billing";
const WAIT: Duration = Duration::from_secs(15);

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/redis").join(file)
}

/// The deployment's ACL file, with one change: the test harness checks readiness over an unauthenticated
/// connection, so the test's `default` user is an admin instead of `off`. The application users are unchanged.
fn test_acl(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(deploy("users.acl")).expect("deploy/redis/users.acl");
    let mut found_default = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("user default ") {
                assert_eq!(l.trim(), "user default off", "the deployment disables the default user");
                found_default = true;
                "user default on nopass ~* &* +@all".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert!(found_default, "users.acl must mention the default user");
    let path = dir.join("users.acl");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write the test ACL file");
    path
}

/// The placeholder password of `user` in the deployment's ACL file.
fn password(user: &str) -> String {
    format!("change-me-{user}")
}

async fn connect(redis: &RedisServer, user: &str) -> MultiplexedConnection {
    let url = format!("redis://{user}:{}@127.0.0.1:{}", password(user), redis.port());
    redis::Client::open(url)
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect as {user}: {e}\n{}", redis.log()))
}

async fn run(conn: &mut MultiplexedConnection, cmd: &mut redis::Cmd) -> Result<Value, RedisError> {
    cmd.query_async(conn).await
}

fn assert_noperm(result: Result<Value, RedisError>, what: &str) {
    match result {
        Err(e) if e.code() == Some("NOPERM") => {}
        other => panic!("{what}: expected NOPERM, got {other:?}"),
    }
}

fn shard_key(shard: u32) -> String {
    protocol::keys::shard_stream(&StreamName::new(S).expect("stream"), ShardId(shard))
}

fn dead_letter_key(shard: u32) -> String {
    protocol::keys::dead_letter_stream(&StreamName::new(S).expect("stream"), ShardId(shard))
}

fn other_tenant_shard_key(shard: u32) -> String {
    protocol::keys::shard_stream(&StreamName::new(OTHER).expect("stream"), ShardId(shard))
}

fn other_tenant_dead_letter_key(shard: u32) -> String {
    protocol::keys::dead_letter_stream(&StreamName::new(OTHER).expect("stream"), ShardId(shard))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_works_with_only_its_acl_and_flushall_is_denied() {
    let dir = tempfile::tempdir().expect("temp dir");
    let acl = test_acl(dir.path());
    let redis = RedisServer::builder()
        .extra_arg("--include")
        .extra_arg(deploy("redis.conf").to_string_lossy().into_owned())
        .extra_arg("--aclfile")
        .extra_arg(acl.to_string_lossy().into_owned())
        .start()
        .await;

    // The configuration fragment is in force.
    let mut admin = redis.connection().await;
    let policy: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut admin)
        .await
        .expect("CONFIG GET");
    assert_eq!(policy, ["maxmemory-policy", "noeviction"]);
    let aof: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut admin)
        .await
        .expect("CONFIG GET");
    assert_eq!(aof, ["appendonly", "yes"]);

    // The coordinator, as its user: start-up checks, create, join, heartbeats, admin calls, ticks, lag.
    let mut config = common::config(&format!(
        "redis://coordinator:{}@127.0.0.1:{}",
        password("coordinator"),
        redis.port()
    ));
    config.tick_interval = Duration::from_millis(50);
    let coord = CoordinatorHandle::spawn(config)
        .await
        .unwrap_or_else(|e| panic!("the coordinator starts as its ACL user: {e}\n{}", redis.log()));
    let api = Api::new(coord.url());
    api.create_group(S, G, 2).await;
    // The maxmemory-policy check (INFO memory) and the never-created check (traces) work under the ACL.
    assert_eq!(api.get("/readyz").await.status(), reqwest::StatusCode::OK);
    let typo = api.heartbeat(S, "no-such-group", &join("a")).await.unwrap_err();
    assert_eq!(typo.1.status, Status::NotFound, "{typo:?}");
    let a1 = api.hb(S, G, &join("a")).await;
    assert_eq!(a1.status, Status::Ok);
    let a2 = api.hb(S, G, &follow_up(&a1, &a1.assigned)).await;
    assert_eq!(a2.status, Status::Ok);
    assert_eq!(a2.assigned.len(), 2);
    let b1 = api.hb(S, G, &join("b")).await;
    assert_eq!(b1.status, Status::Ok);
    assert_eq!(
        api.get("/v1/groups?rebuild=true").await.status(),
        reqwest::StatusCode::OK
    );
    assert_eq!(
        api.get(&protocol::routes::routing(S)).await.status(),
        reqwest::StatusCode::OK
    );
    assert_eq!(api.get("/readyz").await.status(), reqwest::StatusCode::OK);
    let fence = api
        .request(reqwest::Method::POST, &protocol::routes::fence(S, G, "b"))
        .send()
        .await
        .expect("request sent");
    assert_eq!(fence.status(), reqwest::StatusCode::OK);

    // The producer publishes.
    let mut producer = connect(&redis, "producer-tenant-a").await;
    for i in 0..3 {
        run(
            &mut producer,
            redis::cmd("XADD")
                .arg(shard_key(0))
                .arg("MAXLEN")
                .arg("~")
                .arg(1000)
                .arg("*")
                .arg("n")
                .arg(i),
        )
        .await
        .expect("XADD as producer");
    }
    run(
        &mut producer,
        redis::cmd("XTRIM").arg(shard_key(0)).arg("MAXLEN").arg(1000),
    )
    .await
    .expect("XTRIM as producer");

    // The consumer reads, acknowledges, re-delivers and dead-letters.
    let mut consumer = connect(&redis, "consumer-tenant-a").await;
    let ok = |r: Result<Value, RedisError>, what: &str| r.unwrap_or_else(|e| panic!("{what} as consumer: {e}"));
    ok(
        run(
            &mut consumer,
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(shard_key(0))
                .arg(G)
                .arg("0")
                .arg("MKSTREAM"),
        )
        .await,
        "XGROUP CREATE",
    );
    let read = ok(
        run(
            &mut consumer,
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(G)
                .arg("a")
                .arg("COUNT")
                .arg(2)
                .arg("STREAMS")
                .arg(shard_key(0))
                .arg(">"),
        )
        .await,
        "XREADGROUP",
    );
    let ids = entry_ids(&read);
    assert_eq!(ids.len(), 2, "{read:?}");
    ok(
        run(&mut consumer, redis::cmd("XACK").arg(shard_key(0)).arg(G).arg(&ids[0])).await,
        "XACK",
    );
    ok(
        run(&mut consumer, redis::cmd("XPENDING").arg(shard_key(0)).arg(G)).await,
        "XPENDING",
    );
    ok(
        run(
            &mut consumer,
            redis::cmd("XAUTOCLAIM")
                .arg(shard_key(0))
                .arg(G)
                .arg("b")
                .arg(0)
                .arg("0-0"),
        )
        .await,
        "XAUTOCLAIM",
    );
    ok(
        run(
            &mut consumer,
            redis::cmd("XCLAIM")
                .arg(shard_key(0))
                .arg(G)
                .arg("a")
                .arg(0)
                .arg(&ids[1]),
        )
        .await,
        "XCLAIM",
    );
    ok(
        run(&mut consumer, redis::cmd("XINFO").arg("GROUPS").arg(shard_key(0))).await,
        "XINFO GROUPS",
    );
    ok(
        run(&mut consumer, redis::cmd("CLIENT").arg("SETNAME").arg("reader-a-0")).await,
        "CLIENT SETNAME",
    );
    let dead_lettered: Value = redis::pipe()
        .atomic()
        .cmd("XADD")
        .arg(dead_letter_key(0))
        .arg("*")
        .arg("id")
        .arg(&ids[1])
        .cmd("XACK")
        .arg(shard_key(0))
        .arg(G)
        .arg(&ids[1])
        .query_async(&mut consumer)
        .await
        .expect("MULTI XADD dead-letter + XACK EXEC as consumer");
    assert!(matches!(dead_lettered, Value::Array(_)), "{dead_lettered:?}");

    // The coordinator's ticks and lag scrape ran under the ACL without a refusal.
    let url = coord.url();
    wait_until(WAIT, "the lag of shard 0 on /metrics", || {
        let url = url.clone();
        async move {
            let text = reqwest::get(format!("{url}/metrics"))
                .await
                .expect("GET /metrics")
                .text()
                .await
                .expect("body");
            let pending = format!("{}{{stream=\"{S}\",group=\"{G}\",shard=\"0\"}}", names::SHARD_PENDING);
            let members = format!("{}{{stream=\"{S}\",group=\"{G}\"}}", names::MEMBERS);
            text.contains(&pending) && text.contains(&members)
        }
    })
    .await;
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("body");
    let runtime = format!("{}{{phase=\"runtime\"}} 0", names::COMPATIBILITY_FAILURES);
    assert!(
        text.contains(&runtime),
        "the coordinator met NOPERM:\n{text}\n{}",
        redis.log()
    );
    let acl_log: Value = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .expect("ACL LOG");
    assert!(
        matches!(&acl_log, Value::Array(entries) if entries.is_empty()),
        "no command of the cycle was denied: {acl_log:?}"
    );

    // Least privilege: each user is refused what it does not need.
    let mut coordinator = connect(&redis, "coordinator").await;
    let metadata = common::metadata_key(S, G);
    assert_noperm(
        run(&mut coordinator, redis::cmd("DEL").arg(&metadata)).await,
        "coordinator DEL metadata",
    );
    assert_noperm(
        run(
            &mut coordinator,
            redis::cmd("XADD").arg(shard_key(0)).arg("*").arg("k").arg("v"),
        )
        .await,
        "coordinator XADD to a shard",
    );
    assert_noperm(
        run(&mut coordinator, redis::cmd("KEYS").arg("*")).await,
        "coordinator KEYS",
    );
    assert_noperm(
        run(&mut producer, redis::cmd("HGETALL").arg(&metadata)).await,
        "producer reads metadata",
    );
    assert_noperm(
        run(
            &mut producer,
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(G)
                .arg("p")
                .arg("STREAMS")
                .arg(shard_key(0))
                .arg(">"),
        )
        .await,
        "producer XREADGROUP",
    );
    assert_noperm(
        run(
            &mut consumer,
            redis::cmd("XADD").arg(shard_key(0)).arg("*").arg("k").arg("v"),
        )
        .await,
        "consumer XADD to a shard",
    );
    assert_noperm(
        run(
            &mut consumer,
            redis::cmd("HSET").arg(&metadata).arg("aggregate").arg("{"),
        )
        .await,
        "consumer writes metadata",
    );
    assert_noperm(
        run(&mut consumer, redis::cmd("DEL").arg(shard_key(0))).await,
        "consumer DEL a shard",
    );
    // No tenant user may end or close connections: an ACL cannot confine these to the user's own.
    for (what, args) in [
        ("CLIENT UNBLOCK", &["UNBLOCK", "1"][..]),
        ("CLIENT KILL", &["KILL", "ID", "1"][..]),
    ] {
        assert_noperm(
            run(&mut consumer, redis::cmd("CLIENT").arg(args)).await,
            &format!("consumer {what}"),
        );
    }
    // The producer reads its shards' fences and may not write them (only the coordinator's seals do).
    let fence = protocol::keys::shard_fence(&StreamName::new(S).expect("stream"), ShardId(0));
    run(&mut producer, redis::cmd("HMGET").arg(&fence).arg("routingVersion"))
        .await
        .expect("the producer reads a fence");
    assert_noperm(
        run(
            &mut producer,
            redis::cmd("HSET").arg(&fence).arg("routingVersion").arg(0),
        )
        .await,
        "producer writes a fence",
    );
    // The scripted producer holds HSET (its sequence state), yet the fence stays read-only to it, scripts included.
    let mut scripted = connect(&redis, "producer-scripted-tenant-a").await;
    let sequence = protocol::keys::producer_sequence(&StreamName::new(S).expect("stream"), ShardId(0), "p");
    run(&mut scripted, redis::cmd("HSET").arg(&sequence).arg("epoch").arg(1))
        .await
        .expect("the scripted producer writes its sequence state");
    assert_noperm(
        run(
            &mut scripted,
            redis::cmd("HSET").arg(&fence).arg("routingVersion").arg(0),
        )
        .await,
        "scripted producer writes a fence",
    );
    tenant_users_reach_only_their_prefix(&redis, &mut producer, &mut consumer).await;
    for (user, conn) in [
        ("coordinator", &mut coordinator),
        ("consumer-tenant-a", &mut consumer),
        ("producer-tenant-a", &mut producer),
    ] {
        assert_noperm(
            run(conn, &mut redis::cmd("FLUSHALL")).await,
            &format!("{user} FLUSHALL"),
        );
        assert_noperm(run(conn, &mut redis::cmd("FLUSHDB")).await, &format!("{user} FLUSHDB"));
    }
    // Nothing was flushed.
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&metadata)
        .query_async(&mut admin)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 1);
    coord.shutdown().await;
}

/// Tenant a's producer and consumer against tenant b's shards: every command refused, while tenant b's own users
/// work there.
async fn tenant_users_reach_only_their_prefix(
    redis: &RedisServer,
    producer_a: &mut MultiplexedConnection,
    consumer_a: &mut MultiplexedConnection,
) {
    let mut producer_b = connect(redis, "producer-tenant-b").await;
    run(
        &mut producer_b,
        redis::cmd("XADD")
            .arg(other_tenant_shard_key(0))
            .arg("*")
            .arg("k")
            .arg("v"),
    )
    .await
    .expect("XADD as tenant b's producer");
    let mut consumer_b = connect(redis, "consumer-tenant-b").await;
    run(
        &mut consumer_b,
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(other_tenant_shard_key(0))
            .arg(G)
            .arg("0"),
    )
    .await
    .expect("XGROUP CREATE as tenant b's consumer");

    let theirs = other_tenant_shard_key(0);
    assert_noperm(
        run(producer_a, redis::cmd("XTRIM").arg(&theirs).arg("MAXLEN").arg(0)).await,
        "tenant a's producer XTRIMs tenant b's shard",
    );
    assert_noperm(
        run(producer_a, redis::cmd("XADD").arg(&theirs).arg("*").arg("k").arg("v")).await,
        "tenant a's producer XADDs to tenant b's shard",
    );
    assert_noperm(
        run(
            consumer_a,
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(G)
                .arg("a")
                .arg("STREAMS")
                .arg(&theirs)
                .arg(">"),
        )
        .await,
        "tenant a's consumer reads tenant b's shard",
    );
    assert_noperm(
        run(
            consumer_a,
            redis::cmd("XGROUP").arg("CREATE").arg(&theirs).arg("other").arg("0"),
        )
        .await,
        "tenant a's consumer creates a group on tenant b's shard",
    );
    assert_noperm(
        run(
            consumer_a,
            redis::cmd("XADD")
                .arg(other_tenant_dead_letter_key(0))
                .arg("*")
                .arg("k")
                .arg("v"),
        )
        .await,
        "tenant a's consumer dead-letters into tenant b",
    );
    // The prefix is `tenant-a.`, not `tenant-a`: a stream `tenant-ab` is not tenant a's.
    let lookalike = protocol::keys::shard_stream(&StreamName::new("tenant-ab").expect("stream"), ShardId(0));
    assert_noperm(
        run(
            producer_a,
            redis::cmd("XADD").arg(&lookalike).arg("*").arg("k").arg("v"),
        )
        .await,
        "tenant a's producer XADDs to a look-alike prefix",
    );
    let len: i64 = redis::cmd("XLEN")
        .arg(&theirs)
        .query_async(&mut redis.connection().await)
        .await
        .expect("XLEN");
    assert_eq!(len, 1, "tenant b's shard is untouched");
}

/// The entry ids of an `XREADGROUP` reply (one stream).
fn entry_ids(reply: &Value) -> Vec<String> {
    let mut ids = Vec::new();
    if let Value::Array(streams) = reply {
        for stream in streams {
            if let Value::Array(parts) = stream {
                if let Some(Value::Array(entries)) = parts.get(1) {
                    for entry in entries {
                        if let Value::Array(fields) = entry {
                            if let Some(Value::BulkString(id)) = fields.first() {
                                ids.push(String::from_utf8_lossy(id).into_owned());
                            }
                        }
                    }
                }
            }
        }
    }
    ids
}

/// A token's group-create mutex (`coordinator/quota/lock.rs`) is taken, renewed and freed by the coordinator's
/// ACL user: its scripts call only commands that user may run on its keys (a `PEXPIRE` would be `NOPERM`).
#[tokio::test]
async fn the_quota_mutex_works_under_the_coordinators_acl() {
    let dir = tempfile::tempdir().expect("temp dir");
    let acl = test_acl(dir.path());
    let redis = RedisServer::builder()
        .extra_arg("--aclfile")
        .extra_arg(acl.to_string_lossy().into_owned())
        .start()
        .await;
    let url = format!(
        "redis://coordinator:{}@127.0.0.1:{}",
        password("coordinator"),
        redis.port()
    );
    let manager = redis::Client::open(url)
        .expect("URL")
        .get_connection_manager()
        .await
        .unwrap_or_else(|e| panic!("cannot connect as the coordinator: {e}\n{}", redis.log()));
    let store = coord_server::store::Store::new(manager);
    let key = protocol::keys::quota_mutex("tenant-a-admin");
    let ttl = Duration::from_secs(2);
    assert!(store.try_take_quota_mutex(&key, "t1", ttl).await.expect("SET NX PX"));
    assert!(store.renew_quota_mutex(&key, "t1", ttl).await.expect("renewal script"));
    store.release_quota_mutex(&key, "t1").await.expect("release script");
    assert!(
        store.try_take_quota_mutex(&key, "t2", ttl).await.expect("SET NX PX"),
        "freed"
    );
}
