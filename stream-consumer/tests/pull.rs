//! The pull-style API ([`stream_consumer::MessageStream`]) against a real redis-server and the real coordinator:
//! acks reach Redis, unsettled entries come back, and an ack after the lease ran out is refused.

mod common;

use common::*;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::time::Duration;
use stream_consumer::{AckError, MessageStream, PulledMessage};

async fn next(messages: &mut MessageStream) -> PulledMessage {
    tokio::time::timeout(Duration::from_secs(15), messages.next())
        .await
        .expect("a message within 15 s")
        .expect("the stream is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pulled_messages_are_acked_in_redis_and_a_nacked_one_comes_back() {
    let env = Env::start("pull-ack").await;
    let (consumer, mut messages) = env.builder("a").build_stream().unwrap();
    let a = consumer.spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;

    let mut produced = BTreeSet::new();
    for shard in 0..SHARDS {
        produced.insert(env.produce_one(shard, u64::from(shard)).await);
    }
    let mut pulled = BTreeSet::new();
    let mut nacked = None;
    while pulled.len() < produced.len() {
        let msg = next(&mut messages).await;
        let key = (msg.shard().0, msg.id());
        if nacked.is_none() {
            assert_eq!(msg.delivery_count(), 1);
            nacked = Some(key);
            msg.nack().await.expect("nack within the lease");
            continue;
        }
        if Some(key) == nacked {
            assert_eq!(msg.delivery_count(), 2, "a nacked entry is delivered again");
        }
        pulled.insert(key);
        msg.ack().await.expect("ack within the lease");
    }
    assert_eq!(pulled, produced);
    test_support::wait_until(Duration::from_secs(10), "every ack to reach Redis", || async {
        env.pending_total().await == 0
    })
    .await;
    let report = a.close().await.unwrap();
    assert!(report.left);
    let end = tokio::time::timeout(Duration::from_secs(10), messages.next()).await;
    assert!(matches!(end, Ok(None)), "the stream ends when the consumer stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unacked_message_is_delivered_again_after_the_consumer_restarts() {
    let env = Env::start("pull-redeliver").await;
    let (consumer, mut messages) = env.builder("a").build_stream().unwrap();
    let a = consumer.spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    let (shard, id) = env.produce_one(3, 1).await;
    let held = next(&mut messages).await;
    assert_eq!((held.shard().0, held.id()), (shard, id));

    // A crash with the message in hand: nothing was acknowledged.
    a.abort().await;
    assert_eq!(held.ack().await, Err(AckError::LeaseExpired));
    let end = tokio::time::timeout(Duration::from_secs(10), messages.next()).await;
    assert!(matches!(end, Ok(None)), "the stream ends with the consumer");
    assert_eq!(env.pending_total().await, 1);

    let (consumer, mut messages) = env.builder("b").build_stream().unwrap();
    let b = consumer.spawn();
    let again = next(&mut messages).await;
    assert_eq!((again.shard().0, again.id()), (shard, id));
    assert_eq!(again.delivery_count(), 2);
    again.ack().await.expect("ack within the lease");
    test_support::wait_until(Duration::from_secs(10), "the ack to reach Redis", || async {
        env.pending_total().await == 0
    })
    .await;
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ack_after_the_lease_ran_out_is_refused_and_the_entry_stays_pending() {
    let mut env = Env::start("pull-expired").await;
    let (consumer, mut messages) = env.builder("a").build_stream().unwrap();
    let a = consumer.spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    env.produce_one(5, 1).await;
    let held = next(&mut messages).await;
    assert!(!held.is_expired());

    // No heartbeat can succeed any more: the lease runs out while the message is in hand.
    env.abort_coordinator();
    wait_status(&a, LEASE * 3, "the lease to run out", |s| {
        s.heartbeats.lease_expiries >= 1 && s.reading.is_empty()
    })
    .await;
    // The reader drops the delivery at its first poll past the lease end.
    test_support::wait_until(Duration::from_secs(5), "the delivery to end", || {
        let expired = held.is_expired();
        async move { expired }
    })
    .await;
    assert_eq!(held.ack().await, Err(AckError::LeaseExpired));
    // Once every task has stopped, no XACK can be on its way any more.
    a.abort().await;
    assert_eq!(env.pending_total().await, 1, "nothing was acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_can_be_dead_lettered_now_or_retried_after_a_chosen_delay() {
    let env = Env::start("pull-outcomes").await;
    let (consumer, mut messages) = env.builder("a").build_stream().unwrap();
    let a = consumer.spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    let bad = env.produce_one(0, 1).await;
    let later = env.produce_one(1, 2).await;
    let delay = Duration::from_millis(600);

    let mut retried_at = None;
    loop {
        let msg = next(&mut messages).await;
        let key = (msg.shard().0, msg.id());
        if key == bad {
            assert_eq!(msg.delivery_count(), 1, "a dead-lettered entry is not delivered again");
            msg.dead_letter("bad payload")
                .await
                .expect("dead-letter within the lease");
        } else if key == later && retried_at.is_none() {
            msg.retry_after(delay).await.expect("retry within the lease");
            retried_at = Some(std::time::Instant::now());
        } else {
            assert_eq!(key, later);
            assert_eq!(msg.delivery_count(), 2);
            let waited = retried_at.expect("retried before").elapsed();
            // The backoff alone (20 ms to 200 ms in these tests) would deliver it sooner.
            assert!(
                waited >= delay,
                "delivered again after {waited:?}, before the {delay:?} asked for"
            );
            msg.ack().await.expect("ack within the lease");
            break;
        }
    }
    let dead_key = protocol::keys::dead_letter_stream(&env.stream, stream_consumer::ShardId(0));
    let con = env.redis.connection().await;
    let env = &env;
    test_support::wait_until(
        Duration::from_secs(10),
        "the dead letter and the acks to reach Redis",
        || {
            let mut con = con.clone();
            let dead_key = dead_key.clone();
            async move {
                let dead: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                    .arg(&dead_key)
                    .arg("-")
                    .arg("+")
                    .query_async(&mut con)
                    .await
                    .expect("XRANGE");
                let reason_ok = dead.ids.len() == 1
                    && dead.ids[0]
                        .get::<String>(stream_consumer::dead_letter::FIELD_ERROR)
                        .as_deref()
                        == Some("bad payload");
                reason_ok && env.pending_total().await == 0
            }
        },
    )
    .await;
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_whose_delivery_ended_before_they_were_pulled_are_skipped() {
    let mut env = Env::start("pull-skip").await;
    let (consumer, mut messages) = env.builder("a").build_stream().unwrap();
    let a = consumer.spawn();
    wait_status(&a, Duration::from_secs(10), "a reads all 8", |s| s.reading.len() == 8).await;
    for shard in 0..SHARDS {
        env.produce_one(shard, u64::from(shard)).await;
    }
    let held = next(&mut messages).await;
    // Every shard has its entry under way: one pulled, one waiting in the stream, the rest waiting to enter it.
    wait_status(&a, Duration::from_secs(10), "an entry of every shard in flight", |s| {
        s.in_flight.len() == 8
    })
    .await;

    env.abort_coordinator();
    wait_status(&a, LEASE * 3, "the lease to run out", |s| {
        s.heartbeats.lease_expiries >= 1 && s.reading.is_empty()
    })
    .await;
    a.abort().await;
    assert_eq!(held.ack().await, Err(AckError::LeaseExpired));
    let end = tokio::time::timeout(Duration::from_secs(10), messages.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "a message that can no longer be settled is not handed out"
    );
    assert_eq!(env.pending_total().await, u64::from(SHARDS), "nothing was acknowledged");
}
