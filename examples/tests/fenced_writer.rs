//! The fenced writer: the script refuses a write whose token is below one the hash already accepted, and, end to
//! end, a worker that lost its shard while a write was in flight cannot overwrite what the shard's next owner
//! wrote. Real `redis-server` processes and an in-process coordinator.

use coord_server::server::CoordinatorHandle;
use examples::fenced_write::{account_key, apply_entry, FencedHash, WriteOutcome};
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, StreamName};
use protocol::{keys, FencingToken, ShardId};
use std::collections::HashMap;
use std::time::Duration;
use stream_consumer::{ConsumerBuilder, Message};
use test_support::{wait_for, RedisServer};
use tokio::sync::{mpsc, watch};

async fn hash(redis: &RedisServer, key: &str) -> HashMap<String, String> {
    let mut conn = redis.connection().await;
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("HGETALL")
}

#[tokio::test]
async fn a_late_write_with_an_older_token_is_refused_and_the_newer_owners_write_is_kept() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let w = FencedHash::new();
    let (old, new) = (FencingToken(1_700_000_000_000), FencingToken(1_700_000_004_000));
    let shard = ShardId(3);
    assert_eq!(
        w.write(&mut conn, "h", shard, old, &[("writer", "old"), ("n", "1")])
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        w.write(&mut conn, "h", shard, old, &[("n", "2")]).await.unwrap(),
        WriteOutcome::Applied,
        "one owner writes many times with the same token"
    );
    // The shard moved; its new owner writes.
    assert_eq!(
        w.write(&mut conn, "h", shard, new, &[("writer", "new"), ("n", "3")])
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    // The old owner resumes after a pause and finishes its write.
    assert_eq!(
        w.write(&mut conn, "h", shard, old, &[("writer", "old"), ("n", "4")])
            .await
            .unwrap(),
        WriteOutcome::Refused { stored: new }
    );
    let h = hash(&redis, "h").await;
    assert_eq!(h["writer"], "new");
    assert_eq!(h["n"], "3", "the refused write changed nothing");
    assert_eq!(h["fence:3"], new.0.to_string());
    // Another shard's tokens are its own sequence.
    assert_eq!(
        w.write(&mut conn, "h", ShardId(4), FencingToken(5), &[("other", "x")])
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
}

#[tokio::test]
async fn malformed_fenced_writes_are_script_errors_that_write_nothing() {
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
    let w = FencedHash::new();
    assert!(w.write(&mut conn, "h", ShardId(0), FencingToken(1), &[]).await.is_err());
    assert!(w
        .write(&mut conn, "h", ShardId(0), FencingToken(1 << 53), &[("a", "b")])
        .await
        .is_err());
    assert!(hash(&redis, "h").await.is_empty());
}

fn consumer(redis: &RedisServer, coord: &CoordinatorHandle, stream: &str, member: &str) -> ConsumerBuilder {
    test_support::consumer::builder(stream, "ledger", member)
        .coordinator(format!("http://{}", coord.addr()))
        .redis(redis.url())
}

/// The old owner's handler has sent its write (held here by a gate, as a pause would hold it) when its process
/// stops; the shard moves, the new owner handles the same entry and writes, and then the old write lands.
#[tokio::test]
async fn a_stalled_owners_late_write_is_refused_after_its_shard_moved() {
    let redis = RedisServer::start().await;
    let coord = test_support::coordinator::spawn(&redis.url()).await;
    let stream = StreamName::new("fenced").unwrap();
    let timings = test_support::timings::group_timings();
    coord
        .coordinator()
        .create_group(
            &stream,
            &GroupName::new("ledger").unwrap(),
            &CreateGroupRequest {
                shard_count: Some(1),
                timings: Some(timings),
            },
        )
        .await
        .expect("group created");
    let mut conn = redis.connection().await;
    let _: String = redis::cmd("XADD")
        .arg(keys::shard_stream(&stream, ShardId(0)))
        .arg("*")
        .arg("account")
        .arg("acc-1")
        .arg("amount")
        .arg("10")
        .query_async(&mut conn)
        .await
        .expect("XADD");

    // A: its handler sends the write, which stalls until the gate opens, and the handler waits for it.
    let (gate_tx, gate_rx) = watch::channel(false);
    let (late_tx, mut late_rx) = mpsc::unbounded_channel::<(FencingToken, WriteOutcome)>();
    let (a_started_tx, mut a_started) = mpsc::unbounded_channel::<FencingToken>();
    let a_conn = redis.connection().await;
    let a = consumer(&redis, &coord, stream.as_str(), "a")
        .handler(move |msg: Message| {
            let (mut gate, late_tx, mut conn) = (gate_rx.clone(), late_tx.clone(), a_conn.clone());
            let _ = a_started_tx.send(msg.fencing_token());
            let write = tokio::spawn(async move {
                let _ = gate.wait_for(|open| *open).await;
                let outcome = apply_entry(&FencedHash::new(), &mut conn, &msg, "a")
                    .await
                    .expect("a's write");
                let _ = late_tx.send((msg.fencing_token(), outcome));
            });
            async move {
                let _ = write.await;
                Ok::<_, std::io::Error>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    let a_token = tokio::time::timeout(Duration::from_secs(15), a_started.recv())
        .await
        .expect("a handles the entry")
        .unwrap();
    assert!(a_token > FencingToken(0), "the coordinator sent a token");

    // B joins (the shard stays a's), then a's process dies with its write in flight.
    let (b_tx, mut b_rx) = mpsc::unbounded_channel::<(FencingToken, WriteOutcome)>();
    let b_conn = redis.connection().await;
    let b = consumer(&redis, &coord, stream.as_str(), "b")
        .handler(move |msg: Message| {
            let (b_tx, mut conn) = (b_tx.clone(), b_conn.clone());
            async move {
                let outcome = apply_entry(&FencedHash::new(), &mut conn, &msg, "b").await?;
                let _ = b_tx.send((msg.fencing_token(), outcome));
                Ok::<_, redis::RedisError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    a.abort().await;

    // The coordinator expires a; b gets the shard, claims the pending entry and writes it.
    let (b_token, b_outcome) = tokio::time::timeout(Duration::from_secs(20), b_rx.recv())
        .await
        .expect("b handles the entry after a expired")
        .unwrap();
    assert_eq!(b_outcome, WriteOutcome::Applied);
    assert!(b_token > a_token, "the new owner's token {b_token} is above {a_token}");

    // a's write lands late.
    gate_tx.send(true).unwrap();
    let (token, outcome) = tokio::time::timeout(Duration::from_secs(5), late_rx.recv())
        .await
        .expect("a's late write completes")
        .unwrap();
    assert_eq!(token, a_token);
    assert_eq!(outcome, WriteOutcome::Refused { stored: b_token });
    let h = wait_for(Duration::from_secs(5), "the hash to hold b's write", || {
        let redis = &redis;
        async move {
            let h = hash(redis, &account_key("acc-1")).await;
            (h.get("writer").map(String::as_str) == Some("b")).then_some(h)
        }
    })
    .await;
    assert_eq!(h["fence:0"], b_token.0.to_string());
    assert_eq!(h["amount"], "10");
    b.close().await.expect("b closes");
}
