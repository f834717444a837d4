//! A member that cannot reach its shards' Redis does not keep them: the start-up check refuses an unusable Redis
//! before joining, and a member whose readers cannot read for longer than `read_failure_timeout` gives its
//! shards back (leaves the group) and joins again once Redis answers.

mod common;

use common::*;
use std::time::Duration;
use stream_consumer::{ConsumerError, RedisErrorKind, RedisUnusableReason};
use test_support::{free_port, wait_until, RedisServer};

const DEADLINE: Duration = Duration::from_secs(15);

#[tokio::test]
async fn wrong_redis_port_fails_start_before_joining_with_the_url_without_its_password() {
    let env = Env::start("wrong-port").await;
    let rec = Recorder::new();
    let url = format!("redis://app:s3cret@127.0.0.1:{}/0", free_port());
    let err = env
        .consumer("a", &rec)
        .redis(url.clone())
        .build()
        .expect("valid configuration")
        .start()
        .await
        .expect_err("nothing listens on that port");
    let ConsumerError::RedisUnusable { url: shown, reason } = &err else {
        panic!("expected RedisUnusable, got {err:?}");
    };
    assert!(shown.contains("127.0.0.1") && !shown.contains("s3cret"), "{shown}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
    let RedisUnusableReason::Connect(failure) = reason else {
        panic!("expected Connect, got {reason:?}");
    };
    // The Redis client's error is wrapped (its type is not in the API) and still reachable as the source.
    assert_eq!(failure.kind(), RedisErrorKind::Io, "{failure:?}");
    assert!(failure.is_connection_dropped(), "{failure:?}");
    let source = std::error::Error::source(failure).expect("the wrapped error");
    assert!(source.downcast_ref::<redis::RedisError>().is_some(), "{source:?}");
    assert!(reason.to_string().contains("connect"), "{reason}");
    assert!(err.is_retryable(), "nothing listening may be an outage: {err}");

    // `run` refuses the same way, and neither ever joined.
    let run = env
        .consumer("b", &rec)
        .redis(url)
        .build()
        .expect("valid configuration")
        .run(stream_consumer::CancellationToken::new())
        .await;
    assert!(matches!(run, Err(ConsumerError::RedisUnusable { .. })), "{run:?}");
    assert!(env.describe().await.members.is_empty(), "a member joined");
}

#[tokio::test]
async fn redis_without_a_needed_command_fails_start_naming_it() {
    let env = Env::start("renamed").await;
    let renamed = RedisServer::builder().rename_command("XAUTOCLAIM", "").start().await;
    let rec = Recorder::new();
    let err = env
        .consumer("a", &rec)
        .redis(renamed.url())
        .build()
        .expect("valid configuration")
        .start()
        .await
        .expect_err("XAUTOCLAIM is missing");
    assert!(err.to_string().contains("XAUTOCLAIM"), "{err}");
    assert!(
        matches!(&err, ConsumerError::RedisUnusable { reason, .. } if reason.is_unsupported()),
        "{err:?}"
    );
    assert!(!err.is_retryable(), "a missing command stays missing: {err}");
    assert!(env.describe().await.members.is_empty(), "a member joined");
}

#[tokio::test]
async fn member_whose_redis_dies_after_joining_gives_its_shards_back_and_rejoins_once_it_answers() {
    let env = Env::start("redis-dies").await;
    let rec = Recorder::new();
    // a reads its shards from its own Redis (as with a wrong URL that happens to answer), b from the real one.
    let mut own = RedisServer::start().await;
    let a = env
        .consumer("a", &rec)
        .redis(own.url())
        .read_failure_timeout(Duration::from_millis(1000))
        .build()
        .unwrap()
        .start()
        .await
        .expect("a's Redis passes the check");
    let b = env
        .consumer("b", &rec)
        .build()
        .unwrap()
        .start()
        .await
        .expect("b starts");
    wait_until(DEADLINE, "a and b to split the shards", || {
        let (ra, rb) = (a.status().reading.len(), b.status().reading.len());
        async move { ra > 0 && rb > 0 && ra + rb == SHARDS as usize }
    })
    .await;

    own.kill();
    wait_until(DEADLINE, "b to read every shard", || {
        let n = b.status().reading.len();
        async move { n == SHARDS as usize }
    })
    .await;
    let st = a.status();
    assert_eq!(st.heartbeats.redis_give_backs, 1, "{st:?}");
    assert!(st.reading.is_empty() && !st.joined, "{st:?}");

    // While its Redis stays down, a stays out. Real time: the outage lasts a span of the consumer's clock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!a.status().joined);

    own.restart().await;
    wait_until(DEADLINE, "a to join again and read", || {
        let st = a.status();
        async move { st.joined && !st.reading.is_empty() }
    })
    .await;
    a.close().await.expect("a closes");
    b.close().await.expect("b closes");
}
