//! Issue 33, item 1: tenants of one Redis cannot hurt each other through the shipped ACL users. While tenant b's
//! consumer (the SDK, as `consumer-tenant-b`) is blocked in `XREADGROUP`, every user of tenant a tries to read,
//! write, block on, unblock and kill tenant b's keys and connections; each attempt must be refused with `NOPERM`,
//! and tenant b's reader must be the same connection, still blocked, and still read what b's producer publishes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::ShardId;
use redis::aio::MultiplexedConnection;
use scenario_tests::History;
use stream_producer::Producer;
use test_support::{wait_for, RedisServer};

const GROUP: &str = "billing";
const TENANT_A_USERS: [&str; 3] = ["consumer-tenant-a", "producer-tenant-a", "producer-scripted-tenant-a"];

/// Tenant b's blocked reader: its connection id and address, from `CLIENT LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Blocked {
    id: String,
    addr: String,
}

/// Waits until tenant b's reader of shard 0 is blocked in `XREADGROUP` (`flags=b`) and returns its connection.
async fn blocked_reader(redis: &RedisServer) -> Blocked {
    wait_for(DEADLINE, "tenant b's reader to block in XREADGROUP", || async {
        let mut admin = redis.connection().await;
        let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut admin).await.ok()?;
        let line = list
            .lines()
            .find(|l| l.contains(" name=stream-consumer:b:0 ") && l.contains(" flags=b "))?;
        let field = |name: &str| line.split(' ').find_map(|f| f.strip_prefix(name)).map(str::to_owned);
        Some(Blocked {
            id: field("id=")?,
            addr: field("addr=")?,
        })
    })
    .await
}

/// Every attempt on tenant b by a tenant a user: what it tries, and the command.
fn attempts(b: &Blocked) -> Vec<(&'static str, redis::Cmd)> {
    let stream = StreamName::new(TENANT_B).unwrap();
    let shard = protocol::keys::shard_stream(&stream, ShardId(0));
    let fence = protocol::keys::shard_fence(&stream, ShardId(0));
    let dead = protocol::keys::dead_letter_stream(&stream, ShardId(0));
    let seq = protocol::keys::producer_sequence(&stream, ShardId(0), "p");
    let metadata = protocol::keys::group_metadata(&stream, &GroupName::new(GROUP).unwrap());
    let c = |args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd
    };
    let sha = "0".repeat(40);
    vec![
        (
            "read: XREADGROUP",
            c(&["XREADGROUP", "GROUP", GROUP, "x", "COUNT", "1", "STREAMS", &shard, ">"]),
        ),
        ("read: XRANGE", c(&["XRANGE", &shard, "-", "+"])),
        ("read: XPENDING", c(&["XPENDING", &shard, GROUP])),
        ("read: XINFO STREAM", c(&["XINFO", "STREAM", &shard])),
        ("read: the fence", c(&["HMGET", &fence, "routingVersion"])),
        ("read: a producer's sequence", c(&["HMGET", &seq, "epoch"])),
        ("read: the group's metadata", c(&["HGETALL", &metadata])),
        ("write: XADD", c(&["XADD", &shard, "*", "k", "v"])),
        ("write: XADD dead letter", c(&["XADD", &dead, "*", "k", "v"])),
        ("write: XACK", c(&["XACK", &shard, GROUP, "0-1"])),
        ("write: XGROUP CREATE", c(&["XGROUP", "CREATE", &shard, "other", "0"])),
        ("write: XTRIM", c(&["XTRIM", &shard, "MAXLEN", "0"])),
        ("write: XAUTOCLAIM", c(&["XAUTOCLAIM", &shard, GROUP, "x", "0", "0-0"])),
        ("write: XCLAIM", c(&["XCLAIM", &shard, GROUP, "x", "0", "0-1"])),
        ("write: a producer's sequence", c(&["HSET", &seq, "epoch", "1"])),
        (
            "write: a script on b's keys",
            c(&["EVALSHA", &sha, "3", &shard, &fence, &seq]),
        ),
        ("write: DEL", c(&["DEL", &shard])),
        (
            "block: XREADGROUP BLOCK",
            c(&[
                "XREADGROUP",
                "GROUP",
                GROUP,
                "x",
                "BLOCK",
                "100",
                "STREAMS",
                &shard,
                ">",
            ]),
        ),
        (
            "block: XREAD BLOCK",
            c(&["XREAD", "BLOCK", "100", "STREAMS", &shard, "$"]),
        ),
        ("unblock: CLIENT UNBLOCK", c(&["CLIENT", "UNBLOCK", &b.id])),
        (
            "unblock: CLIENT UNBLOCK ERROR",
            c(&["CLIENT", "UNBLOCK", &b.id, "ERROR"]),
        ),
        ("kill: CLIENT KILL ID", c(&["CLIENT", "KILL", "ID", &b.id])),
        ("kill: CLIENT KILL addr", c(&["CLIENT", "KILL", &b.addr])),
        (
            "kill: CLIENT KILL USER",
            c(&["CLIENT", "KILL", "USER", "consumer-tenant-b"]),
        ),
        ("see connections: CLIENT LIST", c(&["CLIENT", "LIST"])),
        ("everything: FLUSHALL", c(&["FLUSHALL"])),
    ]
}

