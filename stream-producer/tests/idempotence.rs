//! The idempotent producer against a real redis-server: a call whose answer was lost is retried with the same
//! sequence numbers and answered with the original entry ids instead of being written twice, and under
//! connection resets in the middle of pipelines (fault proxy) nothing is lost and nothing is written twice.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{stream, total_len, Env, DEADLINE};
use protocol::{keys, ShardId};
use stream_producer::{Record, WriteState};
use test_support::{wait_until, FaultProxy, Mode, RedisServer};

const LEASE: Duration = Duration::from_secs(60);

/// A Redis whose main thread a test can block (`DEBUG SLEEP`), so that a request is executed only after the
/// client stopped waiting for its answer.
async fn blockable_redis() -> RedisServer {
    RedisServer::builder()
        .extra_arg("--enable-debug-command")
        .extra_arg("yes")
        .start()
        .await
}

/// Blocks `redis` for `secs` seconds and returns once it is blocked.
async fn block(redis: &RedisServer, secs: f64) -> tokio::task::JoinHandle<()> {
    let mut con = redis.connection().await;
    let sleeper = tokio::spawn(async move {
        let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg(secs).query_async(&mut con).await;
    });
    let probe = redis.client();
    wait_until(DEADLINE, "Redis is blocked", || {
        let probe = probe.clone();
        async move {
            let ping = async {
                let mut con = probe.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut con).await
            };
            tokio::time::timeout(Duration::from_millis(100), ping).await.is_err()
        }
    })
    .await;
    sleeper
}

async fn entries(redis: &RedisServer, shards: u32) -> Vec<(u32, String, HashMap<String, String>)> {
    let mut con = redis.connection().await;
    let mut all = Vec::new();
    for s in 0..shards {
        let got: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(keys::shard_stream(&stream(), ShardId(s)))
            .arg("-")
            .arg("+")
            .query_async(&mut con)
            .await
            .unwrap();
        all.extend(got.into_iter().map(|(id, fields)| (s, id, fields)));
    }
    all
}

fn batch(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record::with_key("one-key").field("n", i.to_string()))
        .collect()
}

