//! The data-plane fence against a real redis-server and coordinator: a producer that missed a reshard is refused
//! by the shards it still routes to (nothing written), refreshes at once, and with `reroute_fenced` sends the
//! refused records again with the new routing. The fence is set the way the coordinator's seal sets it (HSET on
//! the shard's fence key).

mod common;

use std::time::Duration;

use common::{fence, field_values, stream, total_len, xlen, Env, DEADLINE};
use protocol::routing::shard_for_key;
use protocol::{keys, ShardId};
use stream_producer::{BatchError, PublishError, Published, Record, WriteState};
use test_support::{wait_until, FaultProxy, Mode};

/// Long enough that no periodic refresh runs during a test: the producer is stale until a fence refuses it.
const LEASE: Duration = Duration::from_secs(60);

fn keyed(round: usize, keys: usize) -> Vec<Record> {
    (0..keys)
        .map(|k| {
            Record::with_key(format!("key-{k}"))
                .field("key", format!("key-{k}"))
                .field("round", round.to_string())
        })
        .collect()
}

/// A stream of 4 shards grown to 8, every old shard sealed at the new routing version; returns that version.
async fn reshard(env: &Env, old_version: u64) -> u64 {
    env.add_shards(4).await;
    let sealed = old_version + 1;
    fence(&env.redis, 4, sealed).await;
    sealed
}

#[tokio::test]
async fn a_stale_producer_is_refused_writes_nothing_and_refreshes_at_once() {
    let env = Env::start(4, LEASE).await;
    // Without the re-route (on by default), the refusal reaches the caller.
    let producer = env.producer().reroute_fenced(false).build().unwrap();
    let before = producer.ready().await.unwrap();
    assert_eq!(before.shard_count, 4);
    let sealed = reshard(&env, before.version.0).await;

    let err = producer.send_batch(keyed(0, 50)).await.unwrap_err();
    assert_eq!(err.count(WriteState::NotWritten), 50, "{err}");
    for outcome in err.outcomes() {
        match outcome.error() {
            Some(PublishError::Fenced {
                routing_version, fence, ..
            }) => {
                assert_eq!(*routing_version, before.version);
                assert_eq!(fence.0, sealed);
            }
            other => panic!("expected Fenced, got {other:?}"),
        }
        assert!(outcome.error().unwrap().is_retryable());
    }
    assert_eq!(total_len(&env.redis, 8).await, 0, "a refused batch writes nothing");

    // The refusal refreshed the routing at once (the lease alone would keep the old one for a minute).
    wait_until(DEADLINE, "the producer adopts the new routing", || {
        let routing = producer.routing();
        async move { routing.is_some_and(|r| r.version.0 >= sealed && r.shard_count == 8) }
    })
    .await;
    let published = producer.send_batch(keyed(1, 50)).await.unwrap();
    for (k, p) in published.iter().enumerate() {
        assert_eq!(p.shard, shard_for_key(format!("key-{k}").as_bytes(), 8));
    }
    assert_eq!(total_len(&env.redis, 8).await, 50);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn reroute_fenced_sends_the_refused_records_again_with_the_new_routing_in_order() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().reroute_fenced(true).build().unwrap();
    let before = producer.ready().await.unwrap();
    let keys = 200;
    producer.send_batch(keyed(0, keys)).await.unwrap();
    let sealed = reshard(&env, before.version.0).await;

    // The producer still routes with 4 shards: every call is refused, refreshed, re-routed and written.
    for round in 1..=3 {
        let published = producer.send_batch(keyed(round, keys)).await.unwrap();
        for (k, p) in published.iter().enumerate() {
            assert_eq!(
                p.shard,
                shard_for_key(format!("key-{k}").as_bytes(), 8),
                "round {round} key {k}"
            );
            assert!(p.routing_version.0 >= sealed);
        }
    }
    assert_eq!(
        total_len(&env.redis, 8).await,
        4 * keys as u64,
        "nothing lost, nothing twice"
    );
    // Per key: round 0 in its old shard, rounds 1..3 in its new shard, in order (a key that stays keeps one shard).
    for shard in 0..8u32 {
        let keys_here = field_values(&env.redis, shard, "key").await;
        let rounds = field_values(&env.redis, shard, "round").await;
        let mut last: std::collections::HashMap<String, u32> = Default::default();
        for (k, r) in keys_here.into_iter().zip(rounds) {
            let r: u32 = r.parse().unwrap();
            if let Some(prev) = last.insert(k.clone(), r) {
                assert!(r > prev, "shard {shard}: {k} round {r} after {prev}");
            }
        }
    }
    // Keys that moved left their old shard at the seal: only round 0 is there.
    for k in 0..keys {
        let key = format!("key-{k}");
        let old = shard_for_key(key.as_bytes(), 4);
        let new = shard_for_key(key.as_bytes(), 8);
        if old != new {
            assert!(new.0 >= 4, "jump hash moves keys only to new shards");
        }
    }
    for shard in 0..4 {
        assert!(xlen(&env.redis, shard).await >= (keys / 8) as u64);
    }
    producer.close().await.unwrap();
}