/// The attempts `conn` (as `user`) was not refused with `NOPERM`.
async fn not_refused(conn: &mut MultiplexedConnection, user: &str, attempts: &[(&str, redis::Cmd)]) -> Vec<String> {
    let mut through = Vec::new();
    for (what, cmd) in attempts {
        let answer: redis::RedisResult<redis::Value> = cmd.query_async(conn).await;
        match answer {
            Err(e) if e.code() == Some("NOPERM") => {}
            other => through.push(format!("{user} {what}: {other:?}")),
        }
    }
    through
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_users_cannot_read_write_block_unblock_or_kill_another_tenants_keys_and_connections() {
    init_tracing();
    let acl = acl_file(&records_dir("acl-isolation"), &[]);
    let redis = RedisServer::builder().aclfile(&acl).start().await;
    let coord = Coord::start(&user_url(redis.port(), "coordinator")).await;
    let stream = StreamName::new(TENANT_B).unwrap();
    let group = GroupName::new(GROUP).unwrap();
    coord
        .coordinator()
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(1),
                timings: Some(timings()),
            },
        )
        .await
        .expect("group created");

    // Tenant b: a producer and a consumer, as its own users, through the SDKs.
    let history = History::new();
    let producer = Producer::builder(TENANT_B)
        .coordinator(coord.url())
        .redis(user_url(redis.port(), "producer-tenant-b"))
        .build()
        .unwrap();
    assert_eq!(publish(&producer, &history, 0, 5, 4).await, 5);
    // A long BLOCK: the reader stays blocked (one connection, one id) while tenant a tries.
    let builder = consumer_builder(
        &stream,
        &group,
        "b",
        vec![coord.url()],
        user_url(redis.port(), "consumer-tenant-b"),
    )
    .read_block(Duration::from_secs(30));
    let consumer = Scenario::spawn_with(builder, "b", &history, &Gate::open());
    wait_all_handled(&history, DEADLINE).await;
    let before = blocked_reader(&redis).await;

    let started = Instant::now();
    let tries = attempts(&before);
    let mut through = Vec::new();
    for user in TENANT_A_USERS {
        let mut conn = connect_as(redis.port(), user).await;
        through.extend(not_refused(&mut conn, user, &tries).await);
    }
    let elapsed = started.elapsed();
    assert!(through.is_empty(), "tenant a reached tenant b: {through:#?}");
    println!(
        "{} attempts x {} users refused in {elapsed:?}",
        tries.len(),
        TENANT_A_USERS.len()
    );

    // b's reader is the same connection, still blocked: nothing unblocked or killed it.
    assert_eq!(blocked_reader(&redis).await, before);
    // And it still reads what b publishes.
    assert_eq!(publish(&producer, &history, 5, 5, 4).await, 5);
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    let mut admin = redis.connection().await;
    let len: u64 = redis::cmd("XLEN")
        .arg(protocol::keys::shard_stream(&stream, ShardId(0)))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(len, 10, "tenant b's shard holds exactly b's records");
    let stop = Instant::now();
    consumer.close().await.expect("b's consumer closes");
    // The stop closed the blocked read's connection: it did not wait out the 30 s BLOCK.
    assert!(
        stop.elapsed() < Duration::from_secs(10),
        "close took {:?}",
        stop.elapsed()
    );
    producer.close().await.unwrap();
}
