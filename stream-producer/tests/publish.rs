//! Publishing against a real redis-server and the real coordinator: shard choice, pipelines, trimming, and
//! outcomes (written, not written, unknown).

mod common;

use std::time::Duration;

use common::{field_values, stream, total_len, xlen, Env, DEADLINE};
use protocol::messages::CreateGroupRequest;
use protocol::names::GroupName;
use protocol::routing::shard_for_key;
use protocol::{keys, ShardId};
use stream_producer::{PublishError, Record, Trim, WriteState};
use test_support::{wait_until, FaultProxy, Mode};

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn send_returns_the_shard_and_entry_id() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().build().unwrap();
    let published = producer.send("customer-42", &[("type", "created")]).await.unwrap();
    assert_eq!(published.shard, shard_for_key(b"customer-42", 4));
    let mut con = env.redis.connection().await;
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(keys::shard_stream(&stream(), published.shard))
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        entries,
        vec![(published.id.to_string(), vec![("type".into(), "created".into())])]
    );
    producer.close().await.unwrap();
}

#[tokio::test]
async fn send_batch_writes_every_record_to_its_shard_for_key() {
    let env = Env::start(5, LEASE).await;
    let producer = env.producer().build().unwrap();
    let records: Vec<Record> = (0..1000)
        .map(|i| Record::with_key(format!("key-{i}")).field("key", format!("key-{i}")))
        .collect();
    let published = producer.send_batch(records).await.unwrap();
    assert_eq!(published.len(), 1000);
    for (i, p) in published.iter().enumerate() {
        assert_eq!(p.shard, shard_for_key(format!("key-{i}").as_bytes(), 5), "record {i}");
    }
    for shard in 0..5 {
        let keys = field_values(&env.redis, shard, "key").await;
        assert!(!keys.is_empty(), "shard {shard} got records");
        let expected: Vec<String> = (0..1000)
            .map(|i| format!("key-{i}"))
            .filter(|k| shard_for_key(k.as_bytes(), 5) == ShardId(shard))
            .collect();
        // One pipeline per shard: the shard's records are in input order.
        assert_eq!(keys, expected, "shard {shard}");
    }
    // Fenced (the default): one checked transaction per lane turn, which carries the batches of every shard of
    // the lane queued by then: at most one per shard, at least one per lane.
    let pipelines = producer.stats().pipelines;
    assert!((2..=5).contains(&pipelines), "{pipelines} transactions");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn keyless_records_go_round_robin() {
    let env = Env::start(4, LEASE).await;
    let producer = env.producer().build().unwrap();
    let records: Vec<Record> = (0..40)
        .map(|i| Record::without_key().field("n", i.to_string()))
        .collect();
    producer.send_batch(records).await.unwrap();
    for shard in 0..4 {
        assert_eq!(xlen(&env.redis, shard).await, 10, "shard {shard}");
    }
    producer.close().await.unwrap();
}

#[tokio::test]
async fn approximate_maxlen_trimming_bounds_each_shard() {
    let env = Env::start(1, LEASE).await;
    let mut con = env.redis.connection().await;
    // Small radix-tree nodes, so approximate trimming (whole nodes only) is visible with few entries.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("stream-node-max-entries")
        .arg(10)
        .query_async(&mut con)
        .await
        .unwrap();
    let producer = env.producer().trim(Trim::MaxLen(20)).build().unwrap();
    for chunk in 0..10 {
        let records: Vec<Record> = (0..100)
            .map(|i| Record::with_key(format!("{chunk}-{i}")).field("n", "x"))
            .collect();
        producer.send_batch(records).await.unwrap();
    }
    let len = xlen(&env.redis, 0).await;
    assert!((20..=40).contains(&len), "about 20 entries kept, got {len}");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn approximate_max_age_trimming_drops_old_entries() {
    let env = Env::start(1, LEASE).await;
    let mut con = env.redis.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("stream-node-max-entries")
        .arg(10)
        .query_async(&mut con)
        .await
        .unwrap();
    // Old entries: ids from 1970.
    let key = keys::shard_stream(&stream(), ShardId(0));
    for i in 1..=50 {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg(format!("{i}-0"))
            .arg("old")
            .arg("1")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let producer = env
        .producer()
        .trim(Trim::MaxAge(Duration::from_secs(3600)))
        .build()
        .unwrap();
    producer.send("k", &[("new", "1")]).await.unwrap();
    let len = xlen(&env.redis, 0).await;
    assert!(len < 51, "old entries trimmed (MINID ~), {len} left");
    producer.close().await.unwrap();
}

#[tokio::test]
async fn error_reply_fails_only_that_shard_as_not_written() {
    let env = Env::start(4, LEASE).await;
    let mut con = env.redis.connection().await;
    // Shard 2's stream key holds a string: XADD answers WRONGTYPE there.
    let _: () = redis::cmd("SET")
        .arg(keys::shard_stream(&stream(), ShardId(2)))
        .arg("not a stream")
        .query_async(&mut con)
        .await
        .unwrap();
    let producer = env.producer().build().unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let records = keys
        .iter()
        .map(|k| Record::with_key(k.as_str()).field("f", "v"))
        .collect();
    let err = producer.send_batch(records).await.unwrap_err();
    for (k, outcome) in keys.iter().zip(err.outcomes()) {
        if shard_for_key(k.as_bytes(), 4) == ShardId(2) {
            assert_eq!(outcome.write_state(), WriteState::NotWritten, "{k}");
            assert!(
                matches!(outcome.error(), Some(PublishError::Rejected { .. })),
                "{outcome:?}"
            );
        } else {
            assert_eq!(outcome.write_state(), WriteState::Written, "{k}");
        }
    }
    assert_eq!(err.count(WriteState::Unknown), 0);
    let mut written = 0;
    for shard in [0, 1, 3] {
        written += xlen(&env.redis, shard).await;
    }
    assert_eq!(written, err.count(WriteState::Written) as u64);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn unreachable_redis_is_reported_as_not_written() {
    let env = Env::start(4, LEASE).await;
    let port = test_support::free_port();
    let producer = env
        .producer()
        .redis(format!("redis://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let err = producer.send("k", &[("f", "v")]).await.unwrap_err();
    let PublishError::Connect { source, .. } = &err else {
        panic!("expected Connect, got {err:?}");
    };
    assert_eq!(source.kind(), stream_producer::RedisErrorKind::Io, "{source:?}");
    let wrapped = std::error::Error::source(source).expect("the wrapped error");
    assert!(wrapped.downcast_ref::<redis::RedisError>().is_some(), "{wrapped:?}");
    assert_eq!(err.write_state(), WriteState::NotWritten);
    assert!(err.is_retryable());
    producer.close().await.unwrap();
}

/// A producer (built by `configure` from the env's) through a fault proxy: 100 keyed records sent while the proxy
/// stalls, the proxy reset once `in_flight` pipelines are out, then switched back to pass. Returns the producer
/// and the call's error.
async fn reset_with_pipelines_out(
    env: &Env,
    configure: impl FnOnce(stream_producer::ProducerBuilder) -> stream_producer::ProducerBuilder,
    in_flight: u64,
) -> (std::sync::Arc<stream_producer::Producer>, stream_producer::BatchError) {
    let target = format!("127.0.0.1:{}", env.redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(target).await;
    let producer = std::sync::Arc::new(configure(env.producer().redis(proxy.url())).build().unwrap());
    producer.ready().await.unwrap();
    // The requests leave, but Redis's answers never come back...
    proxy.set_mode(Mode::Stall);
    let batch = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let records = (0..100)
                .map(|i| Record::with_key(format!("k{i}")).field("f", "v"))
                .collect();
            producer.send_batch(records).await
        })
    };
    wait_until(DEADLINE, "pipelines in flight", || {
        let out = producer.stats().pipelines_in_flight;
        async move { out == in_flight }
    })
    .await;
    // ...and the connection drops.
    proxy.set_mode(Mode::Reset);
    let err = batch.await.unwrap().unwrap_err();
    // Once the path works again, the lane reconnects.
    proxy.set_mode(Mode::Pass);
    producer.send("k", &[("f", "v")]).await.unwrap();
    (producer, err)
}

#[tokio::test]
async fn connection_reset_mid_pipeline_is_reported_as_unknown() {
    let env = Env::start(4, LEASE).await;
    // Plain pipelines, whose XADDs leave in the first write (the fenced producer's check comes first: next test).
    let (producer, err) = reset_with_pipelines_out(&env, |b| b.fencing(false), 4).await;
    // Redis may or may not have run them.
    assert_eq!(err.count(WriteState::Unknown), 100, "{err}");
    assert!(err
        .outcomes()
        .iter()
        .all(|o| matches!(o.error(), Some(PublishError::ConnectionLost { .. }))));
    assert_eq!(producer.stats().records_unknown, 100);
    std::sync::Arc::into_inner(producer).unwrap().close().await.unwrap();
}

#[tokio::test]
async fn connection_reset_during_the_fence_check_is_reported_as_not_sent() {
    let env = Env::start(4, LEASE).await;
    // One check per lane in flight (a lane writes one checked transaction at a time): no XADD had left, so nothing
    // can have been written. (Batches queued behind the two checks then find no connection: not written either.)
    let (producer, err) = reset_with_pipelines_out(&env, |b| b.connections(2), 2).await;
    assert_eq!(err.count(WriteState::NotWritten), 100, "{err}");
    let not_sent = err
        .outcomes()
        .iter()
        .filter(|o| matches!(o.error(), Some(PublishError::NotSent { .. })))
        .count();
    assert!(not_sent > 0, "{err}");
    assert!(err.outcomes().iter().all(|o| matches!(
        o.error(),
        Some(PublishError::NotSent { .. } | PublishError::Connect { .. })
    )));
    assert_eq!(producer.stats().records_not_written, 100);
    // Only the record sent after the reset is in Redis.
    assert_eq!(total_len(&env.redis, 4).await, 1);
    std::sync::Arc::into_inner(producer).unwrap().close().await.unwrap();
}

#[tokio::test]
async fn the_fenced_transaction_writes_records_with_more_fields_than_the_script_takes() {
    let env = Env::start(2, LEASE).await;
    let producer = env.producer().build().unwrap();
    let wide = (0..1500).fold(Record::with_key("k"), |r, i| r.field(format!("f{i}"), i.to_string()));
    producer.send_record(wide).await.unwrap();
    let shard = shard_for_key(b"k", 2);
    let mut con = env.redis.connection().await;
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(keys::shard_stream(&stream(), shard))
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1.len(), 1500);
    assert_eq!(entries[0].1[1499], ("f1499".to_owned(), "1499".to_owned()));
    producer.close().await.unwrap();
}

#[tokio::test]
async fn invalid_record_is_not_written() {
    let env = Env::start(2, LEASE).await;
    let producer = env.producer().build().unwrap();
    let err = producer.send_record(Record::with_key("k")).await.unwrap_err();
    assert!(matches!(err, PublishError::InvalidRecord(_)));
    let err = producer
        .send_batch(vec![Record::with_key("a").field("f", "v"), Record::with_key("b")])
        .await
        .unwrap_err();
    assert_eq!(err.indices(WriteState::Written), vec![0]);
    assert_eq!(err.indices(WriteState::NotWritten), vec![1]);
    assert_eq!(total_len(&env.redis, 2).await, 1);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn killed_redis_fails_records_as_unknown_or_not_written_then_recovers_after_restart() {
    let mut env = Env::start(4, LEASE).await;
    let producer = std::sync::Arc::new(env.producer().build().unwrap());
    producer.ready().await.unwrap();
    producer.send("before", &[("f", "v")]).await.unwrap();

    env.redis.kill();
    // The first publish on each connection may still go to the dead socket (unknown: the request may have
    // left); once the connections know, nothing can be sent and records are reported as not written.
    let one_per_shard: Vec<String> = (0..4).map(|s| key_on(s, 4)).collect();
    wait_until(DEADLINE, "publishes fail as not written on every connection", || {
        let producer = producer.clone();
        let records = one_per_shard
            .iter()
            .map(|k| Record::with_key(k.as_str()).field("f", "v"))
            .collect();
        async move {
            let err = producer.send_batch(records).await.expect_err("Redis is down");
            assert_eq!(err.count(WriteState::Written), 0, "{err}");
            err.count(WriteState::NotWritten) == 4
        }
    })
    .await;
    // Concurrent publishes share the failed connection attempt: all not written, none waits for its own.
    let sends: Vec<_> = (0..50)
        .map(|i| {
            let producer = producer.clone();
            tokio::spawn(async move { producer.send(format!("k{i}"), &[("f", "v")]).await })
        })
        .collect();
    for s in sends {
        let e = s.await.unwrap().unwrap_err();
        assert_eq!(e.write_state(), WriteState::NotWritten, "{e:?}");
    }

    env.redis.restart().await;
    // The server came back empty: no routing, no shard records. A fenced publish needs its shard's record (issue
    // 30): refused, nothing written, rather than written into a stream no routing or group knows.
    let e = producer.send("after", &[("f", "v")]).await.unwrap_err();
    assert_eq!(e.write_state(), WriteState::NotWritten, "{e:?}");
    // The stream is created again (`coordctl recreate`, or a group creation): its shards have records again.
    wait_until(DEADLINE, "the stream is created again", || async {
        env.coordinator
            .coordinator()
            .create_group(
                &stream(),
                &GroupName::new("billing").unwrap(),
                &CreateGroupRequest {
                    shard_count: Some(4),
                    timings: None,
                },
            )
            .await
            .is_ok()
    })
    .await;
    wait_until(DEADLINE, "publishing works again", || {
        let producer = producer.clone();
        async move { producer.send("after", &[("f", "v")]).await.is_ok() }
    })
    .await;
    std::sync::Arc::into_inner(producer).unwrap().close().await.unwrap();
}

/// A key that `shard_for_key` puts on `shard` of `count`.
fn key_on(shard: u32, count: u32) -> String {
    (0..)
        .map(|i| format!("key-{i}"))
        .find(|k| shard_for_key(k.as_bytes(), count) == ShardId(shard))
        .expect("some key maps to every shard")
}
