//! Redis Cluster, issue 15: every Lua script of the project runs in one hash slot (no `CROSSSLOT`), shown on a
//! local 3-master cluster through a redis-rs cluster connection, with the keys and arguments the Rust code passes:
//! the coordinator's `LOAD` / `COMMIT` / `RELEASE` (group and routing sections), `SEAL` / `DRAIN`, and the
//! producer's publish script (plain and idempotent). Every call must succeed.
//!
//! The second test shows what was *not* slot-safe before the coordinator ran on a cluster (docs/cluster.md) and
//! is now: the multi-key pipelines of the coordinator that span slots (refused by the cluster client as one
//! pipeline; the store now sends one per master, or separate commands), the `SCAN` that rebuilds the groups index
//! (one node's keys only; the store scans every master), and the node-local answers (asked of every master).

use std::collections::BTreeSet;

use coord_server::store::traces::{self, Absence, Trace};
use coord_server::store::{script_sources, SectionKeys, Store};
use protocol::keys::{self, LAYOUT_VERSION};
use protocol::names::{GroupName, StreamName};
use protocol::{RoutingVersion, ShardId};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, Script, ServerErrorKind, Value};
use stream_producer::{publish_script_call, publish_script_source, Record};
use test_support::cluster::{key_slot, RedisCluster};

const TTL_MS: u64 = 5000;

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// Fails the test on any error, naming `CROSSSLOT` when it is one.
fn ok<T>(what: &str, r: redis::RedisResult<T>) -> T {
    r.unwrap_or_else(|e| {
        let cross = e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) || e.to_string().contains("CROSSSLOT");
        panic!("{what} failed{}: {e}", if cross { " with CROSSSLOT" } else { "" })
    })
}

