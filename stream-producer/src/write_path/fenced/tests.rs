//! The checked transaction's tests: turns that meet an aborted `EXEC` or a failed check, and the check's replies.

use super::*;
use crate::record::Record;
use crate::write_path::xadd::Xadd;

const V1: Presented = Presented {
    version: RoutingVersion(1),
    records: false,
    count: 1,
};

fn ok(v: Value) -> RedisResult<Value> {
    Ok(v)
}

fn hmget(fence: Option<&[u8]>, born: Option<&[u8]>) -> RedisResult<Value> {
    let field = |f: Option<&[u8]>| f.map_or(Value::Nil, |b| Value::BulkString(b.to_vec()));
    ok(Value::Array(vec![field(fence), field(born), Value::Nil, Value::Nil]))
}

fn status() -> RedisResult<Value> {
    ok(Value::Okay)
}

/// Calls of `command` so far (`INFO commandstats`).
async fn calls(redis: &test_support::RedisServer, command: &str) -> u64 {
    let stats = redis.info("commandstats").await;
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The fenced path of stream `orders` with one lane to `redis`.
fn one_lane(redis: &test_support::RedisServer) -> Fenced {
    let mut config = crate::config::ProducerConfig::new(StreamName::new("orders").unwrap());
    config.redis_url = redis.url();
    config.connections = 1;
    config.redis_connect_timeout = std::time::Duration::from_secs(1);
    config.redis_response_timeout = std::time::Duration::from_secs(5);
    let lanes = ServerLanes::new(&config, Arc::default(), false).unwrap();
    Fenced::new(&config, lanes)
}

/// Queues `records` of shard 0 on the lane, as a publish call does.
fn queue(p: &Fenced, records: &[&Record], presented: Presented) -> Vec<(BatchOutcome, usize)> {
    let xadd = Xadd::now(None);
    p.queue_batches(
        0,
        &ShardBatch {
            shard: ShardId(0),
            records,
            presented,
            xadd: &xadd,
        },
    )
}

fn records(tag: &str) -> Vec<Record> {
    (0..3)
        .map(|i| Record::with_key("k").field("n", format!("{tag}{i}")))
        .collect()
}

/// A turn that checked its batches while the previous turn's `EXEC` was still unanswered, and then learns that
/// `EXEC` was aborted by `WATCH` (its batches back at the front of the queue), writes nothing: it `DISCARD`s
/// and puts its batches right behind the aborted ones, and the next turn writes both in issue order.
#[tokio::test]
async fn a_turn_behind_an_aborted_exec_discards_and_goes_behind_its_batches() {
    let redis = test_support::RedisServer::start().await;
    let p = one_lane(&redis);
    // The lane's first connection takes the start-up check, whose permission probes send MULTI, EXEC and
    // DISCARD: counted from after it.
    p.lanes.connect_all().await.expect("the lane connects");
    let mut admin = redis.connection().await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();
    let txs = &p.transactions[0];
    let (a, b) = (records("a"), records("b"));
    let (a, b): (Vec<&Record>, Vec<&Record>) = (a.iter().collect(), b.iter().collect());
    let version = Presented {
        version: RoutingVersion(1),
        records: false,
        count: 1,
    };
    let mut b_out = queue(&p, &b, version);
    // The previous turn, which carried `a`, has sent its EXEC; its end is not known yet.
    let (ended, end) = watch::channel(None);
    txs.queue().last = Some(end);
    let mut a_out = queue(&p, &a, version);
    let a_batch = txs.queue().batches.pop_back().unwrap();
    let turn = txs.turn.lock().await;
    let b_turn = p.write_queued(0, turn);
    let previous_aborts = async {
        test_support::wait_until(std::time::Duration::from_secs(5), "b's check ran", || async {
            calls(&redis, "multi").await == 1
        })
        .await;
        // What the previous turn does on a nil EXEC: its batch back at the front, then its end.
        txs.requeue(0, vec![a_batch]);
        ended.send(Some(TurnEnd::Aborted { requeued: 1 })).unwrap();
    };
    let (wrote, ()) = tokio::join!(b_turn, previous_aborts);
    assert!(wrote);
    assert_eq!(calls(&redis, "discard").await, 1, "b's transaction was left");
    assert_eq!(calls(&redis, "exec").await, 0, "nothing was written");
    let queued: Vec<Bytes> = txs.queue().batches.iter().map(|b| b.writes.clone()).collect();
    assert_eq!(queued.len(), 2);
    assert!(queued[0].windows(2).any(|w| w == b"a0") && queued[1].windows(2).any(|w| w == b"b0"));
    assert!(
        b_out[0].0.try_recv().is_err() && a_out[0].0.try_recv().is_err(),
        "neither settled yet"
    );
    // The next turn takes both, in order, as one transaction.
    assert!(p.write_queued(0, txs.turn.lock().await).await);
    for out in [&mut a_out, &mut b_out] {
        let results = out.pop().unwrap().0.await.unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    let mut con = redis.connection().await;
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(protocol::keys::shard_stream(&p.stream, ShardId(0)))
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    let order: Vec<&str> = entries.iter().map(|(_, f)| f[0].1.as_str()).collect();
    assert_eq!(order, ["a0", "a1", "a2", "b0", "b1", "b2"]);
}

/// A turn whose check fails (here `HGET` of a fence that is not a hash) stops before waiting for the previous
/// turn's end: it puts that end back, so the next turn still writes only after it (the previous `EXEC` may yet
/// be aborted).
#[tokio::test]
async fn a_turn_whose_check_fails_leaves_the_previous_end_to_the_next_turn() {
    let redis = test_support::RedisServer::start().await;
    let p = one_lane(&redis);
    let txs = &p.transactions[0];
    let mut con = redis.connection().await;
    let () = redis::cmd("SET")
        .arg(protocol::keys::shard_fence(&p.stream, ShardId(0)))
        .arg("not a hash")
        .query_async(&mut con)
        .await
        .unwrap();
    let b = records("b");
    let b: Vec<&Record> = b.iter().collect();
    let mut b_out = queue(&p, &b, V1);
    let (ended, end) = watch::channel(None);
    txs.queue().last = Some(end.clone());
    assert!(p.write_queued(0, txs.turn.lock().await).await);
    let results = b_out.pop().unwrap().0.await.unwrap();
    assert!(
        results.iter().all(|r| matches!(r, Err(PublishError::Rejected { .. }))),
        "{results:?}"
    );
    let restored = txs.queue().last.take();
    assert!(
        restored.is_some_and(|last| last.same_channel(&end)),
        "the previous end is back"
    );
    // Had the previous turn ended (aborted: its batches back at the front), there is nothing to put back.
    txs.queue().last = Some(end.clone());
    let (c, _) = (records("c"), ());
    let c: Vec<&Record> = c.iter().collect();
    let mut c_out = queue(&p, &c, V1);
    let turn = txs.turn.lock().await;
    let (batches, previous) = txs.take();
    ended.send(Some(TurnEnd::Settled)).unwrap();
    drop(previous);
    drop(turn);
    assert!(txs.queue().last.is_none());
    drop(batches);
    assert!(c_out.pop().unwrap().0.await.is_err(), "dropped unsettled");
}

#[test]
fn exec_is_the_command_redis_rs_packs() {
    assert_eq!(EXEC, redis::cmd("EXEC").get_packed_command());
}

#[test]
fn fence_values_are_decimal_digits_only() {
    assert_eq!(parse_fence(b"0"), Some(RoutingVersion(0)));
    assert_eq!(parse_fence(b"42"), Some(RoutingVersion(42)));
    assert_eq!(
        parse_fence(b"999999999999999"),
        Some(RoutingVersion(999_999_999_999_999))
    );
    for bad in [&b""[..], b"-1", b"1.5", b" 1", b"1e3", b"abc", b"1000000000000000"] {
        assert_eq!(parse_fence(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn the_check_reads_an_absent_fence_as_zero_and_a_set_one_as_its_value() {
    let read = check_reply(
        vec![
            status(),
            status(),
            hmget(None, None),
            hmget(Some(b"7"), Some(b"3")),
            hmget(Some(b"x"), None),
            hmget(Some(b"7"), Some(b"-")),
            status(),
        ],
        4,
    )
    .unwrap();
    assert!(matches!(read[0], Fence::Read(r) if r == ShardRecord::default()));
    assert!(matches!(
        read[1],
        Fence::Read(ShardRecord {
            fence: RoutingVersion(7),
            born: Some(RoutingVersion(3)),
            fence_count: 0,
            born_count: 0,
        })
    ));
    assert!(matches!(read[2], Fence::Unreadable(_)));
    assert!(matches!(read[3], Fence::Unreadable(_)), "a birth that is not a version");
}

#[test]
fn the_layout_counts_are_read_and_one_that_is_not_a_count_is_refused() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let read = read_fence(Value::Array(vec![bulk("7"), bulk("3"), bulk("8"), bulk("4")])).unwrap();
    assert!(matches!(
        read,
        Fence::Read(ShardRecord {
            fence: RoutingVersion(7),
            born: Some(RoutingVersion(3)),
            fence_count: 8,
            born_count: 4,
        })
    ));
    for bad in ["x", "-1", "4294967296"] {
        let read = read_fence(Value::Array(vec![bulk("7"), bulk("3"), bulk("8"), bulk(bad)])).unwrap();
        assert!(matches!(read, Fence::Unreadable(_)), "{bad}");
        let read = read_fence(Value::Array(vec![bulk("7"), bulk("3"), bulk(bad), Value::Nil])).unwrap();
        assert!(matches!(read, Fence::Unreadable(_)), "{bad}");
    }
}

#[test]
fn any_refused_command_of_the_check_stops_the_batch() {
    let refused = || -> RedisResult<Value> { Err(RedisError::from((redis::ErrorKind::Client, "refused"))) };
    let seven = || hmget(Some(b"7"), None);
    for replies in [
        vec![refused(), status(), seven(), status()],
        vec![status(), refused(), seven(), status()],
        vec![status(), status(), refused(), status()],
        vec![status(), status(), seven(), refused()],
        vec![status(), status(), seven()],
        vec![status(), status(), ok(Value::Int(7)), status()],
        vec![status(), status(), ok(Value::Array(vec![Value::Nil])), status()],
    ] {
        assert!(check_reply(replies, 1).is_err());
    }
}