/// Issue 42: what the example producer does (the batching mode, default settings) across `add-shards`. The
/// records the fence refused were never written, so the producer sends them again itself: none is dropped.
#[tokio::test]
async fn by_default_the_records_a_growth_refused_are_sent_again_and_none_is_dropped() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().build().unwrap();
    assert!(producer.config().reroute_fenced, "on by default");
    let before = producer.ready().await.unwrap();
    let sealed = reshard(&env, before.version.0).await;
    let mut deliveries = Vec::new();
    for record in keyed(0, 100) {
        deliveries.push(producer.enqueue(record).await.unwrap());
    }
    for (k, d) in deliveries.into_iter().enumerate() {
        let p = d.await.unwrap_or_else(|e| panic!("key-{k}: {e:?}"));
        assert!(p.routing_version.0 >= sealed, "key-{k}: {p:?}");
        assert_eq!(p.shard, shard_for_key(format!("key-{k}").as_bytes(), 8), "key-{k}");
    }
    let stats = producer.close().await.unwrap();
    assert_eq!(
        (stats.records_written, stats.records_not_written),
        (100, 0),
        "{stats:?}"
    );
    assert_eq!(total_len(&env.redis, 8).await, 100, "nothing lost, nothing twice");
}

/// A growth seals its parents before the coordinator serves the routing that lists its children, and a routing
/// Redis lost is restored only by the coordinator's next tick: a producer the fence refused meanwhile gets the
/// old routing from its refresh. It waits for the fenced version (backing off within its coordinator timeout)
/// instead of failing the records fenced. Here the fence comes first and the tick restores the version it names
/// from shard 0's fence, as after a lost growth. (A group with no members is not due, so the test runs that tick's
/// look itself, once the producer is waiting: a tick that came before the fence would find nothing to restore.)
#[tokio::test]
async fn reroute_fenced_waits_until_the_coordinator_serves_the_fenced_version() {
    let env = Env::start(4, LEASE).await;
    let producer = std::sync::Arc::new(
        env.producer()
            .reroute_fenced(true)
            .coordinator_timeout(Duration::from_secs(20))
            .build()
            .unwrap(),
    );
    let before = producer.ready().await.unwrap();
    let sealed = before.version.0 + 1;
    fence(&env.redis, 4, sealed).await;
    let refreshes = producer.stats().refreshes;
    let coordinator = env.coordinator.coordinator().clone();
    let waiting = std::sync::Arc::clone(&producer);
    let tick = tokio::spawn(async move {
        // The refusal made the producer refresh and get the old routing: it is waiting for the fenced version.
        wait_until(DEADLINE, "the refused producer refreshed", || {
            let n = waiting.stats().refreshes;
            async move { n > refreshes }
        })
        .await;
        coordinator
            .tend_routing(&stream())
            .await
            .expect("the tick's look at the routing")
    });
    let published = producer
        .send_batch(keyed(1, 50))
        .await
        .expect("the refused records wait for the fenced version and are written");
    tick.await.unwrap();
    let routing = producer.routing().expect("a routing");
    assert!(routing.version.0 >= sealed, "{routing:?}");
    for (k, p) in published.iter().enumerate() {
        assert!(p.routing_version.0 >= sealed, "key {k}: {p:?}");
        let shard = shard_for_key(format!("key-{k}").as_bytes(), routing.shard_count);
        assert_eq!(p.shard, shard, "key {k}");
    }
    assert_eq!(total_len(&env.redis, 8).await, 50, "nothing lost, nothing twice");
    assert!(producer.stats().refreshes >= 2, "{:?}", producer.stats());
    std::sync::Arc::into_inner(producer).unwrap().close().await.unwrap();
}