#[tokio::test]
async fn a_call_whose_answer_was_lost_is_retried_and_answered_with_the_original_ids() {
    let env = Env::start_on(blockable_redis().await, 2, LEASE).await;
    let producer = env
        .producer()
        .idempotence_retries(30)
        .redis_response_timeout(Duration::from_millis(300))
        .redis_connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    assert!(producer.producer_id().is_some_and(|id| id.starts_with("p-")));

    // The call reaches Redis while it sleeps; the producer stops waiting (timeout) and retries; Redis then
    // executes the first attempt, whose answer nobody reads, and a later retry finds it written.
    let sleeper = block(&env.redis, 1.5).await;
    let published = producer.send_batch(batch(10)).await.unwrap();
    sleeper.await.unwrap();

    let stored = entries(&env.redis, 2).await;
    assert_eq!(stored.len(), 10, "written once: {stored:?}");
    assert!(
        published.iter().all(|p| p.duplicate),
        "the answer came from a retry that found the call written"
    );
    let ids: Vec<&str> = stored.iter().map(|(_, id, _)| id.as_str()).collect();
    let answered: Vec<String> = published.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(answered, ids, "the original entry ids, in order");

    // The sequence goes on: the next call is new, not a duplicate.
    let next = producer.send_batch(batch(3)).await.unwrap();
    assert!(next.iter().all(|p| !p.duplicate));
    assert_eq!(total_len(&env.redis, 2).await, 13);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn without_idempotence_the_same_lost_answer_is_unknown_and_a_retry_would_duplicate() {
    let env = Env::start_on(blockable_redis().await, 2, LEASE).await;
    // Plain pipelines: the writes leave in the first round trip, as they do in the second round trip of a fenced
    // transaction (whose first round trip, the check, the next test loses instead).
    let producer = env
        .producer()
        .fencing(false)
        .redis_response_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    let sleeper = block(&env.redis, 1.0).await;
    let err = producer.send_batch(batch(10)).await.unwrap_err();
    assert_eq!(err.count(WriteState::Unknown), 10, "{err}");
    sleeper.await.unwrap();
    wait_until(DEADLINE, "the unanswered call was executed", || {
        let redis = &env.redis;
        async move { total_len(redis, 2).await == 10 }
    })
    .await;
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_fenced_batch_whose_check_goes_unanswered_is_not_sent_and_never_written() {
    let env = Env::start_on(blockable_redis().await, 2, LEASE).await;
    let producer = env
        .producer()
        .redis_response_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    producer.ready().await.unwrap();
    // The check (UNWATCH, WATCH, HGET, MULTI) reaches Redis while it sleeps; the producer stops waiting, sends
    // no XADD and drops the connection. When Redis wakes up it runs the check on a closed connection: nothing.
    let sleeper = block(&env.redis, 1.0).await;
    let err = producer.send_batch(batch(10)).await.unwrap_err();
    assert_eq!(err.count(WriteState::NotWritten), 10, "{err}");
    assert!(err.to_string().contains("before"), "{err}");
    sleeper.await.unwrap();
    // Redis has run everything the producer sent before the sleeper's answer came back; a PING after it proves it.
    let mut con = env.redis.connection().await;
    let _: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(
        total_len(&env.redis, 2).await,
        0,
        "the unchecked batch was never written"
    );
    // The next call opens a new connection and writes.
    let published = producer.send_batch(batch(10)).await.unwrap();
    assert_eq!(published.len(), 10);
    assert_eq!(total_len(&env.redis, 2).await, 10);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn connection_resets_in_the_middle_of_pipelines_lose_nothing_and_write_nothing_twice() {
    let env = Env::start(4, LEASE).await;
    let target = format!("127.0.0.1:{}", env.redis.port()).parse().unwrap();
    let proxy = Arc::new(FaultProxy::start(target).await);
    let producer = Arc::new(
        env.producer()
            .redis(proxy.url())
            .idempotence_retries(50)
            .build()
            .unwrap(),
    );
    producer.ready().await.unwrap();

    const TASKS: usize = 4;
    const BATCHES: usize = 60;
    const PER_BATCH: usize = 40;
    const RESETS: u32 = 40;
    let done = Arc::new(AtomicUsize::new(0));
    let chaos = {
        let (proxy, producer, done) = (proxy.clone(), producer.clone(), done.clone());
        tokio::spawn(async move {
            let mut resets = 0u32;
            // A bounded storm: resets at random points of the traffic, then a network that works again (a reset
            // every few ms for ever would starve any retry).
            while resets < RESETS && done.load(Ordering::Relaxed) < TASKS {
                // Reset only while pipelines are in flight: their requests may or may not have been executed.
                if producer.stats().pipelines_in_flight > 0 {
                    // Real time: a short outage, then traffic until the next one (the storm's pace).
                    proxy.set_mode(Mode::Reset);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    proxy.set_mode(Mode::Pass);
                    resets += 1;
                    tokio::time::sleep(Duration::from_millis(10 + u64::from(resets % 7) * 5)).await;
                } else {
                    tokio::task::yield_now().await;
                }
            }
            resets
        })
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (producer, done) = (producer.clone(), done.clone());
            tokio::spawn(async move {
                let (mut duplicates, mut resent) = (0, 0);
                for b in 0..BATCHES {
                    let records: Vec<Record> = (0..PER_BATCH)
                        .map(|i| {
                            let n = b * PER_BATCH + i;
                            Record::with_key(format!("t{t}-k{}", n % 16))
                                .field("id", format!("t{t}-{n}"))
                                .field("n", n.to_string())
                        })
                        .collect();
                    // A record whose connection could not even be opened is not written (safe to resend, new
                    // numbers); an unknown outcome would be the idempotent producer's failure.
                    let mut pending = records;
                    while !pending.is_empty() {
                        match producer.send_batch(pending.clone()).await {
                            Ok(published) => {
                                duplicates += published.iter().filter(|p| p.duplicate).count();
                                pending.clear();
                            }
                            Err(e) => {
                                assert_eq!(e.count(WriteState::Unknown), 0, "every call settled: {e}");
                                duplicates += e
                                    .outcomes()
                                    .iter()
                                    .filter(|o| o.published().is_some_and(|p| p.duplicate))
                                    .count();
                                let again = e.indices(WriteState::NotWritten);
                                pending = again.into_iter().map(|i| pending[i].clone()).collect();
                                resent += pending.len();
                            }
                        }
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
                (duplicates, resent)
            })
        })
        .collect();
    let (mut duplicate_answers, mut resent) = (0, 0);
    for t in tasks {
        let (d, r) = t.await.unwrap();
        duplicate_answers += d;
        resent += r;
    }
    let resets = chaos.await.unwrap();

    let stored = entries(&env.redis, 4).await;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for (_, _, fields) in &stored {
        *copies.entry(fields["id"].as_str()).or_default() += 1;
    }
    let duplicates = copies.values().filter(|&&c| c > 1).count();
    let expected = TASKS * BATCHES * PER_BATCH;
    let lost = (0..TASKS)
        .flat_map(|t| (0..BATCHES * PER_BATCH).map(move |n| format!("t{t}-{n}")))
        .filter(|id| !copies.contains_key(id.as_str()))
        .count();
    println!(
        "resets {resets}, records {expected}, stored {}, duplicates {duplicates}, lost {lost}, \
         answered as duplicates {duplicate_answers}, resent as not written {resent}",
        stored.len()
    );
    assert!(
        resets >= 10,
        "the proxy reset connections mid-pipeline ({resets} times)"
    );
    assert_eq!(duplicates, 0);
    assert_eq!(lost, 0);
    assert_eq!(stored.len(), expected);
    // Per key, one task's records stay in order (one call per shard in flight, retried before the next).
    let mut last: HashMap<(u32, String), u64> = HashMap::new();
    for (shard, _, fields) in &stored {
        let id = &fields["id"];
        let task = id.split('-').next().unwrap().to_owned();
        let n: u64 = fields["n"].parse().unwrap();
        if let Some(prev) = last.insert((*shard, format!("{task}-{}", n % 16)), n) {
            assert!(n > prev, "{id} after n={prev}");
        }
    }
    Arc::into_inner(producer).unwrap().close().await.unwrap();
}