/// `LOAD`, `COMMIT` (a new aggregate and one lease), `LOAD` again, `RELEASE`: one critical section, as
/// `Store::try_load` / `Store::commit` / `Store::release` send it.
async fn critical_section(con: &mut ClusterConnection, keys: &SectionKeys, scope: &str, member: Option<&str>) {
    let [(_, load), (_, commit), (_, release), ..] = script_sources();
    let (load, commit, release) = (Script::new(&load), Script::new(&commit), Script::new(&release));
    let token = "00000000000000010000000000000002";
    let mut inv = load.key(&keys.hash);
    inv.key(&keys.liveness)
        .key(&keys.mutex)
        .arg(token)
        .arg(TTL_MS)
        .arg("")
        .arg("")
        .arg(keys.schema)
        .arg(LAYOUT_VERSION)
        .arg(scope);
    if let Some(m) = member {
        inv.arg(m);
    }
    let reply: Vec<Value> = ok(&format!("LOAD {}", keys.hash), inv.invoke_async(con).await);
    assert_eq!(int(&reply[0]), 1, "LOAD took the mutex: {reply:?}");
    let now_ms = text(&reply[1]).parse::<u64>().unwrap() * 1000;
    let run_id = text(&reply[10]);
    assert_eq!(run_id.len(), 40, "{reply:?}");

    let mut inv = commit.key(&keys.hash);
    inv.key(&keys.liveness)
        .key(&keys.mutex)
        .arg(token)
        .arg("")
        .arg("0")
        .arg(r#"{"cluster":true}"#)
        .arg(keys.schema)
        .arg(LAYOUT_VERSION)
        .arg(now_ms)
        .arg(&run_id)
        .arg("");
    match member {
        Some(m) => inv.arg(1).arg(m).arg(now_ms + 10_000),
        None => inv.arg(0),
    };
    let reply: Vec<Value> = ok(&format!("COMMIT {}", keys.hash), inv.invoke_async(con).await);
    assert_eq!(int(&reply[0]), 1, "COMMIT wrote: {reply:?}");
    assert_eq!(text(&reply[1]), "1", "first revision");

    let mut inv = load.key(&keys.hash);
    inv.key(&keys.liveness)
        .key(&keys.mutex)
        .arg(token)
        .arg(TTL_MS)
        .arg("1")
        .arg("")
        .arg(keys.schema)
        .arg(LAYOUT_VERSION)
        .arg(scope);
    if let Some(m) = member {
        inv.arg(m);
    }
    let reply: Vec<Value> = ok(&format!("LOAD {} again", keys.hash), inv.invoke_async(con).await);
    assert_eq!(int(&reply[0]), 1, "{reply:?}");
    assert_eq!(text(&reply[3]), "1", "the committed revision: {reply:?}");
    assert_eq!(
        text(&reply[9]),
        text(&reply[10]),
        "runId is the run id of the slot's master: {reply:?}"
    );
    let released: i64 = ok(
        &format!("RELEASE {}", keys.mutex),
        release
            .key(&keys.mutex)
            .key(&keys.hash)
            .arg(token)
            .invoke_async(con)
            .await,
    );
    assert_eq!(released, 1);
}

/// Loads the publish script on every master (the producer loads it per connection; a cluster connection sends
/// `EVALSHA` straight to the slot's master).
async fn load_publish_script(cluster: &RedisCluster) {
    for &m in &cluster.masters().await {
        let mut con = cluster.node(m).server().connection().await;
        let _: String = ok(
            "SCRIPT LOAD",
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(publish_script_source())
                .query_async(&mut con)
                .await,
        );
    }
}

#[tokio::test]
async fn every_script_runs_in_one_slot_on_a_cluster() {
    let cluster = RedisCluster::start().await;
    let mut con = cluster.connection().await;
    load_publish_script(&cluster).await;
    let [(_, seal), (_, drain), (_, record)] = coord_server::store::reshard::script_sources();
    let (seal, drain, record) = (Script::new(seal), Script::new(drain), Script::new(record));

    let stream = StreamName::new("orders").unwrap();
    let mut masters_used = BTreeSet::new();
    for name in ["billing", "audit", "search", "mail", "ship", "fraud"] {
        let group = GroupName::new(name).unwrap();
        let keys = SectionKeys::group(&stream, &group);
        masters_used.insert(cluster.owner_of_key(&keys.hash).await);
        critical_section(&mut con, &keys, "m", Some("member-1")).await;
    }
    critical_section(&mut con, &SectionKeys::routing(&stream), "", None).await;
    assert_eq!(
        masters_used.len(),
        3,
        "the groups' metadata is spread over every master"
    );

    let group = "billing";
    let mut shard_masters = BTreeSet::new();
    for n in 0..8 {
        let shard = ShardId(n);
        let shard_key = keys::shard_stream(&stream, shard);
        shard_masters.insert(cluster.owner_of_key(&shard_key).await);

        let records = [
            Record::with_key("k").field("f", "v"),
            Record::without_key().field("g", "w"),
        ];
        let pipe = publish_script_call(&stream, shard, RoutingVersion(1), None, &records);
        let reply: Vec<Value> = ok("publish (plain)", pipe.query_async(&mut con).await);
        let Value::Array(items) = &reply[0] else {
            panic!("{reply:?}")
        };
        assert_eq!(text(&items[0]), "WRITTEN", "{reply:?}");

        let pipe = publish_script_call(&stream, shard, RoutingVersion(1), Some(("p-1", "e1", 0)), &records);
        let reply: Vec<Value> = ok("publish (idempotent)", pipe.query_async(&mut con).await);
        let Value::Array(items) = &reply[0] else {
            panic!("{reply:?}")
        };
        assert_eq!(text(&items[0]), "WRITTEN", "{reply:?}");
        let reply: Vec<Value> = ok("publish (idempotent retry)", pipe.query_async(&mut con).await);
        let Value::Array(items) = &reply[0] else {
            panic!("{reply:?}")
        };
        assert_eq!(text(&items[0]), "DUPLICATE", "{reply:?}");

        let _: () = ok(
            "XGROUP CREATE",
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&shard_key)
                .arg(group)
                .arg("0")
                .query_async(&mut con)
                .await,
        );
        let reply: Vec<Value> = ok(
            "SEAL",
            seal.key(&shard_key)
                .key(keys::shard_fence(&stream, shard))
                .arg(2)
                .arg(keys::shard_fence_fields::ROUTING_VERSION)
                .arg(keys::shard_fence_fields::seal(RoutingVersion(2)))
                .arg(keys::shard_fence_fields::FENCE_COUNT)
                .arg(2)
                .invoke_async(&mut con)
                .await,
        );
        let sealed_at = text(&reply[0]);
        let born: Vec<Value> = ok(
            "RECORD",
            record
                .key(keys::shard_fence(&stream, shard))
                .arg(keys::shard_fence_fields::BORN_VERSION)
                .arg(keys::shard_fence_fields::BORN_PARENTS)
                .arg(1)
                .arg(0)
                .arg(keys::shard_fence_fields::BORN_COUNT)
                .arg(2)
                .invoke_async(&mut con)
                .await,
        );
        assert_eq!(text(&born[0]), "1", "{born:?}");
        assert_ne!(sealed_at, "0-0", "four records were written: {reply:?}");
        let reply: Vec<Value> = ok(
            "DRAIN",
            drain
                .key(&shard_key)
                .key(keys::shard_fence(&stream, shard))
                .arg(group)
                .arg(&sealed_at)
                .arg(keys::shard_fence_fields::ROUTING_VERSION)
                .invoke_async(&mut con)
                .await,
        );
        assert_eq!(text(&reply[0]), "2", "the fence SEAL set: {reply:?}");
        assert_eq!(text(&reply[1]), "0-0", "nothing delivered yet: {reply:?}");

        // The fence now refuses an older routing version, atomically with the write: FENCED, nothing written.
        let pipe = publish_script_call(&stream, shard, RoutingVersion(1), None, &records);
        let reply: Vec<Value> = ok("publish (fenced)", pipe.query_async(&mut con).await);
        let Value::Array(items) = &reply[0] else {
            panic!("{reply:?}")
        };
        assert_eq!(text(&items[0]), "FENCED", "{reply:?}");
    }
    assert_eq!(shard_masters.len(), 3, "8 shards land on every master");
}