#[tokio::test]
async fn without_the_fence_a_stale_producer_keeps_writing_moved_keys_to_their_old_shard() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().fencing(false).build().unwrap();
    let before = producer.ready().await.unwrap();
    reshard(&env, before.version.0).await;
    let published = producer.send_batch(keyed(0, 100)).await.unwrap();
    let moved = published
        .iter()
        .enumerate()
        .filter(|(k, p)| p.shard != shard_for_key(format!("key-{k}").as_bytes(), 8))
        .count();
    assert!(
        moved > 0,
        "the plain path writes moved keys to the old shards: what the fence prevents"
    );
    assert!(published.iter().all(|p| p.shard < ShardId(4)));
    producer.close().await.unwrap();
}

/// Clients of `redis` inside MULTI now (`CLIENT LIST` flag `x`).
async fn clients_in_multi(redis: &test_support::RedisServer) -> usize {
    let mut con = redis.connection().await;
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut con).await.unwrap();
    list.lines()
        .filter(|l| {
            l.split(' ')
                .any(|kv| kv.strip_prefix("flags=").is_some_and(|f| f.contains('x')))
        })
        .count()
}

/// Calls of `command` so far that did not answer an error (`INFO commandstats`).
async fn calls(redis: &test_support::RedisServer, command: &str) -> u64 {
    let mut con = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(stats) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        stats
            .split(',')
            .find_map(|f| f.strip_prefix(name))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    // Calls that ran and answered an error do not count: the producer's start-up permission probes send
    // commands Redis refuses after its ACL check (`XADD` with id 0-0, `EXEC` without `MULTI`), which write nothing.
    field("calls=") - field("failed_calls=")
}

