//! The background batching mode against a real redis-server: nothing accepted is lost on close, flush waits for
//! every accepted record, and a full queue makes `enqueue` wait.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{field_values, total_len, Env, DEADLINE};
use futures::FutureExt;
use stream_producer::{PublishError, Record, WriteState};
use test_support::{wait_until, FaultProxy, Mode};

const LEASE: Duration = Duration::from_secs(30);

/// A stream of 2 shards and a proxy in front of its redis-server, for the producer to write through.
async fn behind_proxy() -> (Env, FaultProxy) {
    let env = Env::start(2, LEASE).await;
    let target = format!("127.0.0.1:{}", env.redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(target).await;
    (env, proxy)
}

#[tokio::test]
async fn close_loses_nothing_accepted() {
    let env = Env::start(4, LEASE).await;
    let producer = Arc::new(
        env.producer()
            .queue_capacity(1000)
            .max_batch_size(100)
            .linger(Duration::from_millis(5))
            .build()
            .unwrap(),
    );
    let mut callers = Vec::new();
    for c in 0..8 {
        let producer = producer.clone();
        callers.push(tokio::spawn(async move {
            let mut deliveries = Vec::new();
            for i in 0..2500 {
                let record = Record::with_key(format!("{c}-{i}")).field("n", i.to_string());
                deliveries.push(producer.enqueue(record).await.expect("accepted"));
            }
            deliveries
        }));
    }
    let mut deliveries = Vec::new();
    for c in callers {
        deliveries.extend(c.await.unwrap());
    }
    // Close right after the last accept: most records are still queued or in flight.
    let producer = Arc::into_inner(producer).expect("callers are done");
    let stats = producer.close().await.unwrap();
    assert_eq!(stats.records_written, 20_000, "{stats:?}");
    assert!(stats.batches < 20_000, "records shared batches: {stats:?}");
    // (Awaited rather than polled once: tokio's cooperative budget may make a ready oneshot yield.)
    let outcomes = tokio::time::timeout(DEADLINE, futures::future::join_all(deliveries))
        .await
        .expect("resolved by close");
    assert!(outcomes.iter().all(Result::is_ok));
    assert_eq!(total_len(&env.redis, 4).await, 20_000);
}

#[tokio::test]
async fn flush_waits_for_every_accepted_record() {
    let env = Env::start(3, LEASE).await;
    // A long linger: without the flush the batch would wait.
    let producer = env.producer().linger(Duration::from_secs(5)).build().unwrap();
    let mut deliveries = Vec::new();
    for i in 0..300 {
        deliveries.push(
            producer
                .enqueue(Record::with_key(i.to_string()).field("n", "1"))
                .await
                .unwrap(),
        );
    }
    producer.flush().await.unwrap();
    assert_eq!(total_len(&env.redis, 3).await, 300);
    let outcomes = tokio::time::timeout(DEADLINE, futures::future::join_all(deliveries))
        .await
        .expect("resolved by flush");
    assert!(outcomes.iter().all(Result::is_ok));
    // A flush with nothing queued returns at once.
    producer.flush().await.unwrap();
    producer.close().await.unwrap();
}

#[tokio::test]
async fn full_queue_makes_enqueue_wait_until_there_is_room() {
    let (env, proxy) = behind_proxy().await;
    let producer = env
        .producer()
        .redis(proxy.url())
        .queue_capacity(10)
        .max_batch_size(10)
        .max_in_flight_batches(1)
        .linger(Duration::ZERO)
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    proxy.set_mode(Mode::Stall);

    // One batch goes out and hangs (its records leave the queue); the next one fills the queue.
    let mut deliveries = Vec::new();
    let mut accepted = 0;
    while producer.stats().queued < 10 {
        deliveries.push(
            producer
                .enqueue(Record::with_key(accepted.to_string()).field("n", "1"))
                .await
                .unwrap(),
        );
        accepted += 1;
        assert!(accepted <= 30, "the queue must fill: {:?}", producer.stats());
    }
    wait_until(DEADLINE, "queue full", || {
        let queued = producer.stats().queued;
        async move { queued == 10 }
    })
    .await;
    // Backpressure: no room, so enqueue waits.
    let mut blocked = Box::pin(producer.enqueue(Record::with_key("late").field("n", "1")));
    assert!(
        (&mut blocked).now_or_never().is_none(),
        "enqueue must wait while the queue is full"
    );

    // Redis answers again: the queue drains and the waiting record is accepted.
    proxy.set_mode(Mode::Pass);
    let late = tokio::time::timeout(DEADLINE, blocked)
        .await
        .expect("room again")
        .unwrap();
    let stats = producer.close().await.unwrap();
    tokio::time::timeout(DEADLINE, late)
        .await
        .expect("resolved by close")
        .unwrap();
    for d in deliveries {
        // Every accepted record was written once the stall ended.
        tokio::time::timeout(DEADLINE, d)
            .await
            .expect("resolved by close")
            .unwrap();
    }
    assert_eq!(stats.records_not_written, 0);
}

#[tokio::test]
async fn the_in_flight_byte_budget_holds_the_next_batch_until_the_first_is_answered() {
    let (env, proxy) = behind_proxy().await;
    // Batches of 10 records of 10 bytes (key 1, field name 1, value 8): one batch is above the 50-byte budget,
    // while the batch count would let 8 go. A long linger: only full batches go.
    let producer = env
        .producer()
        .redis(proxy.url())
        .queue_capacity(100)
        .max_batch_size(10)
        .max_in_flight_batches(8)
        .max_in_flight_bytes(50)
        .linger(Duration::from_secs(5))
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    proxy.set_mode(Mode::Stall);

    let mut deliveries = Vec::new();
    for i in 0..30 {
        deliveries.push(
            producer
                .enqueue(Record::with_key((i % 10).to_string()).field("n", "12345678"))
                .await
                .unwrap(),
        );
    }
    // The first batch went out alone (nothing was in flight) and hangs; the second and the third are full and
    // wait for the budget: 20 records accepted and not sent.
    wait_until(DEADLINE, "the second and third batches held back", || {
        let queued = producer.stats().queued;
        async move { queued == 20 }
    })
    .await;
    assert_eq!(producer.stats().batches, 1, "{:?}", producer.stats());

    proxy.set_mode(Mode::Pass);
    for d in deliveries {
        tokio::time::timeout(DEADLINE, d)
            .await
            .expect("written once Redis answers")
            .unwrap();
    }
    let stats = producer.close().await.unwrap();
    assert_eq!(stats.batches, 3);
    assert_eq!(total_len(&env.redis, 2).await, 30);
}

#[tokio::test]
async fn dropping_the_producer_fails_queued_records_as_not_written() {
    let (env, proxy) = behind_proxy().await;
    let producer = env
        .producer()
        .redis(proxy.url())
        .queue_capacity(50)
        .max_batch_size(10)
        .max_in_flight_batches(1)
        .linger(Duration::ZERO)
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    proxy.set_mode(Mode::Stall);
    let mut deliveries = Vec::new();
    for i in 0..40 {
        deliveries.push(
            producer
                .enqueue(Record::with_key(i.to_string()).field("n", "1"))
                .await
                .unwrap(),
        );
    }
    drop(producer);
    let mut states = Vec::new();
    for d in deliveries {
        let result = tokio::time::timeout(DEADLINE, d)
            .await
            .expect("a dropped producer resolves deliveries");
        let e = result.expect_err("nothing could be written through the stalled proxy");
        assert!(matches!(e, PublishError::Closed | PublishError::Abandoned), "{e:?}");
        states.push(e.write_state());
    }
    assert!(
        states.contains(&WriteState::NotWritten),
        "queued records were never sent"
    );
}

/// Records of one key enqueued one after another by one caller are written in that order, with several batches
/// in flight (8): `enqueue` order is the key's order. (It was not: a pipeline issued after a lane's
/// connection opened overtook those waiting for it, and tokio's cooperative budget let a later batch reach the
/// connection first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_records_of_a_key_keep_their_order_with_batches_in_flight() {
    const SHARDS: u32 = 4;
    let env = Env::start(SHARDS, LEASE).await;
    let producer = env
        .producer()
        .max_batch_size(64)
        .max_in_flight_batches(8)
        .linger(Duration::from_millis(1))
        .build()
        .unwrap();
    let mut deliveries = Vec::new();
    for i in 0..20_000u32 {
        let record = Record::with_key(format!("k{}", i % 100))
            .field("key", format!("k{}", i % 100))
            .field("n", i.to_string());
        deliveries.push(producer.enqueue(record).await.expect("accepted"));
    }
    let outcomes = tokio::time::timeout(DEADLINE, futures::future::join_all(deliveries))
        .await
        .expect("resolved");
    assert!(outcomes.iter().all(Result::is_ok));
    producer.close().await.unwrap();
    let mut out_of_order = 0;
    for shard in 0..SHARDS {
        let keys = field_values(&env.redis, shard, "key").await;
        let ns = field_values(&env.redis, shard, "n").await;
        let mut last: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
        for (k, n) in keys.into_iter().zip(ns) {
            let n: u32 = n.parse().unwrap();
            if last.get(&k).is_some_and(|&prev| prev > n) {
                out_of_order += 1;
            }
            last.insert(k, n);
        }
    }
    assert_eq!(out_of_order, 0, "records written after a later record of their key");
}