/// Each of these was not slot-safe before the coordinator ran on a cluster (issue 15) and is now, through
/// `Store::connect("cluster:…")`: shown by calling the store itself, after pinning why it was a problem.
#[tokio::test]
async fn what_was_not_slot_safe_is_now() {
    let cluster = RedisCluster::start().await;
    let mut con = cluster.connection().await;
    let target = format!("cluster:{}", cluster.urls().join(","));
    let store = ok_store("Store::connect", Store::connect(&target).await);
    assert!(store.nodes().is_some(), "a cluster store");
    let stream = StreamName::new("orders").unwrap();
    let group = GroupName::new("billing").unwrap();

    // `Store::index_group`: the two untagged index sets lie in two slots, so one pipeline of both SADDs is refused
    // by the cluster client; the store sends two commands.
    assert_ne!(
        key_slot(keys::groups_index().as_bytes()),
        key_slot(keys::streams_index().as_bytes())
    );
    let refused: redis::RedisResult<()> = redis::pipe()
        .sadd(keys::groups_index(), keys::groups_index_member(&stream, &group))
        .ignore()
        .sadd(keys::streams_index(), stream.as_str())
        .ignore()
        .query_async(&mut con)
        .await;
    let e = refused.expect_err("a pipeline over two slots");
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::CrossSlot), "{e}");
    ok_store("index_group", store.index_group(&stream, &group).await);
    let groups: BTreeSet<String> = ok(
        "SMEMBERS",
        redis::cmd("SMEMBERS")
            .arg(keys::groups_index())
            .query_async(&mut con)
            .await,
    );
    let streams: BTreeSet<String> = ok(
        "SMEMBERS",
        redis::cmd("SMEMBERS")
            .arg(keys::streams_index())
            .query_async(&mut con)
            .await,
    );
    assert!(
        groups.contains(&keys::groups_index_member(&stream, &group)),
        "{groups:?}"
    );
    assert!(streams.contains(stream.as_str()), "{streams:?}");

    // `traces::of_group` / `of_stream` read keys of several tags (and the shards, one slot each): the store sends
    // one pipeline per master.
    let of_group = [
        keys::group_metadata(&stream, &group),
        keys::groups_index(),
        keys::group_liveness(&stream, &group),
        keys::stream_routing(&stream),
    ];
    let slots: BTreeSet<u16> = of_group.iter().map(|k| key_slot(k.as_bytes())).collect();
    assert!(slots.len() > 1, "of_group spans {slots:?}");
    let shards: BTreeSet<u16> = (0..8)
        .map(|n| key_slot(keys::shard_stream(&stream, ShardId(n)).as_bytes()))
        .collect();
    assert_eq!(
        shards.len(),
        8,
        "one slot per shard: a pipeline over shards spans slots"
    );
    assert_eq!(
        ok_store("of_group", traces::of_group(&store, &stream, &group).await),
        Absence::Lost(Trace::Indexed),
        "the index entry written above"
    );
    let never = GroupName::new("never").unwrap();
    assert_eq!(
        ok_store("of_group", traces::of_group(&store, &stream, &never).await),
        Absence::NeverCreated
    );
    // A Redis consumer group on shard 0 is found through the EXISTS and XINFO GROUPS reads over shards.
    let ghost = GroupName::new("ghost").unwrap();
    let _: () = ok(
        "XGROUP CREATE",
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(keys::shard_stream(&stream, ShardId(0)))
            .arg(ghost.as_str())
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut con)
            .await,
    );
    assert_eq!(
        ok_store("of_group", traces::of_group(&store, &stream, &ghost).await),
        Absence::Lost(Trace::ConsumerGroup(ShardId(0)))
    );
    assert_eq!(
        ok_store("of_stream", traces::of_stream(&store, &stream).await),
        Absence::Lost(Trace::Indexed)
    );
    let other = StreamName::new("never-created").unwrap();
    assert_eq!(
        ok_store("of_stream", traces::of_stream(&store, &other).await),
        Absence::NeverCreated
    );

    // `Store::rebuild_index`: SCAN MATCH on one node sees that node's keys. The groups' metadata lands on every
    // master, so no single node's SCAN finds them all; the store scans every master.
    let names = ["billing", "audit", "search", "mail", "ship", "fraud"];
    for name in names {
        let keys = SectionKeys::group(&stream, &GroupName::new(name).unwrap());
        let _: () = ok(
            "HSET",
            redis::cmd("HSET")
                .arg(&keys.hash)
                .arg("revision")
                .arg(1)
                .query_async(&mut con)
                .await,
        );
    }
    let mut union = BTreeSet::new();
    for &m in &cluster.masters().await {
        let mut node = cluster.node(m).server().connection().await;
        let mut found = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = ok(
                "SCAN",
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(keys::group_metadata_pattern())
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut node)
                    .await,
            );
            found.extend(batch);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        assert!(found.len() < names.len(), "node {m} alone finds {found:?}");
        union.extend(found);
    }
    assert_eq!(union.len(), names.len(), "{union:?}");
    let rebuilt: BTreeSet<String> = ok_store("rebuild_index", store.rebuild_index().await)
        .into_iter()
        .collect();
    let want: BTreeSet<String> = names
        .iter()
        .map(|n| keys::groups_index_member(&stream, &GroupName::new(*n).unwrap()))
        .collect();
    assert_eq!(rebuilt, want);

    // Node-local answers: every master is asked, and each answer names its node.
    let masters = cluster.masters().await.len();
    let infos = ok_store("info", store.info("server").await);
    assert_eq!(infos.len(), masters);
    let ports: BTreeSet<u16> = infos.iter().map(|(n, _)| n.as_ref().expect("a node").port).collect();
    let want_ports: BTreeSet<u16> = cluster
        .masters()
        .await
        .iter()
        .map(|&m| cluster.node(m).port())
        .collect();
    assert_eq!(ports, want_ports);
    let run_id = ok_store("run_id", store.run_id().await);
    assert_eq!(run_id.split(',').count(), masters, "{run_id}");
    for &m in &cluster.masters().await {
        let info = cluster.node(m).server().info("server").await;
        let id = info
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .unwrap()
            .trim()
            .to_owned();
        assert!(
            run_id.contains(&format!(":{}={id}", cluster.node(m).port())),
            "{run_id}"
        );
    }
    let present = ok_store(
        "commands_present",
        store.commands_present(&["EVALSHA", "NOSUCHCMD"]).await,
    );
    assert_eq!(present.len(), masters);
    assert!(present.iter().all(|(_, p)| p == &[true, false]), "{present:?}");
    ok_store("check_redis", coord_server::startup::check_redis(&store).await);
    assert_eq!(
        ok_store("memory policy", coord_server::memory_policy::read(&store).await),
        "noeviction"
    );
    // One master with an unsafe policy is named.
    let lax = cluster.masters().await[1];
    let mut node = cluster.node(lax).server().connection().await;
    let _: () = ok(
        "CONFIG SET",
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("allkeys-lru")
            .query_async(&mut node)
            .await,
    );
    assert_eq!(
        ok_store("memory policy", coord_server::memory_policy::read(&store).await),
        format!("allkeys-lru on 127.0.0.1:{}", cluster.node(lax).port())
    );
    let before = ok_store("time_ms", store.time_ms().await);
    assert!(before > 1_600_000_000_000, "{before}");
}

/// Fails the test on a store error, naming the call.
fn ok_store<T>(what: &str, r: Result<T, coord_server::error::StoreError>) -> T {
    r.unwrap_or_else(|e| panic!("{what} failed: {e}"))
}