/// Sends 40 keyed records through a proxy that holds Redis's replies, waits until both lanes' checks ran in
/// Redis (WATCH set, MULTI open), sets every fence to `fence_to(the producer's routing version)`, then lets the
/// replies through: the answers the producer reads say what the fences were before. Returns the call's result and
/// the fence set.
async fn fence_changed_between_check_and_writes(
    env: &Env,
    fence_to: impl FnOnce(u64) -> u64,
) -> (Result<Vec<Published>, BatchError>, u64) {
    let target = format!("127.0.0.1:{}", env.redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(target).await;
    // The refusals themselves are the subject: no re-route (on by default).
    let producer = std::sync::Arc::new(
        env.producer()
            .connections(2)
            .reroute_fenced(false)
            .redis(proxy.url())
            .build()
            .unwrap(),
    );
    let before = producer.ready().await.unwrap();
    proxy.set_mode(Mode::HoldReplies);
    let batch = {
        let producer = producer.clone();
        tokio::spawn(async move { producer.send_batch(keyed(0, 40)).await })
    };
    wait_until(DEADLINE, "both lanes' checks ran in Redis", || {
        let redis = &env.redis;
        async move { clients_in_multi(redis).await == 2 }
    })
    .await;
    let version = fence_to(before.version.0);
    fence(&env.redis, 4, version).await;
    proxy.set_mode(Mode::Pass);
    let result = batch.await.unwrap();
    std::sync::Arc::into_inner(producer).unwrap().close().await.unwrap();
    (result, version)
}

#[tokio::test]
async fn a_seal_between_the_check_and_the_writes_aborts_the_transaction_and_nothing_is_written() {
    let env = Env::start(4, LEASE).await;
    // The seal raises every fence after the checks read them: the producer sends the writes, WATCH aborts them.
    let (result, sealed) = fence_changed_between_check_and_writes(&env, |v| v + 1).await;
    let err = result.unwrap_err();
    assert_eq!(err.count(WriteState::NotWritten), 40, "{err}");
    for outcome in err.outcomes() {
        match outcome.error() {
            // At least the seal's: a fence above the routing with no growth in it is what a growth Redis lost
            // looks like, and a tick of the new group may restore the routing past it (raising the fences again)
            // before the producer reads them once more.
            Some(PublishError::Fenced { fence, .. }) => assert!(fence.0 >= sealed, "{} < {sealed}", fence.0),
            other => panic!("expected Fenced after the aborted transaction, got {other:?}"),
        }
    }
    assert_eq!(
        calls(&env.redis, "exec").await,
        2,
        "each lane's EXEC ran and was aborted"
    );
    assert_eq!(
        total_len(&env.redis, 4).await,
        0,
        "an aborted transaction writes nothing"
    );
}

#[tokio::test]
async fn a_fence_touched_but_not_raised_between_check_and_writes_sends_the_same_batch_again() {
    let env = Env::start(4, LEASE).await;
    // Written, but to the producer's own version: WATCH aborts the EXEC all the same, the check then passes.
    let (result, _) = fence_changed_between_check_and_writes(&env, |v| v).await;
    let published = result.unwrap();
    assert_eq!(published.len(), 40);
    // Two aborted EXECs (one per lane), their two re-sends, and any later turn for batches queued after them.
    let execs = calls(&env.redis, "exec").await;
    assert!((4..=6).contains(&execs), "{execs} EXECs");
    assert_eq!(total_len(&env.redis, 4).await, 40, "written once, after the abort");
    for shard in 0..4 {
        let expected: Vec<String> = (0..40)
            .map(|k| format!("key-{k}"))
            .filter(|k| shard_for_key(k.as_bytes(), 4) == ShardId(shard))
            .collect();
        assert_eq!(
            field_values(&env.redis, shard, "key").await,
            expected,
            "shard {shard} in order"
        );
    }
}

/// Sends 20 keyed records and returns the error, which must leave all of them not written and Redis empty.
async fn refused_and_nothing_written(env: &Env, producer: &stream_producer::Producer) -> BatchError {
    let err = producer.send_batch(keyed(0, 20)).await.unwrap_err();
    assert_eq!(err.count(WriteState::NotWritten), 20, "{err}");
    assert_eq!(total_len(&env.redis, 4).await, 0, "nothing written");
    err
}

#[tokio::test]
async fn a_fence_that_is_not_a_number_refuses_the_checked_transaction() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    let mut con = env.redis.connection().await;
    for s in 0..4 {
        let _: u64 = redis::cmd("HSET")
            .arg(keys::shard_fence(&stream(), ShardId(s)))
            .arg(keys::shard_fence_fields::ROUTING_VERSION)
            .arg("not-a-version")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let err = refused_and_nothing_written(&env, &producer).await;
    assert!(
        err.outcomes()
            .iter()
            .all(|o| matches!(o.error(), Some(PublishError::Rejected { .. }))),
        "{err}"
    );
    producer.close().await.unwrap();
}

/// One transaction carries the batches of several shards; an `XADD` that fails while `EXEC` runs (the key holds
/// another type) fails its own batch only: the other shards' records ran and are reported written.
#[tokio::test]
async fn an_xadd_failing_inside_exec_fails_its_own_batch_only() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().connections(1).build().unwrap();
    producer.ready().await.unwrap();
    let mut con = env.redis.connection().await;
    let broken = keys::shard_stream(&stream(), ShardId(1));
    let () = redis::cmd("SET")
        .arg(&broken)
        .arg("not a stream")
        .query_async(&mut con)
        .await
        .unwrap();
    let err = producer.send_batch(keyed(0, 40)).await.unwrap_err();
    for (record, outcome) in keyed(0, 40).iter().zip(err.outcomes()) {
        let shard = shard_for_key(record.key().unwrap(), 4);
        match outcome.error() {
            None => assert_ne!(shard, ShardId(1), "written to the broken shard?"),
            Some(PublishError::Rejected { source, .. }) => {
                assert_eq!(shard, ShardId(1), "{source}");
                assert!(source.to_string().contains("WRONGTYPE"), "{source}");
                assert_eq!(source.code(), Some("WRONGTYPE"), "{source:?}");
                assert_eq!(
                    source.kind(),
                    stream_producer::RedisErrorKind::ResponseError,
                    "{source:?}"
                );
                assert!(!outcome.error().is_some_and(PublishError::is_retryable), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }
    let written = err.outcomes().iter().filter(|o| o.error().is_none()).count();
    assert!(written > 0 && written < 40, "{written}");
    let mut total = 0;
    for s in [0u32, 2, 3] {
        total += xlen(&env.redis, s).await;
    }
    assert_eq!(total as usize, written, "what is reported written is in Redis");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn an_xadd_refused_while_queued_aborts_the_whole_transaction() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().build().unwrap();
    producer.ready().await.unwrap();
    // Out of memory: the check's commands pass, every queued XADD is refused, EXEC answers EXECABORT.
    let mut con = env.redis.connection().await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query_async(&mut con)
        .await
        .unwrap();
    let err = refused_and_nothing_written(&env, &producer).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        err.outcomes().iter().all(|o| matches!(
            o.error(),
            Some(PublishError::Rejected { source, .. }) if source.to_string().contains("OOM")
        )),
        "{err}"
    );
    assert_eq!(calls(&env.redis, "xadd").await, 0, "no queued XADD ran");
    // Memory back: the same producer writes.
    producer.send_batch(keyed(1, 20)).await.unwrap();
    assert_eq!(total_len(&env.redis, 4).await, 20);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_check_command_the_server_refuses_stops_the_batch_before_any_xadd() {
    let env = Env::start(4, LEASE).await;
    // A user allowed everything but WATCH: the check fails, and no XADD may go out unchecked.
    let mut con = env.redis.connection().await;
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "nowatch", "on", ">pw", "~*", "&*", "+@all", "-watch"][..])
        .query_async(&mut con)
        .await
        .unwrap();
    let producer = env
        .producer()
        .redis(format!("redis://nowatch:pw@127.0.0.1:{}", env.redis.port()))
        .build()
        .unwrap();
    let err = refused_and_nothing_written(&env, &producer).await;
    assert!(
        err.outcomes().iter().all(|o| matches!(
            o.error(),
            Some(PublishError::Rejected { .. } | PublishError::RedisUnsupported { .. })
        )),
        "{err}"
    );
    assert_eq!(calls(&env.redis, "xadd").await, 0, "no XADD was sent");
    producer.close().await.unwrap();
}

/// Issue 30: a producer learned a growth (4 -> 8) that Redis then lost with everything after it: the routing's
/// commit, the parents' seals and the children's records. A key of child 5 is refused (the shard has no record:
/// no routing Redis knows lists it), and the producer refreshes reporting what it saw. Since issue 39 a report is
/// never evidence: Redis holds nothing of the growth, so the coordinator answers the stored routing and the record
/// is written by it, to a parent: never into a shard the stored routing does not list. Both write paths: the
/// checked transaction and the script.
#[tokio::test]
async fn a_producer_that_learned_a_lost_growth_writes_by_the_stored_routing_never_into_the_lost_child() {
    for idempotent in [false, true] {
        let mut env = common::Env::start_persistent(4, LEASE).await;
        let routing_key = keys::stream_routing(&stream());
        let before: Vec<u8> = redis::cmd("DUMP")
            .arg(&routing_key)
            .query_async(&mut env.redis.connection().await)
            .await
            .unwrap();
        // The child's refusal is the subject: no re-route (on by default).
        let mut builder = env.producer().reroute_fenced(false);
        if idempotent {
            builder = builder.idempotence(true).producer_id("p1");
        }
        let producer = builder.build().unwrap();
        producer.ready().await.unwrap();
        env.add_shards(4).await;
        producer.observe_routing_version(protocol::RoutingVersion(2));
        wait_until(DEADLINE, "the producer routes by 8 shards", || {
            let r = producer.routing();
            async move { r.is_some_and(|r| r.shard_count == 8) }
        })
        .await;

        // The loss in one atomic step: the running coordinator's tick must not see half of it (a routing gone back
        // with the growth's seals and records still there is a loss it restores at once, and the rest of the
        // deletions would then remove what that restoration wrote).
        let mut con = env.redis.connection().await;
        let mut lose = redis::pipe();
        lose.atomic();
        lose.cmd("RESTORE")
            .arg(&routing_key)
            .arg(0)
            .arg(&before)
            .arg("REPLACE")
            .ignore();
        for s in 0..8 {
            let record = keys::shard_fence(&stream(), ShardId(s));
            if s >= 4 {
                lose.cmd("DEL").arg(record).ignore();
            } else {
                lose.cmd("HDEL")
                    .arg(record)
                    .arg(keys::shard_fence_fields::ROUTING_VERSION)
                    .arg(keys::shard_fence_fields::FENCE_COUNT)
                    .ignore();
            }
        }
        let () = lose.query_async(&mut con).await.unwrap();
        // A failover promotes another server: the same data (as lost), another run id.
        drop(con);
        env.redis.restart().await;
        let key = (0..)
            .map(|i| format!("key-{i}"))
            .find(|k| shard_for_key(k.as_bytes(), 8) == ShardId(5))
            .unwrap();
        // Refused, nothing written; the refusal makes the producer refresh at once, reporting version 2 and 8 shards.
        // (The first sends may also fail on the connections the restart broke: not written either.)
        let refused = test_support::wait_for(DEADLINE, "the child's refusal", || async {
            match producer.send(&key, &[("f", "v")]).await {
                Err(e @ PublishError::Fenced { .. }) => Some(e),
                Err(e) => {
                    assert_eq!(e.write_state(), WriteState::NotWritten, "{e:?}");
                    None
                }
                Ok(p) => panic!("written into a shard no routing lists: {p:?}"),
            }
        })
        .await;
        assert!(
            matches!(refused, PublishError::Fenced { shard: ShardId(5), .. }),
            "idempotent {idempotent}: {refused:?}"
        );
        assert_eq!(
            xlen(&env.redis, 5).await,
            0,
            "nothing written into the shard no routing lists"
        );
        wait_until(DEADLINE, "the producer holds the stored routing", || {
            let r = producer.routing();
            async move { r.is_some_and(|r| r.shard_count == 4) }
        })
        .await;
        // (A parent's connection the restart broke may fail the first send: not written.)
        let published = test_support::wait_for(DEADLINE, "a send by the stored routing", || async {
            match producer.send(&key, &[("f", "v")]).await {
                Ok(p) => Some(p),
                Err(e) => {
                    assert_eq!(e.write_state(), WriteState::NotWritten, "{e:?}");
                    None
                }
            }
        })
        .await;
        let stored = env.coordinator.coordinator().describe_routing(&stream()).await.unwrap();
        assert_eq!(
            stored.shard_count, 4,
            "idempotent {idempotent}: the report grew nothing"
        );
        assert_eq!(published.shard, shard_for_key(key.as_bytes(), 4));
        assert_eq!(published.routing_version, stored.routing_version);
        assert_eq!(xlen(&env.redis, 5).await, 0, "nothing in the lost child");
        producer.close().await.unwrap();
    }
}