/// Many callers append while each of them flushes from time to time: every flush returns only once every record
/// its caller had accepted before it has its outcome, and every record is written once. (Batches are sealed by
/// the caller that fills them, by the sending task when their linger passes, and by flushes, concurrently.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_racing_with_appends_wait_for_every_record_accepted_before_them() {
    const SHARDS: u32 = 3;
    const CALLERS: usize = 8;
    const PER_CALLER: usize = 1_500;
    let env = Env::start(SHARDS, LEASE).await;
    let producer = Arc::new(
        env.producer()
            .queue_capacity(500)
            .max_batch_size(37)
            .max_in_flight_batches(4)
            .linger(Duration::from_millis(2))
            .build()
            .unwrap(),
    );
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let producer = producer.clone();
        callers.push(tokio::spawn(async move {
            let mut pending = Vec::new();
            let mut ids = Vec::new();
            for i in 0..PER_CALLER {
                let record = Record::with_key(format!("{c}-{}", i % 50)).field("n", i.to_string());
                pending.push(producer.enqueue(record).await.expect("accepted"));
                if i % 97 == 96 {
                    producer.flush().await.expect("flushed");
                    for delivery in pending.drain(..) {
                        let outcome = delivery
                            .now_or_never()
                            .expect("a record accepted before the flush has its outcome when the flush returns");
                        ids.push(outcome.expect("written").id);
                    }
                }
            }
            for delivery in pending {
                ids.push(delivery.await.expect("written").id);
            }
            ids
        }));
    }
    let mut written = 0;
    for c in callers {
        written += c.await.unwrap().len();
    }
    assert_eq!(written, CALLERS * PER_CALLER);
    let producer = Arc::into_inner(producer).expect("callers are done");
    let stats = producer.close().await.unwrap();
    assert_eq!(stats.records_written, (CALLERS * PER_CALLER) as u64, "{stats:?}");
    assert_eq!(total_len(&env.redis, SHARDS).await, (CALLERS * PER_CALLER) as u64);
}
